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
  ``args: Namespace(model='...', tensor_parallel_size=N, ...)`` (``non-default args: {'model': ...}``
  since vLLM 0.10) / engine-config log line, with a
  non-default weight dtype, quantization method and KV-cache dtype from the same lines
  (:func:`deployment_key`). No key (no device properties, no model in the log): no reference, the
  columns read "unknown".
* **Reference**: per key, per kernel symbol (its normalized name) and position (the occurrence
  index within its process's step, as the per-position fit of :mod:`teller.data.summary`), a
  function of the step's load that predicts x = ln(1 + duration in us), fitted over the training
  split's events outside every labelled fault window. The load is two numbers of the step's
  range: w = ln(1 + ``num_tokens``) (what a GEMM scales with) and s = ln(1 + ``num_seqs``) (what
  the sampling kernels scale with). Each row is one of two forms, whichever predicts the held-out
  half of the row's training captures better (median absolute error; a deployment's captures
  alternate between two halves in the order given; a tie goes to the table; fewer than 6 events
  or one capture: the quadratic):

  - ``table``: along one axis (w or s: the one whose 0.1-wide cells leave the smaller spread of x
    within a cell), knots at each cell's mean load and the median x of the cell, linearly
    interpolated, clipped at the ends. A roofline has a kink where a kernel turns compute-bound,
    and the GEMM tile a normalized name stands for changes with the batch; a table follows both.
  - ``quad``: a least-squares quadratic in (w, s) with the cross term where the (w, s) pairs are
    not one curve (>= 8 distinct pairs, more than distinct w, >= 12 events); else a quadratic in w
    (>= 5 distinct loads, >= 8 events), a line in w (>= 2, >= 3), or the median; the loads
    clipped to the fitted ranges. Smoother where the cells are sparse or x depends on what the
    step does not record (attention on the context length).

  Measured on ``default`` (normal val/test/test_ood captures, median |residual|): version 1's
  quadratic in w alone read 0.048 / 0.047 (A100 / H100 GEMMs), 0.153 (softmax), 0.112 (sampling
  reduce), 0.36 (FlashAttention, sm90); this form 0.042 / 0.038, 0.034, 0.035, 0.30; a mild power
  cap's GEMMs stopped reading -0.1 outside the fault's window (docs/models-history.md, the shards-v10
  round). Stored as JSON next to the shards (``reference.json``); version 1 files (a quadratic in
  w per row) still read.
* **Residual** of an event: x - fit(w, s), NaN where the key, symbol or position has no fit.

Measured before building it (a probe on ``default``, docs/models-history.md, the shards-v8 round): the
GBDT with reference columns keyed by an oracle deployment went from 0.860 to 0.890 test category accuracy.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from teller.errors import ConfigError, TellerFileNotFoundError

REF_FORMAT = "teller-kernel-reference"
REF_VERSION = 2
# 1: a quadratic in w per row ([c2, c1, c0, w_lo, w_hi, n]); 2: a table or a quadratic in (w, s)
# per row, chosen out of fold (rows are dicts). Both read.
READ_VERSIONS = (1, 2)
FILE_NAME = "reference.json"
CELL = 0.1  # width of a table's cells in ln(1 + load): 10 % more tokens or sequences

# ``model='x'`` (the engine-config line, V0's ``args: Namespace(...)``) or ``'model': 'x'`` (0.10's
# ``non-default args: {...}``)
_MODEL = re.compile(r"(?:\bmodel=|'model': )'([^'\n]+)'")
_TP = re.compile(r"(?:\btensor_parallel_size=|'tensor_parallel_size': )(\d+)")
# what else changes a kernel's time on the same GPUs, model and TP size, as vLLM's args line
# (``dtype='half'``, ``quantization='fp8'``) or engine-config line (``dtype=torch.float16``,
# ``quantization=fp8``, ``kv_cache_dtype=fp8_e5m2``) names it; keyed only when not the default
# (bf16 weights, no quantization, the KV cache in the model's dtype), so the keys of the common
# case, and every reference fitted before these parts, stay as they were
_EXTRA = (
    ("dtype", re.compile(r"(?:\bdtype=|'dtype': )(?:torch\.)?'?([A-Za-z0-9_]+)"), {"auto", "bfloat16"}),
    ("q", re.compile(r"(?:\bquantization=|'quantization': )'?([A-Za-z0-9_\-]+)"), {"none", "null"}),
    ("kv", re.compile(r"(?:\bkv_cache_dtype=|'kv_cache_dtype': )'?([A-Za-z0-9_]+)"), {"auto"}),
)
# the spellings vLLM accepts for one thing, as the key writes it (``--dtype half`` and the resolved
# ``torch.float16`` are one deployment; ``--kv-cache-dtype fp8`` is e4m3 on CUDA)
_ALIAS = {
    "dtype": {
        "half": "float16",
        "fp16": "float16",
        "float": "float32",
        "fp32": "float32",
        "bf16": "bfloat16",
    },
    "kv": {"fp8": "fp8_e4m3"},
}


def deployment_key(tr: Any, log_text: str | None) -> str | None:
    """``"<GPU name(s)>|<model>|tp<N>"`` for a trace and its log text, or None when either the GPUs
    (``tr.device_properties``) or the model (the log) are unknown. TP defaults to 1 when the log
    names the model but not the size. A weight dtype other than bf16, a quantization method or a
    KV-cache dtype other than the model's, where the log names one, is appended
    (``|dtype=float16``, ``|q=fp8``, ``|kv=fp8_e5m2``; aliases such as ``half`` written as one
    name): a reference fitted on bf16 weights says nothing of an fp8 model's kernels. Read from
    the lines that name the (first) model, the args and engine-config lines; the last of them that
    names a part counts."""
    names = sorted({str(d["name"]) for d in tr.device_properties if d.get("name")})
    if not names or not log_text:
        return None
    m = _MODEL.search(log_text)
    if not m:
        return None
    model = m.group(1)
    # only the configuration lines of that model's (first) start count: another line can name a
    # dtype (a fused-MoE config file ``...,dtype=fp8_w8a8.json``), a restart another configuration
    conf = [ln for ln in log_text.splitlines() if (c := _MODEL.search(ln)) and c.group(1) == model]
    t = next((t for ln in conf if (t := _TP.search(ln))), None)
    key = f"{'+'.join(names)}|{model}|tp{int(t.group(1)) if t else 1}"
    for tag, rx, default in _EXTRA:
        # the engine-config line (resolved: dtype=torch.float16) comes after the args line
        # (dtype='auto'): the last of these lines that names it counts
        vals = [v for ln in conf for v in rx.findall(ln)]
        if vals:
            v = vals[-1].lower() if tag == "q" else vals[-1]
            v = _ALIAS.get(tag, {}).get(v, v)
            if v not in default:
                key += f"|{tag}={v}"
    return key


def base_key(key: str) -> str:
    """The key without its dtype / quantization / KV-cache parts: what a version-1 reference (fitted
    before they were keyed) calls the deployment."""
    return key.split("|dtype=")[0].split("|q=")[0].split("|kv=")[0]


def kernel_points(
    tr: Any, w: np.ndarray | None = None, s: np.ndarray | None = None
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The kernel events of ``tr``: ``(event index, "symbol\\tposition" per event, w, s, x)``.
    The position counts a symbol's events within its (process, step) in time order (the 2nd GEMM of
    a step is another shape than the 1st); ``*`` outside every step and in traces with fewer than
    two steps; ``w`` is :func:`teller.data.summary.step_work` and ``s``
    :func:`teller.data.summary.step_seqs` (computed when not given)."""
    from teller.data.summary import step_seqs, step_work

    idx = np.flatnonzero(tr.layer_mask("kernel"))
    if w is None:
        w = step_work(tr)
    if s is None:
        s = step_seqs(tr)
    if len(idx) == 0:
        return idx, [], np.zeros(0), np.zeros(0), np.zeros(0)
    sym = np.asarray(tr.symbol, dtype=np.int64)[idx]
    pid = np.asarray(tr.pid, dtype=np.int64)[idx]
    step = np.asarray(tr.step, dtype=np.int64)[idx]
    ts = np.asarray(tr.ts, dtype=np.int64)[idx]
    o = np.lexsort((ts, step, pid, sym))
    sy, p, st = sym[o], pid[o], step[o]
    new = np.r_[True, (sy[1:] != sy[:-1]) | (p[1:] != p[:-1]) | (st[1:] != st[:-1])]
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
    return idx, keys, np.asarray(w, np.float64)[idx], np.asarray(s, np.float64)[idx], x


def _r(v: float) -> float:
    return round(float(v), 6)


def _fit_quad(w: np.ndarray, s: np.ndarray, x: np.ndarray) -> dict[str, Any]:
    """The ``quad`` row: coefficients of [1, w, w^2, s, s^2, w*s] (zeros where a term is left out,
    see the module docstring) and the fitted ranges."""
    nd = len(np.unique(np.round(w, 2)))
    nd2 = len(np.unique(np.round(np.c_[w, s], 2), axis=0))
    cols = [0, 1, 2, 3, 4, 5] if nd2 >= 8 and len(w) >= 12 and nd2 > nd else []
    if not cols:
        cols = [0, 1, 2] if nd >= 5 and len(w) >= 8 else [0, 1] if nd >= 2 and len(w) >= 3 else []
    coef = np.zeros(6)
    if cols:
        c, *_ = np.linalg.lstsq(_design(w, s)[:, cols], x, rcond=None)
        coef[cols] = c
    else:
        coef[0] = float(np.median(x))
    return {
        "kind": "quad",
        "coef": [_r(c) for c in coef],
        "w": [_r(w.min()), _r(w.max())],
        "s": [_r(s.min()), _r(s.max())],
        "n": len(w),
    }


def _design(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(w), w, w * w, s, s * s, w * s], 1)


def _cells(v: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Knots (each CELL-wide cell's mean load), the cell's median x, and the spread of x within
    the cells (median |x - its cell's median| over cells with >= 2 events; inf without any)."""
    c = np.floor(v / CELL + 0.5).astype(np.int64)
    o = np.lexsort((x, c))  # by cell, x sorted within
    c, vv, xx = c[o], v[o], x[o]
    bounds = np.flatnonzero(c[1:] != c[:-1]) + 1
    starts = np.r_[0, bounds]
    cnt = np.diff(np.r_[starts, len(c)])
    knots = np.add.reduceat(vv, starts) / cnt
    lo, hi = starts + (cnt - 1) // 2, starts + cnt // 2  # the median of a sorted cell
    med = 0.5 * (xx[lo] + xx[hi])
    many = np.repeat(cnt >= 2, cnt)
    spread = float(np.median(np.abs(xx - np.repeat(med, cnt))[many])) if many.any() else float("inf")
    return knots, med, spread


def _fit_table(w: np.ndarray, s: np.ndarray, x: np.ndarray) -> dict[str, Any]:
    """The ``table`` row along the axis that leaves the smaller spread within its cells (w on a
    tie)."""
    kw, mw, sw = _cells(w, x)
    ks, ms, ss = _cells(s, x)
    axis, k, m = ("w", kw, mw) if sw <= ss else ("s", ks, ms)
    # knots are stored rounded; two cell means closer than that (only with non-integer loads)
    # become one knot with the mean of their values, so that the file reads back
    kr = np.round(k, 6)
    u, inv = np.unique(kr, return_inverse=True)
    mv = np.bincount(inv, weights=m) / np.bincount(inv)
    return {
        "kind": "table",
        "axis": axis,
        "knots": [_r(v) for v in u],
        "values": [_r(v) for v in mv],
        "n": len(w),
    }


def _predict(row: Any, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """A row's prediction of x at loads (w, s); a version-1 row (a list) reads w only."""
    if isinstance(row, list):  # version 1: [c2, c1, c0, w_lo, w_hi, n]
        c2, c1, c0, lo, hi, _n = row
        u = np.clip(w, lo, hi)
        return c2 * u * u + c1 * u + c0
    if row["kind"] == "table":
        return np.interp(w if row["axis"] == "w" else s, row["knots"], row["values"])
    (wl, wh), (sl, sh) = row["w"], row["s"]
    return _design(np.clip(w, wl, wh), np.clip(s, sl, sh)) @ np.asarray(row["coef"])


def _fit(w: np.ndarray, s: np.ndarray, x: np.ndarray, half: np.ndarray) -> dict[str, Any]:
    """One row: the form (``table`` or ``quad``) with the smaller median absolute error on the
    held-out half, fitted on the other (``half``: 0/1 per event, by capture; a tie goes to the
    table); ``quad`` when the events come from one half only (nothing to hold out) or are fewer
    than 6."""
    forms = (_fit_table, _fit_quad)
    if len(np.unique(half)) < 2 or len(w) < 6:
        return _fit_quad(w, s, x)
    err = []
    for f in forms:
        e = [
            np.abs(
                x[half == g]
                - _predict(f(w[half != g], s[half != g], x[half != g]), w[half == g], s[half == g])
            )
            for g in (0, 1)
        ]
        err.append(float(np.median(np.concatenate(e))))
    # (measured on default: 588 of 1 035 rows took the table, 8 of them along s; the softmax, norm
    # and GEMM rows mostly the table, the attention rows mostly the quadratic)
    return forms[int(np.argmin(err))](w, s, x)


_NUM_TYPES = frozenset((int, float))


def _nums(v: Any, n: int | None = None) -> bool:
    """A flat list of finite real numbers that fit a float (not bools, not strings), of length
    ``n`` if given. A reference holds ~60 000 numbers, checked at every load (every `teller
    diagnose` call): ``map`` over builtins, not a Python-level loop (10 ms -> 2 ms per load)."""
    if not isinstance(v, list) or (n is not None and len(v) != n):
        return False
    types = set(map(type, v))
    if not types <= _NUM_TYPES and any(  # (a subclass, e.g. np.float64, is a number; a bool is not)
        issubclass(t, bool) or not issubclass(t, (int, float)) for t in types
    ):
        return False
    try:
        return all(map(math.isfinite, v))
    except OverflowError:  # an int past the float range
        return False


def _valid_row(r: Any, version: int) -> bool:
    if version == 1:  # [c2, c1, c0, w_lo, w_hi, n]
        return _nums(r, 6) and r[3] <= r[4]
    if not isinstance(r, dict):
        return False
    if r.get("kind") == "table":
        k, v = r.get("knots"), r.get("values")
        return (
            r.get("axis") in ("w", "s")
            and _nums(k)
            and _nums(v)
            and len(k) == len(v) >= 1
            and all(map(operator.lt, k, k[1:]))
        )
    if r.get("kind") == "quad":
        return (
            _nums(r.get("coef"), 6)
            and _nums(r.get("w"), 2)
            and _nums(r.get("s"), 2)
            and r["w"][0] <= r["w"][1]
            and r["s"][0] <= r["s"][1]
        )
    return False


class KernelReference:
    """Fitted per (deployment key, ``symbol\\tposition``); see the module docstring."""

    def __init__(self, table: dict[str, dict[str, Any]] | None = None, version: int = REF_VERSION) -> None:
        self.table: dict[str, dict[str, Any]] = table or {}
        self.version = version

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

    @classmethod
    def fit(
        cls,
        points: Iterable[tuple[str | None, list[str], np.ndarray, np.ndarray, np.ndarray]],
        min_events: int = 3,
    ) -> KernelReference:
        """From ``(key, point keys, w, s, x)`` per training capture (events inside fault windows
        already left out); a (key, symbol, position) needs ``min_events`` events. Captures alternate
        between the two halves that choose each row's form, in the order given, per key (a
        deployment's halves do not depend on the other deployments' captures)."""
        acc: dict[str, dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]]] = {}
        seen: dict[str, int] = {}
        for key, pk, w, s, x in points:
            if key is None or not len(pk):
                continue
            ci = seen.get(key, 0)
            seen[key] = ci + 1
            arr = np.asarray(pk)
            order = np.argsort(arr, kind="stable")
            a = arr[order]
            bounds = np.flatnonzero(a[1:] != a[:-1]) + 1
            d = acc.setdefault(key, {})
            for g in np.split(order, bounds):
                d.setdefault(str(arr[g[0]]), []).append(
                    (np.asarray(w)[g], np.asarray(s)[g], np.asarray(x)[g], ci % 2)
                )
        table: dict[str, dict[str, Any]] = {}
        for key in sorted(acc):
            rows = {}
            for pk in sorted(acc[key]):
                parts = acc[key][pk]
                ww = np.concatenate([p[0] for p in parts])
                if len(ww) >= min_events:
                    rows[pk] = _fit(
                        ww,
                        np.concatenate([p[1] for p in parts]),
                        np.concatenate([p[2] for p in parts]),
                        np.concatenate([np.full(len(p[0]), p[3]) for p in parts]),
                    )
            if rows:
                table[key] = rows
        return cls(table)

    def residuals(
        self, key: str | None, pk: list[str], w: np.ndarray, s: np.ndarray, x: np.ndarray
    ) -> np.ndarray:
        """x - fit(w, s) per point (see the module docstring); NaN where nothing was fitted."""
        out = np.full(len(pk), np.nan)
        rows = self.table.get(self.table_key(key)) if key is not None else None
        if not rows or not len(pk):
            return out
        arr = np.asarray(pk)
        order = np.argsort(arr, kind="stable")
        bounds = np.flatnonzero(arr[order][1:] != arr[order][:-1]) + 1
        w, s, x = (np.asarray(v, np.float64) for v in (w, s, x))
        for g in np.split(order, bounds):
            row = rows.get(str(arr[g[0]]))
            if row is not None:
                out[g] = x[g] - _predict(row, w[g], s[g])
        return out

    def table_key(self, key: str | None) -> str | None:
        """The table's name for a deployment key: a version-1 reference's keys have no dtype /
        quantization / KV-cache parts (:func:`base_key`)."""
        if key is None or self.version != 1:
            return key
        return base_key(key)

    def knows(self, key: str | None) -> bool:
        return key is not None and self.table_key(key) in self.table

    def to_dict(self) -> dict[str, Any]:
        return {"format": REF_FORMAT, "version": self.version, "table": self.table}

    @classmethod
    def from_dict(cls, d: Any, *, path: str = "<dict>") -> KernelReference:
        if not isinstance(d, dict) or d.get("format") != REF_FORMAT:
            got = d.get("format") if isinstance(d, dict) else None
            raise ConfigError(
                f"{path}: not a teller kernel reference (format {got!r}; a reference's is {REF_FORMAT!r})",
                path=path,
            )
        version = d.get("version")
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise ConfigError(
                f"{path}: kernel reference version {version!r}, expected one of {list(READ_VERSIONS)}",
                path=path,
            )
        table = d.get("table")
        if not isinstance(table, dict) or not all(
            isinstance(v, dict) and all(_valid_row(r, version) for r in v.values()) for v in table.values()
        ):
            raise ConfigError(f"{path}: malformed kernel reference table", path=path)
        return cls(table, version)

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
    if ref is None or not ref.knows(key):
        return None
    idx, pk, ww, ss, x = kernel_points(tr, w)
    out = np.full(len(tr), np.nan)
    out[idx] = ref.residuals(key, pk, ww, ss, x)
    return out
