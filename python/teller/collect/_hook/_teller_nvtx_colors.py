"""Colours of ``--nvtx-json`` groups: read by the hook in the program and checked by teller before
the program starts (one table for both)."""

from __future__ import annotations

# NVTX's colour names (the nvtx package's own; it takes other names only through matplotlib, where
# the program has it): a colour is turned into ARGB here, so it means the same in every program
COLORS = {
    "green": 0x008000,
    "blue": 0x0000FF,
    "yellow": 0xFFFF00,
    "purple": 0x800080,
    "rapids": 0x7400FF,
    "cyan": 0x00FFFF,
    "red": 0xFF0000,
    "white": 0xFFFFFF,
    "darkgreen": 0x006400,
    "orange": 0xFFA500,
}


def color_argb(color: str | None) -> int | None:
    """A colour name of :data:`COLORS` (any case) or ``#RRGGBB``, as opaque ARGB; None for None;
    ValueError otherwise."""
    if color is None:
        return None
    if color.lower() in COLORS:
        return 0xFF000000 | COLORS[color.lower()]
    if len(color) == 7 and color[0] == "#" and all(c in "0123456789abcdefABCDEF" for c in color[1:]):
        return 0xFF000000 | int(color[1:], 16)
    raise ValueError(f"unknown colour {color!r} (known: {', '.join(COLORS)}, or #RRGGBB)")
