"""What a capture itself shows, without a model: rules over the trace summary's time breakdown.

``findings(tr)`` reads :meth:`teller.trace.Trace.summary` (per GPU: compute, communication and
copy time, and its idle time split by what the GPU waited for, computed in the Rust core) and the
trace's steps, and returns the statements worth a look, largest share of time first. Each is a
dict: ``kind``, ``device`` (None for the capture as a whole), ``share`` (the fraction of the
device's active span, or of the step time, the finding is about: the ranking key), ``message``
(one sentence with its numbers) and ``values`` (those numbers).

These are facts of the capture, thresholded, in the spirit of HTA's temporal and idle-time
breakdowns; they name no root cause, and they work on any capture (a `teller collect` run, a
PyTorch profiler trace), where a model trained on other captures may not (`teller diagnose` flags
those as unfamiliar and prints these findings).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

# A finding is reported when its share of the device's span (first to last GPU activity) reaches:
HOST_WAIT = 0.20  # idle before the launching call: the host was late to ask
LAUNCH = 0.10  # idle inside launch calls
QUEUED = 0.10  # idle after the launch returned
UNLINKED_IDLE = 0.20  # a GPU's idle time that no linked launch explains (where the trace is linked overall)
COMM = 0.15  # communication kernels (NCCL/RCCL, custom all-reduce)
MEMORY = 0.10  # copies and memsets
SYNC = 0.10  # host threads blocked in synchronization records of the device
# the share of kernels shorter than their launch call that makes a host-bound GPU launch-bound
SHORT_KERNELS = 0.5
# the spread of the ranks' communication shares that points at the least waiting one
STRAGGLER_GAP = 0.10
# another process's work on the same physical GPU, in this one's idle time, as a share of its span
SHARED = 0.02
# the share of a GPU's launches whose work starts before the call: a clock caveat
CLOCK_SKEW = 0.01
# the slowest step against what its process's other steps predict: its load where the step ranges
# record one (``num_tokens``, or ``num_seqs``), else their median (prefill steps run 1.5-3x decode
# ones, so a bare median flagged a quarter of the simulator's healthy captures; the load fit none)
STEP_OUTLIER = 3.0
MIN_STEPS = 3
STEP_WORK_ARGS = ("num_tokens", "num_seqs")


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if ns >= 1e5 else f"{ns / 1e3:.1f} us"


def _entries(src: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``teller.sources`` entries of a Chrome file teller wrote, read back (each an input it was
    written from, with the pids its events are under), as far as they are well-formed; [] else."""
    import json

    if src.get("kind") != "chrome":
        return []
    try:
        doc = json.loads((src.get("metadata") or {}).get("teller") or "{}")
    except ValueError:
        return []
    entries = doc.get("sources") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("pids"), list)]


def origin(sources: list[dict[str, Any]] | None, d: dict[str, Any]) -> dict[str, Any] | None:
    """The input a device entry of ``Trace.summary()["devices"]`` came from, where its source is a
    file teller wrote from several (or from a raw file) and read back: the ``teller.sources`` entry
    that lists the device's pid (``path``, ``kind``, ``metadata``: the input's ``header`` or
    ``distributedInfo``, which name its rank). None for an input read directly, or a file that does
    not say (written before teller listed pids, or by another tool)."""
    src = d.get("source", 0)
    if not sources or not 0 <= src < len(sources):
        return None
    # (a GPU track under a label pid: the summary gives the label too, as the file writes it)
    pid = d.get("pid_label", d.get("pid"))
    found = [e for e in _entries(sources[src]) if pid in e["pids"]]
    return found[0] if len(found) == 1 else None


def gpu_names(devices: list[dict[str, Any]], sources: list[dict[str, Any]] | None = None) -> list[str]:
    """A name per entry of ``Trace.summary()["devices"]``: ``GPU 3``, or where two inputs both name a
    GPU 3 (per-rank profiler files, each process seeing its own GPU as 0), ``GPU 3 of X``, X the
    shortest tail of the input's path that tells it from the others (``rank1.json``,
    ``r1/trace.json``). A merged trace teller wrote, read back, names each GPU by the input it was
    written from (:func:`origin`), as when those inputs were read; where that is not known and one
    input holds several processes' GPU 3 (``part`` differs), ``pid N`` is added: the process
    Perfetto shows it under."""
    origins = [origin(sources, d) for d in devices]

    def ident(i: int) -> tuple[int, str | None]:
        o = origins[i]
        return (devices[i].get("source", 0), str(o.get("path")) if o else None)

    def path_of(i: int) -> list[str]:
        src = devices[i].get("source", 0)
        o = origins[i]
        path = (
            o.get("path") if o else sources[src].get("path") if sources and 0 <= src < len(sources) else None
        )
        return list(Path(str(path)).parts) if path else [f"input {src}"]

    out = []
    for i, d in enumerate(devices):
        name = f"GPU {d['device']}"
        same = [j for j, e in enumerate(devices) if e["device"] == d["device"]]
        apart = [j for j in same if ident(j) != ident(i)]
        if apart:
            mine, others = path_of(i), [path_of(j) for j in apart]
            k = 1
            while k < len(mine) and any(o[-k:] == mine[-k:] for o in others):
                k += 1
            name += f" of {'/'.join(mine[-k:])}"
        if any(ident(j) == ident(i) and devices[j].get("part", 0) != d.get("part", 0) for j in same):
            name += f" pid {d.get('pid', 0)}"
        out.append(name)
    return out


def device_findings(d: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    """The findings of one device entry of ``Trace.summary()["devices"]``; ``name``: how the messages
    call it (:func:`gpu_names`; ``GPU <device>`` by default)."""
    span = d.get("span_ns") or 0
    if span <= 0:
        return []
    dev = d["device"]
    gpu = name or f"GPU {dev}"
    out: list[dict[str, Any]] = []

    def add(kind: str, share: float, message: str, **values: Any) -> None:
        out.append(
            {
                "kind": kind,
                "device": dev,
                "gpu": gpu,
                "source": d.get("source", 0),
                "share": float(share),
                "message": message,
                "values": values,
            }
        )

    host = d["idle_host_ns"] / span
    kernels = d.get("kernels", 0)
    short = d.get("kernels_shorter_than_launch", 0) / kernels if kernels else 0.0
    if host >= HOST_WAIT:
        msg = (
            f"{gpu} waited for the host {_pct(host)} of its time ({_ms(d['idle_host_ns'])}): "
            "it went idle before the next launch call was made (CPU-side work between launches: "
            "Python, scheduling, input preparation, a blocking synchronization)"
        )
        if short >= SHORT_KERNELS:
            msg += (
                f"; {_pct(short)} of its kernels ran shorter than their launch call and started as soon as "
                "it returned, so it is launch-bound (CUDA graphs or fused kernels issue fewer launches)"
            )
        add("host_wait", host, msg, idle_host_ns=d["idle_host_ns"], short_kernel_share=short)
    launch = d["idle_launch_ns"] / span
    if launch >= LAUNCH:
        add(
            "launch_overhead",
            launch,
            f"{gpu} sat idle {_pct(launch)} of its time ({_ms(d['idle_launch_ns'])}) "
            "while launch calls were in progress (slow launches: module loading, first-call setup, "
            "driver contention)",
            idle_launch_ns=d["idle_launch_ns"],
        )
    queued = d["idle_queued_ns"] / span
    if queued >= QUEUED:
        add(
            "queued",
            queued,
            f"{gpu} sat idle {_pct(queued)} of its time ({_ms(d['idle_queued_ns'])}) with work already "
            f"launched (launch delay p50 {_ms(d['launch_delay_p50_ns'])}, "
            f"p99 {_ms(d['launch_delay_p99_ns'])}): "
            "streams waiting on events or another device, or another process holding the GPU",
            idle_queued_ns=d["idle_queued_ns"],
            launch_delay_p50_ns=d["launch_delay_p50_ns"],
            launch_delay_p99_ns=d["launch_delay_p99_ns"],
        )
    comm = d["comm_ns"] / span
    if comm >= COMM:
        hidden = d["comm_compute_overlap_ns"] / d["comm_ns"] if d["comm_ns"] else 0.0
        add(
            "communication",
            comm,
            f"collective kernels take {_pct(comm)} of {gpu}'s time ({_ms(d['comm_ns'])}), "
            f"{_pct(hidden)} of it overlapped with compute (a collective's time includes waiting for the "
            "slowest peer)",
            comm_ns=d["comm_ns"],
            overlapped_share=hidden,
        )
    mem = d["memory_ns"] / span
    if mem >= MEMORY:
        add(
            "memory_copies",
            mem,
            f"copies and memsets take {_pct(mem)} of {gpu}'s time ({_ms(d['memory_ns'])})",
            memory_ns=d["memory_ns"],
        )
    early = d.get("starts_before_launch", 0)
    if early and early >= CLOCK_SKEW * max(1, d.get("launches", 0)):
        add(
            "clock_skew",
            0.0,  # (no time of its own: listed last, as a caveat on the idle split)
            f"{early} launches on {gpu} start their work before the call began (by up to "
            f"{_ms(d['max_start_before_launch_ns'])}): host and GPU clocks disagree, so its idle time "
            "by cause is approximate",
            starts_before_launch=early,
            max_start_before_launch_ns=d["max_start_before_launch_ns"],
        )
    sync = min(1.0, d["sync_ns"] / span)
    if sync >= SYNC:
        add(
            "host_sync",
            sync,
            f"host threads waited on {gpu} in synchronization calls for {_ms(d['sync_ns'])} "
            f"({_pct(sync)} of its span)",
            sync_ns=d["sync_ns"],
        )
    return out


def straggler_finding(devices: list[dict[str, Any]], names: list[str] | None = None) -> dict[str, Any] | None:
    """Of two or more GPUs that run collectives, the one with the smallest share of its time in
    them, when the others spend clearly more: in a collective every rank waits for the last to
    arrive, so the rank that waits least is the one the others wait for."""
    names = names or [f"GPU {d['device']}" for d in devices]
    shares = [
        (d["comm_ns"] / d["span_ns"], d, nm)
        for d, nm in zip(devices, names, strict=True)
        if d.get("span_ns", 0) > 0 and d["comm_ns"] > 0
    ]
    if len(shares) < 2:
        return None
    shares.sort(key=lambda x: (x[0], x[1]["device"], x[1].get("source", 0)))
    low, d, nm = shares[0]
    others = [s for s, _, _ in shares[1:]]
    if min(others) - low < STRAGGLER_GAP - 1e-9:  # ("at least 10 points": 0.30 - 0.20 is 0.0999...)
        return None
    rng = f"{_pct(min(others))}" if len(others) == 1 else f"{_pct(min(others))}-{_pct(max(others))}"
    return {
        "kind": "straggler",
        "device": d["device"],
        "gpu": nm,
        "source": d.get("source", 0),
        "share": float(min(others) - low),
        "message": (
            f"{nm} spends the least of its time in collectives ({_pct(low)}, the others {rng}): "
            "the others wait for it in each collective (a slower or busier GPU, a noisy neighbour, more work)"
        ),
        "values": {"comm_share": low, "others_min": min(others), "others_max": max(others)},
    }


def step_loads(tr: Any, ss: list[Any], key: str) -> np.ndarray | None:
    """Every step's ``key`` argument (one of ``STEP_WORK_ARGS``), where each of ``ss`` records it as
    a finite number >= 0; else None."""
    vals = [tr.args(s.event).get(key) for s in ss]
    if all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0 for v in vals
    ):
        return np.asarray(vals, dtype=np.float64)
    return None


def _step_load(tr: Any, ss: list[Any]) -> tuple[str, np.ndarray] | None:
    """The load every step of ``ss`` records (the first of ``STEP_WORK_ARGS`` they all carry as a
    finite number >= 0), or None."""
    for key in STEP_WORK_ARGS:
        vals = step_loads(tr, ss, key)
        if vals is not None:
            return key, vals
    return None


# the pairs of steps the slope is the median over at most: every pair up to ~450 steps, a fixed
# random draw of pairs beyond (all pairs of 8 000 steps took 3.3 s and 1.3 GB; a long serving
# capture has tens of thousands)
MAX_PAIRS = 100_000


def _theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """The median slope over the pairs of points with different x (0 when there are none); over
    ``MAX_PAIRS`` pairs drawn with a fixed seed where there are more (deterministic)."""
    n = len(x)
    if n * (n - 1) // 2 > MAX_PAIRS:
        rng = np.random.default_rng(0)
        i = rng.integers(0, n, MAX_PAIRS)
        j = rng.integers(0, n, MAX_PAIRS)
    else:
        i, j = np.triu_indices(n, 1)
    dx = x[j] - x[i]
    ok = dx != 0
    return float(np.median((y[j] - y[i])[ok] / dx[ok])) if ok.any() else 0.0


def expected_step_times(dur: np.ndarray, load: np.ndarray | None) -> tuple[np.ndarray, float, float]:
    """What each step's time should be from the others: ``c + k * load``, a robust line (Theil-Sen
    slope, clipped at 0; intercept the median residual, at least 0: then ``k`` is refitted as the
    median time per unit of load) through the steps' (load, time) pairs, so that one slow step moves
    neither; without a load, the median step. Returns (expected, c, k)."""
    if load is None:
        med = float(np.median(dur))
        return np.full(len(dur), med), med, 0.0
    k = max(_theil_sen(load, dur), 0.0)
    c = float(np.median(dur - k * load))
    if c < 0:  # time proportional to the load: no fixed part
        pos = load > 0
        c, k = 0.0, float(np.median(dur[pos] / load[pos])) if pos.any() else 0.0
    return c + k * load, c, k


def _header(src: dict[str, Any]) -> dict[str, Any]:
    """A raw source's HEADER meta (pid, host, env, ...), or {}."""
    text = (src.get("metadata") or {}).get("header")
    try:
        h = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return h if isinstance(h, dict) else {}


_ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"


def _is_uuid(v: Any) -> bool:
    """A GPU UUID as the shim writes it (or a ``CUDA_VISIBLE_DEVICES`` entry naming one): a driver
    that answered without filling it in (all zeros) names no GPU."""
    return isinstance(v, str) and v.startswith(("GPU-", "MIG-")) and len(v) > 8 and v != _ZERO_UUID


def physical_gpu(src: dict[str, Any] | list[dict[str, Any]], device: int) -> tuple[str | None, tuple | None]:
    """The identities of the physical GPU behind ``device`` of a raw process (its source, or all its
    sources: a process that execs writes a second file, whose header is the newer): (``uuid``,
    ``numbering``). ``uuid``: the GPU's UUID, where a header's ``deviceProperties`` record one (the
    shim does, from the driver) or the device's ``CUDA_VISIBLE_DEVICES`` entry is one; one physical
    GPU whatever the run, host or numbering. ``numbering``: for a ``teller collect`` run
    (``TELLER_RUN_DIR``: its processes share one machine's numbering), (host, run directory, the
    device's ``CUDA_VISIBLE_DEVICES`` entry, or its index where that is unset, and
    ``CUDA_DEVICE_ORDER``, which decides which GPU an index or entry names: processes of one run that
    number the GPUs in different orders are not matched by number). Either is None where
    unknown; both for a profiler file or a process outside a collect run without a UUID (an index
    there names no particular device: containers that share a host name each see their own GPU 0)."""
    srcs = [src] if isinstance(src, dict) else list(src)
    heads = [_header(x) for x in srcs if x.get("kind") == "raw"]
    if not heads or device < 0:
        return None, None
    uuid = None
    for h in heads:
        for dp in h.get("deviceProperties") or []:
            if isinstance(dp, dict) and dp.get("id") == device and _is_uuid(dp.get("uuid")):
                uuid = dp["uuid"]
    h = heads[-1]  # (the environment of the latest file: an exec may have changed it)
    env = h.get("env") if isinstance(h.get("env"), dict) else {}
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    entry: str | None = str(device)
    if cvd is not None:
        # (empty entries skipped; an index past the list names no GPU of the list)
        entries = [e.strip() for e in str(cvd).split(",") if e.strip()]
        entry = entries[device] if device < len(entries) else None
    if uuid is None and entry is not None and _is_uuid(entry):
        uuid = entry
    run, host = env.get("TELLER_RUN_DIR"), h.get("host")
    # (an index means one GPU only in one order: CUDA's default is FASTEST_FIRST)
    order = str(env.get("CUDA_DEVICE_ORDER") or "FASTEST_FIRST").strip().upper()
    numbering = (str(host), str(run), order, entry) if run and host and entry is not None else None
    return uuid, numbering


def _merged(iv: np.ndarray) -> np.ndarray:
    """Sorted, merged [start, end) intervals of an (n, 2) array."""
    if len(iv) == 0:
        return iv.reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    ends = np.maximum.accumulate(iv[:, 1])
    new = np.r_[True, iv[1:, 0] > ends[:-1]]
    starts = iv[new, 0]
    idx = np.flatnonzero(new)
    stops = np.r_[ends[idx[1:] - 1], ends[-1]] if len(idx) > 1 else ends[-1:]
    return np.stack([starts, stops], axis=1)


def _overlap(a: np.ndarray, b: np.ndarray) -> int:
    """Total length of the intersection of two merged interval lists: the length of ``a`` below t,
    at each end of ``b``'s intervals, by binary search (``b``'s intervals are disjoint)."""
    if not len(a) or not len(b):
        return 0
    starts, ends = a[:, 0], a[:, 1]
    cum = np.r_[0, np.cumsum(ends - starts)]

    def below(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right") - 1
        kk = np.maximum(k, 0)
        part = np.clip(t - starts[kk], 0, ends[kk] - starts[kk])
        return np.where(k >= 0, cum[kk] + part, 0)

    return int((below(b[:, 1]) - below(b[:, 0])).sum())


def shared_gpu_findings(
    tr: Any, devices: list[dict[str, Any]], names: list[str] | None = None
) -> list[dict[str, Any]]:
    """GPUs shown apart (one per process) that are one physical GPU (:func:`physical_gpu`): for each,
    how much of its idle time the other processes' work filled. The breakdown is per process, so its
    idle time (and its split by cause) counts a neighbour's kernels as idle; this says so, and names
    the neighbour: a process time-slicing the GPU is a cause in itself (docs/faults.md)."""
    names = names or [f"GPU {d['device']}" for d in devices]
    srcs = tr.sources
    proc_of_src = [x.get("process", k) for k, x in enumerate(srcs)]
    ids: list[tuple[str | None, tuple | None]] = []
    for d in devices:
        k = d.get("source", 0)
        if not (0 <= k < len(srcs)) or d.get("span_ns", 0) <= 0:
            ids.append((None, None))
            continue
        mine = [x for j, x in enumerate(srcs) if proc_of_src[j] == proc_of_src[k]]
        ids.append(physical_gpu(mine, int(d["device"])))
    # one GPU: the same UUID, or the same numbering where not two different UUIDs; joined as sets
    # (a process without a UUID, killed before its first flush, joins its neighbour by numbering),
    # never a set holding two UUIDs
    comp = list(range(len(devices)))
    uuids: dict[int, set[str]] = {i: ({u} if u else set()) for i, (u, _n) in enumerate(ids)}

    def root(i: int) -> int:
        while comp[i] != i:
            comp[i] = comp[comp[i]]
            i = comp[i]
        return i

    for i in range(len(devices)):
        for j in range(i + 1, len(devices)):
            (ui, ni), (uj, nj) = ids[i], ids[j]
            if not ((ui and ui == uj) or (ni is not None and ni == nj)):
                continue
            a, b = root(i), root(j)
            if a != b and len(uuids[a] | uuids[b]) <= 1:
                comp[b] = a
                uuids[a] |= uuids[b]
    members_of: dict[int, list[int]] = {}
    for i in range(len(devices)):
        if ids[i] != (None, None):
            members_of.setdefault(root(i), []).append(i)
    groups = {r: m for r, m in members_of.items() if len(m) > 1}
    if not groups:
        return []
    from teller.trace import GPU_ACTIVITY_LAYERS, LAYER_NAMES

    layer = np.asarray(tr.layer)
    gpu = np.isin(layer, [LAYER_NAMES.index(x) for x in GPU_ACTIVITY_LAYERS])
    ts = np.asarray(tr.ts, dtype=np.int64)
    end = ts + np.asarray(tr.dur, dtype=np.int64)
    dev = np.asarray(tr.device)
    proc_of_src = np.array([x.get("process", k) for k, x in enumerate(srcs)], dtype=np.int64)
    proc = proc_of_src[np.asarray(tr.source, dtype=np.int64)]

    def busy(i: int) -> np.ndarray:
        d = devices[i]
        p = proc_of_src[d.get("source", 0)]
        m = gpu & (dev == d["device"]) & (proc == p)
        return _merged(np.stack([ts[m], end[m]], axis=1))

    out = []
    for r, members in sorted(groups.items()):
        uuid = next(iter(uuids[root(r)]), None)
        num = next((ids[i][1] for i in members if ids[i][1] is not None), None)
        where = uuid if uuid else f"GPU {num[3]} of host {num[0]}, one run" if num else "one GPU"
        key = ["uuid", uuid] if uuid else list(num or [])
        iv = {i: busy(i) for i in members}
        for i in members:
            d = devices[i]
            others = _merged(np.concatenate([iv[j] for j in members if j != i]))
            if not len(iv[i]):
                continue
            span = np.array([[iv[i][0, 0], iv[i][-1, 1]]], dtype=np.int64)  # (its first to last activity)
            in_span = _overlap(others, span)
            in_busy = _overlap(others, iv[i])
            filled = in_span - in_busy
            if d["idle_ns"] <= 0 or filled < SHARED * d["span_ns"]:
                continue
            who = ", ".join(names[j] for j in members if j != i)
            out.append(
                {
                    "kind": "shared_gpu",
                    "device": d["device"],
                    "gpu": names[i],
                    "source": d.get("source", 0),
                    "share": float(filled / d["span_ns"]),
                    "message": (
                        f"{names[i]} is one physical GPU with {who} ({where}): their work ran during "
                        f"{_pct(filled / d['idle_ns'])} of the time it shows as idle ({_ms(filled)}), "
                        "so its idle time by cause counts another process's "
                        "kernels (a process time-slicing the GPU delays this one's work)"
                    ),
                    "values": {
                        "physical": key,
                        "with": [names[j] for j in members if j != i],
                        "others_in_idle_ns": int(filled),
                        "others_in_busy_ns": int(in_busy),
                    },
                }
            )
    return out


def step_findings(tr: Any) -> list[dict[str, Any]]:
    """Per process (of at least ``MIN_STEPS`` steps), the step furthest above what its process's
    other steps predict, when it took ``STEP_OUTLIER`` times that or more: the prediction follows
    the step's load where every step of the process records one (``STEP_WORK_ARGS``: a 6 000-token
    prefill step is not slow next to 40-token decode steps), else it is the median step."""
    from teller.compare import pattern_steps
    from teller.trace import DEFAULT_STEP_PATTERNS

    # (step ranges only: the loader's fallbacks, the busiest thread's root ranges whatever their
    # names, compared a one-off `load_weights` with the `generate` calls after it)
    steps = pattern_steps(tr, (tr.load_options or {}).get("step_names") or DEFAULT_STEP_PATTERNS)
    src = np.asarray(tr.source)
    proc = [x.get("process", k) for k, x in enumerate(tr.sources)]
    # (by the loader's process and pid: per-rank files of containers may share a pid, and the raw
    # files of one process are one)
    by_proc: dict[tuple[int, int], list[Any]] = {}
    for s in steps:
        if s.event >= 0:
            by_proc.setdefault((int(proc[int(src[s.event])]), int(s.pid)), []).append(s)
    out = []
    for (_src, pid), ss in sorted(by_proc.items()):
        if len(ss) < MIN_STEPS:
            continue
        dur = np.array([s.dur_ns for s in ss], dtype=np.float64)
        load = _step_load(tr, ss)
        want, c, k_per = expected_step_times(dur, None if load is None else load[1])
        # (a step predicted to take nothing, an idle engine step of 0 tokens with no fixed part, has
        # no ratio; the process's other steps still do)
        ok = want > 0
        if ok.sum() < MIN_STEPS:
            continue
        ratio = np.where(ok, dur / np.where(ok, want, 1.0), 0.0)
        k = int(np.argmax(ratio))
        if ratio[k] < STEP_OUTLIER:
            continue
        slow = int((ratio >= STEP_OUTLIER).sum())
        first = " (its first: warm-up, lazy initialization, compilation)" if k == 0 else ""
        if load is None:
            against = f"took {ratio[k]:.1f}x the median step ({_ms(dur[k])} against {_ms(want[k])})"
            what = "the median"
        else:
            key, w = load
            against = (
                f"took {ratio[k]:.1f}x what its load predicts ({_ms(dur[k])} for {key}={w[k]:g}, "
                f"against {_ms(want[k])} from its process's steps: {_ms(c)} + {k_per / 1e3:.3g} us per "
                f"{'token' if key == 'num_tokens' else 'sequence'})"
            )
            what = "their prediction"
        out.append(
            {
                "kind": "slow_step",
                "device": None,
                "share": float((dur[k] - want[k]) / dur.sum()),
                "message": (
                    f"step {ss[k].name!r} of pid {pid}{first} {against}; {slow} of its {len(ss)} steps "
                    f"took {STEP_OUTLIER}x {what} or more"
                ),
                "values": {
                    "pid": pid,
                    "step": ss[k].index,
                    "name": ss[k].name,
                    "dur_ns": int(dur[k]),
                    "expected_ns": float(want[k]),
                    "ratio": float(ratio[k]),
                    # kept for readers of the first version: the median step
                    "median_ns": float(np.median(dur)),
                    "load_arg": None if load is None else load[0],
                    "load": None if load is None else float(load[1][k]),
                    "slow_steps": slow,
                },
            }
        )
    return out


def findings(tr: Any, summary: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every finding of the capture ``tr`` (a :class:`teller.trace.Trace`), largest share first;
    ``summary``: its ``tr.summary()`` when already computed."""
    s = summary if summary is not None else tr.summary(0)
    names = gpu_names(s["devices"], tr.sources)
    out = [f for d, nm in zip(s["devices"], names, strict=True) for f in device_findings(d, nm)]
    st = straggler_finding(s["devices"], names)
    if st is not None:
        out.append(st)
    out += shared_gpu_findings(tr, s["devices"], names)
    out += step_findings(tr)
    gpu, linked = s["gpu_events"], s["linked_gpu_events"]
    idle = sum(d.get("idle_ns", 0) for d in s["devices"])
    if gpu and linked < 0.5 * gpu and idle > 0:  # (a caveat on the idle split: none without idle time)
        span = sum(d.get("span_ns", 0) for d in s["devices"])
        out.append(
            {
                "kind": "unlinked",
                "device": None,
                # (as every share: of the span, here the idle time the split could not attribute)
                "share": sum(d.get("idle_unlinked_ns", 0) for d in s["devices"]) / span if span else 0.0,
                "message": (
                    f"only {linked} of {gpu} GPU activities are linked to their launching call: "
                    "the idle time by cause counts the rest as 'unlinked'"
                ),
                "values": {"gpu_events": gpu, "linked_gpu_events": linked},
            }
        )
    elif gpu:
        # (linked overall, yet one GPU's activities not: its idle time is unattributed, said for it,
        # not left under another GPU's findings)
        for d, nm in zip(s["devices"], names, strict=True):
            span, un = d.get("span_ns", 0), d.get("idle_unlinked_ns", 0)
            if span and un / span >= UNLINKED_IDLE:
                out.append(
                    {
                        "kind": "unlinked",
                        "device": d["device"],
                        "gpu": nm,
                        "source": d.get("source", 0),
                        "share": un / span,
                        "message": (
                            f"{nm}: {_pct(un / span)} of its time is idle time the split by cause could not "
                            f"attribute ({_ms(un)}): its activities are not linked to their launching calls"
                        ),
                        "values": {"idle_unlinked_ns": un},
                    }
                )
    out.sort(key=lambda f: (-f["share"], f["kind"], -1 if f["device"] is None else f["device"]))
    return out


def _group_key(f: dict[str, Any]) -> tuple[str, str] | None:
    if f["kind"] == "slow_step":
        return ("slow_step", str(f["values"].get("name")))
    if f.get("device") is not None and f["kind"] != "straggler":
        return (f["kind"], "")
    return None


def _where(f: dict[str, Any]) -> str:
    if f["kind"] == "slow_step":
        return f"pid {f['values']['pid']} ({f['values']['ratio']:.1f}x)"
    return f"{f.get('gpu') or 'GPU ' + str(f['device'])} ({_pct(f['share'])})"


def group_findings(fs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``fs`` (:func:`findings`) for reading: a kind that fires on several GPUs (every rank of a
    tensor-parallel group spends a fifth of its time in all-reduce), and a slow step seen in several
    processes (a stalled step holds every rank), is one entry, the largest share's, whose message
    ends with the others (``; the same on GPU 1 (22 %), GPU 2 (22 %)``) and which lists them all in
    ``group``. The order stays largest share first; the rest are as they were."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in fs:
        key = _group_key(f)
        if key is not None:
            groups.setdefault(key, []).append(f)
    out = []
    for f in fs:
        key = _group_key(f)
        if key is None or len(groups[key]) == 1:
            out.append(f)
        elif groups[key][0] is f:  # (the largest share of its group: fs is sorted)
            rest = groups[key][1:]
            g = dict(f)
            g["message"] = f["message"] + "; the same on " + ", ".join(_where(x) for x in rest)
            g["group"] = [dict(x) for x in groups[key]]
            out.append(g)
    return out
