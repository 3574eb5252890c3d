"""Type checks of a configuration section (``model:``, ``train:``) against its dataclass: a value of
the wrong type is a :class:`ConfigError` naming the key, not a ``TypeError`` deep in training."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import fields
from typing import Any

from teller.errors import ConfigError


def _conforms(t: Any, v: Any) -> tuple[bool, Any]:
    """Whether ``v`` is a ``t``, and the value to keep (a float field's int or numeric string as a
    float: PyYAML reads ``1e-3``, without a dot, as a string; a float is finite)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        if v is None:
            return type(None) in args, v
        for a in args:
            if a is not type(None):
                ok, c = _conforms(a, v)
                if ok:
                    return True, c
        return False, v
    if t is bool:
        return isinstance(v, bool), v
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    if t is float:
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                return False, v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False, v
        return True, float(v)
    if t is str:
        return isinstance(v, str), v
    if origin is list:
        return isinstance(v, list) and all(_conforms(args[0], x)[0] for x in v), v
    return True, v  # (a type this check does not know: left to the dataclass)


def _name(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _name(a) for a in args)
    if origin is list:
        return f"a list of {_name(args[0]).removeprefix('a ').removeprefix('an ')}s"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(t, str(t))


def typed_config(cls: type, d: dict[str, Any], section: str) -> dict[str, Any]:
    """``d`` checked against the dataclass ``cls``: unknown keys and values of the wrong type are a
    ConfigError naming ``section.key``; a float field's int (or numeric string) becomes a float."""
    known = {f.name for f in fields(cls)}
    bad = sorted(set(d) - known)
    if bad:
        raise ConfigError(f"{section}: unknown key(s) {', '.join(bad)}")
    hints = typing.get_type_hints(cls)
    out = {}
    for k, v in d.items():
        ok, kept = _conforms(hints[k], v)
        if not ok:
            raise ConfigError(f"{section}.{k}: {v!r} is not {_name(hints[k])}")
        out[k] = kept
    return out
