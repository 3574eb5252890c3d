"""The fault model: which faults exist, how a fault instance is drawn, and what it does to the engine.

A :class:`Fault` is drawn per sample (onset, duration, severity, target) and turned into
:class:`Effects`, the time-dependent factors the simulator reads at every event. The physics of each
fault (and why some look alike at one layer) is documented in ``docs/faults.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NORMAL = "normal"

# type id -> (layer of the root cause, needs tensor parallelism, whole-run fault)
FAULT_INFO: dict[str, tuple[str, bool, bool]] = {
    "gpu_throttle": ("device", False, False),
    "hbm_contention": ("device", False, False),
    "pcie_degradation": ("device", False, False),
    "nvlink_degradation": ("communication", True, False),
    "cpu_contention": ("host_op", False, False),
    "host_memory_pressure": ("host_op", False, False),
    "kv_cache_exhaustion": ("engine", False, False),
    "nccl_straggler": ("communication", True, False),
    "network_delay": ("engine", False, False),
    "eager_mode_misconfig": ("runtime", False, True),
    "oom_error": ("runtime", False, False),
    "launch_storm": ("kernel", False, False),
}
FAULT_TYPES: tuple[str, ...] = tuple(FAULT_INFO)
LABELS: tuple[str, ...] = (NORMAL, *FAULT_TYPES)
LAYERS = ("engine", "backend", "host_op", "runtime", "kernel", "communication", "device")
# The faults whose factors stretch a host duration (Effects.host) and a kernel (Effects.clock / mem):
# the candidates Effects.charge credits for those events.
HOST_FAULTS = ("cpu_contention", "host_memory_pressure", "nccl_straggler")
KERNEL_FAULTS = ("gpu_throttle", "hbm_contention", "nccl_straggler")
# The work a time-stretching fault's ``effect.share`` and ``slowdown`` are measured against: GPU time
# (kernels, copies) or host time (ranges, operators, API calls). A straggler also stretches its
# host; that time is in its ``extra_ms`` but not in its GPU share.
EFFECT_WORK = {
    "gpu_throttle": "gpu",
    "hbm_contention": "gpu",
    "pcie_degradation": "gpu",
    "nvlink_degradation": "gpu",
    "nccl_straggler": "gpu",
    "launch_storm": "gpu",
    "cpu_contention": "host",
    "host_memory_pressure": "host",
}


@dataclass
class FaultEffect:
    """What one fault actually did to a sample, counted by the simulator where it applies the fault.

    Counting draws no random numbers: trace and log are byte-identical with or without it. A fault
    whose window saw nothing it could touch (a network delay that held back no request and delayed no
    response) has ``events == 0``: its label is not observable, and a model can only guess it.
    ``share`` is the time it added over the capture's GPU or host work (``EFFECT_WORK``; a ratio, above
    1 when a host fault more than doubles the host time): a 10 % throttle of 5 % of the kernel time is
    a share of 0.005, inside the run-to-run jitter. With two faults on one event, each is credited
    its marginal part: the event's time minus its time without that fault."""

    events: int = 0  # events it stretched, added, held back or delayed
    extra_ns: float = 0.0  # time it added to them (simulation ns), every kind
    # per work kind ("gpu", "host"): [time it added, those events' time without it]
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    share: float | None = None  # extra time of its EFFECT_WORK kind / the capture's work of that kind
    counts: dict[str, int] = field(default_factory=dict)  # type-specific: held_requests, preemptions, ...

    def add(self, kind: str, extra: float, base: float) -> None:
        self.events += 1
        self.extra_ns += extra
        k = self.by_kind.setdefault(kind, [0.0, 0.0])
        k[0] += extra
        k[1] += base

    def to_json(self, ftype: str) -> dict[str, Any]:
        out: dict[str, Any] = {"events": int(self.events), "extra_ms": round(self.extra_ns / 1e6, 4)}
        extra, base = self.by_kind.get(EFFECT_WORK.get(ftype, ""), (0.0, 0.0))
        if base > 0:
            out["slowdown"] = round(extra / base, 4)  # of the events it stretched, in its own kind
        if self.share is not None:
            out["share"] = round(self.share, 6)
        out.update({k: int(v) for k, v in sorted(self.counts.items())})
        return out


@dataclass
class Fault:
    type: str
    layer: str
    start_step: int  # the fault is in force during engine steps [start_step, end_step)
    end_step: int
    severity: float  # 0..1
    target: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0  # simulation time of the window, filled in by the simulator
    end_ns: int = 0
    effect: FaultEffect = field(default_factory=FaultEffect)  # filled in by the simulator

    def active(self, step: int) -> bool:
        return self.start_step <= step < self.end_step

    def ranks(self, tp: int) -> list[int]:
        r = self.target.get("rank")
        return list(range(tp)) if r is None else [int(r)]


def _time_sliced(f: Fault) -> bool:
    return f.params.get("sharing") == "time_slice"


def draw_fault(
    ftype: str, rng: np.random.Generator, *, steps: int, tp: int, severity_range: tuple[float, float]
) -> Fault:
    """Draw one fault instance: onset in the first half of the window of ``steps`` engine steps, a
    duration of 30-75 % of it (whole-run faults cover everything), severity uniform in
    ``severity_range``."""
    layer, _needs_tp, whole = FAULT_INFO[ftype]
    lo, hi = severity_range
    sev = float(rng.uniform(lo, hi))
    if whole:
        start, end = 0, steps
    else:
        start = int(rng.uniform(0.1, 0.45) * steps)
        end = min(steps, start + max(2, int(rng.uniform(0.3, 0.75) * steps)))
    target: dict[str, Any]
    params: dict[str, Any] = {}
    if ftype == "gpu_throttle":
        # a node-wide power cap hits every GPU; a thermal/clock problem one GPU
        rank = None if rng.random() < 0.6 else int(rng.integers(tp))
        target = {"kind": "kernel_family", "name": "gemm", "rank": rank}
        params["cause"] = "power_cap" if rank is None else "thermal"
    elif ftype == "hbm_contention":
        rank = int(rng.integers(tp))
        # Half the neighbours share the GPU's bandwidth (another stream of the process, or MPS): slower
        # memory-bound kernels. The other half are another process without MPS: the GPU time-slices
        # between the two contexts, the victim's kernels keep their durations and start late (measured
        # on an H200 beside an HBM-copying process: launch delay p50 2 us -> 1.3 ms, docs/faults.md).
        if rng.random() < 0.5:
            target = {"kind": "rank", "name": "time_slice", "rank": rank}
            params["sharing"] = "time_slice"
            params["period_ns"] = float(rng.uniform(3e6, 6e6))
            params["phase"] = float(rng.uniform(0.0, 1.0))  # a fraction of the period
        else:
            target = {"kind": "kernel_family", "name": "memory_bound", "rank": rank}
            params["sharing"] = "bandwidth"
            params["foreign_visible"] = bool(rng.random() < 0.6)
    elif ftype == "pcie_degradation":
        rank = None if rng.random() < 0.5 else int(rng.integers(tp))
        target = {"kind": "kernel_family", "name": "memcpy", "rank": rank}
    elif ftype == "nvlink_degradation":
        target = {"kind": "kernel_family", "name": "all_reduce", "rank": None}
    elif ftype == "cpu_contention":
        rank = None if rng.random() < 0.5 else int(rng.integers(tp))
        target = {"kind": "process", "name": "worker", "rank": rank}
    elif ftype == "host_memory_pressure":
        target = {"kind": "process", "name": "engine_core", "rank": 0}
    elif ftype == "kv_cache_exhaustion":
        target = {"kind": "engine", "name": "scheduler", "rank": 0}
    elif ftype == "nccl_straggler":
        target = {"kind": "rank", "name": "worker", "rank": int(rng.integers(tp))}
    elif ftype == "network_delay":
        target = {"kind": "engine", "name": "api_server", "rank": 0}
        params["delay_ms"] = round(float(50 + 950 * sev), 1)
    elif ftype == "eager_mode_misconfig":
        target = {"kind": "operator", "name": "cudaLaunchKernel", "rank": None}
    elif ftype == "oom_error":
        target = {"kind": "operator", "name": "forward", "rank": int(rng.integers(tp))}
        end = steps
    elif ftype == "launch_storm":
        # an un-fused op (e.g. a debug hook or a Python-side elementwise loop) launching many tiny kernels
        rank = None
        target = {"kind": "kernel_family", "name": "elementwise", "rank": rank}
    else:  # pragma: no cover - FAULT_INFO is the single list
        raise KeyError(ftype)
    return Fault(ftype, layer, start, end, sev, target, params)


@dataclass
class Effects:
    """Time-dependent factors for one sample. ``factor(...)`` returns 1.0 when no fault applies."""

    faults: list[Fault]
    tp: int
    step: int = 0  # the engine step being simulated
    # the capture's work without faults, by EFFECT_WORK kind (ns): the denominators of effect.share
    work_ns: dict[str, float] = field(default_factory=lambda: {"gpu": 0.0, "host": 0.0})

    # -- effect accounting (FaultEffect) ---------------------------------------------------------
    def charge(
        self,
        kind: str,
        rank: int | None,
        clean: float,
        actual: float,
        types: tuple[str, ...],
        without: Callable[[Fault], float] | None = None,
        *,
        added: bool = False,
    ) -> None:
        """One event of ``kind`` work took ``actual`` ns where it would have taken ``clean`` without
        any fault: credit the difference to the active faults of ``types`` on ``rank``. With two of
        them on the event, each gets its marginal part, ``actual - without(f)`` (``without``: the
        event's time without that one fault). ``added``: the event exists only because of the fault
        (it is not part of the capture's fault-free work)."""
        if not added:
            self.work_ns[kind] += clean
        if abs(actual - clean) < 1e-6:
            return
        hit = [
            f
            for f in self.faults
            if f.type in types and f.active(self.step) and (rank is None or rank in f.ranks(self.tp))
        ]
        for f in hit:
            base = without(f) if without is not None and len(hit) > 1 else clean
            if actual - base > 1e-6:
                f.effect.add(kind, actual - base, base)

    def count(
        self,
        ftype: str,
        key: str,
        n: int = 1,
        extra_ns: float = 0.0,
        *,
        window: bool = True,
        new: bool = True,
    ) -> None:
        """``n`` events of a fault of ``ftype`` (active now if ``window``), counted under ``key``, and
        in ``events`` if they are ``new`` (not events already counted, as a held request released)."""
        if n <= 0:
            return
        for f in self.faults:
            if f.type == ftype and (f.active(self.step) or not window):
                f.effect.events += n if new else 0
                f.effect.extra_ns += extra_ns
                f.effect.counts[key] = f.effect.counts.get(key, 0) + n

    def finish(self) -> None:
        """Set each fault's ``effect.share`` (at the end of the simulation)."""
        for f in self.faults:
            kind = EFFECT_WORK.get(f.type)
            if kind is not None:
                w = self.work_ns[kind]
                f.effect.share = f.effect.by_kind.get(kind, [0.0])[0] / w if w > 0 else 0.0

    def _active(self, ftype: str, rank: int | None = None) -> Fault | None:
        for f in self.faults:
            if f.type == ftype and f.active(self.step) and (rank is None or rank in f.ranks(self.tp)):
                return f
        return None

    def has(self, ftype: str) -> Fault | None:
        for f in self.faults:
            if f.type == ftype:
                return f
        return None

    # -- GPU -------------------------------------------------------------------------------------
    def clock(self, rank: int, skip: Fault | None = None) -> float:
        """Compute throughput multiplier (SM clock); ``skip``: as if that fault were absent."""
        c = 1.0
        f = self._active("gpu_throttle", rank)
        if f is not None and f is not skip:
            # power cap: SM clock falls up to ~55 %; thermal ramps in over the first 20 % of the window
            ramp = min(1.0, (self.step - f.start_step + 1) / max(1.0, 0.3 * (f.end_step - f.start_step)))
            c *= 1.0 - 0.55 * f.severity * (ramp if f.params.get("cause") == "thermal" else 1.0)
        f = self._active("nccl_straggler", rank)
        if f is not None and f is not skip:
            c *= 1.0 / (1.0 + 1.2 * f.severity)
        f = self._active("hbm_contention", rank)
        if f is not None and f is not skip and not _time_sliced(f):
            c *= 1.0 - 0.08 * f.severity
        return c

    def mem(self, rank: int, skip: Fault | None = None) -> float:
        """HBM throughput multiplier; ``skip``: as if that fault were absent."""
        m = 1.0
        f = self._active("hbm_contention", rank)
        if f is not None and f is not skip:
            # time-sliced: only the L2/TLB state the neighbour leaves behind (+0-8 % measured)
            m *= 1.0 - (0.05 if _time_sliced(f) else 0.6) * f.severity
        f = self._active("nccl_straggler", rank)
        if f is not None and f is not skip:
            m *= 1.0 / (1.0 + 1.2 * f.severity)
        f = self._active("gpu_throttle", rank)
        if f is not None and f is not skip:
            # a lower SM clock also issues loads more slowly: memory-bound kernels lose up to ~20 %
            m *= 1.0 - 0.2 * f.severity
        return m

    def link(self) -> float:
        f = self._active("nvlink_degradation")
        return 1.0 if f is None else 1.0 / (1.0 + 5.0 * f.severity)

    def pcie(self, rank: int) -> float:
        f = self._active("pcie_degradation", rank)
        return 1.0 if f is None else 1.0 / (1.0 + 12.0 * f.severity)

    def waited(self, rank: int, wait: float, work: float) -> None:
        """GPU work of ``work`` ns on ``rank`` started ``wait`` ns late because a time-sliced neighbour
        held the GPU: credited to that fault (an event it delayed, the delay its extra time)."""
        f = self._active("hbm_contention", rank)
        if f is not None and wait > 1e-6:
            f.effect.add("gpu", wait, work)

    def foreign_rate(self, rank: int) -> float:
        """Visible foreign kernels per ms on the rank's GPU (noisy neighbour sharing the device)."""
        f = self._active("hbm_contention", rank)
        if f is None or _time_sliced(f) or not f.params.get("foreign_visible"):
            return 0.0  # (a neighbour in another process is never in this process's CUPTI records)
        return 0.3 + 1.5 * f.severity

    def slice_start(self, rank: int, t: float) -> float:
        """The earliest start >= ``t`` of GPU work on ``rank`` when a time-sliced neighbour holds the GPU
        for a share 0.25 + 0.45 * severity of every period (``t`` itself without one)."""
        f = self._active("hbm_contention", rank)
        if f is None or not _time_sliced(f):
            return t
        period = float(f.params.get("period_ns", 4e6))
        held = (0.25 + 0.45 * f.severity) * period
        _, into = divmod(t - float(f.params.get("phase", 0.0)) * period, period)
        return t if into >= held else t + (held - into)

    def launch_storm(self) -> int:
        """Extra tiny kernels launched per layer by a pathological op."""
        f = self._active("launch_storm")
        return 0 if f is None else int(2 + 14 * f.severity)

    # -- host ------------------------------------------------------------------------------------
    def host(self, rank: int, skip: Fault | None = None) -> float:
        """Host-side duration multiplier (CPU time of ranges, operators and API calls); ``skip``: as
        if that fault were absent."""
        h = 1.0
        f = self._active("cpu_contention", rank)
        if f is not None and f is not skip:
            h *= 1.0 + 2.5 * f.severity
        f = self._active("host_memory_pressure", rank)
        if f is not None and f is not skip:
            h *= 1.0 + 0.25 * f.severity
        f = self._active("nccl_straggler", rank)
        if f is not None and f is not skip:
            h *= 1.0 + 0.3 * f.severity
        return h

    def host_spike(self, rank: int, rng: np.random.Generator, kind: str) -> tuple[float, dict[str, float]]:
        """An extra stall (ns) before a host range: descheduling under CPU contention, page faults /
        swap-in under memory pressure (mostly in tokenization, detokenization and pinned copies), and
        rare benign GC pauses in every sample. Returns the stall and the part of it each fault type
        caused (the rest is the benign pause)."""
        extra = 0.0
        parts: dict[str, float] = {}
        if rng.random() < 0.0015:
            extra += float(rng.uniform(0.2e6, 1.5e6))  # GC pause / benign hiccup
        f = self._active("cpu_contention", rank)
        if f is not None and rng.random() < 0.05 + 0.25 * f.severity:
            stall = float(rng.exponential(40e3 + 400e3 * f.severity))
            parts["cpu_contention"] = stall
            extra += stall
        f = self._active("host_memory_pressure", rank)
        if f is not None:
            p = (0.06 if kind in ("postprocess", "prepare_inputs", "detokenize") else 0.01) * (
                0.3 + f.severity
            )
            if rng.random() < p:
                stall = float(rng.uniform(0.5e6, 2e6 + 18e6 * f.severity))
                parts["host_memory_pressure"] = stall
                extra += stall
        return extra, parts

    # -- engine ----------------------------------------------------------------------------------
    def arrival_scale(self) -> float:
        """Multiplier of the request arrival rate reaching the engine."""
        f = self._active("network_delay")
        return 1.0 if f is None else max(0.05, 1.0 - 0.9 * f.severity)

    def response_delay_ns(self) -> float:
        f = self._active("network_delay")
        return 0.0 if f is None else float(f.params.get("delay_ms", 0.0)) * 1e6

    def kv_burst(self) -> Fault | None:
        return self.has("kv_cache_exhaustion")

    def eager(self) -> bool:
        return self.has("eager_mode_misconfig") is not None

    def oom(self) -> Fault | None:
        return self.has("oom_error")
