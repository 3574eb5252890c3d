"""Path and file checks shared by the commands: one wording for one mistake, wherever it is made."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from teller.errors import TellerIOError


def check_output_dir(path: str | os.PathLike[str], option: str) -> None:
    """Refuse, before any work, an output directory that is an existing file or lies under one (a
    :class:`TellerIOError` naming the file and ``option``, e.g. ``--output-dir names a directory``).
    A path that does not exist yet is fine: it is created when the work is written."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise TellerIOError(f"{q}: exists and is not a directory ({option})", path=str(q))
            return


def make_output_dir(path: str | os.PathLike[str], what: str = "output directory") -> Path:
    """Create ``path`` (and its parents) if needed; a failure (no permission, a full disk, a file in
    the way) is a :class:`TellerIOError` naming it and ``what`` it is for. Returns the path."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TellerIOError(f"{p}: cannot create the {what}: {e.strerror or e}", path=str(p)) from None
    return p


def yaml_error_line(e: Any) -> str:
    """A YAML error on one line: where (line and column, 1-based) and what is wrong, not PyYAML's
    multi-line rendering with the source line and a caret."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e)
    if mark is not None:
        where = f"line {mark.line + 1}, column {mark.column + 1}"
    elif getattr(e, "position", None) is not None:
        where = f"character {e.position}"  # (a ReaderError: a character YAML does not accept)
    else:
        where = ""
    what = " ".join(str(what).split())
    ctx = getattr(e, "context", None)
    if ctx:
        what = f"{' '.join(str(ctx).split())}: {what}"
    return f"{where}: {what}" if where else what


def check_output_file(path: str | os.PathLike[str], inputs: list[Any], option: str) -> None:
    """Refuse an output file that is a directory, or one of ``inputs`` (the files actually read:
    writing it would overwrite what is being converted or diagnosed)."""
    from teller.errors import ConfigError

    o = Path(path)
    if o.is_dir():
        raise TellerIOError(f"{o}: a directory ({option} names a file)", path=str(o))
    # (the files the loader read, not everything under an input directory: a run directory's own
    # earlier output, say RUN/merged.json.gz, is not an input of RUN)
    if o.exists() and any(Path(i).is_file() and os.path.samefile(i, o) for i in inputs):
        raise ConfigError(f"{o}: is one of the inputs; write {option} elsewhere", path=str(o))
