"""What changed between a healthy capture and a slow one, without a model.

``compare(baseline, current)`` puts two captures of the same workload side by side (two
:class:`teller.trace.Trace`): the step time, each GPU's time breakdown (``Trace.summary()``: compute,
communication, copies, idle by what the GPU waited for), and the symbols (normalized kernel, operator,
API call and range names) whose time changed most, per step so that captures of different lengths
compare. Host ranges count their *self* time (their duration less that of the host events nested in
them: an engine step that got slower because one operator inside it did shows as that operator);
GPU activities count their duration. ``statements`` turns the largest changes into sentences.

This is the user's own "normal": where the RCA models were trained on other deployments (a capture
``teller diagnose`` flags as unfamiliar), a healthy run of the same service is the reference that
says which kernel or operator moved. The idea is HTA's trace diff; the code is ours.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from teller.findings import _ms, _pct, gpu_names

# a change is stated when it moves the time per step by this share of the baseline's step time or more
MIN_SHARE = 0.02
# and a breakdown share (of a GPU's span) by this many points or more
MIN_POINTS = 0.05
# the step time ratio that is worth a sentence
STEP_RATIO = 1.2
GPU_LAYERS = ("kernel", "memcpy", "memset")
BREAKDOWN = (
    ("compute_ns", "compute"),
    ("comm_ns", "communication"),
    ("memory_ns", "copies"),
    ("idle_host_ns", "waiting for the host"),
    ("idle_launch_ns", "idle in launch calls"),
    ("idle_queued_ns", "idle with work queued"),
)


def _units(tr: Any) -> tuple[float, str, float]:
    """(units, what a unit is, median unit time in ns): the trace's steps where it has any, else the
    capture as one unit (its span)."""
    steps = [s for s in tr.steps() if s.event >= 0]  # (not the loader's fallback: the whole capture)
    if steps:
        d = np.array([s.dur_ns for s in steps], dtype=np.float64)
        return float(len(steps)), "step", float(np.median(d))
    return 1.0, "capture", _span(tr)


def _span(tr: Any) -> float:
    return float(np.max(tr.end) - np.min(tr.ts)) if len(tr) else 0.0


def symbol_times(tr: Any) -> dict[str, dict[str, Any]]:
    """Per symbol: its layer, the events, and their time (ns): GPU activities their duration, host
    events their self time (less the host events nested in them, as the call-chain tree nests them)."""
    from teller.trace import LAYER_NAMES

    n = len(tr)
    if n == 0:
        return {}
    layer = np.asarray(tr.layer)
    dur = np.asarray(tr.dur, dtype=np.float64)
    sym = np.asarray(tr.symbol, dtype=np.int64)
    parent = np.asarray(tr.parent, dtype=np.int64)
    gpu_codes = [LAYER_NAMES.index(x) for x in GPU_LAYERS]
    is_gpu = np.isin(layer, gpu_codes)
    # self time of host events: subtract each host child's duration from its host parent
    own = dur.copy()
    child = (~is_gpu) & (parent >= 0)
    if child.any():
        par = parent[child]
        host_par = ~is_gpu[par]
        np.subtract.at(own, par[host_par], dur[child][host_par])
    own = np.where(is_gpu, dur, np.maximum(own, 0.0))
    names = tr.symbols
    tot = np.bincount(sym, weights=own, minlength=len(names))
    cnt = np.bincount(sym, minlength=len(names))
    lay = np.zeros(len(names), dtype=np.int64)
    lay[sym] = layer
    out: dict[str, dict[str, Any]] = {}
    for k in np.flatnonzero(cnt):
        if not names[k]:
            continue
        out[names[k]] = {"layer": LAYER_NAMES[int(lay[k])], "count": int(cnt[k]), "ns": float(tot[k])}
    return out


def _device_rows(s: dict[str, Any], tr: Any) -> list[tuple[str, dict[str, float]]]:
    """Per GPU (in the summary's order: by process, then device), its name and its breakdown as
    shares of its span."""
    devs = [d for d in s["devices"] if d.get("span_ns", 0) > 0]
    names = gpu_names(devs, tr.sources)
    return [(nm, {f: d[f] / d["span_ns"] for f, _ in BREAKDOWN}) for d, nm in zip(devs, names, strict=True)]


def _all_gpus(s: dict[str, Any]) -> dict[str, float] | None:
    devs = [d for d in s["devices"] if d.get("span_ns", 0) > 0]
    span = sum(d["span_ns"] for d in devs)
    return {f: sum(d[f] for d in devs) / span for f, _ in BREAKDOWN} if span else None


def compare(baseline: Any, current: Any, top: int = 10) -> dict[str, Any]:
    """The changes from ``baseline`` to ``current`` (two :class:`teller.trace.Trace`). Returns a
    dict: ``unit`` ("step" when both captures have steps, else "capture"); ``steps`` (per capture,
    its steps and their median time; with unit "capture", its span instead); ``symbols`` (the
    ``top`` symbols by the largest change of their time per unit, each with layer, events and time
    per unit in both, the change and the ratio; a symbol of one capture only included); ``gpus``
    (the GPUs paired in order where both captures have as many, then ``all GPUs``: each breakdown
    share in both); ``statements`` (:func:`statements`)."""
    nb, ub, med_b = _units(baseline)
    nc, uc, med_c = _units(current)
    unit = "step" if ub == uc == "step" else "capture"
    steps_b, steps_c = (int(nb) if ub == "step" else 0), (int(nc) if uc == "step" else 0)
    if unit == "capture":
        nb = nc = 1.0
        if ub == "step":  # (the other has none: both as a whole, the span against the span)
            med_b = _span(baseline)
        if uc == "step":
            med_c = _span(current)
    tb, tc = symbol_times(baseline), symbol_times(current)
    rows = []
    for name in sorted(set(tb) | set(tc)):
        b, c = tb.get(name), tc.get(name)
        b_ns = b["ns"] / nb if b else 0.0
        c_ns = c["ns"] / nc if c else 0.0
        rows.append(
            {
                "symbol": name,
                "layer": (c or b or {}).get("layer"),
                "baseline_count": (b["count"] / nb) if b else 0.0,
                "current_count": (c["count"] / nc) if c else 0.0,
                "baseline_ns": b_ns,
                "current_ns": c_ns,
                "delta_ns": c_ns - b_ns,
                "ratio": (c_ns / b_ns) if b_ns > 0 else None,
            }
        )
    rows.sort(key=lambda r: (-abs(r["delta_ns"]), r["symbol"]))
    sb, sc = baseline.summary(0), current.summary(0)
    db, dc = _device_rows(sb, baseline), _device_rows(sc, current)
    # GPUs paired in order (by process, then device) where both captures have as many; the current
    # capture's names (a path tail tells per-rank files apart); always the whole as well
    gpus = (
        [{"gpu": nm, "baseline": b, "current": c} for (_, b), (nm, c) in zip(db, dc, strict=True)]
        if len(db) == len(dc)
        else []
    )
    ab, ac = _all_gpus(sb), _all_gpus(sc)
    if ab is not None and ac is not None:
        gpus.append({"gpu": "all GPUs", "baseline": ab, "current": ac})
    out = {
        "unit": unit,
        "steps": {
            "baseline": {"count": steps_b, "median_ns": med_b},
            "current": {"count": steps_c, "median_ns": med_c},
        },
        "symbols": rows[: max(0, int(top))],
        "gpus": gpus,
    }
    out["statements"] = statements(out, rows)
    return out


def statements(cmp: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[str]:
    """The changes worth a sentence, largest first: the step time (at ``STEP_RATIO`` or more either
    way), the symbols whose time per unit moved by ``MIN_SHARE`` of the baseline's unit time or more
    (at most five), and the breakdown shares that moved by ``MIN_POINTS`` or more."""
    unit = cmp["unit"]
    out: list[str] = []
    mb, mc = cmp["steps"]["baseline"]["median_ns"], cmp["steps"]["current"]["median_ns"]
    if mb > 0 and mc > 0 and max(mc / mb, mb / mc) >= STEP_RATIO:
        what = "median step" if unit == "step" else "capture span"
        out.append(f"the {what} took {mc / mb:.2f}x the baseline's ({_ms(mc)} against {_ms(mb)})")
    rows = rows if rows is not None else cmp["symbols"]
    ref = mb if mb > 0 else 1.0
    n = 0
    for r in rows:
        if abs(r["delta_ns"]) < MIN_SHARE * ref or n >= 5:
            break
        n += 1
        per = f"per {unit}"
        if r["baseline_ns"] == 0:
            out.append(
                f"{r['symbol']} is new: {_ms(r['current_ns'])} {per} ({r['current_count']:.3g} events {per})"
            )
        elif r["current_ns"] == 0:
            out.append(f"{r['symbol']} is gone: it took {_ms(r['baseline_ns'])} {per} in the baseline")
        else:
            sign = "+" if r["delta_ns"] > 0 else "-"
            cnt = ""
            if abs(r["current_count"] - r["baseline_count"]) >= 0.5 * max(1.0, 0.1 * r["baseline_count"]):
                cnt = f"; {r['current_count']:.3g} events {per} against {r['baseline_count']:.3g}"
            out.append(
                f"{r['symbol']}: {sign}{_ms(abs(r['delta_ns']))} {per} ({r['ratio']:.2f}x: "
                f"{_ms(r['current_ns'])} against {_ms(r['baseline_ns'])}{cnt})"
            )
    # the whole's changes, then a GPU's own where it moved apart from the whole (one rank slowed);
    # with one GPU the whole is that GPU
    gpus = cmp["gpus"]
    whole = next((g for g in gpus if g["gpu"] == "all GPUs"), None)
    each = [g for g in gpus if g["gpu"] != "all GPUs"]
    for f, label in BREAKDOWN:
        if whole is not None:
            b, c = whole["baseline"][f], whole["current"][f]
            if abs(c - b) >= MIN_POINTS:
                who = "the GPUs" if len(each) != 1 else each[0]["gpu"]
                their = "their" if len(each) != 1 else "its"
                out.append(f"{who}: {label} {_pct(c)} of {their} time, against {_pct(b)} in the baseline")
            dw = c - b
        else:
            dw = 0.0
        if len(each) > 1:
            for g in each:
                b, c = g["baseline"][f], g["current"][f]
                if abs(c - b) >= MIN_POINTS and abs((c - b) - dw) >= MIN_POINTS:
                    out.append(
                        f"{g['gpu']}: {label} {_pct(c)} of its time, against {_pct(b)} in the baseline"
                    )
    return out
