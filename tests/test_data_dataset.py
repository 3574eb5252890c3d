"""Dataset generation: determinism, parse round trip, splits, validation with broken samples, CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import teller
from teller.data import LABELS, culprit_mask, generate, load_config, plan, validate
from teller.errors import ConfigError, TellerFileNotFoundError, TellerIOError

N = 13  # one sample per class


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny") / "ds"
    generate(d, num_samples=N, seed=11, preset="tiny")
    return d


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_layout_and_manifest(tiny):
    man = json.loads((tiny / "manifest.json").read_text())
    assert man["format"] == "teller-dataset" and man["generator"]["name"] == "teller-sim"
    assert man["num_samples"] == N and man["seed"] == 11 and man["preset"] == "tiny"
    assert sorted(sum(man["splits"].values(), [])) == [f"s{i:06d}" for i in range(N)]
    assert sum(sum(c.values()) for c in man["counts"].values()) == N
    for sid in man["samples"]:
        for f in ("trace.json", "log.txt", "annotation.json"):
            assert (tiny / sid / f).is_file()
        assert not (tiny / sid / "raw").exists()
    labels = {json.loads((tiny / s / "annotation.json").read_text())["label"] for s in man["samples"]}
    assert labels == set(LABELS)
    assert not any(p.name.startswith(".") for p in tiny.iterdir())


def test_validate_ok(tiny):
    assert validate(tiny, deep=True) == []


def test_determinism_same_seed_identical_bytes_any_workers(tiny, tmp_path):
    again = tmp_path / "again"
    generate(again, num_samples=N, seed=11, preset="tiny", workers=2)
    assert _files(again) == _files(tiny)
    other = tmp_path / "other"
    generate(other, num_samples=3, seed=12, preset="tiny")
    assert (other / "s000000" / "trace.json").read_bytes() != (tiny / "s000000" / "trace.json").read_bytes()


def test_parse_round_trip_and_trace_clock(tiny, tmp_path):
    cfg = tmp_path / "raw.yaml"
    cfg.write_text("base: tiny\nkeep_raw: true\n")
    d = tmp_path / "raw"
    generate(d, num_samples=4, seed=11, config=cfg)
    for k in range(4):
        sd = d / f"s{k:06d}"
        ann = json.loads((sd / "annotation.json").read_text())
        from_raw = teller.trace.load(sd / "raw", warn=False)
        from_json = teller.trace.load(sd / "trace.json", warn=False)
        assert len(from_raw) == len(from_json) == ann["trace"]["events"]
        np.testing.assert_array_equal(np.sort(from_raw.ts), np.sort(from_json.ts))
        np.testing.assert_array_equal(np.sort(from_raw.dur), np.sort(from_json.dur))
        assert int(from_json.ts.min()) == ann["trace"]["start_ns"]
        # trace.json times: ts (us) * 1000 + baseTimeNanoseconds are the absolute ns of the annotation
        raw = json.loads((sd / "trace.json").read_text())
        base = int(raw["baseTimeNanoseconds"])
        xs = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
        assert min(round(float(e["ts"]) * 1000) + base for e in xs) == ann["trace"]["start_ns"]
        for f in ann["faults"]:
            assert ann["trace"]["start_ns"] <= f["start_ns"] <= f["end_ns"] <= ann["trace"]["end_ns"] + 1
        # raw files are per rank, with the rank's pid
        assert len(list((sd / "raw").glob("*.tmsgpack"))) == ann["workload"]["tp"]
        # the same sample id under the same seed does not depend on keep_raw
        assert (sd / "trace.json").read_bytes() != b""


def test_splits_stratified_and_ood_workloads_unseen():
    cfg = load_config("default")
    plans = plan(cfg, 1300, seed=0)
    by = {}
    for p in plans:
        by.setdefault(p.label, {}).setdefault(p.split, 0)
        by[p.label][p.split] += 1
    for label, counts in by.items():
        assert counts["test_ood"] == 10, label
        assert (counts["train"], counts["val"], counts["test"]) == (62, 14, 14), (label, counts)
    from teller.data.dataset import draw_workload, sample_rng

    ind = cfg["workloads"]["in_dist"]
    for p in plans[:200]:
        wl = draw_workload(cfg, sample_rng(0, p.index), p.label, p.ood)
        seen = wl.model in ind["models"] and wl.gpu in ind["gpus"] and wl.arrival in ind["arrivals"]
        assert seen != p.ood


def test_culprit_mask_on_generated_samples(tiny):
    for sd in sorted(p for p in tiny.iterdir() if p.is_dir()):
        ann = json.loads((sd / "annotation.json").read_text())
        tr = teller.trace.load(sd / "trace.json", warn=False)
        m = culprit_mask(tr, ann)
        assert m.dtype == bool and m.shape == (len(tr),)
        if not ann["faults"]:
            assert not m.any()
        else:
            # (in true time: each process's events are on its clock, off by its clock-sync error)
            err = {p["pid"]: p["clock_error_ns"] for p in ann["workload"]["processes"]}
            err.update({p["device"]: p["clock_error_ns"] for p in ann["workload"]["processes"]})
            true = tr.ts - np.array([err.get(int(x), 0) for x in tr.pid])
            f = ann["faults"][0]
            assert ((true[m] >= f["start_ns"]) & (true[m] < f["end_ns"])).all()


def _broken(tiny: Path, tmp_path: Path) -> Path:
    d = tmp_path / "broken"
    shutil.copytree(tiny, d)
    return d


def _ann(d: Path, sid: str) -> dict:
    return json.loads((d / sid / "annotation.json").read_text())


def _put(d: Path, sid: str, ann: dict) -> None:
    (d / sid / "annotation.json").write_text(json.dumps(ann))


def test_validate_reports_each_broken_sample_with_its_path(tiny, tmp_path):
    d = _broken(tiny, tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    faulty = [s for s, v in man["samples"].items() if v["label"] not in ("normal", "network_delay")]
    a, b, c, e, g, h = faulty[:6]
    x = _ann(d, h)
    x["faults"][0]["effect"]["held_requests"] = "many"
    _put(d, h, x)
    x = _ann(d, a)
    del x["faults"][0]["start_ns"]
    _put(d, a, x)
    x = _ann(d, b)
    x["faults"][0]["severity"] = "high"
    _put(d, b, x)
    x = _ann(d, c)
    x["faults"][0]["type"] = "cosmic_ray"
    _put(d, c, x)
    x = _ann(d, e)
    x["faults"][0]["target"]["rank"] = 9
    _put(d, e, x)
    (d / g / "log.txt").unlink()
    (d / "s000000" / "annotation.json").write_text("{not json")
    probs = [str(p) for p in validate(d)]
    text = "\n".join(probs)
    assert f"{a}/annotation.json $.faults[0]: 'start_ns' is a required property" in text
    assert f"{b}/annotation.json $.faults[0].severity: 'high' is not of type 'number'" in text
    assert f"{c}/annotation.json $.faults[0].type: 'cosmic_ray' is not one of" in text
    assert f"{e}/annotation.json $.faults[0].target.rank: rank 9 does not exist" in text
    assert f"{g}/log.txt: missing" in text
    assert f"{h}/annotation.json $.faults[0].effect.held_requests: 'many' is not of type 'integer'" in text
    assert "s000000/annotation.json: not valid JSON" in text
    # the other samples are clean
    bad = {a, b, c, e, g, h, "s000000"}
    assert all(any(p.startswith(s) for s in bad) for p in probs)


def test_validate_catches_non_finite_numbers_and_an_empty_trace(tiny, tmp_path):
    # NaN passes a JSON schema's "number" and its bounds; a 0-byte trace.json is not a trace
    from teller.data.dataset import LABELS, annotation_problem

    d = _broken(tiny, tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    a, b = [s for s, v in man["samples"].items() if v["label"] != "normal"][:2]
    x = _ann(d, a)
    x["faults"][0]["severity"] = float("nan")
    _put(d, a, x)
    (d / b / "trace.json").write_bytes(b"")
    text = "\n".join(str(p) for p in validate(d))
    assert f"{a}/annotation.json $.faults[0].severity: is not a finite number" in text
    assert f"{b}/trace.json: empty file" in text
    with pytest.raises(TellerIOError, match="a file, not a dataset directory"):
        validate(d / "manifest.json")
    # what tokenize checks before encoding: a severity that is not a number in [0, 1]
    for bad in (float("nan"), "high", 1.5):
        x["faults"][0]["severity"] = bad
        assert annotation_problem(x, LABELS)[0] == "$.faults[0].severity", bad
    x["faults"][0]["severity"] = 0.5
    assert annotation_problem(x, LABELS) is None


def test_validate_manifest_problems(tiny, tmp_path):
    d = _broken(tiny, tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    del man["splits"]["val"]
    man["num_sample"] = 3  # (a misspelt key: refused, as in annotation.json)
    (d / "manifest.json").write_text(json.dumps(man))
    shutil.rmtree(d / "s000003")
    text = "\n".join(map(str, validate(d)))
    assert "manifest.json $.splits: 'val' is a required property" in text
    assert "manifest.json $: Additional properties are not allowed ('num_sample' was unexpected)" in text
    assert "s000003/: listed in manifest.json but missing" in text
    with pytest.raises(TellerFileNotFoundError):
        validate(tmp_path / "nope")


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config("huge")
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: tiny\nseverity: [0.5, 2.0]\n")
    with pytest.raises(ConfigError, match="severity"):
        load_config(config=bad)
    bad.write_text("base: tiny\nclasses: [normal, meteor]\n")
    with pytest.raises(ConfigError, match="meteor"):
        load_config(config=bad)
    bad.write_text("base: tiny\nworkloads: {tp: [1]}\n")
    with pytest.raises(ConfigError, match="tensor parallelism"):
        load_config(config=bad)
    bad.write_text("base: large\nworkloads: {in_dist: {gpus: [A100, A10]}}\n")
    with pytest.raises(ConfigError, match="llama-3.1-70b does not fit on A10 at any workloads.tp"):
        load_config(config=bad)
    with pytest.raises(TellerFileNotFoundError):
        load_config(config=tmp_path / "missing.yaml")
    # a misspelt key, at any depth, is named (not silently left at the preset's value)
    bad.write_text("base: tiny\nnum_sample: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key\(s\) num_sample$"):
        load_config(config=bad)
    bad.write_text("base: tiny\nworkloads: {in_dist: {gpu: [A100]}}\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) workloads.in_dist.gpu$"):
        load_config(config=bad)
    bad.write_text("base: tiny\nworkloads: {rates: [1, 2]}\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) workloads.rates$"):
        load_config(config=bad)
    # base: is not a setting, also where --preset overrides it
    bad.write_text("base: default\nnum_samples: 5\n")
    assert load_config("tiny", config=bad)["preset"] == "tiny"
    # and the CLI prints a message's [brackets] as text, not as rich markup
    import subprocess
    import sys

    bad.write_text("base: tiny\nsteps: x\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "teller",
            "dataset",
            "generate",
            "--output-dir",
            str(tmp_path / "o"),
            "--config",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "steps must be a [min, max] pair" in r.stderr, r.stderr


def test_generate_refuses_other_dataset_and_resumes(tmp_path):
    d = tmp_path / "ds"
    generate(d, num_samples=3, seed=1, preset="tiny")
    with pytest.raises(ConfigError, match="already holds a dataset"):
        generate(d, num_samples=3, seed=2, preset="tiny")
    # the same command again is a no-op that keeps the bytes
    before = _files(d)
    generate(d, num_samples=3, seed=1, preset="tiny")
    assert _files(d) == before
    # an interrupted run: a stamp and some complete samples; the rerun completes the rest
    r = tmp_path / "resume"
    generate(r, num_samples=3, seed=1, preset="tiny")
    before = _files(r)
    shutil.rmtree(r / "s000001")
    (r / "manifest.json").unlink()
    (r / "s000000" / "marker").write_text("kept")
    from teller.data.dataset import GENERATOR_VERSION
    from teller.data.dataset import load_config as lc

    stamp = {"seed": 1, "config": lc("tiny"), "num_samples": 3}
    # a run interrupted under another simulator version is not completed with this one's samples
    (r / ".generate.json").write_text(json.dumps({**stamp, "generator_version": 1}, sort_keys=True))
    with pytest.raises(ConfigError, match="simulator version"):
        generate(r, num_samples=3, seed=1, preset="tiny")
    (r / ".generate.json").write_text(
        json.dumps({**stamp, "generator_version": GENERATOR_VERSION}, sort_keys=True)
    )
    generate(r, num_samples=3, seed=1, preset="tiny")
    assert (r / "s000000" / "marker").exists()  # complete samples are kept
    after = _files(r)
    after.pop("s000000/marker")
    assert after == before
    # sample directories no run of ours stamped (copied in): refused, left as they are
    f = tmp_path / "foreign"
    (f / "s000000").mkdir(parents=True)
    (f / "s000000" / "mine.txt").write_text("mine")
    shutil.copytree(d / "s000001", f / "s000001")
    with pytest.raises(ConfigError, match="holds sample directories .* that no generate run here left"):
        generate(f, num_samples=2, seed=1, preset="tiny")
    assert (f / "s000000" / "mine.txt").read_text() == "mine" and not (f / "manifest.json").exists()


def _teller(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "teller", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def test_cli_generate_validate(tmp_path):
    d = tmp_path / "cli"
    r = _teller(
        "dataset", "generate", "--output-dir", str(d), "--num-samples", "4", "--seed", "3", "--preset", "tiny"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(d)
    assert "4 samples" in r.stderr
    r = _teller("dataset", "validate", str(d), "--deep")
    assert r.returncode == 0, r.stdout + r.stderr
    x = _ann(d, "s000001")
    x["faults"][0]["layer"] = "firmware"
    _put(d, "s000001", x)
    r = _teller("dataset", "validate", str(d))
    assert r.returncode == 1
    assert "s000001/annotation.json $.faults[0].layer" in r.stdout
    r = _teller("dataset", "generate", "--output-dir", str(tmp_path / "x"), "--preset", "nope")
    assert r.returncode == 2 and "unknown preset" in r.stderr


def _generated(tmp_path: Path, name: str, config: str, n: int, seed: int) -> list[tuple[Path, dict]]:
    """A valid dataset generated from ``config`` (YAML text): its (sample directory, annotation)s."""
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(config)
    d = tmp_path / name
    generate(d, num_samples=n, seed=seed, config=cfg)
    assert validate(d) == []
    return [(sd, _ann(d, sd.name)) for sd in sorted(p for p in d.iterdir() if p.is_dir())]


def test_secondary_faults(tmp_path):
    n_multi = 0
    for _sd, ann in _generated(tmp_path, "multi", "base: tiny\nsecondary_fault_fraction: 1.0\n", 8, 4):
        if ann["label"] == "normal":
            assert ann["faults"] == []
            continue
        assert ann["faults"][0]["type"] == ann["label"]
        if len(ann["faults"]) == 2:
            n_multi += 1
            sec = ann["faults"][1]
            assert sec["type"] != ann["label"] and sec["params"]["role"] == "secondary"
            assert sec["severity"] <= 0.5
    assert n_multi >= 5


def test_a_secondary_fault_due_after_a_crash_never_acted_and_marks_nothing(tmp_path):
    """(from a review) An oom_error crash ends the run; a secondary fault due to start later was
    clamped onto the crash step: in force there by its window, its events culprits, effect 0."""
    samples = _generated(
        tmp_path,
        "oom",
        "base: tiny\nclasses: [oom_error, cpu_contention, host_memory_pressure, gpu_throttle]\n"
        "secondary_fault_fraction: 1.0\nood_fraction: 0.0\n",
        20,
        0,
    )
    late = 0
    for sd, ann in samples:
        if ann["label"] != "oom_error" or len(ann["faults"]) < 2:
            continue
        sec = ann["faults"][1]
        if sec["effect"]["events"] == 0:
            late += 1
            assert sec["start_ns"] == sec["end_ns"], sec
            tr = teller.trace.load(sd / "trace.json", warn=False)
            only_primary = culprit_mask(tr, {**ann, "faults": ann["faults"][:1]})
            assert (culprit_mask(tr, ann) == only_primary).all()
    # a secondary fault that did act is a nuisance, not the root cause: its events are no culprits
    for sd, ann in samples:
        if len(ann["faults"]) == 2 and ann["faults"][1]["effect"]["events"] > 0:
            tr = teller.trace.load(sd / "trace.json", warn=False)
            sec_as_primary = culprit_mask(tr, {**ann, "faults": [{**ann["faults"][1], "params": {}}]})
            assert (
                sec_as_primary.any()
                and not (
                    culprit_mask(tr, ann)
                    & sec_as_primary
                    & ~culprit_mask(tr, {**ann, "faults": ann["faults"][:1]})
                ).any()
            )
            break
    else:
        raise AssertionError("no acting secondary fault in the sample")
    assert late >= 3, late


def test_fault_windows_inside_trace(tiny):
    for sd in sorted(p for p in tiny.iterdir() if p.is_dir()):
        ann = _ann(tiny, sd.name)
        t0, t1 = ann["trace"]["start_ns"], ann["trace"]["end_ns"]
        for f in ann["faults"]:
            assert t0 <= f["start_ns"] < f["end_ns"] <= t1 + 1, (sd.name, f["type"])


def test_diverse_preset_more_gpus_same_ood(tmp_path):
    """`diverse` = `default` with three more in-distribution GPUs (for extra training data); the
    benchmark's OOD workloads stay out of its in-distribution lists, and every new GPU simulates."""
    d, v = load_config("default"), load_config("diverse")
    assert v["workloads"]["in_dist"]["gpus"] == ["A100", "H100", "A10", "A40", "H200"]
    strip = {**v, "preset": "default", "workloads": {**v["workloads"], "in_dist": d["workloads"]["in_dist"]}}
    assert strip == d
    for k in ("models", "gpus", "arrivals"):
        assert not set(v["workloads"]["ood"][k]) & set(v["workloads"]["in_dist"][k])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("base: tiny\nworkloads:\n  in_dist:\n    gpus: [A10, A40, H200]\n")
    out = tmp_path / "ds"
    generate(out, num_samples=6, seed=2, config=cfg, train_only=True)
    assert validate(out, deep=True) == []
    gpus = {json.loads(p.read_text())["workload"]["gpu"] for p in out.glob("s*/annotation.json")}
    assert gpus <= {"A10", "A40", "H200"} and len(gpus) >= 2


# sha256 (first 16 hex digits) of trace.json + log.txt of one `default` benchmark test sample (seed 0)
# per class, recorded when the simulator first counted fault effects (and equal to the samples
# generated before that), updated when the traces gained deviceProperties (generator version 2: the
# same bytes without that line), and for hbm_contention when half its neighbours became time-sliced
# processes (generator version 3; the other classes' bytes unchanged); generator version 4 (the
# start-up log lines before serving) changes none of them; version 5 (a visible neighbour's kernels
# one after another on their stream) changes hbm_contention's only; version 7 (closer to vLLM V1's
# logs, the PCIe latency, drawn clocks, ranges' External id) changes every sample, and so does version 8
# (trace.json lists its inputs' pids; rank 0 its own process at TP > 1). A change here changes the
# standard benchmark: make it on purpose, bump GENERATOR_VERSION and say so in docs/dataset.md, then
# update the digests.
BENCHMARK_DIGESTS = {
    0: ("normal", "e33da4875ea98842"),  # tp 1
    20: ("kv_cache_exhaustion", "51d29a481f431876"),  # tp 1
    22: ("network_delay", "774dbba0e01adf29"),  # tp 1
    23: ("eager_mode_misconfig", "e8e392510f74a18a"),  # tp 1
    29: ("pcie_degradation", "7d5e80c272b79fc7"),  # tp 2
    50: ("oom_error", "fc84d5d09c6c725d"),  # tp 4
    80: ("hbm_contention", "f00e533410bf1be1"),  # tp 1
    96: ("cpu_contention", "6ca8c097261cf1c4"),  # tp 2
    103: ("launch_storm", "125b51ef01219685"),  # tp 1
    121: ("nvlink_degradation", "865bed7637411f9c"),  # tp 4
    123: ("host_memory_pressure", "bc2a1a138c2ef9b7"),  # tp 4
    144: ("gpu_throttle", "65f946a140212deb"),  # tp 2
    151: ("nccl_straggler", "2ab3f07bd32ed51b"),  # tp 4
}


def test_the_default_benchmark_samples_are_pinned(tmp_path):
    import hashlib

    from teller.data.dataset import generate_sample

    cfg = load_config("default")
    plans = plan(cfg, 2600, 0)
    for idx, (label, digest) in BENCHMARK_DIGESTS.items():
        ann = generate_sample(cfg, 0, plans[idx], tmp_path)
        sd = tmp_path / plans[idx].sample_id
        got = hashlib.sha256((sd / "trace.json").read_bytes() + (sd / "log.txt").read_bytes()).hexdigest()
        assert (ann["label"], got[:16]) == (label, digest), plans[idx].sample_id
        if label != "normal":
            assert ann["faults"][0]["effect"]["events"] > 0, label


def test_a_visible_neighbours_kernels_run_one_after_another_on_their_stream(tmp_path):
    """hbm_contention's visible neighbour puts its kernels on one stream of the rank's GPU; a stream
    runs one kernel at a time. Before generator version 5 they were drawn at independent start times
    and overlapped: the loader warned of improper nesting (s000002, s000054 of `default`) and nested
    one foreign kernel inside another. s000080 is the pinned sample of the class."""
    from teller.data.dataset import generate_sample
    from teller.data.simulator import FOREIGN_STREAM

    cfg = load_config("default")
    plans = plan(cfg, 2600, 0)
    for idx in (2, 54, 80):
        ann = generate_sample(cfg, 0, plans[idx], tmp_path)
        f = ann["faults"][0]
        assert f["type"] == "hbm_contention" and f["params"]["foreign_visible"], idx
        path = tmp_path / plans[idx].sample_id / "trace.json"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tr = teller.trace.load(path)
        assert tr.warnings == [], idx
        evs = json.loads(path.read_text())["traceEvents"]
        foreign: dict[int, list[tuple[float, float]]] = {}
        for e in evs:
            if e.get("ph") == "X" and e.get("tid") == FOREIGN_STREAM:
                foreign.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
        n = sum(len(v) for v in foreign.values())
        assert n == f["effect"]["foreign_kernels"] > 0, idx
        for spans in foreign.values():
            spans.sort()
            # the trace's microseconds carry 3 decimals: a kernel may start at its predecessor's
            # rounded end
            assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:], strict=False)), idx


def test_start_up_log_lines_come_before_serving(tmp_path):
    """The start-up lines (server version, engine init, graph capture, "Starting vLLM API server")
    end at least a second before serving. Before generator version 4 their draws could add up past
    serving's start: in s000252 and s002375 of `default` "Starting vLLM API server" came after the
    trace. Those two are the regression cases (their lines are moved back, so the gap is about the
    one second); s000000 was never affected (its gap is two minutes)."""
    from teller.data.dataset import generate_sample

    cfg = load_config("default")
    plans = plan(cfg, 2600, 0)
    for idx, moved in ((0, False), (252, True), (2375, True)):
        sid = plans[idx].sample_id
        ann = generate_sample(cfg, 0, plans[idx], tmp_path)
        lines = (tmp_path / sid / "log.txt").read_text().splitlines()
        stamps = [int(x.split(" ", 1)[0]) for x in lines]
        at = [i for i, x in enumerate(lines) if "Starting vLLM API server" in x]
        assert len(at) == 1 and at[0] + 1 < len(lines), sid
        # the next line is serving's first (a request received or finished), a second or more later
        nxt = lines[at[0] + 1]
        assert "(APIServer" in nxt and "request" in nxt, (sid, nxt)
        gap = stamps[at[0] + 1] - stamps[at[0]]
        assert gap >= 10**9, (sid, gap)
        assert (gap < 1.5e9) == moved, (sid, gap)
        assert stamps[at[0]] <= ann["trace"]["start_ns"] - 10**9, sid
        # the stamp inside the text follows the moved time (MM-DD HH:MM:SS of the line's own clock)
        hms = nxt.split()[4]
        own = lines[at[0]].split()[4]
        assert own <= hms, (sid, own, hms)


def test_trace_json_keeps_each_gpu_activity_linked_to_its_own_process(tmp_path):
    """A trace.json merged from several processes has one source but overlapping correlation ids
    (each process counts its own). Loading it back must link every kernel to its own process's
    launch, as loading the raw per-process files does (it used to link them all to rank 0's)."""
    from teller.data.dataset import generate_sample

    cfg = dict(load_config("default"), keep_raw=True)
    p = plan(cfg, 2600, 0)[121]  # nvlink_degradation, tp 4
    ann = generate_sample(cfg, 0, p, tmp_path)
    assert ann["workload"]["tp"] == 4
    sd = tmp_path / p.sample_id

    def links(tr: teller.trace.Trace) -> list[tuple[int, ...]]:
        i = np.flatnonzero(tr.link >= 0)
        j = tr.link[i]
        return sorted(zip(tr.device[i], tr.tid[i], tr.ts[i], tr.pid[j], tr.tid[j], tr.ts[j], strict=True))

    from_raw = teller.trace.load(sd / "raw", warn=False)
    from_json = teller.trace.load(sd / "trace.json", warn=False)
    a, b = links(from_raw), links(from_json)
    assert len(a) > 1000 and a == b
    owner = {q["device"]: q["pid"] for q in ann["workload"]["processes"]}
    assert {(d, pid) for d, _, _, pid, _, _ in b} == set(owner.items())


def test_samples_say_which_gpus_they_ran_on(tiny):
    # each sample's trace.json lists its workload's GPUs (Kineto's deviceProperties), one per rank
    import json as _json

    from teller import trace as _trace
    from teller.data import kernels as K

    seen = set()
    for sd in sorted(p for p in tiny.iterdir() if p.is_dir()):
        wl = _json.loads((sd / "annotation.json").read_text())["workload"]
        devs = _trace.load(sd / "trace.json").device_properties
        spec = K.gpu_spec(wl["gpu"])
        assert [x["id"] for x in devs] == list(range(wl["tp"])), sd.name
        assert {x["name"] for x in devs} == {spec.name}, sd.name
        assert {(x["computeMajor"], x["computeMinor"]) for x in devs} == {divmod(spec.sm, 10)}, sd.name
        seen.add(spec.name)
    assert seen  # (the tiny preset's GPUs)


def test_too_few_samples_for_the_splits_is_a_warning(tmp_path):
    """Each class is split on its own, so a few samples per class leave val, test and test_ood empty:
    said when the dataset is generated (training would have no validation, evaluation no test)."""
    import warnings

    from teller.data.dataset import generate
    from teller.errors import TellerWarning

    with pytest.warns(TellerWarning, match=r"the val, test, test_ood split\(s\) hold no samples: 13 samples"):
        man = generate(tmp_path / "few", num_samples=13, preset="tiny")
    assert not man["splits"]["val"] and not man["splits"]["test"]
    with warnings.catch_warnings():  # (enough of each class: nothing to say; extra train data: none wanted)
        warnings.simplefilter("error")
        generate(tmp_path / "enough", num_samples=100, preset="tiny")
        generate(tmp_path / "extra", num_samples=13, preset="tiny", train_only=True)


def test_validate_names_shards_and_a_sample_directory(tiny, tmp_path):
    """(from a review) Shards gave 17 schema problems, a sample directory "manifest.json: missing":
    what the directory is is said once."""
    from teller.errors import DatasetError

    shards = tmp_path / "tok"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"format": "teller-shards"}))
    with pytest.raises(DatasetError, match="tokenized shards of teller tokenize, not a dataset"):
        validate(shards)
    sample = next(p for p in sorted(Path(tiny).iterdir()) if p.is_dir())
    with pytest.raises(DatasetError, match="one sample directory, not a dataset: validate its dataset"):
        validate(sample)


def test_validate_checks_the_manifest_against_itself_and_the_annotations(tiny, tmp_path):
    """(from a review) Each was accepted: a training sample listed under test (tokenize follows
    `splits`: it was encoded as a test sample), a sample in no split, `num_samples` and `counts`
    that disagree with `samples`, `ood` on a sample outside test_ood, a fault window past the trace."""
    d = _broken(tiny, tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    sid = man["splits"]["train"][0]
    man["splits"]["train"].remove(sid)
    man["splits"]["test"] = [*man["splits"].get("test", []), sid]
    other = man["splits"]["train"].pop()  # (in no split)
    man["num_samples"] = 5
    label = man["samples"][sid]["label"]
    man["counts"]["train"][label] = 999
    # (and a pair the counts leave out)
    gone = next(k for k, v in man["counts"]["train"].items() if v and k != label)
    del man["counts"]["train"][gone]
    (d / "manifest.json").write_text(json.dumps(man))
    faulty = next(s for s in man["splits"]["train"] if _ann(d, s)["faults"])
    ann = _ann(d, faulty)
    ann["ood"] = True
    ann["faults"][0]["end_ns"] = ann["trace"]["end_ns"] + 10**12
    _put(d, faulty, ann)
    said = [str(p) for p in validate(d)]
    n = len(man["samples"])
    for want in (
        f"manifest.json $.splits.test[{len(man['splits']['test']) - 1}]: '{sid}' is listed under test, "
        "$.samples says 'train'",
        f"manifest.json $.samples.{other}: in no split of $.splits",
        f"manifest.json $.num_samples: is 5, $.samples lists {n}",
        f"manifest.json $.counts.train.{label}: is 999, $.samples has",
        f"manifest.json $.counts.train.{gone}: missing, $.samples has",
        f"{faulty}/annotation.json $.ood: is True for a train sample",
        f"{faulty}/annotation.json $.faults[0]: window [",
    ):
        assert any(p.startswith(want) for p in said), (want, said)


def test_test_ood_workloads_must_be_unseen_in_training(tmp_path):
    cfg = tmp_path / "ov.yaml"
    cfg.write_text("base: tiny\nworkloads: {ood: {models: [], gpus: [A100], arrivals: []}}\n")
    with pytest.raises(ConfigError, match=r"workloads.ood.gpus lists 'A100', also in workloads.in_dist.gpus"):
        load_config(config=cfg)


def test_configurations_the_simulator_cannot_run_are_refused(tmp_path):
    """(from a review) kv_util [0, 0] was a ZeroDivisionError traceback, max_num_seqs [0, 0.9] a
    dataset `validate` then refused, repeated classes a manifest it refused."""
    bad = tmp_path / "bad.yaml"
    for text, said in (
        ("workloads: {kv_util: [0, 0]}", r"workloads.kv_util must lie within"),
        ("workloads: {kv_util: [0.5, 1.5]}", r"workloads.kv_util must lie within"),
        ("workloads: {max_num_seqs: [0, 0.9]}", r"workloads.max_num_seqs must lie within \[1"),
        ("workloads: {rate: [0, 10]}", r"workloads.rate must be above 0"),
        ("classes: [normal, gpu_throttle, normal]", r"classes must be distinct"),
    ):
        bad.write_text(f"base: tiny\n{text}\n")
        with pytest.raises(ConfigError, match=said):
            load_config(config=bad)


def test_split_counts_never_go_below_zero():
    """(from a review) val and test were rounded apart: with train 0 and an odd count per class they
    took more than the class had, and plan() failed in zip()."""
    cfg = load_config("tiny")
    cfg = {**cfg, "splits": {"train": 0, "val": 0.5, "test": 0.5}, "ood_fraction": 0}
    for n in (39, 65, 13 * 7):
        ps = plan(cfg, n, seed=0)
        counts = {s: sum(p.split == s for p in ps) for s in ("train", "val", "test", "test_ood")}
        assert sum(counts.values()) == n and counts["train"] == 0, counts


def test_the_last_sample_index_allowed_still_generates(tmp_path):
    """(from a review) In generator version 6 each capture started 2 h after the one before it: past
    index 310 555 the clock was beyond what the trace readers hold and generation failed with a
    raw-file error; the most samples a dataset may hold stops short of that (version 7 draws the
    clocks, and the last index allowed must still generate)."""
    from teller.data.dataset import MAX_SAMPLES, SamplePlan, generate_sample

    cfg = load_config("tiny")
    ann = generate_sample(
        cfg, 0, SamplePlan(MAX_SAMPLES - 1, f"s{MAX_SAMPLES - 1:06d}", "normal", "train"), tmp_path
    )
    assert ann["label"] == "normal" and (tmp_path / f"s{MAX_SAMPLES - 1:06d}" / "trace.json").is_file()
    with pytest.raises(ConfigError, match=r"num_samples|--num-samples"):
        generate(tmp_path / "big", num_samples=MAX_SAMPLES + 1, preset="tiny")


def test_a_damaged_manifest_or_stamp_in_the_output_directory_is_refused_clearly(tmp_path):
    """(from a review) A manifest.json that is a list, or a stamp that is not UTF-8, was an
    AttributeError / UnicodeDecodeError traceback naming no file."""
    out = tmp_path / "ds"
    out.mkdir()
    (out / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"ds: already holds a dataset \(manifest.json\)"):
        generate(out, num_samples=13, preset="tiny")
    generate(tmp_path / "ok", num_samples=13, preset="tiny")
    (tmp_path / "ok" / ".generate.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"ok: holds a dataset generated with another"):
        generate(tmp_path / "ok", num_samples=13, preset="tiny")


def test_v7_every_log_line_starts_with_its_process_and_clocks_do_not_tell_the_index(tmp_path):
    """Generator version 7: vLLM V1 prefixes every line a process writes (tracebacks and uvicorn's
    access lines included) with ``(Proc pid=N)``; the capture clocks are drawn, so a sample's start
    time does not grow with its index (before, each started 2 h after the one before it, and the
    index told the label)."""
    from teller.data.dataset import generate_sample

    cfg = load_config("default")
    plans = plan(cfg, 2600, 0)
    starts = []
    for idx in (0, 1, 2, 3, 50):  # 50: an oom_error (its traceback)
        generate_sample(cfg, 0, plans[idx], tmp_path)
        log = (tmp_path / plans[idx].sample_id / "log.txt").read_text().splitlines()
        texts = [ln.split(" ", 2)[2] for ln in log]
        assert texts and all(
            re.match(
                r"\((APIServer|EngineCore_DP0|Worker_TP\d+) pid=\d+\) (INFO|WARNING|ERROR|CRITICAL)\b", t
            )
            for t in texts
        )
        if idx == 50:  # logger.exception: each traceback line carries the record's header
            assert any(re.search(r"\) ERROR .* \[core\.py:\d+\] Traceback \(most recent", t) for t in texts)
        assert not any("Host memory is low" in t or "is preempted" in t or "Preemptions" in t for t in texts)
        starts.append(int(log[0].split()[0]))
    assert starts != sorted(starts)
