"""What changed between two captures (``teller.compare``, ``teller trace compare``,
``teller diagnose --baseline``), on hand-built Kineto-style traces with known answers and on the
simulator's captures of one workload with and without a fault."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from teller.compare import compare, symbol_times
from test_findings import _Trace


def _steps(tmp_path, name: str, kernel_us: float, *, n: int = 4, extra: str | None = None, op_us: float = 20):
    """``n`` ProfilerSteps of 200 us, each an operator range (``op_us``, with a launch inside) whose
    kernel runs ``kernel_us``; ``extra``: one more kernel per step of that name (10 us)."""
    t = _Trace()
    for k in range(n):
        at = k * 300.0
        t.step(f"ProfilerStep#{k}", at, 200)
        t.ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": at + 5,
                     "dur": op_us})  # fmt: skip
        t.launch(at + 6, 3, at + 10, kernel_us)
        if extra:
            t.launch(at + 30, 3, at + 120, 10, name=extra)
    return t.load(tmp_path, name)


def test_symbol_times_count_host_self_time_and_gpu_duration(tmp_path) -> None:
    tr = _steps(tmp_path, "a.json", 50, n=1)
    st = symbol_times(tr)
    # the step range (200 us) holds aten::mm (20 us), which holds cudaLaunchKernel (3 us); the kernel
    # (50 us) runs on the GPU and takes nothing from the host ranges
    assert st["annotation:ProfilerStep#N"]["ns"] == pytest.approx((200 - 20) * 1e3)
    assert st["host_op:aten::mm"]["ns"] == pytest.approx((20 - 3) * 1e3)
    assert st["runtime:cudaLaunchKernel"]["ns"] == pytest.approx(3e3)
    assert st["kernel:gemm_kernel"] == {"layer": "kernel", "count": 1, "ns": pytest.approx(50e3)}


def test_compare_names_the_kernel_that_slowed_and_the_new_one(tmp_path) -> None:
    base = _steps(tmp_path, "base.json", 20)
    cur = _steps(tmp_path, "cur.json", 80, n=6, extra="debug_kernel")
    c = compare(base, cur)
    assert (
        c["unit"] == "step" and c["steps"]["baseline"]["count"] == 4 and c["steps"]["current"]["count"] == 6
    )
    top = {r["symbol"]: r for r in c["symbols"]}
    k = top["kernel:gemm_kernel"]
    # per step, so the 6-step capture compares with the 4-step one
    assert k["baseline_ns"] == pytest.approx(20e3) and k["current_ns"] == pytest.approx(80e3)
    assert k["delta_ns"] == pytest.approx(60e3) and k["ratio"] == pytest.approx(4.0)
    assert c["symbols"][0]["symbol"] == "kernel:gemm_kernel"
    new = top["kernel:debug_kernel"]
    assert new["baseline_ns"] == 0 and new["ratio"] is None and new["current_count"] == 1
    says = "\n".join(c["statements"])
    assert "kernel:gemm_kernel: +60.0 us per step (4.00x" in says
    assert "kernel:debug_kernel is new: 10.0 us per step (1 events per step)" in says
    # the GPU's breakdown, one GPU: the same numbers as the whole, said once
    assert [g["gpu"] for g in c["gpus"]] == ["GPU 0", "all GPUs"]
    assert c["gpus"][1]["current"]["compute_ns"] > c["gpus"][1]["baseline"]["compute_ns"]
    assert any(s.startswith("GPU 0: compute") for s in c["statements"])
    assert not any(s.startswith("all GPUs") or s.startswith("the GPUs") for s in c["statements"])


def test_the_same_capture_changes_nothing(tmp_path) -> None:
    tr = _steps(tmp_path, "a.json", 20)
    c = compare(tr, tr)
    assert c["statements"] == [] and all(r["delta_ns"] == 0 for r in c["symbols"])


def test_without_steps_captures_compare_whole(tmp_path) -> None:
    a, b = _Trace(), _Trace()
    for k in range(5):
        a.launch(k * 100, 2, k * 100 + 5, 10)
        b.launch(k * 100, 2, k * 100 + 5, 30)
    c = compare(a.load(tmp_path, "a.json"), b.load(tmp_path, "b.json"))
    assert c["unit"] == "capture" and c["steps"]["baseline"]["count"] == 0
    k = c["symbols"][0]
    assert k["symbol"] == "kernel:gemm_kernel" and k["delta_ns"] == pytest.approx(100e3)
    assert c["statements"][0].startswith("kernel:gemm_kernel: +0.1 ms per capture (3.00x")


def test_simulated_straggler_against_its_healthy_run(tmp_path) -> None:
    from test_data_faults import STEADY, run

    base, _ = run(tmp_path, STEADY, None)
    cur, _ = run(tmp_path, STEADY, "nccl_straggler", rank=0)
    c = compare(base, cur)
    assert [g["gpu"] for g in c["gpus"]] == ["GPU 0", "GPU 1", "all GPUs"]
    says = c["statements"]
    assert says[0].startswith("the median step took") and any("cross_device_reduce" in s for s in says)
    # the straggler's peer (GPU 1) now waits in the all-reduce: its own change, apart from the whole
    assert any(s.startswith("GPU 1: communication") for s in says)


def test_cli_trace_compare(tmp_path) -> None:
    _steps(tmp_path, "base.json", 20)
    _steps(tmp_path, "cur.json", 80, extra="debug_kernel")
    cli = [sys.executable, "-m", "teller", "trace", "compare"]
    a, b = str(tmp_path / "base.json"), str(tmp_path / "cur.json")
    r = subprocess.run([*cli, a, b, "--json", "--top", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["baseline"] == a and d["current"] == b and len(d["symbols"]) == 3 and d["statements"]
    r = subprocess.run([*cli, a, b], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "what changed" in r.stdout and "kernel:gemm_kernel" in r.stdout
    r = subprocess.run([*cli, a, str(tmp_path / "missing.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "missing.json" in r.stderr and "Traceback" not in r.stderr
