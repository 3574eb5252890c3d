"""Per-fault symptom checks: each fault changes what the physics says it changes, and not the rest.

Each check simulates the same workload and seed twice, healthy and with one fault over the whole
window at full severity, then compares the traces (and logs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import teller
from teller.data import culprit_mask, kernel_family
from teller.data.dataset import _fault_json
from teller.data.faults import FAULT_INFO, Fault
from teller.data.simulator import SimResult, Workload, simulate
from teller.trace import FLAG_UNFINISHED

REAL = 1_764_000_000_000_000_000

# prefill-heavy: every step is a full chunk, so GEMMs are compute-bound
PREFILL = Workload(
    model="llama-3.1-8b",
    gpu="H100",
    tp=2,
    arrival="poisson",
    rate=2000.0,
    prompt_mean=2048,
    output_mean=64,
    cuda_graphs=True,
    max_num_seqs=128,
    max_num_batched_tokens=4096,
    steps=10,
    traced_layers=2,
    init_running=0,
    kv_util=0.5,
)
# decode-heavy with CUDA graphs
DECODE = replace(
    PREFILL, rate=20.0, prompt_mean=256, output_mean=512, init_running=32, max_num_batched_tokens=2048
)
# no arrivals: identical batches whatever the step times, so kernel shapes compare one to one
STEADY = replace(DECODE, rate=0.01)


def run(
    tmp: Path,
    wl: Workload,
    ftype: str | None,
    seed: int = 7,
    rank: int | None = None,
    sev: float = 1.0,
    params: dict | None = None,
) -> tuple[teller.trace.Trace, SimResult]:
    faults = []
    if ftype is not None:
        faults.append(
            Fault(
                ftype,
                FAULT_INFO[ftype][0],
                0 if ftype != "oom_error" else 4,
                wl.steps,
                sev,
                {"kind": "rank", "name": "x", "rank": rank},
                dict(params or {}),
            )
        )
    d = tmp / f"{ftype}-{seed}-{rank}"
    res = simulate(wl, faults, np.random.default_rng(seed), d, real_base=REAL)
    return teller.trace.load(d, warn=False), res


def kernels(tr: teller.trace.Trace, family: str, *, device: int | None = None, large_tile: bool = False):
    k = tr.layer_mask("kernel") & (tr.tid == 7)
    names = np.array(tr.strings, dtype=object)[tr.name]
    fam = np.array([kernel_family(n) for n in names], dtype=object)
    m = k & (fam == family)
    if device is not None:
        m &= tr.device == device
    if large_tile:
        m &= np.array(["128x256" in n or "256x128" in n or "128x128" in n for n in names])
    return tr.dur[m].astype(float)


def runtime(tr: teller.trace.Trace, name: str, pid: int | None = None) -> np.ndarray:
    names = np.array(tr.strings, dtype=object)[tr.name]
    m = tr.layer_mask("runtime") & (names == name)
    if pid is not None:
        m &= tr.pid == pid
    return tr.dur[m].astype(float)


def ratio(a: np.ndarray, b: np.ndarray) -> float:
    assert len(a) and len(b)
    return float(np.median(a) / np.median(b))


def test_gpu_throttle_slows_compute_bound_gemms_not_memory_bound(tmp_path):
    ok, _ = run(tmp_path, PREFILL, None)
    bad, _ = run(tmp_path, PREFILL, "gpu_throttle", params={"cause": "power_cap"})
    gemm = ratio(kernels(bad, "gemm", large_tile=True), kernels(ok, "gemm", large_tile=True))
    assert gemm > 1.6
    for fam in ("rms_norm", "silu_and_mul"):
        r = ratio(kernels(bad, fam), kernels(ok, fam))
        assert r < 1.35 and gemm > 1.4 * r, fam


def test_hbm_contention_slows_memory_bound_kernels_and_shows_foreign_kernels(tmp_path):
    ok, _ = run(tmp_path, PREFILL, None)
    bad, _ = run(tmp_path, PREFILL, "hbm_contention", rank=0, params={"foreign_visible": True})
    assert ratio(kernels(bad, "rms_norm", device=0), kernels(ok, "rms_norm", device=0)) > 1.8
    assert (
        ratio(kernels(bad, "gemm", device=0, large_tile=True), kernels(ok, "gemm", device=0, large_tile=True))
        < 1.2
    )
    # the other rank is unaffected
    assert ratio(kernels(bad, "rms_norm", device=1), kernels(ok, "rms_norm", device=1)) < 1.15
    foreign = bad.layer_mask("kernel") & (bad.tid != 7)
    assert foreign.sum() > 0 and set(np.unique(bad.device[foreign])) == {0}
    assert (ok.layer_mask("kernel") & (ok.tid != 7)).sum() == 0


def test_a_time_sliced_neighbour_delays_kernels_without_slowing_them(tmp_path):
    """Another process on the GPU without MPS (measured on an H200, docs/faults.md): the victim's
    kernels keep their durations but start late, its syncs wait, nothing foreign is recorded."""
    params = {"sharing": "time_slice", "period_ns": 4e6, "phase": 0.3}
    ok, _ = run(tmp_path, STEADY, None)
    bad, res = run(tmp_path, STEADY, "hbm_contention", rank=0, params=params)
    for fam in ("rms_norm", "gemm"):
        assert ratio(kernels(bad, fam, device=0), kernels(ok, fam, device=0)) < 1.08, fam

    def launch_delay(tr, device):  # launch call's end -> start of the first kernel it launched
        k = np.flatnonzero(tr.layer_mask("kernel") & (tr.device == device) & (tr.link >= 0))
        first = {}
        for i in k[np.argsort(tr.ts[k], kind="stable")]:
            first.setdefault(int(tr.link[i]), int(tr.ts[i]))
        return np.array([t - (tr.ts[c] + tr.dur[c]) for c, t in first.items()])

    # (CUDA graphs: the host runs ahead, so a healthy launch already waits ~0.3-0.5 ms for the queue)
    assert np.percentile(launch_delay(bad, 0), 90) > np.percentile(launch_delay(ok, 0), 90) + 1e6
    # the host waits for it where it waits for the GPU: the copy of the sampled ids, the stream sync
    waits = ("cudaMemcpyAsync", "cudaStreamSynchronize")
    assert sum(runtime(bad, w).sum() for w in waits) > 2 * sum(runtime(ok, w).sum() for w in waits)
    assert (bad.layer_mask("kernel") & (bad.tid != 7)).sum() == 0
    eff = res.faults[0].effect
    assert eff.events > 0 and eff.extra_ns > 0
    # culprits: the rank's kernels and its host waits for them, nothing of the other rank
    ann = {
        "faults": [_fault_json(res.faults[0], REAL, res.pids)],
        "workload": {"processes": [{"rank": r, "pid": p, "device": r} for r, p in enumerate(res.pids)]},
    }
    m = culprit_mask(bad, ann)
    names = np.array(bad.strings, dtype=object)[bad.name]
    kern = bad.layer_mask("kernel") & m
    assert kern.sum() > 0 and set(np.unique(bad.device[kern])) == {0}
    waits = m & bad.layer_mask("runtime")
    assert set(names[waits]) <= {"cudaMemcpyAsync", "cudaStreamSynchronize"} and waits.sum() > 0
    assert set(np.unique(bad.pid[waits])) == {res.pids[0]}


def test_nccl_straggler_slows_one_rank_and_the_others_wait_in_all_reduce(tmp_path):
    ok, _ = run(tmp_path, PREFILL, None)
    bad, _ = run(tmp_path, PREFILL, "nccl_straggler", rank=1)
    assert ratio(kernels(bad, "gemm", device=1), kernels(ok, "gemm", device=1)) > 1.5
    assert ratio(kernels(bad, "gemm", device=0), kernels(ok, "gemm", device=0)) < 1.1
    # the healthy rank waits for the straggler inside the all-reduce kernel
    ar0, ar1 = kernels(bad, "all_reduce", device=0), kernels(bad, "all_reduce", device=1)
    assert ar0.mean() > 3 * ar1.mean()
    ok0, ok1 = kernels(ok, "all_reduce", device=0), kernels(ok, "all_reduce", device=1)
    assert 0.3 < ok0.mean() / ok1.mean() < 3.0


def test_nvlink_degradation_slows_all_reduce_on_every_rank_uniformly(tmp_path):
    ok, _ = run(tmp_path, STEADY, None)
    bad, _ = run(tmp_path, STEADY, "nvlink_degradation")
    for dev in (0, 1):
        assert ratio(kernels(bad, "all_reduce", device=dev), kernels(ok, "all_reduce", device=dev)) > 1.5
    assert ratio(kernels(bad, "gemm"), kernels(ok, "gemm")) < 1.1
    r = kernels(bad, "all_reduce", device=0).mean() / kernels(bad, "all_reduce", device=1).mean()
    assert 0.5 < r < 2.0


def test_pcie_degradation_slows_memcpy(tmp_path):
    ok, _ = run(tmp_path, STEADY, None)
    bad, _ = run(tmp_path, STEADY, "pcie_degradation")
    mk = lambda tr: tr.dur[tr.layer_mask("memcpy")].astype(float)  # noqa: E731
    assert ratio(mk(bad), mk(ok)) > 2.0
    assert ratio(runtime(bad, "cudaMemcpyAsync"), runtime(ok, "cudaMemcpyAsync")) > 1.5
    assert ratio(kernels(bad, "gemm"), kernels(ok, "gemm")) < 1.1


def test_cpu_contention_stretches_host_side_not_kernels(tmp_path):
    eager = replace(STEADY, cuda_graphs=False)
    ok, _ = run(tmp_path, eager, None)
    bad, _ = run(tmp_path, eager, "cpu_contention")
    assert ratio(runtime(bad, "cudaLaunchKernel"), runtime(ok, "cudaLaunchKernel")) > 1.8
    assert ratio(kernels(bad, "gemm"), kernels(ok, "gemm")) < 1.1
    ho = lambda tr: tr.dur[tr.layer_mask("host_op")].astype(float)  # noqa: E731
    assert ratio(ho(bad), ho(ok)) > 1.8


def test_host_memory_pressure_gives_sporadic_long_host_stalls(tmp_path):
    wl = replace(STEADY, steps=24)
    ok, _ = run(tmp_path, wl, None)
    bad, res = run(tmp_path, wl, "host_memory_pressure", rank=0)
    names = np.array(bad.strings, dtype=object)[bad.name]
    host = bad.layer_mask("annotation") & np.isin(names, ["prepare_inputs", "postprocess"])
    names_ok = np.array(ok.strings, dtype=object)[ok.name]
    host_ok = ok.layer_mask("annotation") & np.isin(names_ok, ["prepare_inputs", "postprocess"])
    assert bad.dur[host].max() > 1_000_000  # a stall of > 1 ms
    assert bad.dur[host].max() > 5 * ok.dur[host_ok].max()
    # kernels unchanged
    assert ratio(kernels(bad, "gemm"), kernels(ok, "gemm")) < 1.1


def test_kv_cache_exhaustion_preempts_and_reprefills(tmp_path):
    wl = replace(DECODE, steps=24, init_running=48, rate=40.0)
    hits = reprefills = 0
    for seed in (1, 2, 3):
        _ok, ok_res = run(tmp_path, wl, None, seed=seed)
        bad, res = run(tmp_path, wl, "kv_cache_exhaustion", seed=seed, sev=1.0)
        # vLLM V1 logs no line per preemption (V0's "Sequence group ... is preempted" warning) and
        # its stats line no count (generator version 7): the evidence is usage, waiting, re-prefill
        assert "is preempted" not in res.log and "Preemptions" not in res.log
        assert res.stats["max_kv_usage"] > 0.97
        assert res.stats["max_waiting"] > 0
        assert ok_res.stats["preemptions"] == ok_res.stats["reprefills"] == 0
        if res.stats["preemptions"]:
            hits += 1
            # re-prefill: a preempted request is admitted again and recomputed from its prompt (the
            # scheduler's count: the log no longer says when a preemption happened)
            reprefills += int(res.stats["reprefills"] > 0)
    assert hits >= 2 and reprefills >= 1


def test_eager_mode_misconfig(tmp_path):
    ok, ok_res = run(tmp_path, DECODE, None)
    bad, res = run(tmp_path, DECODE, "eager_mode_misconfig")
    assert len(runtime(ok, "cudaGraphLaunch")) > 0
    assert len(runtime(bad, "cudaGraphLaunch")) == 0
    assert len(runtime(bad, "cudaLaunchKernel")) > 2 * max(1, len(runtime(ok, "cudaLaunchKernel")))
    assert "enforce_eager=True" in res.log and "Graph capturing finished" not in res.log
    assert "'enforce_eager': True" in res.log and "'enforce_eager'" not in ok_res.log  # 0.10's args line
    assert "enforce_eager=False" in ok_res.log and "Graph capturing finished" in ok_res.log
    # the config check's warning is the API server's (generator version 8): no trace process's
    warn = [ln.split(" ", 2)[2] for ln in res.log.splitlines() if "async output processing" in ln]
    assert len(warn) == 1 and warn[0].startswith("(APIServer pid=") and " WARNING " in warn[0], warn


def test_oom_error_ends_trace_early_with_traceback(tmp_path):
    ok, _ = run(tmp_path, DECODE, None)
    bad, res = run(tmp_path, DECODE, "oom_error", rank=1)
    assert "torch.OutOfMemoryError: CUDA out of memory" in res.log
    assert "EngineDeadError" in res.log
    # generator version 7: the failing worker's own record, then the engine core's, each line with
    # its process and record header (vLLM's formatter), the API server's EngineDeadError last
    lines = [ln.split(" ", 2)[2] for ln in res.log.splitlines()]
    worker = [ln for ln in lines if ln.startswith("(Worker_TP1 pid=") and " ERROR " in ln]
    assert worker and "WorkerProc hit an exception." in worker[0]
    assert any("torch.OutOfMemoryError: CUDA out of memory" in ln for ln in worker)
    core = [ln for ln in lines if ln.startswith("(EngineCore_DP0 pid=") and " ERROR " in ln]
    assert "EngineCore encountered a fatal error." in core[0]
    assert (
        core[-1].split("] ", 1)[1].startswith("RuntimeError: Worker failed with error 'CUDA out of memory.")
    )
    assert all(" ERROR " in ln for ln in lines if "Traceback (most recent call last)" in ln)
    # generator version 8: vLLM's handler writes its records to stdout, errors included; the
    # worker's frame in worker_busy_loop has its source line
    assert [ln.split(" ", 2)[1] for ln in res.log.splitlines()] == ["stdout"] * len(lines)
    i = next(k for k, ln in enumerate(worker) if ln.endswith("in worker_busy_loop"))
    assert worker[i + 1].endswith("]     output = func(*args, **kwargs)")
    # ... and at TP > 1 rank 0 is a worker process of its own: the engine core's record of the
    # crash names no process of the trace, so the per-process log counts mark the failing rank only,
    # one record each (a traceback's lines repeat its header)
    from teller.data.summary import process_log_levels
    from teller.data.tokenize import parse_log

    pid_of = {ln.split(" pid=")[0][1:]: int(ln.split(" pid=")[1].split(")")[0]) for ln in lines}
    host_pids = set(np.unique(bad.pid[bad.layer_mask("runtime")]).tolist())
    assert host_pids == {pid_of["Worker_TP0"], pid_of["Worker_TP1"]}, (host_pids, pid_of)
    assert pid_of["EngineCore_DP0"] not in host_pids
    (tmp_path / "log.txt").write_text(res.log)
    levels = process_log_levels(parse_log(tmp_path / "log.txt"))
    assert levels[pid_of["Worker_TP1"]] == (1, 0) and levels[pid_of["EngineCore_DP0"]] == (1, 0)
    assert pid_of["Worker_TP0"] not in levels
    by_line = process_log_levels(parse_log(tmp_path / "log.txt"), records=False)
    assert by_line[pid_of["Worker_TP1"]][0] == len(worker) > 1
    assert len(bad.steps()) < len(ok.steps())
    assert (bad.flags & FLAG_UNFINISHED).sum() > 0
    assert (ok.flags & FLAG_UNFINISHED).sum() == 0


def test_network_delay_shows_in_requests_and_responses_only(tmp_path):
    wl = replace(DECODE, rate=150.0, steps=20)
    ok, ok_res = run(tmp_path, wl, None)
    bad, res = run(tmp_path, wl, "network_delay", params={"delay_ms": 800.0})
    assert res.log.count("Received request") < ok_res.log.count("Received request")
    # kernels unchanged
    assert ratio(kernels(bad, "gemm"), kernels(ok, "gemm")) < 1.1

    # access-log lines come long after "Finished request"
    def lag(log: str) -> float:
        lines = log.splitlines()
        fin = [int(x.split()[0]) for x in lines if "Finished request" in x]
        acc = [int(x.split()[0]) for x in lines if "200 OK" in x]
        return float(np.max(np.array(acc) - np.array(fin))) if fin else 0.0

    assert "Finished request" in res.log  # (a request finished while the fault lasted: its response lags)
    assert lag(res.log) > 100e6


def test_launch_storm_adds_tiny_elementwise_kernels(tmp_path):
    ok, _ = run(tmp_path, STEADY, None)
    bad, _ = run(tmp_path, STEADY, "launch_storm")
    assert len(kernels(bad, "elementwise")) > 20
    assert len(kernels(ok, "elementwise")) == 0


def test_culprit_mask_selects_target_rank_family_and_window(tmp_path):
    bad, res = run(tmp_path, PREFILL, "nccl_straggler", rank=1)
    f = res.faults[0]
    ann = {
        "faults": [_fault_json(f, REAL, res.pids)],
        "workload": {"processes": [{"rank": r, "pid": p, "device": r} for r, p in enumerate(res.pids)]},
    }
    m = culprit_mask(bad, ann)
    assert m.sum() > 0
    assert set(np.unique(bad.device[m])) == {1}
    assert bad.layer_mask("kernel")[m].all()
    names = np.array(bad.strings, dtype=object)[bad.name]
    assert not any(kernel_family(n) == "all_reduce" for n in names[m])
    start, end = ann["faults"][0]["start_ns"], ann["faults"][0]["end_ns"]
    assert (bad.ts[m] >= start).all() and (bad.ts[m] < end).all()
    assert culprit_mask(bad, {"faults": [], "workload": ann["workload"]}).sum() == 0


@pytest.mark.parametrize("ftype", sorted(FAULT_INFO))
def test_every_fault_type_simulates_and_has_culprits(tmp_path, ftype):
    wl = DECODE if ftype not in ("eager_mode_misconfig",) else replace(DECODE, cuda_graphs=True)
    tr, res = run(tmp_path, wl, ftype, rank=0 if ftype in ("nccl_straggler", "hbm_contention") else None)
    f = res.faults[0]
    assert 0 <= f.start_ns < f.end_ns
    ann = {
        "faults": [_fault_json(f, REAL, res.pids)],
        "workload": {"processes": [{"rank": r, "pid": p, "device": r} for r, p in enumerate(res.pids)]},
    }
    m = culprit_mask(tr, ann)
    if ftype not in ("network_delay",) or len(tr):
        assert m.sum() > 0, ftype


# -- effect accounting (FaultEffect) ---------------------------------------------------------------


@pytest.mark.parametrize("ftype", sorted(FAULT_INFO))
def test_effect_accounting_does_not_change_the_sample(tmp_path, ftype, monkeypatch):
    """The counters themselves draw no random numbers: with them switched off the sample is the same.
    (That the simulator around them draws as before is pinned by the benchmark digests in
    test_data_dataset.py.)"""
    from teller.data import faults as F

    wl = DECODE if ftype != "eager_mode_misconfig" else replace(DECODE, cuda_graphs=False)
    tr, res = run(
        tmp_path / "on", wl, ftype, rank=0 if ftype in ("nccl_straggler", "hbm_contention") else None
    )
    assert res.faults[0].effect.events > 0, ftype
    monkeypatch.setattr(F.Effects, "charge", lambda self, *a, **k: None)
    monkeypatch.setattr(F.Effects, "count", lambda self, *a, **k: None)
    tr2, res2 = run(
        tmp_path / "off", wl, ftype, rank=0 if ftype in ("nccl_straggler", "hbm_contention") else None
    )
    assert res2.faults[0].effect.events == 0
    assert res.log == res2.log
    for col in ("ts", "dur", "name", "pid", "tid", "corr"):
        assert np.array_equal(getattr(tr, col), getattr(tr2, col)), (ftype, col)


def test_effect_of_a_power_cap_matches_the_clock_factor(tmp_path):
    """A power cap at severity s runs compute-bound kernels at 1 - 0.55 s of the clock: the counted
    slowdown of the stretched kernels is at most 1 / (1 - 0.55 s) - 1 and well above the HBM part."""
    _, res = run(tmp_path, PREFILL, "gpu_throttle", sev=0.8, params={"cause": "power_cap"})
    e = res.faults[0].effect
    top = 1 / (1 - 0.55 * 0.8) - 1
    extra, base = e.by_kind["gpu"]
    assert set(e.by_kind) == {"gpu"} and extra == e.extra_ns
    assert 0.25 < extra / base <= top + 1e-9
    assert 0 < e.share < 1
    j = e.to_json("gpu_throttle")
    assert j["events"] == e.events and j["slowdown"] == round(extra / base, 4)
    _, mild = run(tmp_path, PREFILL, "gpu_throttle", sev=0.1, params={"cause": "power_cap"})
    assert mild.faults[0].effect.share < e.share / 4


def _net_delay(start: int, end: int) -> Fault:
    """An 800 ms network delay over engine steps [start, end)."""
    target = {"kind": "engine", "name": "api_server", "rank": 0}
    return Fault("network_delay", "engine", start, end, 1.0, target, {"delay_ms": 800.0})


def test_effect_of_network_delay_counts_held_released_and_delayed(tmp_path):
    wl = replace(DECODE, rate=150.0, steps=20)
    _, res = run(tmp_path, wl, "network_delay", params={"delay_ms": 800.0})
    c = res.faults[0].effect.counts
    assert c.get("held_requests", 0) > 0
    # the window covers every step, so nothing held is released inside the capture
    assert c.get("released_requests", 0) == 0
    assert c["delayed_responses"] == res.log.count("Finished request")
    assert res.faults[0].effect.share is None  # not a time-stretching fault
    # a window that closes mid-capture releases what it held
    res2 = simulate(wl, [_net_delay(2, 8)], np.random.default_rng(7), tmp_path / "mid", real_base=REAL)
    c2 = res2.faults[0].effect.counts
    assert c2["released_requests"] == c2["held_requests"] > 0


def test_a_fault_window_without_work_has_no_effect(tmp_path):
    """Nothing arriving and nothing finishing in the window (long outputs, a trickle of arrivals): a
    network delay there changes nothing, and its effect says so (events 0): the label is not
    observable."""
    wl = replace(STEADY, output_mean=20000)
    res = simulate(wl, [_net_delay(0, 3)], np.random.default_rng(7), tmp_path / "nd", real_base=REAL)
    assert "Finished request" not in res.log and "Received request" not in res.log
    assert res.faults[0].effect.events == 0
    assert res.faults[0].effect.to_json("network_delay") == {"events": 0, "extra_ms": 0.0}


def test_overlapping_faults_each_get_their_marginal_effect(tmp_path):
    """A mild HBM contention under a strong power cap: the cap's stretch is not credited to it."""
    wl = PREFILL

    def hbm(sev: float) -> Fault:
        return Fault("hbm_contention", "device", 0, wl.steps, sev, {"kind": "rank", "name": "x", "rank": 0})

    cap = Fault("gpu_throttle", "device", 0, wl.steps, 0.9, {"kind": "rank", "name": "x", "rank": None})
    cap.params["cause"] = "power_cap"
    alone = simulate(wl, [hbm(0.1)], np.random.default_rng(7), tmp_path / "a", real_base=REAL).faults[0]
    both = simulate(wl, [hbm(0.1), cap], np.random.default_rng(7), tmp_path / "b", real_base=REAL).faults
    assert 0 < alone.effect.share
    # the same order of magnitude (the batches differ: the capped steps are slower), not the cap's
    assert both[0].effect.share < 3 * alone.effect.share
    assert both[1].effect.share > 20 * both[0].effect.share


def test_a_stragglers_share_counts_its_gpu_time_only(tmp_path):
    """A straggler stretches its host too: that time is in extra_ms, not in its GPU share."""
    _, res = run(tmp_path, PREFILL, "nccl_straggler", rank=1, sev=0.8)
    e = res.faults[0].effect
    assert set(e.by_kind) == {"gpu", "host"}
    assert e.extra_ns == pytest.approx(e.by_kind["gpu"][0] + e.by_kind["host"][0])
    j = e.to_json("nccl_straggler")
    assert j["slowdown"] == round(e.by_kind["gpu"][0] / e.by_kind["gpu"][1], 4)
    assert 0 < e.share < 1


def test_effects_share_divides_its_own_kind_by_its_own_work():
    """Effects.charge / finish by hand: a straggler on rank 1 stretches a kernel 10 -> 15 and a host
    range 4 -> 5; rank 0 has 30 of clean GPU work and 6 of host. Its share is GPU extra / GPU work
    (5 / 40: a launch storm's added kernel is not fault-free work); a second fault on the same kernel
    gets its marginal part, not the whole stretch."""
    from teller.data.faults import KERNEL_FAULTS as kf
    from teller.data.faults import Effects

    st = Fault("nccl_straggler", "communication", 0, 4, 0.5, {"kind": "rank", "name": "w", "rank": 1})
    fx = Effects([st], tp=2)
    fx.charge("gpu", 1, 10.0, 15.0, kf)
    fx.charge("host", 1, 4.0, 5.0, ("cpu_contention", "nccl_straggler"))
    fx.charge("gpu", 0, 30.0, 30.0, kf)  # rank 0: unaffected work
    fx.charge("host", 0, 6.0, 6.0, ("nccl_straggler",))
    fx.charge("gpu", 0, 0.0, 7.0, ("launch_storm",), added=True)  # not fault-free work
    fx.finish()
    e = st.effect
    assert (e.events, e.extra_ns) == (2, 6.0)
    assert e.by_kind == {"gpu": [5.0, 10.0], "host": [1.0, 4.0]}
    assert e.share == pytest.approx(5.0 / 40.0)
    assert e.to_json("nccl_straggler")["slowdown"] == 0.5
    # two faults on one kernel: 10 -> 20, of which 10 -> 12 without the throttle (the straggler's)
    th = Fault("gpu_throttle", "device", 0, 4, 0.5, {"kind": "rank", "name": "x", "rank": None})
    st2 = Fault("nccl_straggler", "communication", 0, 4, 0.5, {"kind": "rank", "name": "w", "rank": 0})
    fx = Effects([th, st2], tp=1)
    fx.charge("gpu", 0, 10.0, 20.0, kf, lambda f: 12.0 if f is th else 15.0)
    assert th.effect.by_kind["gpu"] == [8.0, 12.0]
    assert st2.effect.by_kind["gpu"] == [5.0, 15.0]


def test_pcie_degradation_scales_latency_and_bandwidth_apart():
    """bandwidth / (1 + 12 s), latency x (1 + 3 s) (docs/faults.md): at severity 1 a large copy is
    ~13x slower and a tiny one ~4x; before generator version 7 the latency factor multiplied the
    whole copy (a 64 MiB copy 52x slower)."""
    from teller.data import kernels as K

    g = K.gpu_spec("H100")
    big, tiny = 64 * 2**20, 64
    slow = K.memcpy_ns(g, big, pcie=1 / 13, latency=4.0) / K.memcpy_ns(g, big)
    assert 12.0 < slow < 13.1
    assert 3.9 < K.memcpy_ns(g, tiny, pcie=1 / 13, latency=4.0) / K.memcpy_ns(g, tiny) < 4.1
