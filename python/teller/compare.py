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

import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from teller.errors import TellerWarning
from teller.findings import _ms, _pct, gpu_names, origin

# a change is stated when it moves the time per step by this share of the baseline's step time or more
MIN_SHARE = 0.02
# and a breakdown share (of a GPU's span) by this many points or more
MIN_POINTS = 0.05
# the step time ratio that is worth a sentence
STEP_RATIO = 1.2
# the change of the steps' median load (their `num_tokens`, else `num_seqs`) from which the step time
# is also read against the load: what the baseline's steps take for the current steps' loads
LOAD_RATIO = 1.2
GPU_LAYERS = ("kernel", "memcpy", "memset")
BREAKDOWN = (
    ("compute_ns", "compute"),
    ("comm_ns", "communication"),
    ("memory_ns", "copies"),
    ("idle_host_ns", "waiting for the host"),
    ("idle_launch_ns", "idle in launch calls"),
    ("idle_queued_ns", "idle with work queued"),
)


# What a kernel does, from its symbol, for captures whose kernels were *chosen* differently (another
# cuBLAS heuristic, attention backend, library version or GPU: `sm90_xmma_gemm_...` in one,
# `nvjet_sm90_tst_...` in the other): per symbol that is one kernel gone and another new, per class
# the same work in both. Communication is what the breakdown counts as such (`is_collective` of
# teller_core's summary, the same tokens); then the first match wins, on the name's last `::` part,
# case ignored: a KV-cache write before attention (it attends to nothing), attention before the
# rest (a paged-attention reduction is attention), a split-K reduction and an MoE grouped GEMM are
# GEMMs, FlashInfer's top-p renormalization is sampling, not a norm. HTA sorts kernels into
# communication, memory and computation; the computation is split further here, as LLM kernels are.
# (Tried on the five real fixtures and on kernel names of vLLM, SGLang, FlashAttention 2/3,
# FlashInfer, CUTLASS, cuBLAS, Triton/Inductor, Marlin and composable_kernel; DeepEP's `dispatch` /
# `combine` are not told apart from other kernels of those names and read as "other".)
KERNEL_CLASSES: tuple[tuple[str, str], ...] = (
    (
        "copy and index",
        r"reshape_and_cache|concat_and_cache|append_?paged_?kv_?cache|store_?kv"
        r"|kv_?cache_?(?:write|update|store|copy)",
    ),
    (
        "attention",
        r"flash|fmha|attn|attention|paged_?att|mha_|_mha|xformers|merge_?attn|merge_?states?|xqa|sdpa"
        r"|prefillwith|decodewith",
    ),
    ("convolution", r"conv(?!ert)|fprop|dgrad|wgrad|winograd|scudnn|implicit_?convolve"),
    (
        "MoE routing",
        r"top_?k_?gating|moe_?align|align_block_size|count_and_sort_expert|expert_?tokens|moe_?permute"
        r"|moe_?unpermute|moe_?sum|dispatch_?layout",
    ),
    (
        "GEMM",
        r"gemm|gemv|nvjet|xmma|cijk_|cublas|hipblaslt|matmul|s1688|s16816|h1688|h16816|i8816|splitk"
        r"|tensorop|fused_moe|marlin|machete|triton_tem|bmm|addmm|_mm$",
    ),
    ("sampling", r"sampling|renorm|top_?p|min_?p|multinomial|argmax|(?<!up)(?<!down)sampl"),
    (
        "normalization",
        r"rms_?norm|layer_?norm|group_?norm|batch_?norm|instance_?norm|^bn_|norm_kernel|norm_fwd|norm_bwd",
    ),
    ("softmax, top-k, sort", r"softmax|top_?k|sort|radix"),
    # (elementwise before copy: `rotary_embedding_kernel`, `elementwise_kernel_with_index` are elementwise)
    (
        "elementwise",
        r"elementwise|unrolled|triton_poi|act_and_mul|silu|gelu|relu|rotary|rope|(?<!pre)fill|pool",
    ),
    ("copy and index", r"copy|cat_?array|gather|scatter|index|embedding"),
    ("reduction", r"reduce|triton_red|triton_per"),
)
_KERNEL_CLASS_RX = [(c, re.compile(rx, re.IGNORECASE)) for c, rx in KERNEL_CLASSES]
# teller_core::summary::is_ep_exchange: expert-parallel token exchanges by their own name (DeepEP's
# `deep_ep::intranode::dispatch`, normalized to `kernel:dispatch`)
_EP_EXCHANGE = re.compile(
    r"^(?:dispatch|combine|notify_dispatch|cached_notify|cached_notify_dispatch|cached_notify_combine)$"
)


def kernel_class(symbol: str, communication: bool | None = None) -> str | None:
    """The class of a kernel symbol (``kernel:...``, :data:`KERNEL_CLASSES`; ``communication`` as
    the GPU breakdown counts it; ``other`` when none fits), or None for anything not a kernel.
    ``communication``: what the breakdown said of the symbol's kernels (:func:`comm_symbols`, from
    their full names); without it, the symbol's name decides (a namespace the normalization
    stripped is then not there to tell `deep_ep::...::dispatch` from another library's)."""
    if not symbol.startswith("kernel:"):
        return None
    name = symbol[len("kernel:") :]
    last = name.rsplit("::", 1)[-1]  # (`flashinfer::norm::RMSNormKernel` is a norm, not attention)
    if communication is None:  # (the breakdown's own rule, teller_core::summary::is_collective)
        from teller import _native

        communication = bool(_native.is_collective([name])[0]) or bool(_EP_EXCHANGE.match(last))
    if communication:
        return "communication"
    return next((c for c, rx in _KERNEL_CLASS_RX if rx.search(last)), "other")


def comm_symbols(*traces: Any) -> dict[str, bool]:
    """Per kernel symbol of the traces, whether the GPU breakdown counts its kernels as
    communication (``teller_core::summary::is_collective`` on their full names; a symbol some of
    whose kernels are and some not: by the majority of its events)."""
    from teller import _native
    from teller.trace import LAYER_NAMES

    votes: dict[str, list[int]] = {}
    k_layer = LAYER_NAMES.index("kernel")
    for tr in traces:
        if not len(tr):
            continue
        kern = np.flatnonzero(np.asarray(tr.layer) == k_layer)
        if not len(kern):
            continue
        pairs, cnt = np.unique(
            np.stack([np.asarray(tr.symbol)[kern], np.asarray(tr.name)[kern]]).astype(np.int64),
            axis=1,
            return_counts=True,
        )
        strings, symbols = tr.strings, tr.symbols
        coll = _native.is_collective([strings[int(x)] for x in pairs[1]])
        for sy, c, n in zip(pairs[0].tolist(), coll, cnt.tolist(), strict=True):
            v = votes.setdefault(symbols[sy], [0, 0])
            v[0 if c else 1] += n
    return {k: v[0] > v[1] for k, v in votes.items()}


# The host calls that wait for the GPU (or for a copy to reach it): synchronizations and copies
# (`cudaMemcpyAsync` of pageable memory, or of results the host reads next, returns when the copy is
# done), in CUDA's runtime and driver APIs and HIP's; and CUPTI's synchronization records.
_HOST_WAIT_RX = re.compile(r"^(?:sync:.*|(?:runtime|driver):(?:cuda|cu|hip)\w*(?:Synchronize|Memcpy)\w*)$")


def is_host_wait(symbol: str) -> bool:
    """Whether ``symbol`` is a call in which the host waits for the GPU (a synchronization, a copy)
    or a synchronization record: its time is the GPU's, seen from the host."""
    return bool(_HOST_WAIT_RX.match(symbol))


# the kernels gone and the kernels new of a class did its work in place of one another when their
# times per unit are within this factor of each other (a tiny kernel gone and a large one new are two
# changes, not one)
SWAP_RATIO = 2.0


def is_swap(a: dict[str, Any]) -> bool:
    """Whether a kernel class of :func:`compare`'s ``kernel_classes`` ran its work on other kernels:
    kernels of it gone and others new, of comparable time (:data:`SWAP_RATIO`), in a class that says
    what they do (not ``other``)."""
    g, n = a.get("gone_ns", 0.0), a.get("new_ns", 0.0)
    if a["class"] == "other" or not (a["gone"] and a["new"]) or g <= 0 or n <= 0:
        return False
    return 1 / SWAP_RATIO <= n / g <= SWAP_RATIO


def _classes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel class, the time per unit of its kernels in both captures, and the kernels of it
    that one capture ran and the other did not (``gone``, ``new``); largest change first."""
    acc: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = r["class"] if "class" in r else kernel_class(r["symbol"])
        if c is None:
            continue
        a = acc.setdefault(
            c,
            {
                "class": c,
                "baseline_ns": 0.0,
                "current_ns": 0.0,
                "gone": [],
                "new": [],
                "gone_ns": 0.0,
                "new_ns": 0.0,
            },
        )
        a["baseline_ns"] += r["baseline_ns"]
        a["current_ns"] += r["current_ns"]
        if r.get("only_in") == "baseline":
            a["gone"].append(r["symbol"])
            a["gone_ns"] += r["baseline_ns"]
        elif r.get("only_in") == "current":
            a["new"].append(r["symbol"])
            a["new_ns"] += r["current_ns"]
    out = []
    for a in acc.values():
        a["delta_ns"] = a["current_ns"] - a["baseline_ns"]
        a["ratio"] = a["current_ns"] / a["baseline_ns"] if a["baseline_ns"] > 0 else None
        a["gone"].sort()
        a["new"].sort()
        out.append(a)
    out.sort(key=lambda a: (-abs(a["delta_ns"]), a["class"]))
    return out


def pattern_steps(tr: Any, patterns: Sequence[str]) -> list[Any]:
    """The trace's steps that are step ranges (their name matches one of ``patterns``), or none: the
    loader's fallbacks (the busiest thread's root ranges, the whole trace) are not steps to divide by."""
    steps = [s for s in tr.steps() if s.event >= 0]
    # (the loader's globs: only '*' is special, as in teller_core's glob_match)
    rx = [re.compile(".*".join(map(re.escape, pat.split("*"))), re.DOTALL) for pat in patterns]
    if steps and all(any(r.fullmatch(s.name) for r in rx) for s in steps):
        return steps
    return []


def _units(tr: Any, patterns: Sequence[str]) -> tuple[float, str, float]:
    """(units, what a unit is, median unit time in ns): the trace's steps where it has step ranges,
    else the capture as one unit (its span)."""
    steps = pattern_steps(tr, patterns)
    if steps:
        d = np.array([s.dur_ns for s in steps], dtype=np.float64)
        return float(len(steps)), "step", float(np.median(d))
    return 1.0, "capture", _span(tr)


def _span(tr: Any) -> float:
    return float(np.max(tr.end) - np.min(tr.ts)) if len(tr) else 0.0


def symbol_times(tr: Any, *, in_steps: bool = False) -> dict[str, dict[str, Any]]:
    """Per symbol: its layer, the events, and their time (ns): GPU activities their duration, host
    events their self time (less the part of each host event nested in them that overlaps them, as
    the call-chain tree nests them; the GPU work a call launched takes nothing from it).
    ``in_steps``: only the events inside a step (GPU work counts in its launching call's step), so
    that set-up and warm-up outside the steps do not divide into them."""
    from teller.trace import LAYER_NAMES

    n = len(tr)
    if n == 0:
        return {}
    layer = np.asarray(tr.layer)
    ts = np.asarray(tr.ts, dtype=np.int64)
    dur = np.asarray(tr.dur, dtype=np.float64)
    end = ts + np.asarray(tr.dur, dtype=np.int64)
    sym = np.asarray(tr.symbol, dtype=np.int64)
    parent = np.asarray(tr.parent, dtype=np.int64)
    is_gpu = np.isin(layer, [LAYER_NAMES.index(x) for x in GPU_LAYERS])
    # self time of host events: each host child's overlap with its host parent taken from the parent
    # (an improperly nested child, running past its parent's end, takes only its part inside)
    own = dur.copy()
    child = np.flatnonzero((~is_gpu) & (parent >= 0))
    if len(child):
        par = parent[child]
        keep = ~is_gpu[par]
        child, par = child[keep], par[keep]
        ov = np.minimum(end[child], end[par]) - np.maximum(ts[child], ts[par])
        np.subtract.at(own, par, np.maximum(ov, 0).astype(np.float64))
    own = np.where(is_gpu, dur, np.maximum(own, 0.0))
    names = tr.symbols
    sel = np.ones(n, dtype=bool)
    if in_steps:
        sel = _in_steps(tr, ts, end)
    tot = np.bincount(sym[sel], weights=own[sel], minlength=len(names))
    cnt = np.bincount(sym[sel], minlength=len(names))
    lay = np.zeros(len(names), dtype=np.int64)
    lay[sym] = layer
    out: dict[str, dict[str, Any]] = {}
    for k in np.flatnonzero(cnt):
        if not names[k]:
            continue
        out[names[k]] = {"layer": LAYER_NAMES[int(lay[k])], "count": int(cnt[k]), "ns": float(tot[k])}
    return out


def _in_steps(tr: Any, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per event, whether it counts per step: an event of a process that has steps, inside one (GPU
    work by its launching call's step); an event of a process without steps (the workers of an
    engine whose steps are its scheduler's ranges), inside the steps' window (first step start to
    last step end). Set-up and warm-up outside them do not divide into the steps."""
    n = len(tr)
    step = np.asarray(tr.step, dtype=np.int64)
    link = np.asarray(tr.link, dtype=np.int64) if len(tr.link) else np.full(n, -1, np.int64)
    pid = np.asarray(tr.pid, dtype=np.int64)
    proc_of_src = np.array([x.get("process", k) for k, x in enumerate(tr.sources)], dtype=np.int64)
    src = np.asarray(tr.source, dtype=np.int64)
    # a GPU activity belongs to the process of its launching call (its own pid is often the device's)
    owner = np.where(link >= 0, np.maximum(link, 0), np.arange(n))
    key = proc_of_src[src[owner]] * (1 << 32) + (pid[owner] & 0xFFFFFFFF)
    steps = [st for st in tr.steps() if st.event >= 0]
    with_steps = np.unique([key[st.event] for st in steps]) if steps else np.zeros(0, np.int64)
    has = np.isin(key, with_steps)
    if not steps:
        return np.ones(n, dtype=bool)
    lo, hi = min(st.start_ns for st in steps), max(st.end_ns for st in steps)
    return np.where(has, step >= 0, (end > lo) & (ts < hi))


def _rank(src: dict[str, Any]) -> int | None:
    """The distributed rank of an input: a raw file's ``RANK`` (its header's environment), a
    profiler file's ``distributedInfo.rank`` (Kineto); None where it says none."""
    import json

    meta = src.get("metadata") or {}
    try:
        if src.get("kind") == "raw":
            h = json.loads(meta.get("header") or "{}")
            v = (h.get("env") or {}).get("RANK") if isinstance(h, dict) else None
        else:
            di = json.loads(meta.get("distributedInfo") or "{}")
            v = di.get("rank") if isinstance(di, dict) else None
        if isinstance(v, bool) or v is None:
            return None
        if isinstance(v, float):  # (an integral number only: 2.7, inf and NaN name no rank)
            return int(v) if v.is_integer() else None
        return int(v) if isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit()) else None
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def _device_rows(s: dict[str, Any], tr: Any) -> list[tuple[str, dict[str, float], tuple | None]]:
    """Per GPU (in the summary's order: by device, then input), its name, its breakdown as shares of
    its span, and its key across captures: (rank, device) where its input names its rank, else
    None."""
    devs = [d for d in s["devices"] if d.get("span_ns", 0) > 0]
    names = gpu_names(devs, tr.sources)
    out = []
    for d, nm in zip(devs, names, strict=True):
        src = d.get("source", 0)
        # (a merged file teller wrote, read back: the rank of the input the GPU's pid came from)
        o = origin(tr.sources, d)
        r = _rank(o) if o else _rank(tr.sources[src]) if 0 <= src < len(tr.sources) else None
        out.append(
            (nm, {f: d[f] / d["span_ns"] for f, _ in BREAKDOWN}, (r, d["device"]) if r is not None else None)
        )
    return out


def _pair_gpus(db: list, dc: list) -> list[tuple[int, int]]:
    """Index pairs (baseline, current) of the GPUs to compare: by (rank, device) where every GPU of
    both captures has one, each once, and both have the same ones (the order of the input files, and
    so of the processes, may differ between two runs of one service: rank 1's file first in one);
    else by rank alone where each rank has one GPU in both (one run giving each rank its GPU as
    device 0 through ``CUDA_VISIBLE_DEVICES``, the other as ``cuda:<rank>``); else in order where
    both have as many GPUs; else none."""
    kb, kc = [x[2] for x in db], [x[2] for x in dc]
    for key in (lambda k: k, lambda k: k[0]):
        if None in kb or None in kc:
            break
        b, c = [key(k) for k in kb], [key(k) for k in kc]
        if len(set(b)) == len(b) == len(c) and set(b) == set(c):
            at = {k: i for i, k in enumerate(b)}
            return [(at[k], j) for j, k in enumerate(c)]
    return [(i, i) for i in range(len(db))] if len(db) == len(dc) else []


def _all_gpus(s: dict[str, Any]) -> dict[str, float] | None:
    devs = [d for d in s["devices"] if d.get("span_ns", 0) > 0]
    span = sum(d["span_ns"] for d in devs)
    return {f: sum(d[f] for d in devs) / span for f, _ in BREAKDOWN} if span else None


def compare(
    baseline: Any, current: Any, top: int = 10, *, step_patterns: Sequence[str] | None = None
) -> dict[str, Any]:
    """The changes from ``baseline`` to ``current`` (two :class:`teller.trace.Trace`). Returns a
    dict: ``unit`` ("step" when both captures have steps, else "capture"); ``steps`` (per capture,
    its steps and their median time; with unit "capture", its span instead); ``symbols`` (the
    ``top`` symbols by the largest change of their time per unit, each with layer, events and time
    per unit in both, the change and the ratio; a symbol of one capture only included); ``gpus``
    (the GPUs paired by rank and device, else by rank, else in order where both captures have as
    many, then ``all GPUs``: each breakdown share in both); ``statements`` (:func:`statements`).
    ``step_patterns``: the globs the captures' steps were found by
    (``teller.trace.load(step_names=...)``; the loader's defaults by default): steps found by the
    loader's fallbacks (root ranges, the whole trace) make the unit "capture"."""
    from teller.errors import ConfigError
    from teller.trace import DEFAULT_STEP_PATTERNS, Trace

    for name, v in (("baseline", baseline), ("current", current)):
        if not isinstance(v, Trace):
            raise ConfigError(
                f"compare takes two teller.trace.Trace objects (teller.trace.load), got {type(v).__name__} "
                f"as {name}"
            )
    patterns = list(step_patterns or DEFAULT_STEP_PATTERNS)
    nb, ub, med_b = _units(baseline, patterns)
    nc, uc, med_c = _units(current, patterns)
    unit = "step" if ub == uc == "step" else "capture"
    steps_b, steps_c = (int(nb) if ub == "step" else 0), (int(nc) if uc == "step" else 0)
    if unit == "capture":
        nb = nc = 1.0
        med_b, med_c = _span(baseline), _span(current)  # (both as a whole: the span against the span)
    per_step = unit == "step"
    tb, tc = symbol_times(baseline, in_steps=per_step), symbol_times(current, in_steps=per_step)
    comm = comm_symbols(baseline, current)
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
                "only_in": "baseline" if c is None else "current" if b is None else None,
                # (a kernel's class as the GPU breakdown counts it; None for anything not a kernel)
                "class": kernel_class(name, comm.get(name)),
            }
        )
    rows.sort(key=lambda r: (-abs(r["delta_ns"]), r["symbol"]))
    # the share of both captures' time in symbols both have: little (another program, engine or
    # machine) and every change below compares different work (a review compared a ResNet training
    # trace with an LLM serving capture and read "the median step took 0.01x the baseline's").
    # Measured (2026-12-07): simulated captures of one preset 0.53-0.69 pairwise, the five real Kineto
    # fixtures 0.00-0.59 (their runtime calls and aten operators are common), a CPU run against a
    # simulated sample 0.00; said below COMMON_MIN
    tot = sum(v["ns"] for v in tb.values()) + sum(v["ns"] for v in tc.values())
    common_ns = sum(tb[k]["ns"] + tc[k]["ns"] for k in set(tb) & set(tc))
    common = common_ns / tot if tot > 0 else None
    if common is not None and common < COMMON_MIN:
        warnings.warn(
            f"the two captures have little in common: {100 * common:.0f} % of their time is in symbols "
            "both have (another program, engine or machine?); the changes compare different work",
            TellerWarning,
            stacklevel=2,
        )
    sb, sc = baseline.summary(0), current.summary(0)
    db, dc = _device_rows(sb, baseline), _device_rows(sc, current)
    # GPUs paired by (rank, device), else rank, else in order where both have as many; named as the
    # current capture names them (a path tail tells per-rank files apart), the baseline's name
    # beside it; always the whole as well
    gpus = [
        {"gpu": dc[j][0], "baseline_gpu": db[i][0], "baseline": db[i][1], "current": dc[j][1]}
        for i, j in _pair_gpus(db, dc)
    ]
    ab, ac = _all_gpus(sb), _all_gpus(sc)
    if ab is not None and ac is not None:
        gpus.append({"gpu": "all GPUs", "baseline": ab, "current": ac})
    out = {
        "unit": unit,
        "steps": {
            # (median_ns: the median step; with unit "capture", the span: span_ns)
            "baseline": {"count": steps_b, "median_ns": med_b, "span_ns": _span(baseline)},
            "current": {"count": steps_c, "median_ns": med_c, "span_ns": _span(current)},
        },
        "symbols": rows[: max(0, int(top))],
        # per kernel class (KERNEL_CLASSES): what a class of work took, whichever kernels did it
        "kernel_classes": _classes(rows),
        "gpus": gpus,
        # the GPUs with work in each capture (the breakdowns pair them only where as many)
        "gpu_count": {"baseline": len(db), "current": len(dc)},
        # the share of both captures' time in symbols both have (None: no time in either)
        "common_time_share": common,
        # the steps' load in both, and the current steps against the baseline's time for their load
        "load": _load_change(baseline, current, patterns) if per_step else None,
    }
    out["statements"] = statements(out, rows)
    return out


def _step_ranks(tr: Any, ss: list[Any]) -> list[int] | None:
    """The rank of each step's input (:func:`_rank`), or None where any step's input names none."""
    src, pid = np.asarray(tr.source), np.asarray(tr.pid)
    sources = tr.sources  # (once: `sources` is built on each access)
    by_source = [_rank(x) for x in sources]

    def rank_of(e: int) -> int | None:
        # (a merged file teller wrote, read back: the rank of the input the step's pid came from)
        o = origin(sources, {"source": int(src[e]), "pid": int(pid[e])})
        return _rank(o) if o else by_source[int(src[e])]

    ranks = [rank_of(s.event) for s in ss]
    return None if any(r is None for r in ranks) else [int(r) for r in ranks]  # type: ignore[arg-type]


def _read_line(xb: np.ndarray, db: np.ndarray, xc: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The line through the baseline's (load, time) pairs, read for the current loads: (what it
    gives, whether it may be read there, c, k). Read only within the baseline's loads (beyond, it
    would be extrapolated; a baseline of one load has no slope, and is read only for that load,
    within 2 %)."""
    from teller.findings import expected_step_times

    _, c, k = expected_step_times(db, xb)
    lo, hi = float(xb.min()), float(xb.max())
    if hi - lo <= 0.02 * hi:  # (one load: no slope to read other loads with)
        inside = np.abs(xc - hi) <= 0.02 * max(hi, 1.0)
    else:
        inside = (xc >= lo) & (xc <= hi)
    return c + k * xc, inside, c, k


def _load_change(baseline: Any, current: Any, patterns: Sequence[str]) -> dict[str, Any] | None:
    """Where every step of both captures records a load (the first of
    ``teller.findings.STEP_WORK_ARGS`` that all of them carry): the median load of each, the line
    ``c + k * load`` through the baseline's steps (``teller.findings.expected_step_times``: robust,
    so one slow step moves it not), and the median of the current steps' time over what that line
    gives for their load (``ratio``): above 1 they are slower than the baseline's steps of the same
    work, whatever the traffic did to the mix. Where every step's input names its rank in both
    captures (:func:`_rank`), each rank's steps are read against the line through that rank's
    baseline steps (``fit`` "per rank": a prefill rank and a decode rank, or pipeline stages, take
    different times for one load; the ranks of a tensor-parallel engine each get their own line,
    which for them is the same line); a rank with fewer than three baseline steps is not read
    (``unmatched``: the share of current steps in such ranks). Else one line through the steps of
    every process. A line is read only within its baseline loads (:func:`_read_line`) and for steps
    that took some time: ``in_range``, the share of the current steps of matched ranks it was read
    for, ``ratio`` their median (None with none). ``fixed_ns`` / ``per_unit_ns``: the line through
    every baseline step. None otherwise, or with fewer than three baseline steps."""
    from teller.findings import MIN_STEPS, STEP_WORK_ARGS, step_loads

    sb, sc = pattern_steps(baseline, patterns), pattern_steps(current, patterns)
    if len(sb) < MIN_STEPS or not sc:
        return None
    for key in STEP_WORK_ARGS:
        xb, xc = step_loads(baseline, sb, key), step_loads(current, sc, key)
        if xb is not None and xc is not None:
            break
    else:
        return None
    db = np.array([s.dur_ns for s in sb], dtype=np.float64)
    dc = np.array([s.dur_ns for s in sc], dtype=np.float64)
    pred, inside, c, k = _read_line(xb, db, xc)
    rb, rc = _step_ranks(baseline, sb), _step_ranks(current, sc)
    fit = "all"
    matched = np.ones(len(sc), dtype=bool)  # (steps of a rank the baseline has a line for)
    if rb is not None and rc is not None and len(set(rb) | set(rc)) > 1:
        fit = "per rank"
        ab, ac = np.asarray(rb), np.asarray(rc)
        pred, inside = np.zeros(len(sc)), np.zeros(len(sc), dtype=bool)
        for r in sorted(set(rc)):
            mb, mc = ab == r, ac == r
            if mb.sum() < MIN_STEPS:
                matched[mc] = False  # (a rank the baseline ran too little of, or not at all: not read)
                continue
            pred[mc], inside[mc], _, _ = _read_line(xb[mb], db[mb], xc[mc])
    ok = inside & (pred > 0) & (dc > 0)
    return {
        "arg": key,
        "baseline_median": float(np.median(xb)),
        "current_median": float(np.median(xc)),
        "fixed_ns": c,
        "per_unit_ns": k,
        "fit": fit,
        "ratio": float(np.median(dc[ok] / pred[ok])) if ok.any() else None,
        # of the steps of ranks with a baseline line, the share read (within its loads, of some time)
        "in_range": float(np.mean(ok[matched])) if matched.any() else 0.0,
        # the share of current steps whose rank the baseline has fewer than three steps of
        "unmatched": float(np.mean(~matched)),
    }


def _load_statements(ld: dict[str, Any] | None) -> list[str]:
    """The load's sentences, where the steps' median load moved by ``LOAD_RATIO`` or more."""
    if not ld:
        return []
    lb, lc, r = ld["baseline_median"], ld["current_median"], ld["ratio"]
    if lb > 0 and lc > 0:
        if max(lc / lb, lb / lc) < LOAD_RATIO:
            return []
        f = lc / lb
        moved = f"{f:.3g}x the baseline's load" if f >= 0.1 else f"1/{1 / f:,.0f} of the baseline's load"
    elif lb == lc:
        return []
    else:
        moved = "another load than the baseline's"
    arg = ld["arg"]
    unit = {"num_tokens": "token", "num_seqs": "sequence"}.get(arg, "unit")
    line = f"{_ms(ld['fixed_ns'])} + {ld['per_unit_ns'] / 1e3:.3g} us per {unit}"
    if ld.get("fit") == "per rank":
        line = f"each rank against its own steps; all ranks: {line}"
    said = f"the steps carried {moved} (median {arg} {lc:.4g} against {lb:.4g})"
    if ld.get("unmatched", 0.0) > 0.5:
        # (most steps on ranks the baseline ran too little of: there is no line to read them by)
        return [
            f"{said}, mostly on ranks the baseline has too few steps of: "
            "their time is not compared for their load"
        ]
    if r is None or ld["in_range"] < 0.5:
        # (most steps outside the baseline's loads: what it would take for them is not known)
        return [f"{said}, mostly outside the baseline's loads: their time is not compared for their load"]
    if max(r, 1 / r) >= STEP_RATIO:
        took = f"{r:.2f}x what the baseline's steps take for that load ({line})"
    else:
        took = f"about what the baseline's steps take for that load ({r:.2f}x; {line})"
    return [f"{said}; for their load they took {took}"]


# below this share of their time in common symbols two captures are said to be of different work
COMMON_MIN = 0.25


def statements(cmp: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[str]:
    """The changes worth a sentence, largest first: the step time (at ``STEP_RATIO`` or more either
    way), the steps' load and their time for it (where the load moved by ``LOAD_RATIO``), the
    symbols whose time per unit moved by ``MIN_SHARE`` of the baseline's unit time or more (at most
    five), and the breakdown shares that moved by ``MIN_POINTS`` or more."""
    unit = cmp["unit"]
    out: list[str] = []
    common = cmp.get("common_time_share")
    if common is not None and common < COMMON_MIN:
        out.append(
            f"the captures have little in common ({100 * common:.0f} % of their time in symbols both "
            "have): they are of different work, and the changes below compare it"
        )
    mb, mc = cmp["steps"]["baseline"]["median_ns"], cmp["steps"]["current"]["median_ns"]
    if mb > 0 and mc > 0 and max(mc / mb, mb / mc) >= STEP_RATIO:
        what = "median step" if unit == "step" else "capture span"
        out.append(f"the {what} took {mc / mb:.2f}x the baseline's ({_ms(mc)} against {_ms(mb)})")
    out += _load_statements(cmp.get("load"))
    rows = rows if rows is not None else cmp["symbols"]
    # a class with kernels gone *and* new ran its work on other kernels: one sentence for the swap,
    # with the class's time in both, in place of a "new" and a "gone" that read as two changes
    swapped = {a["class"]: a for a in cmp.get("kernel_classes", []) if is_swap(a)}
    said: set[str] = set()
    # the calls in which the host waits for the GPU are stated after the rest, as what they are: their
    # time follows whatever the GPU was doing, so they move in nearly every comparison (a symptom)
    first: list[str] = []
    waits: list[str] = []
    for r in rows if mb > 0 else []:  # (no reference time: no scale to call a change large by)
        if abs(r["delta_ns"]) < MIN_SHARE * mb or len(first) + len(waits) >= 5:
            break
        per = f"per {unit}"
        kc = r["class"] if "class" in r else kernel_class(r["symbol"])
        cls = kc if r.get("only_in") else None
        if cls in swapped:
            if cls not in said:
                said.add(cls)
                first.append(_swap_statement(swapped[cls], per))
            continue
        if r.get("only_in") == "current":
            text = f"{r['symbol']} is new: {_ms(r['current_ns'])} {per} ({_count(r['current_count'])} {per})"
        elif r.get("only_in") == "baseline":
            text = f"{r['symbol']} is gone: it took {_ms(r['baseline_ns'])} {per} in the baseline"
        else:
            sign = "+" if r["delta_ns"] > 0 else "-"
            cnt = ""
            if abs(r["current_count"] - r["baseline_count"]) >= 0.5 * max(1.0, 0.1 * r["baseline_count"]):
                cnt = (
                    f"; {_count(r['current_count'])} {per} against {_count(r['baseline_count'], unit=False)}"
                )
            ratio = f"{r['ratio']:.2f}x: " if r["ratio"] is not None else ""
            text = (
                f"{r['symbol']}: {sign}{_ms(abs(r['delta_ns']))} {per} ({ratio}"
                f"{_ms(r['current_ns'])} against {_ms(r['baseline_ns'])}{cnt})"
            )
        if is_host_wait(r["symbol"]):
            waits.append(
                text + "; the host waits in this call for the GPU work queued before it, "
                "so its time follows the GPU's too"
            )
        elif kc == "communication" and not r.get("only_in"):
            first.append(text + "; a collective's time includes waiting for the slowest rank")
        else:
            first.append(text)
    out += first + waits
    nb, nc = cmp.get("gpu_count", {}).get("baseline", 0), cmp.get("gpu_count", {}).get("current", 0)
    if nb != nc:
        out.append(
            f"{nc} GPU{'s' if nc != 1 else ''} with work in this capture, {nb} in the baseline"
            + ("" if nb and nc else ": no GPU time to compare")
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


def _count(n: float, unit: bool = True) -> str:
    """An event count per step or capture, as people write it: ``1 event``, ``1,590 events``, ``2.5 events``
    (a mean over steps keeps one decimal below 100)."""
    text = f"{n:.1f}"
    if n >= 99.95 or text.endswith(".0"):
        text = f"{n:,.0f}"
    if not unit:
        return text
    return f"{text} event" if text == "1" else f"{text} events"


def _swap_statement(a: dict[str, Any], per: str) -> str:
    """One sentence for a kernel class whose work ran on other kernels in one capture: which kernels
    are new and gone, and the class's time per unit in both."""

    def names(syms: list[str]) -> str:
        short = [x[len("kernel:") :] for x in syms]
        return ", ".join(short[:2]) + (f" and {len(short) - 2} more" if len(short) > 2 else "")

    b, c, ratio = a["baseline_ns"], a["current_ns"], a["ratio"]
    if ratio is not None and 1 / 1.05 < ratio < 1.05:
        total = f"about the same time in all ({_ms(c)} {per} against {_ms(b)})"
    else:
        total = f"{_ms(c)} {per} in all against {_ms(b)}" + (f" ({ratio:.2f}x)" if ratio else "")
    return (
        f"{a['class']} kernels ran as other kernels: {names(a['new'])} new, {names(a['gone'])} gone; " + total
    )


def side_by_side(
    baseline: Any, current: Any, path: str | Any, *, step_patterns: Sequence[str] | None = None
) -> dict[str, Any]:
    """Write both captures into one Chrome trace (gzip when ``path`` ends in .gz) that opens in
    Perfetto, one above the other: the baseline's processes as they are, named ``baseline · NAME``,
    the current capture's below them, named ``current · NAME``, with their process ids and flow ids
    moved past the baseline's so that nothing of one joins the other, and their times shifted so that
    the two first steps (steps as in :func:`compare`; the first event where a capture has none) start
    together. Perfetto opens one trace at a time; this is the two runs on one timeline. (A file to
    look at: loaded back into teller, the two captures' GPUs of one number are one device.) Returns
    ``shift_us`` (how far the current capture's times moved: the baseline's first step's start less
    its own), ``pid_offset`` and ``events``."""
    import gzip
    import json
    import os
    import tempfile
    from pathlib import Path

    from teller._io import write_atomic
    from teller.trace import DEFAULT_STEP_PATTERNS

    patterns = list(step_patterns or DEFAULT_STEP_PATTERNS)

    def start_of(tr: Any) -> int:
        st = pattern_steps(tr, patterns)
        return min(s.start_ns for s in st) if st else int(np.min(tr.ts))

    # (each through teller's own writer, read back: the merge works on the events as written)
    with tempfile.TemporaryDirectory(prefix="teller-sbs-") as td:
        docs = []
        for k, tr in enumerate((baseline, current)):
            f = Path(td) / f"{k}.json"
            tr.to_chrome(f)
            with open(f, encoding="utf-8") as fh:
                docs.append(json.load(fh))
    b, c = docs
    bb, cb = int(b.get("baseTimeNanoseconds", 0)), int(c.get("baseTimeNanoseconds", 0))
    # (in the files' own terms: each writes its times relative to its own baseTimeNanoseconds)
    rel_us = ((start_of(baseline) - bb) - (start_of(current) - cb)) / 1e3
    shift_us = (start_of(baseline) - start_of(current)) / 1e3
    bev, cev = b["traceEvents"], c["traceEvents"]
    ints = [e["pid"] for e in bev if isinstance(e.get("pid"), int)]
    # (past every baseline pid, a round number so that the current pids stay readable: 100238)
    top = max(ints, default=0) + 1
    pid_off = 10 ** len(str(top))
    ids = [e["id"] for e in bev if isinstance(e.get("id"), int)]
    id_off = max(ids, default=0) + 1

    def moved(pid: Any) -> Any:
        return pid + pid_off if isinstance(pid, int) else f"current {pid}"

    def name_processes(evs: list[dict[str, Any]], label: str, sort_base: int) -> list[dict[str, Any]]:
        """Prefix the processes' names with ``label`` (a name for each that had none) and order them
        (Perfetto's ``process_sort_index``): the baseline's first."""
        named = set()
        out_m = []
        for e in evs:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                e["args"] = {"name": f"{label} · {(e.get('args') or {}).get('name', e['pid'])}"}
                named.add(e["pid"])
        pids = list(dict.fromkeys(e["pid"] for e in evs if "pid" in e))
        for k, p in enumerate(pids):
            if p not in named:
                out_m.append(
                    {
                        "ph": "M",
                        "name": "process_name",
                        "pid": p,
                        "tid": 0,
                        "args": {"name": f"{label} · {orig.get(p, p)}"},  # (its own pid, unmoved)
                    }
                )
            out_m.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": p,
                    "tid": 0,
                    "args": {"sort_index": sort_base + k},
                }
            )
        return out_m

    orig: dict[Any, Any] = {}
    for e in cev:
        if "pid" in e:
            orig[moved(e["pid"])] = e["pid"]
            e["pid"] = moved(e["pid"])
        if "ts" in e:
            e["ts"] = round(e["ts"] + rel_us, 3)
        if e.get("ph") in ("s", "t", "f") and "id" in e:
            e["id"] = e["id"] + id_off if isinstance(e["id"], int) else f"current {e['id']}"
    extra = name_processes(bev, "baseline", 0) + name_processes(cev, "current", 100_000)
    merged = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": bb,
        "deviceProperties": b.get("deviceProperties", []),
        "teller": {
            "side_by_side": {
                "baseline": b.get("teller", {}),
                "current": c.get("teller", {}),
                "shift_us": shift_us,
                "pid_offset": pid_off,
            }
        },
        "traceEvents": bev + cev + extra,
    }
    data = json.dumps(merged, separators=(",", ":")).encode()
    out = os.fspath(path)
    write_atomic(out, gzip.compress(data, 6, mtime=0) if out.lower().endswith(".gz") else data)
    return {"shift_us": shift_us, "pid_offset": pid_off, "events": len(baseline) + len(current)}
