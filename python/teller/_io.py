"""Path and file checks shared by the commands: one wording for one mistake, wherever it is made; and
the lock that keeps two teller processes from writing one output directory at once (dir_lock)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from teller.errors import DirectoryLockedError, TellerIOError

try:
    import fcntl
except ImportError:  # (Windows: no flock; dir_lock is then a no-op)
    fcntl = None  # type: ignore[assignment]


def check_output_dir(path: str | os.PathLike[str], option: str) -> None:
    """Refuse, before any work, an output directory that is an existing file or lies under one (a
    :class:`TellerIOError` naming the file and ``option``, e.g. ``--output-dir names a directory``),
    or whose nearest existing directory this user cannot write. A path that does not exist yet is
    fine: it is created when the work is written."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise TellerIOError(
                    f"{q}: exists and is not a directory ({option})", path=str(q), errno=errno.ENOTDIR
                )
            # (the nearest existing directory is where the first file or directory is created)
            if not os.access(q, os.W_OK | os.X_OK):
                raise TellerIOError(f"{q}: not writable ({option})", path=str(q), errno=errno.EACCES)
            return


def check_outside(
    out: str | os.PathLike[str], data: str | os.PathLike[str], out_option: str, data_option: str
) -> None:
    """Refuse, before any work, an output directory that is the input directory ``data`` or lies
    inside it: what is written there would be read as part of the input (a dataset's run directories
    would read as samples the manifest does not list)."""
    from teller.errors import ConfigError

    d = Path(data)
    if not d.is_dir():
        return
    o, dr = Path(out).resolve(), d.resolve()
    if o == dr or dr in o.parents:
        raise ConfigError(
            f"{out}: inside {data_option} {data} (what is written there would be read as part of "
            f"it); write {out_option} elsewhere",
            path=str(out),
        )


def make_output_dir(path: str | os.PathLike[str], what: str = "output directory") -> Path:
    """Create ``path`` (and its parents) if needed; a failure (no permission, a full disk, a file in
    the way) is a :class:`TellerIOError` naming it and ``what`` it is for. Returns the path."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TellerIOError(
            f"{p}: cannot create the {what}: {e.strerror or e}", path=str(p), errno=e.errno
        ) from None
    return p


def _own_fd(s: str) -> int | None:
    """The descriptor of this process that ``s`` names (``/dev/stdout``, ``/dev/fd/N``,
    ``/proc/self/fd/N``, ``/proc/<our pid>/fd/N``), or None."""
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
    if s in named:
        return named[s]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if s.startswith(prefix) and s[len(prefix) :].isdigit():
            return int(s[len(prefix) :])
    return None


def resolve_output(p: Path) -> tuple[Path, int | None, bool]:
    """Where a write through ``p`` lands (as ``teller_core::writer::resolve_links``): the file at the
    end of its symbolic links, one of this process's descriptors where the way passes through a
    descriptor alias (written to at its own position, not replaced), and whether it passed through
    any alias (``/proc/...``, ``/dev/fd/...``: another process's descriptor is appended to)."""
    cur = str(p)
    fd, alias = _own_fd(cur), cur.startswith(("/proc/", "/dev/fd/"))
    for _ in range(40):
        if fd is not None:
            break
        try:
            link = os.readlink(cur)
        except OSError:
            break
        cur = link if os.path.isabs(link) else os.path.join(os.path.dirname(cur), link)
        fd, alias = _own_fd(cur), alias or cur.startswith(("/proc/", "/dev/fd/"))
    return Path(cur), fd, alias


def _write_in_place(p: Path, data: str | bytes | Any, fd: int | None) -> Path:
    """``write_atomic``'s data appended to ``p`` (or to the descriptor ``fd``, which it closes)."""
    try:
        if not isinstance(data, (str, bytes, bytearray, memoryview)):
            if fd is not None:
                os.close(fd)
            data(p)  # (a writer of its own: given the path)
            return p
        with open(fd if fd is not None else p, "ab") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as e:
        raise TellerIOError(f"{p}: cannot write it ({e.strerror or e})", path=str(p), errno=e.errno) from None
    return p


def write_atomic(path: str | os.PathLike[str], data: str | bytes | Any) -> Path:
    """Write ``data`` (text, bytes, or a callable that writes the file it is given) to ``path``
    through a temporary file beside it, flushed to disk and renamed over it: a reader, or a rerun
    after a crash or a Ctrl-C, sees the old file or the new one, never half of one. A symbolic link
    at ``path`` is written through (its target replaced); an existing file keeps its permissions. A
    device or FIFO at ``path`` (``/dev/null``, a named pipe) is written in place: renaming over it
    would replace the node with a regular file. One of this process's descriptors (``/dev/stdout``)
    is written through a duplicate that shares its position.
    The temporary name carries the pid, so two processes writing one path do not write into one
    temporary file. A failure removes the temporary file and is a :class:`TellerIOError` naming
    ``path``."""
    p = Path(path)
    target, own, alias = resolve_output(p)
    if own is not None:
        # one of our own descriptors (`/dev/stdout`): written through a duplicate sharing its position,
        # after what Python has buffered for it, so that what is printed next follows
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                f.flush()
        return _write_in_place(p, data, os.dup(own))
    try:
        mode = os.stat(p).st_mode
    except OSError:
        mode = stat.S_IFREG  # (none yet, or unreadable: the usual path says why)
    if not stat.S_ISDIR(mode) and (not stat.S_ISREG(mode) or alias):
        # a device or pipe (renaming over it would replace the node), or another process's descriptor
        return _write_in_place(p, data, None)
    # (pid and thread: two threads of one process may write the same file at once)
    who = f"{os.getpid()}-{threading.get_ident():x}"
    name = f".{target.name}.{who}.tmp"
    if len(name.encode()) > 255:  # (a long name plus the suffix: a name the filesystem still takes)
        name = f".teller-{who}-{abs(hash(target.name)):x}.tmp"
    tmp = target.with_name(name)
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            tmp.write_bytes(data)
        else:
            data(tmp)
        with contextlib.suppress(OSError):  # (the old file's mode, where there is one)
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            why = e.strerror or str(e)
            if isinstance(e, PermissionError) and e.filename is not None and Path(e.filename) == tmp:
                why = f"its directory {tmp.parent} is not writable"  # (not the hidden temporary name)
            raise TellerIOError(f"{p}: cannot write it ({why})", path=str(p), errno=e.errno) from None
        raise
    return p


def claim_run_dir(parent: str | os.PathLike[str], stem: str) -> Path:
    """A new directory ``parent/stem`` (``stem-1``, ``stem-2``, ... where taken), claimed by
    creating it: ``mkdir`` fails on a name that exists, so two processes picking one name at once
    (two runs finishing in the same second) get two directories. ``parent`` is created if needed.
    A failure is a :class:`TellerIOError` naming the path."""
    make_output_dir(parent)
    out, k = Path(parent) / stem, 1
    while True:
        try:
            out.mkdir()
            return out
        except FileExistsError:
            out, k = Path(parent) / f"{stem}-{k}", k + 1
        except OSError as e:
            raise TellerIOError(
                f"{out}: cannot create it ({e.strerror or e})", path=str(out), errno=e.errno
            ) from None


# the lock file of an output directory a teller command is writing (see dir_lock)
LOCK_FILE = ".teller.lock"


def _holder(fd: int) -> str:
    """Who holds the lock whose file is open as ``fd``, as recorded in it: ``pid 1234 on host,
    'teller tokenize', since 2026-12-06T10:00:00Z``; empty where it records nothing readable (a
    holder that has not written it yet)."""
    try:
        rec = json.loads(os.pread(fd, 1 << 16, 0) or b"null")
    except (OSError, ValueError):
        return ""
    if not isinstance(rec, dict):
        return ""
    parts = []
    if rec.get("pid") is not None:
        parts.append(f"pid {rec['pid']}" + (f" on {rec['host']}" if rec.get("host") else ""))
    if rec.get("command"):
        parts.append(repr(str(rec["command"])))
    if rec.get("since"):
        parts.append(f"since {rec['since']}")
    return ", ".join(parts)


def lock_holder(directory: str | os.PathLike[str]) -> str | None:
    """Who holds ``directory``'s lock (:func:`dir_lock`) now, as :func:`_holder` says it (``""``
    where it recorded nothing yet), or None where no one does. Takes nothing and creates nothing: a
    reader's check (``teller evaluate`` of a run ``teller train`` is still writing)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(Path(directory) / LOCK_FILE, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None  # (no lock file: no holder)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # (releases the probe's shared lock, where it got one)
    return None


def _missing_dirs(d: str | os.PathLike[str]) -> list[Path]:
    """The directories up to ``d`` that do not exist yet, deepest first (absolute: a ``with`` block
    may change the working directory)."""
    out = []
    q = Path(os.path.abspath(d))
    while not q.exists() and q.parent != q:
        out.append(q)
        q = q.parent
    return out


def _remove_empty(dirs: list[Path]) -> None:
    """Remove ``dirs`` (deepest first) while they are empty: what was written in them is kept."""
    for c in dirs:
        try:
            c.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def dir_lock(
    directory: str | os.PathLike[str],
    command: str,
    *,
    transient: bool = False,
    what: str = "output directory",
) -> Iterator[Path]:
    """Hold ``directory`` for one writer (``command``, e.g. ``"teller tokenize"``) for the ``with``
    block: an exclusive ``flock`` on ``directory/.teller.lock``, which records the holder (pid, host,
    command, start time). The directory is created if needed (a failure is a :class:`TellerIOError`
    naming it and ``what`` it is). Another process holding it is a :class:`DirectoryLockedError`
    naming the directory and the holder, at once (no waiting). The kernel releases a flock when its
    process dies, so the file a killed process left behind blocks nothing.

    The lock file is removed on release (while still locked), so a directory holds it only while it is
    being written; a process that opened it before then and locks it afterwards sees that the path no
    longer names the file it locked and starts again, so two writers never hold two files of one
    name. ``transient``: the directories this call created are removed again on release if nothing
    else was written in them (a command that writes nothing until late, refused or interrupted before
    then, leaves no empty directory behind). Yields the directory.

    (Where the platform has no ``fcntl``, Windows, this is a no-op that creates nothing: concurrent
    writers there are not detected. A filesystem that refuses locks, some network ones, likewise.)"""
    d = Path(directory)
    if fcntl is None:
        # (no lock: the directory is still made, as the callers count on, and left like a lock's would
        # be: removed again on release where it was created here and nothing was written in it)
        made = _missing_dirs(d)
        make_output_dir(d, what)
        try:
            yield d
        finally:
            if transient:
                _remove_empty(made)
        return
    # (absolute: the block may change the working directory meanwhile)
    created = _missing_dirs(d)
    path = Path(os.path.abspath(d)) / LOCK_FILE
    fd = -1
    for _ in range(100):  # (each retry follows a release by another process: a few at most)
        make_output_dir(d, what)
        # (O_NOFOLLOW: a symlink planted at the lock file's name is refused, not written through)
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        try:
            try:
                # (O_NONBLOCK: a FIFO planted there must not hang the open; the file check follows)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | nofollow | os.O_NONBLOCK, 0o666)
            except (
                PermissionError
            ) as denied:  # (another user's lock file: a read-only descriptor locks it too)
                try:
                    fd = os.open(path, os.O_RDONLY | nofollow | os.O_NONBLOCK)
                except FileNotFoundError:  # (none to read: the directory is not ours to write)
                    raise denied from None
        except FileNotFoundError:  # (the directory removed meanwhile by a transient holder: again)
            continue
        except OSError as e:
            raise TellerIOError(
                f"{d / LOCK_FILE}: cannot open the lock file of the {what}: {e.strerror or e}"
                + (" (a symbolic link, not teller's lock file)" if path.is_symlink() else ""),
                path=str(d / LOCK_FILE),
                errno=e.errno,
            ) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise TellerIOError(
                f"{d / LOCK_FILE}: not a regular file (teller's lock file of the {what} is); remove it",
                path=str(d / LOCK_FILE),
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fd)
            os.close(fd)
            raise DirectoryLockedError(
                f"{d}: another teller process is writing it{f' ({who})' if who else ''}; "
                "wait for it to finish or choose another directory",
                path=str(d),
            ) from None
        except OSError:  # (no locks on this filesystem: unlocked, as without fcntl)
            os.close(fd)
            fd = -1
            with contextlib.suppress(OSError):
                path.unlink()
            break
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)  # (removed, or replaced, by its holder's release before this lock: again)
        fd = -1
    else:
        raise TellerIOError(f"{d / LOCK_FILE}: cannot take the lock of the {what}", path=str(d / LOCK_FILE))
    try:
        if fd >= 0:
            rec = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": command,
                "argv": sys.argv,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            with contextlib.suppress(OSError):  # (only what the error of a second writer shows)
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(rec) + "\n").encode(), 0)
        yield d
    finally:
        if fd >= 0:
            with contextlib.suppress(OSError):
                path.unlink()  # (while still locked: see above)
        if transient:
            _remove_empty(created)
        if fd >= 0:
            os.close(fd)  # (releases the lock)


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
        raise TellerIOError(f"{o}: a directory ({option} names a file)", path=str(o), errno=errno.EISDIR)
    # (the files the loader read, not everything under an input directory: a run directory's own
    # earlier output, say RUN/merged.json.gz, is not an input of RUN)
    if o.exists() and any(Path(i).is_file() and os.path.samefile(i, o) for i in inputs):
        raise ConfigError(f"{o}: is one of the inputs; write {option} elsewhere", path=str(o))


# ECMA-48 escape sequences a terminal interprets and does not show: CSI (colours, cursor moves:
# ``ESC [ ... m``), OSC (titles, hyperlinks: ``ESC ] ... BEL`` or ``ESC ] ... ESC \``), and the
# two- and three-byte ones (``ESC ( B``, ``ESC 7``). The CSI and OSC forms come first: their second
# byte would also end the short form.
_ESCAPE_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])?")


def strip_escapes(line: str) -> str:
    """``line`` without the terminal escape sequences in it (colours, cursor moves, titles, links)."""
    return _ESCAPE_RE.sub("", line) if "\x1b" in line else line


def terminal_text(line: str) -> str:
    """What a terminal shows of one output line: escape sequences removed, and of a line redrawn with
    ``\\r`` (a progress bar) its last state (the last non-empty part)."""
    line = strip_escapes(line)
    if "\r" in line:
        parts = [p for p in line.split("\r") if p]
        line = parts[-1] if parts else ""
    return line
