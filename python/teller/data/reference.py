"""A per-deployment reference of kernel times: how long each kernel takes on *this* GPU, model and
tensor-parallel size at a given load, fitted on training captures.

Every other summary column compares a symbol with the same capture (its opening window, or the
rest of the capture after a fit on the step's load). A fault that covers most of a short capture,
or one that coincides with the load (prefill steps inside the fault, decode steps after it), is
absorbed by that fit: an all-reduce 2.5x slower in the two prefill steps of a capture whose other
steps decode reads as "prefill all-reduces are slower". A kernel's time on the same deployment is
reproducible to a few percent (the simulator's kernels have no per-sample speed factor; real GPUs
at nominal clocks vary by a few percent), so the deployment's own history is a reference that the
capture does not have to contain.

* **Deployment key**: the GPU name(s) the trace's ``deviceProperties`` list (Kineto's, and the
  simulator's since generator version 2), and the model and tensor-parallel size from vLLM's
  ``args: Namespace(model='...', tensor_parallel_size=N, ...)`` / engine-config log line. No key
  (no device properties, no model in the log): no reference, the columns read "unknown".
* **Reference**: per key, per kernel symbol (its normalized name) and position (the occurrence
  index within its process's step, as the per-position fit of :mod:`teller.data.summary`), a
  least-squares fit of x = ln(1 + duration in us) on the step's load w (a quadratic with >= 5
  distinct loads and >= 8 events, a line with >= 2 and >= 3, else the median), over the training
  split's events outside every labelled fault window. Stored as JSON next to the shards
  (``reference.json``); a query's load is clipped to the fitted range.
* **Residual** of an event: x - fit(w), NaN where the key, symbol or position has no fit.

Measured before building it (a probe on ``default``, docs/models.md "Latest round"): the GBDT with
reference columns keyed by an oracle deployment went from 0.860 to 0.890 test category accuracy.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from teller.errors import ConfigError, TellerFileNotFoundError

REF_FORMAT = "teller-kernel-reference"
REF_VERSION = 1
FILE_NAME = "reference.json"

_MODEL = re.compile(r"\bmodel='([^'\n]+)'")
_TP = re.compile(r"\btensor_parallel_size=(\d+)")


def deployment_key(tr: Any, log_text: str | None) -> str | None:
    """``"<GPU name(s)>|<model>|tp<N>"`` for a trace and its log text, or None when either the GPUs
    (``tr.device_properties``) or the model (the log) are unknown. TP defaults to 1 when the log
    names the model but not the size."""
    names = sorted({str(d["name"]) for d in tr.device_properties if d.get("name")})
    if not names or not log_text:
        return None
    m = _MODEL.search(log_text)
    if not m:
        return None
    t = _TP.search(log_text)
    return f"{'+'.join(names)}|{m.group(1)}|tp{int(t.group(1)) if t else 1}"


def kernel_points(
    tr: Any, w: np.ndarray | None = None
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """The kernel events of ``tr``: ``(event index, "symbol\\tposition" per event, load w, x)``.
    The position counts a symbol's events within its (process, step) in time order (the 2nd GEMM of
    a step is another shape than the 1st); ``*`` outside every step and in traces with fewer than
    two steps; ``w`` is :func:`teller.data.summary.step_work` (computed when not given)."""
    from teller.data.summary import step_work

    idx = np.flatnonzero(tr.layer_mask("kernel"))
    if w is None:
        w = step_work(tr)
    if len(idx) == 0:
        return idx, [], np.zeros(0), np.zeros(0)
    sym = np.asarray(tr.symbol, dtype=np.int64)[idx]
    pid = np.asarray(tr.pid, dtype=np.int64)[idx]
    step = np.asarray(tr.step, dtype=np.int64)[idx]
    ts = np.asarray(tr.ts, dtype=np.int64)[idx]
    o = np.lexsort((ts, step, pid, sym))
    s, p, st = sym[o], pid[o], step[o]
    new = np.r_[True, (s[1:] != s[:-1]) | (p[1:] != p[:-1]) | (st[1:] != st[:-1])]
    start = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
    pos = np.empty(len(o), np.int64)
    pos[o] = np.arange(len(o)) - start
    # outside every step, or in a trace with fewer than 2 step ranges (a capture without step
    # annotations is one step): no position, one pooled fit per kernel ("*"), as the summary's
    # per-position fit falls back to a pooled line there
    if len(np.unique(step[step >= 0])) < 2:
        pos[:] = -1
    pos[step < 0] = -1
    names = tr.symbols
    keys = [f"{names[a]}\t{b if b >= 0 else '*'}" for a, b in zip(sym.tolist(), pos.tolist(), strict=True)]
    dur = np.asarray(tr.dur, dtype=np.float64)[idx]
    x = np.log1p(np.maximum(dur, 0.0) / 1000.0)
    return idx, keys, np.asarray(w, np.float64)[idx], x


def _fit(w: np.ndarray, x: np.ndarray) -> list[float]:
    """``[c2, c1, c0, w_lo, w_hi, n]``: the fit of x on w (see the module docstring)."""
    nd = len(np.unique(np.round(w, 2)))
    if nd >= 5 and len(w) >= 8:
        c = np.polyfit(w, x, 2)
    elif nd >= 2 and len(w) >= 3:
        c = np.r_[0.0, np.polyfit(w, x, 1)]
    else:
        c = np.array([0.0, 0.0, float(np.median(x))])
    return [float(c[0]), float(c[1]), float(c[2]), float(w.min()), float(w.max()), int(len(w))]


class KernelReference:
    """Fitted per (deployment key, ``symbol\\tposition``); see the module docstring."""

    def __init__(self, table: dict[str, dict[str, list[float]]] | None = None) -> None:
        self.table: dict[str, dict[str, list[float]]] = table or {}

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

    @classmethod
    def fit(
        cls, points: Iterable[tuple[str | None, list[str], np.ndarray, np.ndarray]], min_events: int = 3
    ) -> KernelReference:
        """From ``(key, point keys, w, x)`` per training capture (events inside fault windows
        already left out); a (key, symbol, position) needs ``min_events`` events."""
        acc: dict[str, dict[str, tuple[list[np.ndarray], list[np.ndarray]]]] = {}
        for key, pk, w, x in points:
            if key is None or not len(pk):
                continue
            arr = np.asarray(pk)
            order = np.argsort(arr, kind="stable")
            a = arr[order]
            bounds = np.flatnonzero(a[1:] != a[:-1]) + 1
            d = acc.setdefault(key, {})
            for g in np.split(order, bounds):
                ww, xx = d.setdefault(str(arr[g[0]]), ([], []))
                ww.append(np.asarray(w)[g])
                xx.append(np.asarray(x)[g])
        table: dict[str, dict[str, list[float]]] = {}
        for key in sorted(acc):
            rows = {}
            for pk in sorted(acc[key]):
                ww = np.concatenate(acc[key][pk][0])
                xx = np.concatenate(acc[key][pk][1])
                if len(ww) >= min_events:
                    rows[pk] = _fit(ww, xx)
            if rows:
                table[key] = rows
        return cls(table)

    def residuals(self, key: str | None, pk: list[str], w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """x - fit(w) per point (w clipped to the fitted range); NaN where nothing was fitted."""
        out = np.full(len(pk), np.nan)
        rows = self.table.get(key) if key is not None else None
        if not rows:
            return out
        for i, k in enumerate(pk):
            f = rows.get(k)
            if f is not None:
                c2, c1, c0, lo, hi, _n = f
                u = min(max(float(w[i]), lo), hi)
                out[i] = float(x[i]) - (c2 * u * u + c1 * u + c0)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": REF_FORMAT, "version": REF_VERSION, "table": self.table}

    @classmethod
    def from_dict(cls, d: Any, *, path: str = "<dict>") -> KernelReference:
        if not isinstance(d, dict) or d.get("format") != REF_FORMAT:
            raise ConfigError(f"{path}: not a teller kernel reference (format {REF_FORMAT!r})", path=path)
        if d.get("version") != REF_VERSION:
            raise ConfigError(
                f"{path}: kernel reference version {d.get('version')!r}, expected {REF_VERSION}", path=path
            )
        table = d.get("table")
        if not isinstance(table, dict) or not all(
            isinstance(v, dict) and all(isinstance(r, list) and len(r) == 6 for r in v.values())
            for v in table.values()
        ):
            raise ConfigError(f"{path}: malformed kernel reference table", path=path)
        return cls(table)

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), sort_keys=True) + "\n")
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KernelReference:
        p = Path(path)
        if not p.is_file():
            raise TellerFileNotFoundError(f"{p}: no kernel reference", path=str(p))
        try:
            d = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not JSON ({e})", path=str(p)) from None
        return cls.from_dict(d, path=str(p))


def outside_faults(tr: Any, idx: np.ndarray, ann: dict[str, Any]) -> np.ndarray:
    """Mask over the events ``idx`` of ``tr``: True where the event overlaps no labelled fault
    window of the annotation (``faults[].start_ns`` / ``end_ns``); a fault without a window
    excludes every event."""
    ts = np.asarray(tr.ts, dtype=np.int64)[idx]
    end = ts + np.maximum(np.asarray(tr.dur, dtype=np.int64)[idx], 0)
    keep = np.ones(len(idx), bool)
    for f in ann.get("faults") or []:
        s, e = f.get("start_ns"), f.get("end_ns")
        if not isinstance(s, int) or not isinstance(e, int):
            keep[:] = False
            break
        keep &= (end < s) | (ts > e)
    return keep


def event_residuals(
    tr: Any, ref: KernelReference | None, key: str | None, w: np.ndarray | None = None
) -> np.ndarray | None:
    """Per trace event, its residual against ``ref`` (NaN for non-kernel events and kernels without
    a fit); None when there is no reference or no key."""
    if ref is None or key is None or key not in ref.table:
        return None
    idx, pk, ww, x = kernel_points(tr, w)
    out = np.full(len(tr), np.nan)
    out[idx] = ref.residuals(key, pk, ww, x)
    return out
