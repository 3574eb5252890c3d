"""What changed between two captures (``teller.compare``, ``teller trace compare``,
``teller diagnose --baseline``), on hand-built Kineto-style traces with known answers and on the
simulator's captures of one workload with and without a fault."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import teller
from teller.compare import compare, symbol_times
from test_findings import _Trace


def _steps(tmp_path, name: str, kernel_us: float, *, n: int = 4, extra: str | None = None, op_us: float = 20,
           kernel: str = "gemm_kernel"):  # fmt: skip
    """``n`` ProfilerSteps of 200 us, each an operator range (``op_us``, with a launch inside) whose
    kernel (named ``kernel``) runs ``kernel_us``; ``extra``: one more kernel per step of that name (10 us)."""
    t = _Trace()
    for k in range(n):
        at = k * 300.0
        t.step(f"ProfilerStep#{k}", at, 200)
        t.ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": at + 5,
                     "dur": op_us})  # fmt: skip
        t.launch(at + 6, 3, at + 10, kernel_us, name=kernel)
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
    assert "kernel:debug_kernel is new: 10.0 us per step (1 event per step)" in says
    # the GPU's breakdown, one GPU: the same numbers as the whole, said once
    assert [g["gpu"] for g in c["gpus"]] == ["GPU 0", "all GPUs"]
    assert c["gpus"][1]["current"]["compute_ns"] > c["gpus"][1]["baseline"]["compute_ns"]
    assert any(s.startswith("GPU 0: compute") for s in c["statements"])
    assert not any(s.startswith("all GPUs") or s.startswith("the GPUs") for s in c["statements"])


def test_a_gemm_run_on_another_kernel_is_one_change_of_its_class(tmp_path) -> None:
    # after a cuBLAS upgrade the same matmul runs as nvjet instead of xmma: 52 us against 50 us
    base = _steps(
        tmp_path, "base.json", 50, kernel="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
    )
    cur = _steps(
        tmp_path, "cur.json", 52, kernel="nvjet_sm90_tst_64x8_64x16_1x4_h_bz_TNT", extra="rms_norm_kernel"
    )
    c = compare(base, cur)
    cls = {a["class"]: a for a in c["kernel_classes"]}
    g = cls["GEMM"]
    assert g["baseline_ns"] == pytest.approx(50e3) and g["current_ns"] == pytest.approx(52e3)
    assert g["gone"] == ["kernel:sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize*"]
    assert g["new"] == ["kernel:nvjet_sm90_tst_*_*_*_h_bz_TNT"]
    n = cls["normalization"]  # (new, but nothing of its class ran before: a new kernel, said as one)
    assert n["new"] == ["kernel:rms_norm_kernel"] and n["gone"] == [] and n["ratio"] is None
    says = c["statements"]
    swap = [s for s in says if s.startswith("GEMM kernels ran as other kernels")]
    assert swap == [
        "GEMM kernels ran as other kernels: nvjet_sm90_tst_*_*_*_h_bz_TNT new, "
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize* gone; "
        "about the same time in all (52.0 us per step against 50.0 us)"
    ]
    # the swap is one sentence, not a "new" and a "gone"; the normalization kernel is new
    assert not any("nvjet" in s and "is new" in s for s in says) and not any("is gone" in s for s in says)
    assert "kernel:rms_norm_kernel is new: 10.0 us per step (1 event per step)" in says
    # a slower swap says by how much
    slow = compare(base, _steps(tmp_path, "slow.json", 100, kernel="nvjet_sm90_tst_64x8_64x16_1x4_h_bz_TNT"))
    assert any(s.endswith("0.1 ms per step in all against 50.0 us (2.00x)") for s in slow["statements"])


@pytest.mark.parametrize(
    ("symbol", "cls"),
    [
        ("kernel:ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
        ("kernel:cross_device_reduce_1stage", "communication"),
        # DeepEP's expert-parallel exchange, its namespace stripped or kept; its layout kernel routes
        ("kernel:dispatch", "communication"),
        ("kernel:deep_ep::internode_ll::combine", "communication"),
        ("kernel:cached_notify_combine", "communication"),
        ("kernel:get_dispatch_layout", "MoE routing"),
        ("kernel:flash_fwd_splitkv_kernel", "attention"),
        ("kernel:paged_attention_ll4mi_reduce_kernel", "attention"),
        ("kernel:reshape_and_cache_flash_kernel", "copy and index"),
        ("kernel:ImplicitGemmConvolution", "convolution"),
        ("kernel:ReduceSplitK", "GEMM"),
        ("kernel:Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT*_MI*_SN", "GEMM"),
        ("kernel:add_rmsnorm_quant_kernel", "normalization"),
        ("kernel:rotary_embedding_kernel", "elementwise"),
        ("kernel:CatArrayBatchedCopy_aligned16_contig", "copy and index"),
        ("kernel:softmax_warp_forward", "softmax, top-k, sort"),
        ("kernel:gatherTopK", "softmax, top-k, sort"),
        # FlashInfer: attention that names the KV cache it reads, the cache write, sampling, a norm
        ("kernel:BatchDecodeWithPagedKVCacheKernel", "attention"),
        ("kernel:BatchPrefillWithRaggedKVCacheKernel", "attention"),
        ("kernel:AppendPagedKVCacheKernel", "copy and index"),
        ("kernel:MergeStatesKernel", "attention"),
        ("kernel:TopPRenormProbKernel", "sampling"),
        ("kernel:TopKTopPSamplingFromProbKernel", "sampling"),
        ("kernel:flashinfer::norm::RMSNormKernel", "normalization"),
        ("kernel:FlashAttnFwdSm90", "attention"),
        # MoE: the grouped GEMMs, the routing
        ("kernel:fused_moe_kernel", "GEMM"),
        ("kernel:marlin_moe_wna16", "GEMM"),
        ("kernel:MacheteKernel", "GEMM"),
        ("kernel:topkGatingSoftmax", "MoE routing"),
        ("kernel:moe_align_block_size_kernel", "MoE routing"),
        ("kernel:triton_tem_fused_addmm_relu", "GEMM"),
        # words inside other words
        ("kernel:convert_fp8_kernel", "other"),
        ("kernel:normal_kernel", "other"),
        ("kernel:upsample_bilinear2d_out_frame", "other"),
        ("kernel:ncclDevKernel_SendRecv", "communication"),
        ("kernel:custom_all_reduce_1stage", "communication"),
        ("kernel:reduce_kernel", "reduction"),
        ("kernel:multi_tensor_apply_kernel", "other"),
        ("runtime:cudaLaunchKernel", None),
    ],
)
def test_kernel_classes(symbol, cls) -> None:
    from teller.compare import kernel_class

    assert kernel_class(symbol) == cls


def test_a_swap_is_kernels_of_one_class_of_comparable_time(tmp_path) -> None:
    from teller.compare import is_swap

    def cls(name: str, gone_ns: float, new_ns: float) -> dict:
        return {
            "class": name,
            "gone": ["kernel:a"],
            "new": ["kernel:b"],
            "gone_ns": gone_ns,
            "new_ns": new_ns,
        }

    assert is_swap(cls("GEMM", 50e3, 52e3)) and is_swap(cls("GEMM", 50e3, 99e3))
    # a tiny kernel gone and a large one new: two changes; "other" says nothing of what they do
    assert not is_swap(cls("GEMM", 5e3, 52e3)) and not is_swap(cls("other", 50e3, 52e3))
    assert not is_swap({**cls("GEMM", 50e3, 52e3), "new": []})
    # so an unrelated new kernel is still said as new
    base = _steps(tmp_path, "base.json", 50, kernel="nchwToNhwcKernel")
    cur = _steps(tmp_path, "cur.json", 50, kernel="nan_inf_check_kernel")
    st = compare(base, cur)["statements"]
    assert any(s.startswith("kernel:nan_inf_check_kernel is new") for s in st), st
    assert any(s.startswith("kernel:nchwToNhwcKernel is gone") for s in st), st


def _loaded_steps(tmp_path, name: str, tokens: list[int], us_per_token: float, *, fixed_us: float = 100):
    """Steps recording their load (``num_tokens``) as vLLM-style engine steps do, each taking
    ``fixed_us + us_per_token * tokens`` with one kernel inside."""
    t = _Trace()
    at = 0.0
    for k, n in enumerate(tokens):
        dur = fixed_us + us_per_token * n
        t.step(f"ProfilerStep#{k}", at, dur)
        t.ev[-1]["args"] = {"num_tokens": n}
        t.launch(at + 2, 3, at + 6, dur / 2)
        at += dur + 50
    return t.load(tmp_path, name)


def test_a_load_change_is_read_against_the_baselines_time_for_that_load(tmp_path) -> None:
    base = _loaded_steps(tmp_path, "base.json", [10, 20, 40, 80, 160, 320, 10, 20], 1.0)
    # twice the tokens per step, each step 1.5x what the baseline's take for its tokens
    cur = _loaded_steps(tmp_path, "cur.json", [20, 40, 80, 160, 320, 40], 1.5, fixed_us=150)
    c = compare(base, cur)
    ld = c["load"]
    assert ld["arg"] == "num_tokens" and ld["baseline_median"] == 30 and ld["current_median"] == 60
    assert ld["fixed_ns"] == pytest.approx(100e3) and ld["per_unit_ns"] == pytest.approx(1e3)
    assert ld["ratio"] == pytest.approx(1.5) and ld["in_range"] == 1.0
    said = [s for s in c["statements"] if s.startswith("the steps carried")]
    assert said == [
        "the steps carried 2x the baseline's load (median num_tokens 60 against 30); for their load "
        "they took 1.50x what the baseline's steps take for that load (0.1 ms + 1 us per token)"
    ]
    # the same load: nothing to add to the step time; far beyond the baseline's loads: not compared
    same = compare(base, _loaded_steps(tmp_path, "same.json", [10, 20, 40, 80, 160, 320, 10, 20], 1.5))
    assert not any(s.startswith("the steps carried") for s in same["statements"])
    far = compare(base, _loaded_steps(tmp_path, "far.json", [4000, 5000, 6000], 1.0))
    assert far["load"]["ratio"] is None and far["load"]["in_range"] == 0
    assert any(s.endswith("their time is not compared for their load") for s in far["statements"])
    # steps without a load: none
    assert compare(_steps(tmp_path, "a.json", 20), _steps(tmp_path, "b.json", 30))["load"] is None
    # a baseline of one load has no slope: a step of 1.5x the load on the same cost line is not read
    # as slower for its load, only steps of the baseline's own load are read
    one = _loaded_steps(tmp_path, "one.json", [4096] * 6, 1.0)
    more = compare(one, _loaded_steps(tmp_path, "more.json", [6144] * 4 + [4096] * 2, 1.0))
    assert more["load"]["ratio"] == pytest.approx(1.0) and more["load"]["in_range"] == pytest.approx(2 / 6)
    # steps of no time are not read (their ratio would be 0, and its inverse a division by zero)
    zero = _loaded_steps(tmp_path, "zero.json", [20, 40, 80, 160, 320, 40], 0.0, fixed_us=0)
    z = compare(base, zero)
    assert z["load"]["ratio"] is None and z["load"]["in_range"] == 0
    # the load both captures carry, though the baseline's steps record another one first
    doc = json.loads((tmp_path / "base.json").read_text())
    for e in doc["traceEvents"]:
        if "num_tokens" in e.get("args", {}):
            e["args"] = {"num_seqs": e["args"]["num_tokens"] // 10, "num_tokens": e["args"]["num_tokens"]}
    (tmp_path / "both.json").write_text(json.dumps(doc))
    doc = json.loads((tmp_path / "cur.json").read_text())
    for e in doc["traceEvents"]:
        if "num_tokens" in e.get("args", {}):
            e["args"] = {"num_seqs": e["args"].pop("num_tokens") // 10}
    (tmp_path / "seqs.json").write_text(json.dumps(doc))
    load = teller.trace.load
    mixed = compare(load(tmp_path / "both.json", warn=False), load(tmp_path / "seqs.json", warn=False))[
        "load"
    ]
    assert mixed is not None and mixed["arg"] == "num_seqs"


def test_each_rank_is_read_against_its_own_baseline_steps(tmp_path) -> None:
    # a prefill rank (10 us per token) and a decode rank (1 us per token) in per-rank files; the
    # current capture runs the same costs, more of the prefill rank's steps and at higher loads: per
    # rank nothing moved; one line through both ranks would read the mix as a change
    def rank_file(d, name: str, rank: int, tokens: list[int], us_per_token: float) -> None:
        t = _Trace()
        at = 0.0
        for k, n in enumerate(tokens):
            dur = 100 + us_per_token * n
            t.step(f"ProfilerStep#{k}", at, dur)
            t.ev[-1]["args"] = {"num_tokens": n}
            t.launch(at + 2, 3, at + 6, dur / 2)
            at += dur + 50
        d.mkdir(exist_ok=True)
        doc = {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": t.ev}
        (d / name).write_text(json.dumps(doc))

    loads = [10, 20, 40, 80, 160, 320]
    rank_file(tmp_path / "base", "r0.json", 0, loads, 10.0)
    rank_file(tmp_path / "base", "r1.json", 1, loads, 1.0)
    rank_file(tmp_path / "cur", "r0.json", 0, [160, 320, 320, 160, 320, 160], 10.0)
    rank_file(tmp_path / "cur", "r1.json", 1, [10, 20, 10], 1.0)
    load = teller.trace.load
    c = compare(load(tmp_path / "base", warn=False), load(tmp_path / "cur", warn=False))
    ld = c["load"]
    assert ld["fit"] == "per rank" and ld["in_range"] == 1.0 and ld["ratio"] == pytest.approx(1.0)
    said = [s for s in c["statements"] if s.startswith("the steps carried")]
    assert len(said) == 1 and "about what the baseline's steps take" in said[0]
    assert "each rank against its own steps" in said[0]
    # rank 1 half as slow again per token (7 of the 13 steps): against its own line each of its steps
    # takes (100 + 1.5 n) / (100 + n); the median of all 13 is its smallest, at 10 tokens
    rank_file(tmp_path / "slow", "r0.json", 0, [160, 320, 320, 160, 320, 160], 10.0)
    rank_file(tmp_path / "slow", "r1.json", 1, [10, 20, 10, 20, 40, 10, 20], 1.5)
    slow = compare(load(tmp_path / "base", warn=False), load(tmp_path / "slow", warn=False))["load"]
    assert slow["fit"] == "per rank" and slow["ratio"] == pytest.approx(115 / 110)
    assert slow["unmatched"] == 0
    # a baseline of rank 0 only: rank 1's steps have no line (not rank 0's), and are not counted as
    # outside the loads; most steps on such ranks: said so
    only0 = compare(load(tmp_path / "base" / "r0.json", warn=False), load(tmp_path / "cur", warn=False))
    ld0 = only0["load"]
    assert ld0["fit"] == "per rank" and ld0["ratio"] == pytest.approx(1.0)
    assert ld0["unmatched"] == pytest.approx(3 / 9) and ld0["in_range"] == 1.0
    rank_file(tmp_path / "other", "r2.json", 2, [2 * x for x in loads], 10.0)
    rank_file(tmp_path / "other", "r3.json", 3, [2 * x for x in loads], 1.0)
    other = compare(load(tmp_path / "base", warn=False), load(tmp_path / "other", warn=False))
    assert other["load"]["unmatched"] == 1.0 and other["load"]["ratio"] is None
    said = [s for s in other["statements"] if s.startswith("the steps carried")]
    assert len(said) == 1 and said[0].endswith(
        "mostly on ranks the baseline has too few steps of: their time is not compared for their load"
    )
    # without ranks: one line through both, which the mix moves
    for d in ("base", "cur"):
        for f in (tmp_path / d).iterdir():
            doc = json.loads(f.read_text())
            del doc["distributedInfo"]
            f.write_text(json.dumps(doc))
    one = compare(load(tmp_path / "base", warn=False), load(tmp_path / "cur", warn=False))["load"]
    assert one["fit"] == "all" and abs(one["ratio"] - 1.0) > 0.1


def _rank_file(d, name: str, rank: int) -> None:
    """A per-rank profiler file ``d/name``: 4 steps, each one kernel on GPU 0, 20 us on rank 0 and 80
    us on rank 1."""
    t = _Trace()
    for k in range(4):
        t.step(f"ProfilerStep#{k}", k * 300.0, 200)
        t.launch(k * 300.0 + 6, 3, k * 300.0 + 10, 20 if rank == 0 else 80)
    d.mkdir(exist_ok=True)
    (d / name).write_text(
        json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": t.ev})
    )


def test_gpus_pair_by_rank_whatever_the_order_of_the_files(tmp_path) -> None:
    # two per-rank profiler files, each process on its GPU 0; rank 1 computes 4x longer than rank 0
    # in both captures, and the current capture's files list rank 1 first: paired by rank, nothing
    # moved; paired by order, each GPU would read as the other's change
    rank_file = _rank_file
    rank_file(tmp_path / "base", "a.json", 0)
    rank_file(tmp_path / "base", "b.json", 1)
    rank_file(tmp_path / "cur", "a.json", 1)
    rank_file(tmp_path / "cur", "b.json", 0)
    base = teller.trace.load(tmp_path / "base", warn=False)
    cur = teller.trace.load(tmp_path / "cur", warn=False)
    c = compare(base, cur)
    each = [g for g in c["gpus"] if g["gpu"] != "all GPUs"]
    assert len(each) == 2
    for g in each:
        assert g["baseline"]["compute_ns"] == pytest.approx(g["current"]["compute_ns"])
    # each row names its GPU as both captures do: rank 0 is a.json's in the baseline, b.json's now
    assert sorted((g["baseline_gpu"], g["gpu"]) for g in each) == [
        ("GPU 0 of a.json", "GPU 0 of b.json"),
        ("GPU 0 of b.json", "GPU 0 of a.json"),
    ]
    assert not any(s.startswith("GPU") for s in c["statements"]), c["statements"]
    # without ranks the same files pair in order (and differ)
    for d in ("base", "cur"):
        for f in (tmp_path / d).iterdir():
            doc = json.loads(f.read_text())
            del doc["distributedInfo"]
            f.write_text(json.dumps(doc))
    c2 = compare(
        teller.trace.load(tmp_path / "base", warn=False), teller.trace.load(tmp_path / "cur", warn=False)
    )
    g0 = [g for g in c2["gpus"] if g["gpu"] != "all GPUs"][0]
    assert g0["baseline"]["compute_ns"] != pytest.approx(g0["current"]["compute_ns"])


def test_gpus_pair_by_rank_after_a_merged_round_trip(tmp_path) -> None:
    # the same two per-rank files, each capture merged into one trace.json by teller and read back:
    # the merged file lists each input's pids and rank (teller.sources), so the GPUs still pair by
    # rank and keep their input's name; before, every GPU took the first input's rank and they
    # paired in order (rank 1's file first in the current capture: each read as the other's change)
    rank_file = _rank_file
    rank_file(tmp_path / "base", "a.json", 0)
    rank_file(tmp_path / "base", "b.json", 1)
    rank_file(tmp_path / "cur", "a.json", 1)
    rank_file(tmp_path / "cur", "b.json", 0)
    merged = {}
    for d in ("base", "cur"):
        teller.trace.load(tmp_path / d, warn=False).to_chrome(tmp_path / f"{d}.json")
        merged[d] = teller.trace.load(tmp_path / f"{d}.json", warn=False)
        # (one input now, whose GPU 0 tracks are two processes)
        assert len(merged[d].sources) == 1
    c = compare(merged["base"], merged["cur"])
    each = [g for g in c["gpus"] if g["gpu"] != "all GPUs"]
    assert len(each) == 2
    for g in each:
        assert g["baseline"]["compute_ns"] == pytest.approx(g["current"]["compute_ns"])
    assert sorted((g["baseline_gpu"], g["gpu"]) for g in each) == [
        ("GPU 0 of a.json", "GPU 0 of b.json"),
        ("GPU 0 of b.json", "GPU 0 of a.json"),
    ]
    assert not any(s.startswith("GPU") for s in c["statements"]), c["statements"]
    # a merged file against the rank files it was written from: the same pairing
    c2 = compare(teller.trace.load(tmp_path / "base", warn=False), merged["cur"])
    for g in (g for g in c2["gpus"] if g["gpu"] != "all GPUs"):
        assert g["baseline"]["compute_ns"] == pytest.approx(g["current"]["compute_ns"])


def test_gpus_pair_by_rank_and_device_else_by_rank_else_in_order() -> None:
    from teller.compare import _pair_gpus

    def rows(*keys):
        return [(f"GPU {k}", {}, k) for k in keys]

    # the files listed in another order
    assert _pair_gpus(rows((0, 0), (1, 0)), rows((1, 0), (0, 0))) == [(1, 0), (0, 1)]
    # each rank's GPU as device 0 in one run (CUDA_VISIBLE_DEVICES), as cuda:<rank> in the other
    assert _pair_gpus(rows((0, 0), (1, 0)), rows((1, 1), (0, 0))) == [(1, 0), (0, 1)]
    # a rank with two GPUs whose devices differ: no key pairs them, so in order
    assert _pair_gpus(rows((0, 0), (0, 1)), rows((0, 2), (0, 0))) == [(0, 0), (1, 1)]
    # no ranks: in order; not as many GPUs: none
    assert _pair_gpus(rows(None, None), rows(None, None)) == [(0, 0), (1, 1)]
    assert _pair_gpus(rows((0, 0), (1, 0)), rows((0, 0))) == []


def test_rank_of_an_input() -> None:
    from teller.compare import _rank

    raw = {"kind": "raw", "metadata": {"header": json.dumps({"env": {"RANK": "3"}})}}
    assert _rank(raw) == 3
    assert _rank({"kind": "raw", "metadata": {"header": json.dumps({"env": {}})}}) is None
    assert _rank({"kind": "raw", "metadata": {"header": "not json"}}) is None
    assert _rank({"kind": "chrome", "metadata": {"distributedInfo": json.dumps({"rank": 1})}}) == 1
    assert _rank({"kind": "chrome", "metadata": {"distributedInfo": json.dumps({"rank": True})}}) is None
    assert _rank({"kind": "chrome", "metadata": {}}) is None
    for bad in ("Infinity", "1e400", "2.7", '"x"'):  # (no rank, and no crash)
        assert _rank({"kind": "chrome", "metadata": {"distributedInfo": '{"rank": ' + bad + "}"}}) is None
    assert _rank({"kind": "chrome", "metadata": {"distributedInfo": '{"rank": 2.0}'}}) == 2


def test_host_waits_are_stated_after_the_rest_as_symptoms(tmp_path) -> None:
    # NVLink congestion: the all-reduce kernels slow, and the host's cudaMemcpyAsync of the sampled ids
    # (where it waits for the GPU) grows by as much: stated after the kernels, as the symptom it is
    from test_data_faults import DECODE, run

    base, _ = run(tmp_path, DECODE, None)
    cur, _ = run(tmp_path, DECODE, "nvlink_degradation", sev=0.6)
    c = compare(base, cur)
    rows = [r["symbol"] for r in c["symbols"]]
    assert rows[0] == "runtime:cudaMemcpyAsync"  # (the largest change of time per step)
    st = c["statements"]
    wait = next(i for i, s in enumerate(st) if s.startswith("runtime:cudaMemcpyAsync"))
    ar = next(i for i, s in enumerate(st) if s.startswith("kernel:cross_device_reduce"))
    assert ar < wait and st[wait].endswith(
        "the host waits in this call for the GPU work queued before it, so its time follows the GPU's too"
    )
    assert st[ar].endswith("a collective's time includes waiting for the slowest rank")


@pytest.mark.parametrize(
    ("symbol", "wait"),
    [
        ("runtime:cudaMemcpyAsync", True),
        ("runtime:cudaStreamSynchronize", True),
        ("driver:cuMemcpyDtoHAsync_v2", True),
        ("runtime:hipDeviceSynchronize", True),
        ("sync:Stream Sync", True),
        ("runtime:cudaLaunchKernel", False),
        ("runtime:cudaMemsetAsync", False),
        ("memcpy:Memcpy DtoH (Device -> Pinned)", False),
    ],
)
def test_host_wait_calls(symbol, wait) -> None:
    from teller.compare import is_host_wait

    assert is_host_wait(symbol) is wait


def test_side_by_side_puts_both_captures_on_one_timeline(tmp_path) -> None:
    import gzip

    from teller.compare import side_by_side

    base = _steps(tmp_path, "base.json", 20)
    _steps(tmp_path, "cur.json", 80, n=6, extra="debug_kernel")
    # the current capture taken 5 s (and a bit) later: its first step must still start with the baseline's
    raw = json.loads((tmp_path / "cur.json").read_text())
    for e in raw["traceEvents"]:
        if "ts" in e:
            e["ts"] += 5e6 + 123.456
    (tmp_path / "late.json").write_text(json.dumps(raw))
    late = teller.trace.load(tmp_path / "late.json", warn=False)
    out = tmp_path / "both.json.gz"
    r = side_by_side(base, late, out)
    assert r["shift_us"] == pytest.approx(-(5e6 + 123.456)) and r["events"] == len(base) + len(late)
    doc = json.loads(gzip.decompress(out.read_bytes()))
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    off = r["pid_offset"]
    # every process named for its capture, the current ones moved past the baseline's pids
    b_pids = {e["pid"] for e in ev if e.get("ph") == "X" and e["pid"] < off}
    c_pids = {e["pid"] for e in ev if e.get("ph") == "X" and e["pid"] >= off}
    assert b_pids and c_pids == {p + off for p in b_pids}
    assert all(names[p].startswith("baseline · ") for p in b_pids)
    assert all(names[p].startswith("current · ") for p in c_pids)
    steps = sorted(
        (e["pid"] >= off, e["ts"]) for e in ev if e.get("ph") == "X" and e["name"].startswith("ProfilerStep")
    )
    first_b = next(t for cur_, t in steps if not cur_)
    first_c = next(t for cur_, t in steps if cur_)
    assert first_b == pytest.approx(first_c)
    # flows stay within their capture: no id of the current one is also the baseline's
    fb = {e["id"] for e in ev if e.get("ph") in ("s", "f") and e["pid"] < off}
    fc = {e["id"] for e in ev if e.get("ph") in ("s", "f") and e["pid"] >= off}
    assert fb and fc and not fb & fc
    # it loads: every event of both, the kernels still linked to their launches
    both = teller.trace.load(out, warn=False)
    assert len(both) == len(base) + len(late)
    assert int((np.asarray(both.link) >= 0).sum()) == int((np.asarray(base.link) >= 0).sum()) + int(
        (np.asarray(late.link) >= 0).sum()
    )


def test_cli_compare_perfetto(tmp_path) -> None:
    _steps(tmp_path, "base.json", 20)
    _steps(tmp_path, "cur.json", 80)
    a, b, o = str(tmp_path / "base.json"), str(tmp_path / "cur.json"), str(tmp_path / "both.json")
    cli = [sys.executable, "-m", "teller", "trace", "compare", a, b]
    r = subprocess.run([*cli, "--json", "--perfetto", o], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["perfetto"]["path"] == o and "ui.perfetto.dev" in r.stderr
    assert len(teller.trace.load(o, warn=False)) > 0
    # an input is never overwritten; a directory is no output file
    r = subprocess.run([*cli, "--perfetto", a], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is one of the inputs" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*cli, "--perfetto", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "a directory" in r.stderr and "Traceback" not in r.stderr


def test_the_same_capture_changes_nothing(tmp_path) -> None:
    c = compare(_steps(tmp_path, "a.json", 20), _steps(tmp_path, "b.json", 20))
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


def test_per_step_counts_only_the_work_inside_steps(tmp_path) -> None:
    # the same set-up (a 2 ms weight load and its copy kernel) before 4 and before 8 identical steps:
    # divided into the steps it would read as halved; it is outside them, so nothing changed
    def mk(name: str, n: int):
        t = _Trace()
        t.ev.append({"ph": "X", "cat": "cpu_op", "name": "load_weights", "pid": 100, "tid": 100, "ts": 0,
                     "dur": 2000})  # fmt: skip
        t.launch(10, 3, 20, 1500, name="copy_weights_kernel")
        for k in range(n):
            at = 3000 + k * 300
            t.step(f"ProfilerStep#{k}", at, 200)
            t.launch(at + 5, 3, at + 10, 50)
        return t.load(tmp_path, name)

    c = compare(mk("o4.json", 4), mk("o8.json", 8))
    assert c["unit"] == "step" and not any("weights" in s for s in c["statements"])
    assert not any(
        r["symbol"].endswith("weights") or r["symbol"].endswith("weights_kernel") for r in c["symbols"]
    )
    assert all(abs(r["delta_ns"]) < 1 for r in c["symbols"])


def test_fallback_steps_are_not_steps(tmp_path) -> None:
    # no step range: the loader's fallback makes the busiest thread's root ranges steps (2 against
    # 10 here, around the same GPU work); they are no unit to divide by, so the captures compare whole
    def mk(name: str, n: int):
        t = _Trace()
        for k in range(n):
            t.ev.append({"ph": "X", "cat": "user_annotation", "name": "chunk", "pid": 100, "tid": 100,
                         "ts": k * 1000 / n, "dur": 900 / n})  # fmt: skip
        for k in range(10):
            t.launch(k * 100, 2, k * 100 + 5, 10)
        return t.load(tmp_path, name)

    a, b = mk("a.json", 2), mk("b.json", 10)
    assert len(a.steps()) == 2 and a.steps()[0].event >= 0  # (the fallback's steps)
    c = compare(a, b)
    assert c["unit"] == "capture" and c["steps"]["baseline"]["count"] == 0
    k = next(r for r in c["symbols"] if r["symbol"] == "kernel:gemm_kernel")
    assert k["delta_ns"] == 0
    # with the range named as the steps, it is a unit again
    assert compare(a, b, step_patterns=["chunk"])["unit"] == "step"


def test_new_and_gone_mean_absent_not_zero(tmp_path) -> None:
    # a zero-length kernel in both captures is neither new nor gone; one in the baseline only is gone
    def mk(name: str, extra: bool):
        t = _Trace()
        for k in range(4):
            at = k * 300.0
            t.step(f"ProfilerStep#{k}", at, 200)
            t.launch(at + 5, 3, at + 10, 50 if name != "b.json" else 150)
            t.launch(at + 20, 3, at + 100, 0, name="empty_kernel")
            if extra:
                t.launch(at + 40, 3, at + 120, 30, name="old_kernel")
        return t.load(tmp_path, name)

    c = compare(mk("a.json", True), mk("b.json", False))
    rows = {r["symbol"]: r for r in c["symbols"]}
    assert rows["kernel:empty_kernel"]["only_in"] is None
    assert rows["kernel:old_kernel"]["only_in"] == "baseline"
    says = "\n".join(c["statements"])
    assert "kernel:old_kernel is gone" in says and "empty_kernel" not in says


def test_self_time_takes_only_the_overlap_of_an_improperly_nested_child(tmp_path) -> None:
    t = _Trace()
    t.ev.append({"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 100, "tid": 100, "ts": 0, "dur": 10})
    t.ev.append({"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 100, "tid": 100, "ts": 5, "dur": 20})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = symbol_times(t.load(tmp_path, "n.json"))
    assert st["host_op:outer"]["ns"] == pytest.approx(5e3) and st["host_op:inner"]["ns"] == pytest.approx(
        20e3
    )


def test_a_capture_without_gpu_work_is_said(tmp_path) -> None:
    a = _steps(tmp_path, "a.json", 20)
    t = _Trace()
    for k in range(4):
        t.step(f"ProfilerStep#{k}", k * 300.0, 200)
    c = compare(a, t.load(tmp_path, "b.json"))
    assert c["gpus"] == [] and c["gpu_count"] == {"baseline": 1, "current": 0}
    assert "0 GPUs with work in this capture, 1 in the baseline: no GPU time to compare" in c["statements"]


def test_workers_without_steps_count_within_the_steps_window(tmp_path) -> None:
    # an engine whose steps are its scheduler's ranges (pid 1) and whose model runs in a worker
    # process (pid 2, no step range): the worker's kernels count per step, inside the steps' window;
    # its set-up kernel before the first step does not
    def mk(name: str, kdur: float):
        def x(cat: str, nm: str, pid: int, tid: int, ts: float, dur: float, **args) -> dict:
            return {
                "ph": "X",
                "cat": cat,
                "name": nm,
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }

        setup = 4000 if name == "a.json" else 1000
        ev = [
            x("cuda_runtime", "cudaLaunchKernel", 2, 2, -5000, 5, correlation=99),
            x("kernel", "load_kernel", 2, 7, -4990, setup, correlation=99, device=0, stream=7),
        ]
        for k in range(6):
            at = k * 1000
            ev.append(x("user_annotation", "engine_step", 1, 1, at, 900))
            ev.append(x("cuda_runtime", "cudaLaunchKernel", 2, 2, at + 10, 5, correlation=k + 1))
            ev.append(x("kernel", "gemm", 2, 7, at + 20, kdur, correlation=k + 1, device=0, stream=7))
        (tmp_path / name).write_text(json.dumps({"traceEvents": ev}))
        return teller.trace.load(tmp_path / name, warn=False)

    c = compare(mk("a.json", 100), mk("b.json", 700))
    assert c["unit"] == "step"
    rows = {r["symbol"]: r for r in c["symbols"]}
    assert rows["kernel:gemm"]["baseline_ns"] == pytest.approx(100e3) and rows["kernel:gemm"]["ratio"] == 7.0
    assert "kernel:load_kernel" not in rows
    assert c["statements"][0].startswith("kernel:gemm: +0.6 ms per step (7.00x")


def test_step_patterns_are_the_loaders_globs(tmp_path) -> None:
    # only '*' is special, as in the loader: 'iter[*]' matches 'iter[3]'
    t = _Trace()
    for k in range(4):
        t.step(f"iter[{k}]", k * 300.0, 200)
        t.launch(k * 300.0 + 5, 3, k * 300.0 + 10, 20)
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"traceEvents": t.ev}))
    tr = teller.trace.load(p, step_names=["iter[*]"], warn=False)
    assert len(tr.steps()) == 4
    assert compare(tr, tr, step_patterns=["iter[*]"])["unit"] == "step"


@pytest.mark.parametrize(
    ("fault", "rank", "says"),
    [
        ("pcie_degradation", None, "memcpy:Memcpy HtoD (Pageable -> Device): +"),
        ("eager_mode_misconfig", None, "runtime:cudaLaunchKernel: +"),
        ("launch_storm", None, "host_op:aten::add_ is new"),
        ("cpu_contention", None, "runtime:cudaLaunchKernel: +"),
        ("nvlink_degradation", None, "kernel:ncclDevKernel_AllReduce"),
    ],
)
def test_each_fault_against_its_healthy_run_names_its_signature(tmp_path, fault, rank, says) -> None:
    # the table of docs/findings.md ("Comparing two captures"): the simulator's two-rank decode
    # workload, one fault at severity 0.6 against the healthy run of the same seed
    from test_data_faults import DECODE, run

    base, _ = run(tmp_path, DECODE, None)
    cur, _ = run(tmp_path, DECODE, fault, rank=rank, sev=0.6)
    st = compare(base, cur)["statements"]
    assert any(s.startswith(says) for s in st[:4]), st


def test_a_kernels_class_is_the_breakdowns_whatever_the_normalization_kept(tmp_path) -> None:
    """(from a review) compare's `communication` class now follows the GPU breakdown's rule on the
    kernels' full names: DeepEP's `cached_notify` was `other` here and communication there; another
    library's `dispatch`, compute there, was communication here (its namespace stripped)."""
    base = _steps(tmp_path, "b.json", 20, extra="void deep_ep::internode::cached_notify<8, 4>(int, int*)")
    cur = _steps(tmp_path, "c.json", 20, extra="void other_lib::dispatch<int>(int)")
    c = compare(base, cur)
    cls = {r["symbol"]: r["class"] for r in c["symbols"] if r["class"]}
    assert cls["kernel:cached_notify"] == "communication" and cls["kernel:dispatch"] != "communication", cls
    for tr in (base, cur):
        comm = sum(d["comm_ns"] for d in tr.summary(0)["devices"])
        assert (comm > 0) == (tr is base)


def test_a_symbol_in_both_captures_is_never_called_new(tmp_path) -> None:
    """(from a review) A symbol with a baseline time of 0 has no ratio: the table said "new"."""
    from teller.cli import app
    from typer.testing import CliRunner

    def mk(name: str, dur: float) -> str:
        p = tmp_path / name
        p.write_text(json.dumps({"traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "foo", "pid": 1, "tid": 1, "ts": 0, "dur": dur},
            {"ph": "X", "cat": "cpu_op", "name": "bar", "pid": 1, "tid": 1, "ts": 1, "dur": 10},
        ]}))  # fmt: skip
        return str(p)

    r = CliRunner().invoke(
        app, ["trace", "compare", mk("a.json", 0), mk("b.json", 5)], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "host_op:foo" in line)
    assert "new" not in row, row


def test_captures_of_different_work_are_said_to_be_so(tmp_path):
    """(from a review) A ResNet training trace against an LLM serving capture read "the median step
    took 0.01x the baseline's": where little of their time is in common symbols, that comes first,
    and a TellerWarning says it."""
    import teller.trace as T
    from conftest import TRACES
    from teller.compare import COMMON_MIN, compare
    from teller.errors import TellerWarning

    a = T.load(TRACES / "a100_nccl_2rank.kineto.json.gz", warn=False)
    b = T.load(TRACES / "mi300x_sglang_decode_hipgraph.kineto.json.gz", warn=False)
    with pytest.warns(TellerWarning, match="little in common"):
        c = compare(a, b)
    assert c["common_time_share"] < COMMON_MIN and c["statements"][0].startswith("the captures have little")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TellerWarning)
        same = compare(a, a)
    assert same["common_time_share"] == pytest.approx(1.0)
    assert not any("little in common" in s for s in same["statements"])
