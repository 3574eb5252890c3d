"""Real CPU fault runs (teller dataset collect-cpu): the collector, a real workload, a real fault."""

from __future__ import annotations

import json

import numpy as np
import pytest
import teller.trace as T
from conftest import needs_shim as _needs_shim
from teller.data import validate
from teller.data.cpu_runs import collect_cpu
from teller.errors import ConfigError

needs_shim = _needs_shim()


@needs_shim
def test_slow_operator_and_contention_runs(tmp_path):
    out = tmp_path / "cpu"
    # one shape and plan for every call on this collection (the shape: 2 layers, 8-token prompts)
    same = {
        "seed": 1,
        "requests": 12,
        "new_tokens": 6,
        "layers": 2,
        "prompt_len": 8,
        "kinds": ["normal", "slow_operator", "cpu_contention"],
    }
    man = collect_cpu(out, 3, **same)
    assert man["num_samples"] == 3 and man["splits"]["test"] == ["cpu0000", "cpu0001", "cpu0002"]
    assert validate(out, deep=True) == []
    anns = {s: json.loads((out / s / "annotation.json").read_text()) for s in man["splits"]["test"]}
    assert anns["cpu0000"]["faults"] == [] and anns["cpu0000"]["label"] == "normal"
    # the workload's shape is what was asked for, and said in every annotation and the manifest
    for a in anns.values():
        wl = a["workload"]
        assert (wl["requests"], wl["new_tokens"], wl["model_layers"], wl["prompt_len"]) == (12, 6, 2, 8)
    assert {k: man["config"][k] for k in ("requests", "new_tokens", "layers", "prompt_len")} == {
        "requests": 12,
        "new_tokens": 6,
        "layers": 2,
        "prompt_len": 8,
    }
    tr0 = T.load(out / "cpu0000" / "trace.json", warn=False)
    assert sum(tr0.name_of(i) == "GPT2MLP" for i in range(len(tr0))) == 12 * 6 * 2  # one per layer per token
    log0 = (out / "cpu0000" / "log.txt").read_text()
    assert "model ready: 2 layers" in log0 and "request 11: 8 prompt tokens, 6 generated" in log0

    # slow_operator: the slowed GPT2MLP calls are inside the window and much longer than the others
    slow = anns["cpu0001"]
    f = slow["faults"][0]
    assert f["type"] == "slow_operator" and f["target"]["name"] == "GPT2MLP"
    tr = T.load(out / "cpu0001" / "trace.json", warn=False)
    mlp = np.asarray([i for i in range(len(tr)) if tr.name_of(i) == "GPT2MLP"])
    inside = (tr.ts[mlp] >= f["start_ns"]) & (tr.ts[mlp] < f["end_ns"])
    assert inside.sum() >= 8 and (~inside).sum() >= 8
    delay_ns = f["params"]["delay_ms"] * 1e6
    assert np.median(tr.dur[mlp][inside]) > np.median(tr.dur[mlp][~inside]) + 0.8 * delay_ns
    # its culprit events (what localization trains on): exactly the slowed GPT2MLP ranges
    from teller.data import culprit_mask

    m = culprit_mask(tr, slow)
    assert set(np.flatnonzero(m)) == set(mlp[inside].tolist())

    # cpu_contention: a window inside the run, measured when the busy processes ran
    c = anns["cpu0002"]["faults"][0]
    assert c["type"] == "cpu_contention" and c["params"]["busy_processes"] >= 1
    assert anns["cpu0002"]["trace"]["start_ns"] <= c["start_ns"] < c["end_ns"]
    log = (out / "cpu0002" / "log.txt").read_text()
    assert "generated in" in log
    tr2 = T.load(out / "cpu0002" / "trace.json", warn=False)
    m2 = culprit_mask(tr2, anns["cpu0002"])
    win = (tr2.ts >= c["start_ns"]) & (tr2.ts < c["end_ns"])
    assert m2.any() and not (m2 & ~win).any()  # the workload's events inside the window

    # resumable: a second call reuses the finished samples; a run from before the shape options
    # (no requests / new_tokens / prompt_len in its workload) says the collection's shape then
    p0 = out / "cpu0000" / "annotation.json"
    a0 = json.loads(p0.read_text())
    for k in ("requests", "new_tokens", "prompt_len"):
        del a0["workload"][k]
    p0.write_text(json.dumps(a0))
    again = collect_cpu(out, 3, **same)
    assert again["samples"] == man["samples"]
    wl0 = json.loads(p0.read_text())["workload"]
    assert (wl0["requests"], wl0["new_tokens"], wl0["prompt_len"], wl0["model_layers"]) == (12, 6, 8, 2)
    # resumed with other split fractions: the finished runs move (annotation and manifest agree)
    moved = collect_cpu(out, 3, **same, splits=(1.0, 0.0, 0.0))
    assert moved["splits"]["train"] == ["cpu0000", "cpu0001", "cpu0002"] and moved["splits"]["test"] == []
    assert moved["counts"]["train"]["slow_operator"] == 1
    for s in moved["splits"]["train"]:
        a = json.loads((out / s / "annotation.json").read_text())
        assert a["split"] == "train" and a["ood"] is False and a["faults"] == anns[s]["faults"]
    assert validate(out, deep=True) == []
    # resumed with another workload shape: refused before anything runs, the runs untouched
    from teller.errors import ConfigError

    before = {s: (out / s / "annotation.json").read_text() for s in moved["splits"]["train"]}
    with pytest.raises(
        ConfigError, match=r"manifest.json: .*another workload shape \(layers 2 there, 4 asked\)"
    ):
        collect_cpu(out, 3, seed=1, requests=12, new_tokens=6, prompt_len=8)
    assert {s: (out / s / "annotation.json").read_text() for s in before} == before


def test_workload_shape_is_checked_before_anything_runs(tmp_path):
    from teller.errors import ConfigError

    for kw, msg in (
        ({"layers": 0}, "layers=0"),
        ({"prompt_len": -1}, "prompt_len=-1"),
        ({"requests": 2.5}, "requests=2.5"),
        ({"new_tokens": True}, "new_tokens=True"),
        ({"prompt_len": 250, "new_tokens": 8}, "context length"),
    ):
        with pytest.raises(ConfigError, match=msg):
            collect_cpu(tmp_path / "never", 3, **kw)
    assert not (tmp_path / "never").exists()
    # an interrupted first collection (runs, no manifest yet): the runs' annotations say the shape
    run = tmp_path / "half" / "cpu0000"
    run.mkdir(parents=True)
    wl = {"requests": 6, "new_tokens": 8, "model_layers": 4, "prompt_len": 16}
    (run / "annotation.json").write_text(json.dumps({"workload": wl}))
    with pytest.raises(ConfigError, match=r"cpu0000/annotation.json: .*new_tokens 8 there, 9 asked"):
        collect_cpu(tmp_path / "half", 3, new_tokens=9)
    # a manifest written before layers and prompt_len were options: its runs had the defaults
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"config": {"requests": 40, "new_tokens": 8}}))
    with pytest.raises(ConfigError, match=r"prompt_len 16 there, 32 asked"):
        collect_cpu(old, 3, requests=40, prompt_len=32)
    # a manifest without the shape (not one this version writes): the runs' annotations decide;
    # one from before the shape options names its depth only, and its prompt was the default
    (old / "manifest.json").write_text(json.dumps({"config": {}}))
    legacy = old / "cpu0000"
    legacy.mkdir()
    (legacy / "annotation.json").write_text(json.dumps({"workload": {"model_layers": 4}}))
    with pytest.raises(ConfigError, match=r"cpu0000/annotation.json: .*layers 4 there, 2 asked"):
        collect_cpu(old, 3, layers=2)
    with pytest.raises(ConfigError, match=r"cpu0000/annotation.json: .*prompt_len 16 there, 32 asked"):
        collect_cpu(old, 3, prompt_len=32)
    # an old run first and a new one after it (two interrupted calls, no manifest): both are read
    mixed = tmp_path / "mixed"
    for sid, said in (("cpu0000", {"model_layers": 4}), ("cpu0001", {**wl, "requests": 40})):
        (mixed / sid).mkdir(parents=True)
        (mixed / sid / "annotation.json").write_text(json.dumps({"workload": said}))
    with pytest.raises(ConfigError, match=r"cpu0001/annotation.json: .*requests 40 there, 30 asked"):
        collect_cpu(mixed, 3, requests=30)
    with pytest.raises(ConfigError, match=r"cpu0000/annotation.json: .*layers 4 there, 2 asked"):
        collect_cpu(mixed, 3, requests=40, layers=2)
    (old / "manifest.json").write_text("{not json")
    with pytest.raises(ConfigError, match="manifest.json: not a readable manifest"):
        collect_cpu(old, 3)
    # another kind of dataset (a simulated one): its manifest and samples are left alone
    sim = tmp_path / "sim"
    (sim / "s000000").mkdir(parents=True)
    (sim / "s000000" / "annotation.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"sim: holds samples of another dataset \(s000000\)"):
        collect_cpu(sim, 3)
    man = json.dumps({"generator": {"name": "teller-sim", "version": 5}, "num_samples": 13})
    (sim / "manifest.json").write_text(man)
    with pytest.raises(
        ConfigError, match=r"sim: already holds a dataset of another kind \(generator 'teller-sim'"
    ):
        collect_cpu(sim, 3)
    assert (sim / "manifest.json").read_text() == man and sorted(p.name for p in sim.iterdir()) == [
        "manifest.json",
        "s000000",
    ]


def test_splits_are_stratified_stable_and_checked():
    from collections import Counter

    from teller.data.cpu_runs import KINDS, _assign_splits, _plan, parse_splits
    from teller.errors import ConfigError

    plans = _plan(0, 60, KINDS)
    a = _assign_splits(plans, 0, (0.6, 0.2, 0.2))
    assert a == _assign_splits(plans, 0, (3, 1, 1))  # (normalized)
    assert a != _assign_splits(plans, 1, (0.6, 0.2, 0.2))  # the seed draws which runs go where
    for seed in range(20):  # each kind within about three runs of the fractions, at any size
        for n in (6, 12, 60, 240):
            big = _plan(seed, n, KINDS)
            asg = _assign_splits(big, seed, (0.6, 0.2, 0.2))
            per_kind = Counter((p["kind"], asg[p["sample_id"]]) for p in big)
            for k in KINDS:
                m = n // len(KINDS)
                assert per_kind[(k, "train")] >= 1  # (the first run of every kind trains)
                for s, f in (("train", 0.6), ("val", 0.2), ("test", 0.2)):
                    assert abs(per_kind[(k, s)] - f * m) <= 3.2, (seed, n, k, s, per_kind[(k, s)])
    # no training split asked for: the first runs go to the first split that is
    assert set(_assign_splits(_plan(0, 6, KINDS), 0, (0, 1, 1)).values()) <= {"val", "test"}
    # growing a collection never moves a finished run
    grown = _assign_splits(_plan(0, 240, KINDS), 0, (0.6, 0.2, 0.2))
    assert {sid: grown[sid] for sid in a} == a
    assert set(_assign_splits(plans, 0, (0, 0, 1)).values()) == {"test"}
    assert set(_assign_splits(plans, 0, (1, 0, 0)).values()) == {"train"}
    assert set(_assign_splits(plans, 0, (1, 0, 1)).values()) == {"train", "test"}
    assert parse_splits(" 0.6, 0.2,0.2") == (0.6, 0.2, 0.2)
    for bad in ("1,2", "a,b,c", "-1,1,1", "0,0,0", "nan,1,1", "inf,1,1", "1e308,1e308,0"):
        with pytest.raises(ConfigError, match="--splits"):
            parse_splits(bad)
    with pytest.raises(ConfigError, match="splits must be"):
        from teller.data.cpu_runs import collect_cpu

        collect_cpu("/nonexistent-not-created", 3, splits=(float("inf"), 0.0, 1.0))


def test_a_collection_resumed_with_another_plan_or_fewer_runs_is_refused(tmp_path, monkeypatch):
    """(from a review) Resumed with another --seed it ran nothing, recorded the new plan over runs
    made by the old one (and moved finished runs to other splits); resumed with a smaller
    --num-samples it left runs on disk out of the manifest (validate then named each)."""
    import teller.data.cpu_runs as C

    monkeypatch.setattr(C, "_calibrate", lambda shape: {"ready_s": 1.0, "gen_s": 1.0})

    def fake_run(plan, out, timing, shape, keep_raw, split="test", ood=True):
        sd = out / plan["sample_id"]
        sd.mkdir(parents=True, exist_ok=True)
        label = C.LABEL_OF[plan["kind"]]
        target = {"kind": "process", "name": "workload", "rank": 0, "pid": 1}
        fault = {"type": label, "layer": "host_op", "target": target, "start_ns": 10, "end_ns": 20,
                 "severity": plan["severity"], "params": {"kind": plan["kind"]}}  # fmt: skip
        ann = {"format": "teller-sample", "version": 1, "sample_id": plan["sample_id"], "label": label,
               "split": split, "ood": ood, "workload": {"model": "gpt2-tiny", "gpu": "cpu", "tp": 1,
               **{k: shape[k] for k in ("requests", "new_tokens", "prompt_len")}},
               "faults": [] if label == "normal" else [fault],
               "trace": {"start_ns": 0, "end_ns": 100, "events": 1, "steps": 0}}  # fmt: skip
        (sd / "annotation.json").write_text(json.dumps(ann))
        return ann

    monkeypatch.setattr(C, "_run_one", fake_run)
    out = tmp_path / "cpu"
    C.collect_cpu(out, 12, seed=0, splits=(0.6, 0.2, 0.2))
    before = (out / "manifest.json").read_text()
    with pytest.raises(
        ConfigError, match=r"cpu000\d: collected as kind .* where --seed 1 and the kinds give"
    ):
        C.collect_cpu(out, 12, seed=1, splits=(0.6, 0.2, 0.2))
    with pytest.raises(ConfigError, match=r"holds 6 run\(s\) past --num-samples 6 \(cpu0006..cpu0011\)"):
        C.collect_cpu(out, 6, seed=0, splits=(0.6, 0.2, 0.2))
    assert (out / "manifest.json").read_text() == before
    # a version-1 run's window past its trace is clipped when the collection is resumed
    a1 = json.loads((out / "cpu0001" / "annotation.json").read_text())
    assert a1["faults"], a1
    a1["faults"][0]["end_ns"] = 10**6
    (out / "cpu0001" / "annotation.json").write_text(json.dumps(a1))
    C.collect_cpu(out, 14, seed=0, splits=(0.6, 0.2, 0.2))  # (growing it: fine)
    assert json.loads((out / "cpu0001" / "annotation.json").read_text())["faults"][0]["end_ns"] == 101


def test_a_collection_that_fails_raises_its_own_error(tmp_path, monkeypatch):
    """(from a review) The collection runs on a thread; its error was lost there and the caller got
    `KeyError: 'res'`. It is raised again on the calling thread."""
    import teller.collect
    import teller.data.cpu_runs as C
    from teller.errors import CudaNotFoundError

    def failing_collect(*a, **k):
        raise CudaNotFoundError("no shim here")

    monkeypatch.setattr(teller.collect, "collect", failing_collect)
    plan = {"kind": "normal", "severity": 0.0, "sample_id": "cpu0000", "onset_frac": 0.1, "dur_frac": 0.2}
    shape = {"requests": 1, "new_tokens": 1, "layers": 1, "prompt_len": 4}
    with pytest.raises(CudaNotFoundError, match="no shim here"):
        C._run_one(plan, tmp_path, {"ready_s": 1.0, "gen_s": 1.0}, shape, keep_raw=False)


def test_the_shim_cache_is_an_absolute_path(tmp_path, monkeypatch):
    """(from a review) A relative TELLER_CACHE_DIR put a relative library path into the program's
    NVTX_INJECTION64_PATH / CUDA_INJECTION64_PATH: a program that changed directory loaded no shim."""
    from teller.collect import shim

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TELLER_CACHE_DIR", "rel-cache")
    assert shim.cache_root() == tmp_path / "rel-cache" / "shim"
