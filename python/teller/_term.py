"""Terminal tables that never cut a number: drawn where every value fits whole, else listed one entry
at a time as ``name=value`` fields (``teller diagnose`` and ``teller trace summary``). Kept free of
torch so the trace commands stay light."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

# the narrowest the first column (a symbol) is folded to before a table gives way to a list
MIN_NAME = 20


def table_or_list(
    console: Any,
    title: str,
    cols: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    min_name: int = MIN_NAME,
    numbered: bool = False,
    fold: int = 0,
    right: bool = False,
    fields: Sequence[str] | None = None,
    title_justify: str = "center",
    name_prefix: str = "",
) -> None:
    """``rows`` as a table whose column ``fold`` (a name) folds, where the console is wide enough
    for every other cell and header whole and ``min_name`` columns for the name; else one entry per
    row, numbered, the first column first and the others after it as ``name=value`` fields. A table
    squeezed further cuts or folds numbers ("10388,1…" reads as another pid; a header cut to
    "ranks/pi"), so it never is. ``numbered``: the table has a "#" column first. Cells are text, not
    rich markup or emoji codes (a kernel "f[abc]", an op "x:fire:y" as written). A header may span
    lines ("comm\noverlap"): its longest line counts. ``right``: every column but the first is
    right-justified (numbers). ``fields``: the list form's field names, one per column after the
    first (default: the headers, spaces as "_"); ``name_prefix``: put before each name there (where
    the header no longer says what the name is: "GPU ")."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    def need(j: int) -> int:
        # (a column that does not fold does not wrap its header either: the whole header counts)
        # (display cells, not characters: a wide character takes two)
        return max(cell_len(x) for x in [*cols[j].split("\n"), *(r[j] for r in rows)])

    # rich draws a table as: a border, then per column 1 + width + 1 and a border (a name shorter
    # than min_name needs only its own width)
    width = 1 + sum(need(j) + 3 for j in range(len(cols)) if j != fold) + min(min_name, need(fold)) + 3
    width += (len(str(len(rows))) + 3) * numbered
    if console.width >= width:
        t = Table(title=Text(title), title_justify=title_justify)  # type: ignore[arg-type]
        if numbered:
            t.add_column("#", no_wrap=True)
        for j, c in enumerate(cols):
            t.add_column(
                Text(c), overflow="fold", no_wrap=j != fold, justify="right" if right and j else "left"
            )
        for i, r in enumerate(rows, 1):
            t.add_row(*((str(i),) if numbered else ()), *map(Text, r))
        console.print(t)
        return

    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False, emoji=False, soft_wrap=True)

    # (prose: wrapped between words where longer than the line, never inside one: a path stays whole)
    for part in textwrap.wrap(f"{title}:", console.width, break_long_words=False, break_on_hyphens=False):
        say(part)
    room = max(20, console.width - 5)
    for i, r in enumerate(rows, 1):
        # the name on its own line (one longer than the line is left to the terminal to wrap), then
        # whole name=value fields, as many to a line as fit: a line breaks between two fields, never
        # inside one
        say(f"  {i}. {name_prefix}{r[0]}")
        line = ""
        names = fields if fields is not None else [c.replace(" ", "_") for c in cols[1:]]
        for c, v in zip(names, r[1:], strict=True):
            field = f"{c}={v}"
            if line and len(line) + 2 + len(field) > room:
                say("     " + line)
                line = ""
            if not line and len(field) > room:
                # a list longer than the line (eight pids) breaks after a comma, never in a number
                *full, line = break_after_commas(field, room)
                for part in full:
                    say("     " + part)
                continue
            line = f"{line}  {field}" if line else field
        if line:
            say("     " + line)


def break_after_commas(text: str, room: int) -> list[str]:
    """``text`` in lines of at most ``room`` characters, broken only after a "," or ";" (a piece
    longer than that stays whole); continuation lines are indented by two spaces."""
    import re

    lines: list[str] = []
    line = ""
    for piece in re.split(r"(?<=[,;])", text):
        if line and len(line) + len(piece) > room:
            lines.append(line.rstrip())
            line = "  " + piece.lstrip()
        else:
            line += piece
    return [*lines, line]
