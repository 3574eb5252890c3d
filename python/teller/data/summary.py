"""Per-symbol summaries of a trace relative to its own opening window: the "symbol tokens".

TPE tokens carry each chain's timing against corpus-wide statistics, which mostly measure the
workload (model size, GPU, batch) rather than a fault. What tells a fault apart is a *change*
within the capture: the same kernel or operator getting slower after some point, on one rank or on
all, or the engine idling between steps. So every base symbol present in a trace gets one summary
row comparing its events to the same symbol's events in the trace's opening window (the first
``baseline_frac`` of its time span, default 10 %):

| col | name | definition (x = ln(1 + dur_us)) |
|---:|---|---|
| 0 | ``count`` | number of events |
| 1 | ``median_log_dur`` | median x |
| 2 | ``max_dev`` | max of x - baseline (baseline: median x in the opening window, else over all) |
| 3 | ``q90_dev`` | 90th percentile of x - baseline |
| 4 | ``max_pid_dev`` | max over processes of the mean x - baseline after the opening window |
| 5 | ``pid_spread`` | max - min of those per-process means (one rank slow vs all) |
| 6 | ``rate_change`` | ln of (events per unit time after the window) / (in the window), each +1 |
| 7 | ``gap_dev`` | longest minus median inter-arrival of the symbol on one process (ln us): idling |
| 8 | ``work_slope`` | slope b of x on w (w = ln(1 + the step's ``num_tokens``)), clipped to [0, 1.2] |
| 9 | ``shift`` | load-normalized change: r = x - f_p(w) averaged per time bin (16 over the span); |
|   |           | the largest (by magnitude) mean(r in a window of >= 2 bins) - mean(r outside) |
| 10 | ``shift_z`` | ``shift`` / (standard deviation of r + 0.02) |
| 11 | ``shift_pid_spread`` | per process, mean r inside minus outside that window; max - min over processes |
| 12 | ``work_shift`` | the same window scan over the per-bin mean w: the load itself changed |
| 13 | ``rate_shift`` | the same scan over ln(1 + events per bin): the symbol came more or less often |
| 14 | ``xfer_median`` | collectives only: median over instances of the fastest rank's x (see below) |
| 15 | ``xfer_shift`` | the window scan (as ``shift``) over that fastest rank's x, load-normalized |
| 16 | ``xfer_shift_z`` | ``xfer_shift`` / (standard deviation of its residual + 0.02) |
| 17 | ``ref_dev`` | kernels: median residual of x against the deployment's reference (0: none) |
| 18 | ``ref_pid_max`` | the largest per-process median of those residuals (one GPU slow) |
| 19 | ``ref_cov`` | the share of the symbol's events that have a reference residual (0: none) |
| 20 | ``ref_fam_dev`` | column 17 pooled over the kernel's family in the capture (all GEMMs, ...) |
| 21 | ``ref_fam_pid_max`` | column 18 pooled likewise: the family's largest per-process median |
| 22 | ``ref_fam_shift`` | the window scan (as ``shift``) over the family's mean residual per time bin |
| 23 | ``xrank_shift`` | x against its peers on the other ranks (below); per process, the window scan over |
|   |                 | the median per time bin; the largest over the processes (0: one process) |
| 24 | ``xrank_group_shift`` | column 23 pooled over the row's group: every host event (annotation, |
|   |                       | operator, Python, runtime and driver calls) or every GPU event but collectives |

``f_p`` is a fit of x on w per *position*: the occurrence index of the symbol within its (process,
step). One kernel name runs several GEMM shapes per layer (QKV, output, up and down projections)
whose durations differ 2-4x at the same load; pooled under one slope, that spread buried a 5-15 %
slowdown, and each time bin's mix of shapes moved its mean. Per position the fit is a quadratic in w
(>= 5 distinct loads and >= 6 events: the roofline knee between memory-bound decode and
compute-bound prefill), a line (>= 2 and >= 3), or the mean; ``work_slope`` stays the pooled slope.
A symbol seen once per step, or in a single step (a trace without step ranges), keeps the pooled
line. Measured with the same probe (summary rows only, 1 638 training samples): gpu_throttle F1
0.27 -> 0.37 on test, 0.38 -> 0.59 on test_ood; accuracy 0.775 -> 0.789 and 0.754 -> 0.785
(shards version 5).

Columns 2-7 compare with the opening window, which is cheap and needs nothing but timestamps,
but the opening window is short (1-2 engine steps) and confounded with the load: a GEMM in a
35-token decode step and in a 6 656-token prefill step differ 100x without any fault. Columns 8-13
normalize by the work of the step each event belongs to (the ``num_tokens`` argument of the step's
range, as vLLM's engine-step annotation and teller's simulator record it; 0 where a trace has none,
and then they reduce to plain durations) and look for the window where the symbol changed most,
wherever it starts (a fault begins anywhere in the capture). Measured with a gradient-boosted
probe on ``default``: gpu_throttle F1 0.17 -> 0.47, test_ood accuracy 0.72 -> 0.80.

Columns 14-16 separate a collective's transfer from its waiting. An all-reduce kernel starts on
each rank when that rank launches it and ends on all ranks together, when the last has arrived and
the data has moved; so every rank but the last spends part of its kernel waiting, and the last
rank's kernel (the shortest) is the transfer. A slow link lengthens the transfer on every rank; a
rank that stalls on its host (a straggler, a CPU hiccup, or a benign pause in a normal run)
lengthens the *other* ranks' kernels and not the transfer. Columns 2-13 see both as "the
all-reduce got slower". An *instance* is one collective matched across ranks: the same occurrence
index within the same step (the k-th step of each process, in time order; collectives are issued
in the same order on every rank), kept where every rank has exactly one and their kernels end
together (within half the fastest one + 20 us: a rank whose capture started a step later is not
matched a step off); its transfer time is the minimum x over the ranks. Symbols whose every event
is a collective kernel (NCCL, vLLM's custom all-reduce: ``_COLLECTIVE``) on >= 2 processes with
>= 3 instances get ``xfer_median``, and with instances in >= 3 steps the scan; others 0.
Measured on ``default``'s val / test / test_ood (shards version 7), the largest ``|xfer_shift|``
of a sample: nvlink_degradation 10th percentile 0.60 / 0.42 / 0.55 (74 of 74 above 0.05, 73
above 0.2); every other class's 99th percentile 0.21 / 0.15 / 0.07, its max 0.30 / 0.19 / 0.17.

Columns 17-19 compare a kernel with the same deployment's other captures rather than with its own
capture (:mod:`teller.data.reference`: a fit per GPU, model, TP, kernel and position on the step's
load, fitted on training captures outside their fault windows; ``teller tokenize`` fits and
stores it). They are what a fault spanning most of a capture, or one that coincides with the load,
leaves: every column above compares within the capture and absorbs it. Columns 20-22 pool the
residuals of a kernel's whole family (:func:`teller.data.dataset.kernel_family`: ``gemm``,
``attention_prefill``, ``rms_norm``...; a kernel of no known family is its own) across the capture's
symbols. One GEMM name runs one shape, so a per-symbol row holds a few dozen events whose 2-4 %
slowdown under a mild power cap sits inside the row's spread; the median over every GEMM of a
capture separated ``gpu_throttle`` from ``normal`` with AUC 0.975 / 0.988 (val / test, shards
version 10; every normal test capture below 0.01). Column 22 finds a fault that covers part of the
capture (a throttle ramping in; pooled over the processes, so one GPU of several moves it less).
A capture of a deployment without a reference (an unseen GPU or model, no ``deviceProperties``)
reads 0 in all of 17-22, and
``teller tokenize`` leaves them 0 for a fixed 30 % of the training samples (``REF_HIDE_FRAC``) so
that a model learns to do without them.

Columns 23-24 compare each rank with its tensor-parallel peers, which run the same operators,
calls and kernels at the same load in every step: an event's *cross-rank residual* is its x minus
the median x of the same symbol at the same step ordinal and occurrence position on every process
that ran it (kept where >= 2 processes did; a single-process capture reads 0). A rank slower than
its peers during part of the capture (a straggler, a noisy neighbour on its GPU, one throttled GPU,
a stall on its host) moves them; a fault on every rank (a power cap, a slow link) does not. Per
time bin the median, not the mean: a benign GC pause on one rank is one event. Column 24 is what
tells a straggler (its kernels *and* its host slower: host x (1 + 0.3 s) in the simulator) from a
bandwidth neighbour on its GPU (kernels only): measured on ``default``'s TP >= 2 captures (shards
version 13), the host group's median is 0.079 for ``nccl_straggler`` and 0.029 for the bandwidth
``hbm_contention``, 0.033 for normal ones; the GPU group's 0.215, 0.105 and 0.015. Ranks are
matched by step ordinal only: captures must start at the same engine step on every rank.

A fault present from the first event (a misconfiguration) shows no change here; the absolute
columns (count, median) and the TPE tokens carry it. The per-event inputs are numpy; the loop over
symbols runs in the Rust core (``teller_core::symrows``), which mirrors :func:`symbol_summary_reference`
to the bit: a median 2.6 ms for a 3 000-event ``default`` trace (5.3 ms with reference residuals)
against 21.2 (26.8) ms for the numpy loop (``benches/bench_summary.py``). Before that, with numpy: ~7-11 ms
for a 3 200-event ``default`` trace (~100 symbols; a Python loop over symbols, measured on this
2-core box: version 4 7-10 ms, version 5 ~11 ms; on a slower machine of the same kind, the median
over 30 ``default`` traces of 3 600 events: version 6 37.0 ms, version 7 39.5 ms, the difference
being the collective columns; columns 23-24 add about 3 ms, 13.5 -> 16.8 ms over 60 ``default``
traces); ``teller tokenize`` stores them in the shards and
``teller diagnose`` recomputes them the way the checkpoint's shards had them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

SUMMARY_FEATURE_NAMES: tuple[str, ...] = (
    "count",
    "median_log_dur",
    "max_dev",
    "q90_dev",
    "max_pid_dev",
    "pid_spread",
    "rate_change",
    "gap_dev",
    "work_slope",
    "shift",
    "shift_z",
    "shift_pid_spread",
    "work_shift",
    "rate_shift",
    "xfer_median",
    "xfer_shift",
    "xfer_shift_z",
    "ref_dev",
    "ref_pid_max",
    "ref_cov",
    "ref_fam_dev",
    "ref_fam_pid_max",
    "ref_fam_shift",
    "xrank_shift",
    "xrank_group_shift",
)
# collective kernels (their symbol, ``kernel:`` + the normalized name): NCCL's and vLLM's custom
# all-reduce (``cross_device_reduce_1stage/2stage``)
_COLLECTIVE = re.compile(
    r"^kernel:.*(nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)", re.I
)


def collective_events(tr: Any) -> np.ndarray:
    """Per event of ``tr``, whether it is a collective kernel (its symbol matches ``_COLLECTIVE``;
    an event without a symbol is not)."""
    coll_sym = np.array([bool(_COLLECTIVE.match(nm)) for nm in tr.symbols] + [False])
    return coll_sym[np.asarray(tr.symbol, dtype=np.int64)]


N_BINS = 16  # time bins of the window scan (about one per engine step at the default capture length)
N_SUMMARY_FEATURES = len(SUMMARY_FEATURE_NAMES)


def _step_arg(tr: Any, keys: tuple[str, ...]) -> np.ndarray:
    """Per event, ln(1 + the first of ``keys`` its step's range records); 0 where the step records
    none of them (or not a finite number) or the event has no step. Kept on a :class:`teller.trace.Trace`
    (read-only): a sample's encoding asks for it four or five times, each a Python loop over steps."""
    cache = getattr(tr, "__dict__", None)
    key = ("_step_arg", keys)
    if cache is not None and key in cache:
        return cache[key]
    out = _step_arg_uncached(tr, keys)
    if cache is not None:
        out.flags.writeable = False
        cache[key] = out
    return out


def _step_arg_uncached(tr: Any, keys: tuple[str, ...]) -> np.ndarray:
    steps = tr.steps()
    w = np.zeros(len(steps) + 1)
    for s in steps:
        if s.event >= 0:
            a = tr.args(s.event)
            v = next((a[k] for k in keys if k in a), None)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
                w[s.index] = np.log1p(max(float(v), 0.0))
    st = np.asarray(tr.step, dtype=np.int64)
    st = np.where((st >= 0) & (st < len(steps)), st, len(steps))
    return w[st]


def step_work(tr: Any) -> np.ndarray:
    """Per event, ln(1 + ``num_tokens``) of its step's range (``num_seqs`` for a range that records
    no token count, a coarser measure of the same load; 0 where the step has neither or the event
    has no step). Read-only, shared by every caller of the same trace (kept on it: ``_step_arg``)."""
    return _step_arg(tr, ("num_tokens", "num_seqs"))


def step_seqs(tr: Any) -> np.ndarray:
    """Per event, ln(1 + ``num_seqs``) of its step's range: the batch's sequence count, what the
    sampling kernels (one row per sequence) scale with; 0 where the step records none. Read-only,
    shared like :func:`step_work`'s."""
    return _step_arg(tr, ("num_seqs",))


def step_ordinal(tr: Any) -> np.ndarray:
    """Per event, the ordinal of its step among its step's process's steps in time order (-1 for
    an event outside every step): the k-th engine step of rank 0 and of rank 1 are the same step,
    while a merged trace numbers each process's step ranges apart."""
    steps = tr.steps()
    ordn = np.full(len(steps) + 1, -1, np.int64)
    if steps:
        sp = np.array([s.pid for s in steps], np.int64)
        t = np.array([s.start_ns for s in steps], np.int64)
        ix = np.array([s.index for s in steps], np.int64)
        o = np.lexsort((ix, t, sp))
        new = np.r_[True, sp[o][1:] != sp[o][:-1]]
        first = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
        ordn[ix[o]] = np.arange(len(o)) - first
    st = np.asarray(tr.step, dtype=np.int64)
    return ordn[np.where((st >= 0) & (st < len(steps)), st, len(steps))]


def _token_events(events: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per TPE token (``offsets`` into the encoding's base positions, ``events`` their trace event
    or -1 for ``<close>``), the trace event of its first base position; a ``<close>`` token takes the
    previous token's (-1 at the start: no event)."""
    ev = np.asarray(events, np.int64)
    o = np.asarray(offsets, np.int64)
    if len(o) < 2:
        return np.zeros(0, np.int64)
    first = ev[o[:-1]]
    last = np.maximum.accumulate(np.where(first >= 0, np.arange(len(first)), -1))
    return np.where(last >= 0, first[np.maximum(last, 0)], -1)


def token_work(tr: Any, events: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per TPE token, the :func:`step_work` of its first event (:func:`_token_events`; 0 for a
    leading ``<close>``). ``float32 [tokens]``: the shards' ``token_work``."""
    e = _token_events(events, offsets)
    w_ev = step_work(tr)
    if len(w_ev) == 0:
        return np.zeros(len(e), np.float32)
    return np.where(e >= 0, w_ev[np.maximum(e, 0)], 0.0).astype(np.float32)


N_PROC_LOG_FEATURES = 2
# a vLLM log line's level and its process prefix: "ERROR 12-18 08:01:44 [core.py:526] (VllmWorker
# rank=1 pid=44660) ..." (generator versions before 7), or the prefix first, "(Worker_TP1
# pid=44660) ERROR ..." (vLLM's stdout decorator), possibly coloured; a traceback line with neither
# level nor prefix is not counted (vLLM's formatter gives each line of a logged traceback its
# record's header, and so its level)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEVEL_PID = re.compile(r"^(WARNING|ERROR|CRITICAL)\b[^(]*\([^)]*\bpid=(\d+)\)")
_PID_LEVEL = re.compile(r"^\([^)]*\bpid=(\d+)\)\s+(WARNING|ERROR|CRITICAL)\b")
# any other line of a process (INFO, DEBUG, a print): it ends the record before it
_ANY_PID = re.compile(r"^(?:\([^)]*\bpid=(\d+)\)|[A-Z]+\b[^(]*\([^)]*\bpid=(\d+)\))")


def process_log_levels(lines: Any, *, records: bool = True) -> dict[int, tuple[int, int]]:
    """Per OS pid, the number of ``(ERROR or CRITICAL, WARNING)`` log records whose process prefix
    names it. ``lines``: ``teller.data.tokenize.parse_log`` tuples ``(ts, stream, text)``.

    A record, not a line: vLLM's formatter gives each line of a logged traceback its record's
    header, so a line count weighs a 9-line traceback 9 times a one-line warning, and the engine
    core's own record of a worker's error nearly as much as the worker's. A line continues a record
    when its header (the text up to its ``]``: prefix, level, time to the second, source) is the
    header of the line its process wrote before it (any other line of the process, INFO included,
    ends a record). Consecutive one-line records of one source and level in one second read as one
    (a record's lines and such records look the same); the count is a log1p'd feature, not a tally.
    Shards version 15; before, lines (``records=False``: what a checkpoint trained on older shards
    was shown)."""
    out: dict[int, list[int]] = {}
    last: dict[int, str] = {}
    for _ts, _stream, text in lines:
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        m = _LEVEL_PID.match(text)
        if m:
            level, pid = m.group(1), m.group(2)
        else:
            m = _PID_LEVEL.match(text)
            if not m:
                if records and last and (m := _ANY_PID.match(text)):
                    last.pop(int(m.group(1) or m.group(2)), None)
                continue
            pid, level = m.group(1), m.group(2)
        p = int(pid)
        head = text[: text.find("]") + 1]
        if records and head and last.get(p) == head:
            continue
        last[p] = head
        c = out.setdefault(p, [0, 0])
        c[0 if level != "WARNING" else 1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def token_process_log(
    tr: Any, events: np.ndarray, offsets: np.ndarray, levels: dict[int, tuple[int, int]]
) -> np.ndarray:
    """Per TPE token, ``log1p`` of the error and warning records of the process its first event ran in
    (:func:`process_log_levels`; a GPU activity belongs to the process of its launching call, a
    ``<close>`` token to the previous token's): the cross-layer link from a log line that names
    ``(Worker_TP1 pid=44660)`` to that worker's ranges in the trace. An out-of-memory crash
    on rank 1 is otherwise one more step chain among the ranks'. ``float32 [tokens, 2]``; the shards'
    ``token_proc_log``."""
    e = _token_events(events, offsets)
    out = np.zeros((len(e), N_PROC_LOG_FEATURES), np.float32)
    if not levels or not len(tr) or not len(e):
        return out
    pid = np.asarray(tr.pid, np.int64)
    link = np.asarray(tr.link, np.int64)
    dev = np.asarray(getattr(tr, "device", np.full(len(pid), -1)), np.int64)
    # a GPU activity belongs to its launching call's process; an unlinked one to none (its "pid" is
    # the device index, which a log line's pid=0 or pid=1 must not match)
    owner = np.where(link >= 0, pid[np.clip(link, 0, len(pid) - 1)], np.where(dev >= 0, -1, pid))
    p = np.where(e >= 0, owner[np.maximum(e, 0)], -1)
    for q in np.unique(p[p >= 0]):  # a handful of processes
        if int(q) in levels:
            out[p == q] = np.log1p(levels[int(q)])
    return out


N_GPU_TIME_FEATURES = 3


def token_gpu_time(tr: Any, events: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per TPE token, ``ln(1 + us)`` of the time of its kernels outside collectives, and of its
    collective kernels (``_COLLECTIVE``), and the collectives' share of the two (0 without kernel
    time; a ratio, so it reads the same on a faster or slower GPU). A token is often a whole step of
    one rank, and its TPE features mix the two: a straggler rank's steps hold long compute and
    short all-reduces, its peers' the reverse (their all-reduce waits for it), and the largest
    z-score of a step sits in the peers' waits. ``float32 [tokens, 3]``; the shards' ``token_gpu``."""
    from teller.trace import LAYER_NAMES

    ev = np.asarray(events, np.int64)
    o = np.asarray(offsets, np.int64)
    t = max(len(o) - 1, 0)
    out = np.zeros((t, N_GPU_TIME_FEATURES), np.float32)
    if not t or not len(tr) or not len(ev):
        return out
    kern = np.asarray(tr.layer) == LAYER_NAMES.index("kernel")
    coll = collective_events(tr)
    us = np.maximum(np.asarray(tr.dur, np.float64), 0.0) / 1000.0
    at = np.maximum(ev, 0)
    tot = []
    for col, sel in enumerate((kern & ~coll, kern & coll)):
        per_pos = np.where(ev >= 0, np.where(sel, us, 0.0)[at], 0.0)  # (<close>: no event)
        c = np.concatenate([[0.0], np.cumsum(per_pos)])
        tot.append(np.maximum(c[o[1:]] - c[o[:-1]], 0.0))
        out[:, col] = np.log1p(tot[-1])
    both = tot[0] + tot[1]
    out[:, 2] = np.where(both > 0, tot[1] / np.where(both > 0, both, 1.0), 0.0)
    return out


@lru_cache(maxsize=N_BINS + 1)
def _windows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) of every window of >= 2 contiguous bins out of ``n`` that leaves at
    least 2 bins outside and does not hold the first bin (the opening is always on the reference
    side, so a change and its complement are one window, with the sign saying which way)."""
    i, j = np.triu_indices(n + 1, k=2)
    keep = ((j - i) <= n - 2) & (i >= 1)
    return i[keep], j[keep]


def window_scan(v: np.ndarray) -> tuple[float, int, int]:
    """``(d, i, j)``: over the windows ``v[i:j]`` of :func:`_windows`, the difference mean(inside) -
    mean(outside) of largest magnitude (the first on ties), or ``(0, 0, 0)`` for fewer than 4
    values."""
    n = len(v)
    if n < 4:
        return 0.0, 0, 0
    i, j = _windows(n)
    c = np.concatenate([[0.0], np.cumsum(v, dtype=np.float64)])
    s_in = c[j] - c[i]
    d = s_in / (j - i) - (c[-1] - s_in) / (n - (j - i))
    k = int(np.argmax(np.abs(d)))
    return float(d[k]), int(i[k]), int(j[k])


# layers whose events a rank's host runs, and its GPU (teller.trace layer names)
_HOST_LAYERS = ("annotation", "host_op", "python", "runtime", "driver")
_GPU_LAYERS = ("kernel", "memcpy", "memset")


def _group_medians(g: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(groups, median of v per group, count per group)`` for integer group labels ``g``."""
    o = np.lexsort((v, g))
    gs, vs = g[o], v[o]
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    cnt = np.diff(np.r_[starts, len(gs)])
    lo, hi = starts + (cnt - 1) // 2, starts + cnt // 2
    return gs[starts], 0.5 * (vs[lo] + vs[hi]), cnt


def cross_rank_residuals(tr: Any, x: np.ndarray, sord: np.ndarray) -> np.ndarray:
    """Per event, ``x`` minus the median ``x`` of its peers: the events of the same symbol at the
    same step ordinal (``sord``, :func:`step_ordinal`) and the same occurrence index within their
    process's (step, symbol), one per process that ran it. NaN outside every step and where fewer
    than two processes ran it (a single-process capture, a rank whose capture missed the step)."""
    n = len(x)
    r = np.full(n, np.nan)
    ok = sord >= 0
    if not ok.any():
        return r
    idx = np.flatnonzero(ok)
    sym = np.asarray(tr.symbol, dtype=np.int64)[idx]
    pid = np.asarray(tr.pid, dtype=np.int64)[idx]
    st = sord[idx]
    ts = np.asarray(tr.ts, dtype=np.int64)[idx]
    o = np.lexsort((ts, pid, st, sym))
    sy, p, s2 = sym[o], pid[o], st[o]
    new = np.r_[True, (sy[1:] != sy[:-1]) | (s2[1:] != s2[:-1]) | (p[1:] != p[:-1])]
    start = np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
    pos = np.arange(len(o)) - start
    g = (sy * (int(s2.max()) + 1) + s2) * (int(pos.max()) + 1) + pos  # (one integer per group)
    # one event per (group, process) by construction: the count of a group is its processes
    ug, med, cnt = _group_medians(g, x[idx][o])
    at = np.searchsorted(ug, g)
    keep = cnt[at] >= 2
    r[idx[o][keep]] = x[idx][o][keep] - med[at][keep]
    return r


def _rank_shift(r: np.ndarray, pid: np.ndarray, tbin: np.ndarray) -> float:
    """Per process, :func:`window_scan` over the median cross-rank residual ``r`` of each time bin
    that holds its events (>= 4 such bins); the largest over the processes (0: no residuals)."""
    ok = np.isfinite(r)
    if not ok.any():
        return 0.0
    p, b = pid[ok], tbin[ok]
    key, med, _ = _group_medians(p * N_BINS + b, r[ok])
    kp = key // N_BINS
    best = None
    for q in np.unique(kp):
        v = med[kp == q]  # (its bins in time order: keys sort by bin within a process)
        if len(v) >= 4:
            d = window_scan(v)[0]
            best = d if best is None else max(best, d)
    return 0.0 if best is None else float(best)


def symbol_summary(
    tr: Any,
    tok: Any,
    baseline_frac: float = 0.1,
    by_position: bool = True,
    ref_resid: np.ndarray | None = None,
    *,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, features)``: the TPE base id of each symbol present in ``tr`` (sorted by id; symbols
    unknown to ``tok`` are pooled into their layer's ``[UNK]`` row) and its summary row
    (``float32 [S, N_SUMMARY_FEATURES]``). ``ref_resid``: per event, its residual against the
    deployment's kernel reference (NaN: none; :func:`teller.data.reference.event_residuals`), for
    columns 17-22; None leaves them 0. ``dtype``: of the rows (float64: before the cast, as the
    tests compare them).

    The per-event inputs are numpy (:func:`_event_inputs`); the loop over symbols runs in the Rust
    core (``teller_core::symrows``, with the GIL released): as a numpy loop it cost ~30 calls per
    symbol, 20-35 ms of a ``default`` trace, the larger part of a ``teller diagnose`` call.
    :func:`symbol_summary_reference` is the same loop in numpy, the readable definition and the
    tests' oracle."""
    from teller import _native

    if len(tr) == 0:
        return np.zeros(0, np.uint32), np.zeros((0, N_SUMMARY_FEATURES), dtype)
    e = _event_inputs(tr, tok, baseline_frac, ref_resid)
    fam_stats = None
    if e["fam"] is not None:
        n_fam = int(e["fam"].max()) + 1 if len(e["fam"]) else 0
        fam_stats = np.full((n_fam, 3), np.nan)
        for f, v in e["fam_stats"].items():
            fam_stats[f] = v
        fam_stats = fam_stats.ravel()

    def c(k: str, dt: Any) -> np.ndarray:
        return np.ascontiguousarray(e[k], dtype=dt)

    ids, rows = _native.symbol_rows(
        c("sid", np.int64),
        c("ts", np.int64),
        c("end", np.int64),
        c("pid", np.int64),
        c("x", np.float64),
        c("ex", np.float64),
        c("gap", np.float64),
        c("early", bool),
        c("w", np.float64),
        c("tbin", np.int64),
        c("step", np.int64),
        c("coll", bool),
        None if e["sord"] is None else c("sord", np.int64),
        c("xr", np.float64),
        c("host", bool),
        c("gpu", bool),
        float(e["host_shift"]),
        float(e["gpu_shift"]),
        None if ref_resid is None else np.ascontiguousarray(ref_resid, dtype=np.float64),
        None if e["fam"] is None else c("fam", np.int64),
        fam_stats,
        # numpy's log1p of the bin counts (its SIMD log1p and libm's differ by an ulp on some
        # integers, and column 13's windows over counts tie)
        np.log1p(np.arange(int(np.unique(e["sid"], return_counts=True)[1].max()) + 1, dtype=np.float64)),
        float(baseline_frac),
        bool(by_position),
    )
    rows = rows.reshape(-1, N_SUMMARY_FEATURES)
    # column 6 here, with numpy's logarithm (the Rust loop computes no transcendental function)
    u, c = np.unique(e["sid"][e["early"]], return_counts=True)
    n_early = np.zeros(len(ids))
    n_early[np.searchsorted(ids, u)] = c
    n_late = rows[:, 0] - n_early
    rows[:, 6] = np.log((n_late + 1) / max(1 - baseline_frac, 1e-9)) - np.log((n_early + 1) / baseline_frac)
    return ids.astype(np.uint32), rows.astype(dtype)


def _event_inputs(tr: Any, tok: Any, baseline_frac: float, ref_resid: np.ndarray | None) -> dict[str, Any]:
    """The per-event arrays the loop over symbols reads (vectorized numpy), and the two shared
    cross-rank shifts and the family statistics (columns 24 and 20-22)."""
    names = tr.symbols
    base = tok.symbol_ids(names).astype(np.int64)  # trace symbol id -> TPE base id
    sid = base[np.asarray(tr.symbol, dtype=np.int64)]
    ts = np.asarray(tr.ts, dtype=np.int64)
    dur = np.asarray(tr.dur, dtype=np.float64)
    end = ts + np.maximum(dur, 0).astype(np.int64)
    pid = np.asarray(tr.pid, dtype=np.int64)
    x = np.log1p(np.maximum(dur, 0.0) / 1000.0)
    t0, t1 = int(ts.min()), int(end.max())
    span = max(t1 - t0, 1)
    cut = t0 + baseline_frac * span
    tbin = np.minimum(((ts - t0) * (N_BINS / span)).astype(np.int64), N_BINS - 1)
    coll = collective_events(tr)
    sord_all = step_ordinal(tr)
    xr = cross_rank_residuals(tr, x, sord_all)
    host = np.asarray(tr.layer_mask(*_HOST_LAYERS), bool)
    gpu = np.asarray(tr.layer_mask(*_GPU_LAYERS), bool)
    gm = gpu & ~coll  # (the peers of a slow rank wait in the collectives: longer there, not slower)
    # per event, the gap since the previous event of its symbol on its process (NaN: none), in the
    # order of the loop over symbols (symbol, process, time)
    o = np.lexsort((ts, pid, sid))
    gap = np.full(len(ts), np.nan)
    same = (sid[o][1:] == sid[o][:-1]) & (pid[o][1:] == pid[o][:-1])
    gap[o[1:][same]] = np.log1p(np.maximum(np.diff(ts[o])[same], 0) / 1000.0)
    fam = fam_stats = None
    if ref_resid is not None:
        fam = _event_family(tr)
        fam_stats = _family_reference(fam, ref_resid, pid, tbin)
    return {
        "sid": sid,
        "ts": ts,
        "end": end,
        "pid": pid,
        "x": x,
        "ex": np.expm1(x),
        "gap": gap,
        "early": ts < cut,
        "w": np.ascontiguousarray(step_work(tr), dtype=np.float64),
        "tbin": tbin,
        "step": np.asarray(tr.step, dtype=np.int64),
        "coll": np.ascontiguousarray(coll, dtype=bool),
        "sord": sord_all if coll.any() else None,
        "xr": xr,
        "host": host,
        "gpu": gpu,
        "host_shift": _rank_shift(xr[host], pid[host], tbin[host]),
        "gpu_shift": _rank_shift(xr[gm], pid[gm], tbin[gm]),
        "fam": fam,
        "fam_stats": fam_stats,
    }


def symbol_summary_reference(
    tr: Any,
    tok: Any,
    baseline_frac: float = 0.1,
    by_position: bool = True,
    ref_resid: np.ndarray | None = None,
    *,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`symbol_summary` with the loop over symbols in numpy: the definition of every column
    (``teller_core::symrows`` mirrors it function by function) and the oracle the tests hold the
    Rust loop to. ~20-35 ms per ``default`` trace."""
    if len(tr) == 0:
        return np.zeros(0, np.uint32), np.zeros((0, N_SUMMARY_FEATURES), dtype)
    e = _event_inputs(tr, tok, baseline_frac, ref_resid)
    sid, ts, end, pid, x, w, tbin, step = (
        e[k] for k in ("sid", "ts", "end", "pid", "x", "w", "tbin", "step")
    )
    early_all, coll, sord, xr, host, gpu = (e[k] for k in ("early", "coll", "sord", "xr", "host", "gpu"))
    fam, fam_stats = e["fam"], e["fam_stats"]
    order = np.lexsort((ts, pid, sid))  # by symbol, then process, then time
    s_sorted = sid[order]
    bounds = np.flatnonzero(np.diff(s_sorted)) + 1
    groups = np.split(order, bounds)
    ids = np.empty(len(groups), np.uint32)
    out = np.zeros((len(groups), N_SUMMARY_FEATURES), np.float64)
    for g, idx in enumerate(groups):
        ids[g] = sid[idx[0]]
        xs = x[idx]
        early = early_all[idx]
        late = ~early
        med = float(np.median(xs))
        baseline = float(np.median(xs[early])) if early.any() else med
        d = xs - baseline
        out[g, 0] = len(idx)
        out[g, 1] = med
        out[g, 2] = d.max()
        out[g, 3] = np.quantile(d, 0.9)
        if late.any():
            pp = pid[idx][late]
            dl = d[late]
            up, inv = np.unique(pp, return_inverse=True)
            means = np.bincount(inv, weights=dl) / np.bincount(inv)
            out[g, 4] = means.max()
            out[g, 5] = means.max() - means.min()
        n_early, n_late = int(early.sum()), int(late.sum())
        out[g, 6] = np.log((n_late + 1) / max(1 - baseline_frac, 1e-9)) - np.log(
            (n_early + 1) / baseline_frac
        )
        # inter-arrival on the same process (idx is sorted by process, then time)
        p = pid[idx]
        same = p[1:] == p[:-1]
        if same.any():
            gap = np.log1p(np.maximum(ts[idx][1:] - ts[idx][:-1], 0) / 1000.0)[same]
            out[g, 7] = float(gap.max() - np.median(gap))
        transfer = sord is not None and coll[idx].all()
        pos_all = _positions(pid[idx], step[idx]) if by_position or transfer else None
        pos = pos_all if by_position and _positions_recur(pos_all, step[idx]) else None
        _work_normalized(out[g], xs, w[idx], tbin[idx], pid[idx], pos)
        if transfer:
            _transfer(out[g], xs, w[idx], tbin[idx], pid[idx], sord[idx], pos_all, end[idx] / 1000.0)
        out[g, 23] = _rank_shift(xr[idx], pid[idx], tbin[idx])
        out[g, 24] = e["host_shift"] if host[idx[0]] else e["gpu_shift"] if gpu[idx[0]] else 0.0
        if ref_resid is not None:
            _reference_columns(out[g], ref_resid[idx], pid[idx])
            if out[g, 19] > 0:  # a kernel with residuals: its family's pooled columns
                fr = ref_resid[idx]
                f = int(np.bincount(fam[idx][np.isfinite(fr)]).argmax())  # the family of most of them
                out[g, 20:23] = fam_stats[f]
    return ids, out.astype(dtype)


def _event_family(tr: Any) -> np.ndarray:
    """Per event, an integer family code: one per :func:`teller.data.dataset.kernel_family` name,
    and one per symbol for the names of no known family (``other``, host events)."""
    from teller.data.dataset import kernel_family  # noqa: PLC0415 (the simulator's module)

    names = tr.strings
    name_col = np.asarray(tr.name, dtype=np.int64)
    sym_col = np.asarray(tr.symbol, dtype=np.int64)
    uniq, first = np.unique(name_col, return_index=True)
    codes: dict[str, int] = {}
    code_of_name = np.empty(len(uniq), np.int64)
    for k, u in enumerate(uniq):
        f = kernel_family(names[int(u)])
        key = f if f != "other" else f"sym:{int(sym_col[first[k]])}"
        code_of_name[k] = codes.setdefault(key, len(codes))
    return code_of_name[np.searchsorted(uniq, name_col)]


def _family_reference(
    fam: np.ndarray, r: np.ndarray, pid: np.ndarray, tbin: np.ndarray
) -> dict[int, np.ndarray]:
    """Columns 20-22 of each family code that has reference residuals ``r`` (NaN: none)."""
    ok = np.isfinite(r)
    out: dict[int, np.ndarray] = {}
    for f in np.unique(fam[ok]):
        m = ok & (fam == f)
        rf, pf, bf = r[m], pid[m], tbin[m]
        med = float(np.median(rf))
        pmax = max(float(np.median(rf[pf == p])) for p in np.unique(pf))
        cnt = np.bincount(bf, minlength=N_BINS)
        tot = np.bincount(bf, weights=rf, minlength=N_BINS)
        have = cnt > 0
        # over the bins that hold the family's events, as column 9 (a filler value for the empty
        # ones would read as a change wherever the family's mean and the filler differ)
        shift = window_scan(tot[have] / cnt[have])[0] if have.sum() >= 4 else 0.0
        out[int(f)] = np.array([med, pmax, shift])
    return out


def _reference_columns(row: np.ndarray, r: np.ndarray, pid: np.ndarray) -> None:
    """Columns 17-19 of one symbol's row from its events' reference residuals ``r`` (NaN: none)."""
    ok = np.isfinite(r)
    if not ok.any():
        return
    rk, pk = r[ok], pid[ok]
    row[17] = float(np.median(rk))
    row[18] = max(float(np.median(rk[pk == p])) for p in np.unique(pk))
    row[19] = float(ok.mean())


def summary_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """:func:`symbol_summary` keyword arguments that rebuild the summaries a model was trained on,
    from its saved configuration's ``shards_version`` (recorded since shards version 5; a checkpoint
    without it was trained on version <= 4: one pooled line per symbol)."""
    return {"by_position": int(cfg.get("shards_version") or 4) >= 5}


def load_slope(x: np.ndarray, w: np.ndarray) -> float:
    """Least-squares slope of log durations ``x`` on the load ``w``, clipped to [0, 1.2] (a kernel
    does not get faster with more work, nor much worse than linearly); 0 without load variation."""
    vw = float(np.var(w))
    if vw <= 1e-9:
        return 0.0
    return float(np.clip(np.mean((w - np.mean(w)) * (x - np.mean(x))) / vw, 0.0, 1.2))


def _positions(pid: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per event of one symbol (sorted by process, then time), its occurrence index within its run
    of (process, step): the 2nd GEMM of a step is the output projection, the 1st the QKV
    projection. Events outside every step (step -1) are numbered within their own runs. (Runs, not
    groups: events of two steps that interleave on one process, several threads in one process,
    restart the count at each switch; the simulator's and vLLM's step ranges do not interleave per
    process.)"""
    n = len(pid)
    if n == 0:
        return np.zeros(0, np.int64)
    new = np.r_[True, (pid[1:] != pid[:-1]) | (step[1:] != step[:-1])]
    start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    return np.arange(n) - start


def _positions_recur(pos: np.ndarray, step: np.ndarray, min_steps: int = 2) -> bool:
    """Whether a per-position fit applies: the symbol occurs more than once in some step, and in
    at least ``min_steps`` distinct steps. A trace without step ranges (one ``<whole trace>`` step)
    would number every event of a process anew and leave one event per position, so it keeps the
    pooled line, as does a symbol seen once per step (all at position 0)."""
    if len(pos) == 0 or not (pos > 0).any():
        return False
    return len(np.unique(step[step >= 0])) >= min_steps


def _position_residual(x: np.ndarray, w: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, float]:
    """Residual of x after a least-squares fit on the load per position (a quadratic in w where the
    position has >= 5 distinct loads and >= 6 events, a line with >= 2 and >= 3, else its mean), and
    the pooled slope (reported as ``work_slope``). All positions at once: the normal equations from
    per-position sums (w centred per position), solved as one batch of 3 x 3 systems; a per-position
    ``np.polyfit`` loop cost ~6 ms per 3 000-event trace."""
    up, inv = np.unique(pos, return_inverse=True)
    k = len(up)
    cnt = np.bincount(inv, minlength=k).astype(np.float64)
    wq = np.round(w * 100).astype(np.int64)
    o = np.lexsort((wq, inv))
    new = np.r_[True, (inv[o][1:] != inv[o][:-1]) | (wq[o][1:] != wq[o][:-1])]
    nd = np.bincount(inv[o][new], minlength=k)
    deg = np.where((nd >= 5) & (cnt >= 6), 2, np.where((nd >= 2) & (cnt >= 3), 1, 0))
    u = w - (np.bincount(inv, weights=w, minlength=k) / cnt)[inv]
    u2 = u * u
    pw = [np.ones_like(u), u, u2, u2 * u, u2 * u2]
    s = np.stack([np.bincount(inv, weights=q, minlength=k) for q in pw], 1)  # [k, 5]
    t = np.stack([np.bincount(inv, weights=x * q, minlength=k) for q in pw[:3]], 1)  # [k, 3]
    a = np.stack([s[:, i : i + 3] for i in range(3)], 1)  # a[g, i, j] = sum u^(i+j)
    used = np.arange(3)[None, :] <= deg[:, None]  # [k, 3]: coefficients fitted per position
    m = used[:, :, None] & used[:, None, :]
    a = np.where(m, a, np.eye(3)[None])
    a += 1e-12 * np.eye(3)[None] * np.maximum(s[:, :1, None], 1.0)  # keeps a near-tie solvable
    coef = _solve3(a, np.where(used, t, 0.0))
    fit = coef[inv, 0] + coef[inv, 1] * u + coef[inv, 2] * u * u
    return x - fit, load_slope(x, w)


def _solve3(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solves a batch of 3 x 3 systems ``a[g] x = b[g]`` by Gaussian elimination with partial
    pivoting (the first largest pivot): the arithmetic ``teller_core::symrows`` does per system, so
    that the two agree to the bit (np.linalg.solve's LAPACK orders its operations otherwise)."""
    a = a.astype(np.float64, copy=True)
    b = b.astype(np.float64, copy=True)
    g = np.arange(len(a))
    for c in range(3):
        p = c + np.argmax(np.abs(a[:, c:, c]), axis=1)  # (the first largest)
        a[g, c], a[g, p] = a[g, p].copy(), a[g, c].copy()
        b[g, c], b[g, p] = b[g, p].copy(), b[g, c].copy()
        for r in range(c + 1, 3):
            f = a[:, r, c] / a[:, c, c]
            for k in range(c, 3):
                a[:, r, k] -= f * a[:, c, k]
            b[:, r] -= f * b[:, c]
    x = np.zeros_like(b)
    for c in (2, 1, 0):
        s = b[:, c].copy()
        for k in range(c + 1, 3):
            s -= a[:, c, k] * x[:, k]
        x[:, c] = s / a[:, c, c]
    return x


def _work_normalized(
    row: np.ndarray,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    pid: np.ndarray,
    pos: np.ndarray | None = None,
) -> None:
    """Columns 8-13 of one symbol's row (x: log durations, w: step work, b: time bin, pid)."""
    if pos is not None:
        r, slope = _position_residual(x, w, pos)
    else:
        slope = load_slope(x, w)
        r = x - slope * w
    cnt = np.bincount(b, minlength=N_BINS)
    occ = cnt > 0
    per_bin = np.bincount(b, weights=r, minlength=N_BINS)[occ] / cnt[occ]
    shift, i, j = window_scan(per_bin)
    row[8] = slope
    row[9] = shift
    row[10] = shift / (float(r.std()) + 0.02)
    if j > i:
        bins = np.flatnonzero(occ)
        inside = (b >= bins[i]) & (b <= bins[j - 1])
        up, inv = np.unique(pid, return_inverse=True)
        if len(up) > 1:
            k = len(up)
            n_in = np.bincount(inv[inside], minlength=k)
            n_out = np.bincount(inv[~inside], minlength=k)
            both = (n_in > 0) & (n_out > 0)
            if both.sum() > 1:
                m_in = np.bincount(inv[inside], weights=r[inside], minlength=k)[both] / n_in[both]
                m_out = np.bincount(inv[~inside], weights=r[~inside], minlength=k)[both] / n_out[both]
                d = m_in - m_out
                row[11] = float(d.max() - d.min())
    per_bin_w = np.bincount(b, weights=w, minlength=N_BINS)[occ] / cnt[occ]
    row[12] = window_scan(per_bin_w)[0]
    row[13] = window_scan(np.log1p(cnt.astype(np.float64)))[0]


def _transfer(
    row: np.ndarray,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    pid: np.ndarray,
    sord: np.ndarray,
    pos: np.ndarray,
    end_us: np.ndarray | None = None,
    min_instances: int = 3,
) -> None:
    """Columns 14-16 of a collective symbol's row: its instances across ranks (same step ordinal
    ``sord``, same position ``pos``; one event on every process), each one's fastest rank's x, its
    median, and the load-normalized window scan of it. An instance whose kernels do not end
    together (``end_us`` spread over half its fastest kernel + 20 us) is not one collective (a
    rank whose capture started a step later) and is left out. Left 0 on fewer than 2 processes or
    ``min_instances`` instances; the scan (15-16) needs instances in >= 3 steps, and fits per
    position where a position has >= 3 instances (the median over positions; else the pooled
    line: a large all-reduce in two prefill steps has two instances per position, whose mean
    would leave the two steps' load difference in the residuals)."""
    n_proc = len(np.unique(pid))
    ok = sord >= 0
    if n_proc < 2 or ok.sum() < n_proc * min_instances:
        return
    key = sord[ok] * (int(pos.max()) + 1) + pos[ok]
    p = pid[ok]
    o = np.lexsort((p, key))  # by instance, then process
    k, po = key[o], p[o]
    starts = np.r_[0, np.flatnonzero(np.diff(k)) + 1]
    size = np.diff(np.r_[starts, len(k)])
    new_proc = np.r_[True, (k[1:] != k[:-1]) | (po[1:] != po[:-1])]
    full = (size == n_proc) & (np.add.reduceat(new_proc.astype(np.int64), starts) == n_proc)
    xo = x[ok][o]
    xm = np.minimum.reduceat(xo, starts)
    if end_us is not None:
        eo = end_us[ok][o]
        spread = np.maximum.reduceat(eo, starts) - np.minimum.reduceat(eo, starts)
        full &= spread <= 0.5 * np.expm1(xm) + 20.0
    if full.sum() < min_instances:
        return
    xm = xm[full]
    wm = np.maximum.reduceat(w[ok][o], starts)[full]  # (the step's load, recorded on some ranks)
    bm = np.minimum.reduceat(b[ok][o], starts)[full]
    pm = pos[ok][o][starts][full]
    sm = sord[ok][o][starts][full]
    row[14] = float(np.median(xm))
    if len(np.unique(sm)) < 3:  # (instances in one or two steps: a scan would compare those steps' loads)
        return
    if _positions_recur(pm, sm) and np.median(np.bincount(pm)[np.unique(pm)]) >= 3:
        r, _ = _position_residual(xm, wm, pm)
    else:
        r = xm - load_slope(xm, wm) * wm
    cnt = np.bincount(bm, minlength=N_BINS)
    occ = cnt > 0
    shift = window_scan(np.bincount(bm, weights=r, minlength=N_BINS)[occ] / cnt[occ])[0]
    row[15] = shift
    row[16] = shift / (float(r.std()) + 0.02)
