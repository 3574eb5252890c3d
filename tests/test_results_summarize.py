"""`teller results summarize`: the comparison tables, the plots, and bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from teller.errors import ConfigError, TellerFileNotFoundError
from teller.models.report import summarize


def _eval(run: Path, model: str, split: str, ac1: float, f1: dict[str, float]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    m = {
        "model": model,
        "split": split,
        "n": 10,
        "ac@1": ac1,
        "ac@3": min(1.0, ac1 + 0.1),
        "ac@5": 1.0,
        "avg@5": 0.9,
        "category_accuracy": ac1 + 0.05,
        "macro_f1": sum(f1.values()) / len(f1),
        "loc_top1": 0.8,
        "loc_top3": 0.95,
        "latency_ms_per_sample": 4.2,
        "per_class": {c: {"support": 5, "precision": v, "recall": v, "f1": v} for c, v in f1.items()},
        "per_severity": {"0.1-0.3": {"n": 3, "category_accuracy": 0.5, "ac@1": ac1 - 0.2}},
        "per_effect": {
            "share >= 0.2": {"n": 4, "category_accuracy": 1.0, "ac@1": ac1 + 0.1},
            "share 0-0.01": {"n": 2, "category_accuracy": 0.5, "ac@1": ac1 - 0.3},
        },
        "ac@1_with_effect": ac1 + 0.01,
    }
    if model == "gbdt":  # (a bin only the second model has: the table's rows keep the bins' order)
        m["per_effect"]["none"] = {"n": 1, "category_accuracy": 0.0, "ac@1": 0.0}
    (run / f"eval-{split}-{model}.json").write_text(json.dumps(m))


def _runs(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "mot", tmp_path / "base"
    _eval(a, "mot", "test", 0.85, {"normal": 0.7, "oom": 1.0})
    _eval(a, "mot", "test_ood", 0.78, {"normal": 0.6, "oom": 0.9})
    _eval(b, "gbdt", "test", 0.66, {"normal": 0.5, "oom": 0.95})
    _eval(b, "gbdt", "test_ood", 0.62, {"normal": 0.4})
    return [a, b]


def test_tables_rank_models_per_split(tmp_path: Path) -> None:
    out = tmp_path / "out"
    text = summarize(_runs(tmp_path), out)
    assert text == (out / "results.md").read_text()
    main = [line for line in text.splitlines() if line.startswith("| mot |") or line.startswith("| base |")]
    # test before test_ood, and within a split the better AC@1 first
    assert [line.split(" | ")[2:4] for line in main] == [
        ["test", "0.850"],
        ["test", "0.660"],
        ["test_ood", "0.780"],
        ["test_ood", "0.620"],
    ]
    assert "## F1 per fault type (test_ood)" in text
    # a class one model never saw on that split is '-', not 0
    assert "| oom | 0.900 | - |" in text
    assert "| 0.1-0.3 | 0.650 | 0.460 |" in text
    # by effect, rows in the bins' order although the first model has no 'none' row
    eff = text.split("## AC@1 of faulty samples by what the fault did (effect) (test)")[1].split("##")[0]
    assert [line.split(" | ")[0] for line in eff.strip().splitlines()[2:]] == [
        "| none",
        "| share 0-0.01",
        "| share >= 0.2",
    ]
    assert "| none | - | 0.000 |" in eff and "| share >= 0.2 | 0.950 | 0.760 |" in eff
    assert "| mot | mot | test | 0.850 | 0.950 | 1.000 | 0.900 | 0.860 |" in text  # ac@1_with_effect
    rows = json.loads((out / "results.json").read_text())
    assert {r["label"] for r in rows} == {"mot", "gbdt"}
    assert rows[0]["per_class_f1"] == {"normal": 0.7, "oom": 1.0}


def test_plots_are_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    text = summarize(_runs(tmp_path), out)
    for name in ("results-metrics.png", "results-per-class-test.png", "results-per-class-test_ood.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"({name})" in text


def test_plots_of_an_earlier_summary_are_not_left_behind(tmp_path: Path) -> None:
    """A second summary into one directory of test only: the first's test_ood plot stayed beside
    results.md, describing models it no longer lists."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    summarize(_runs(tmp_path), out)
    assert (out / "results-per-class-test_ood.png").is_file()
    only = tmp_path / "only"
    _eval(only, "mot", "test", 0.85, {"normal": 0.7, "oom": 1.0})
    (out / "notes.png").write_bytes(b"mine")  # (not a file summarize writes: kept)
    summarize([only], out)
    assert sorted(p.name for p in out.glob("*.png")) == [
        "notes.png",
        "results-metrics.png",
        "results-per-class-test.png",
    ]


def test_without_matplotlib_tables_still_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["matplotlib", *(m for m in list(sys.modules) if m.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError, as if not installed
    out = tmp_path / "out"
    text = summarize(_runs(tmp_path), out)
    assert "matplotlib is not installed" in text and not list(out.glob("*.png"))


def test_same_model_in_two_runs_is_named_by_run(tmp_path: Path) -> None:
    _eval(tmp_path / "seed0", "mot", "test", 0.8, {"normal": 0.5})
    _eval(tmp_path / "seed1", "mot", "test", 0.9, {"normal": 0.6})
    summarize([tmp_path / "seed0", tmp_path / "seed1"], tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["label"] for r in rows] == ["seed1/mot", "seed0/mot"]
    # runs whose directories share a name: as much of the path as tells them apart
    _eval(tmp_path / "a" / "mot", "mot", "test", 0.8, {"normal": 0.5})
    _eval(tmp_path / "b" / "mot", "mot", "test", 0.7, {"normal": 0.5})
    summarize([tmp_path / "a" / "mot", tmp_path / "b" / "mot"], tmp_path / "out2")
    rows = json.loads((tmp_path / "out2" / "results.json").read_text())
    assert [r["label"] for r in rows] == ["a/mot/mot", "b/mot/mot"]
    # ... and so does the per-run table's run column (it said "mot" twice)
    assert [r["run"] for r in rows] == ["a/mot", "b/mot"]
    assert "| a/mot | mot |" in (tmp_path / "out2" / "results.md").read_text()
    # the pooled table lists the runs by those tails too, not by their (equal) directory names
    g = json.loads((tmp_path / "out2" / "results-paired.json").read_text())
    assert g[0]["models"][0]["run_names"] == ["a/mot", "b/mot"]


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TellerFileNotFoundError, match="nope"):
        summarize([tmp_path / "nope"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TellerFileNotFoundError, match="no eval"):
        summarize([tmp_path / "empty"], tmp_path / "out")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "eval-test-mot.json").write_text('{"model": "mot", "spl')
    with pytest.raises(ConfigError, match="eval-test-mot.json"):
        summarize([bad], tmp_path / "out")
    (bad / "eval-test-mot.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not an evaluation file"):
        summarize([bad], tmp_path / "out")
    assert isinstance(ConfigError("x"), ValueError) and isinstance(
        TellerFileNotFoundError("x"), FileNotFoundError
    )
    # a headline number that is not one (a hand-edited file): named, not a TypeError while sorting
    _eval(bad, "mot", "test", 0.8, {"normal": 0.7})
    m = json.loads((bad / "eval-test-mot.json").read_text())
    for k, v in (("ac@1", "x"), ("category_accuracy", True), ("n", [10])):
        (bad / "eval-test-mot.json").write_text(json.dumps({**m, k: v}))
        with pytest.raises(ConfigError, match=rf"eval-test-mot.json: '{k}' must be a number"):
            summarize([bad], tmp_path / "out")
    (bad / "eval-test-mot.json").write_text(json.dumps({**m, "nll": None}))  # (null: not measured)
    summarize([bad], tmp_path / "out")


def _with_samples(run: Path, model: str, split: str, hits: list[bool], **tags: str | float) -> None:
    """An evaluation file with per-sample records: sample i right (rank 1) where hits[i]; ``tags``:
    ``recipe`` and ``data`` as teller evaluate writes them."""
    _eval(run, model, split, sum(hits) / len(hits), {"normal": 0.5})
    f = run / f"eval-{split}-{model}.json"
    m = json.loads(f.read_text()) | tags
    m["samples"] = [  # (the category is right on every other miss: rank 3 with the right cause)
        {"id": f"s{i:03d}", "label": "normal", "pred": "normal" if h or i % 2 else "oom", "p": 0.9}
        | {"rank": 1 if h else 3}
        for i, h in enumerate(hits)
    ]
    f.write_text(json.dumps(m))


def test_seeds_pooled_and_paired_per_sample(tmp_path: Path) -> None:
    # mot: two seeds; single: one run. 20 samples
    a0 = [True] * 18 + [False, False]
    a1 = [True] * 16 + [False, False, True, False]
    b = [False] * 4 + [True] * 16
    _with_samples(tmp_path / "mot-0", "mot", "test", a0, ece=0.02)
    _with_samples(tmp_path / "mot-1", "mot", "test", a1, ece=0.04)
    _with_samples(tmp_path / "single-0", "single", "test", b)  # (evaluated before ece existed)
    out = tmp_path / "out"
    text = summarize([tmp_path / "mot-0", tmp_path / "mot-1", tmp_path / "single-0"], out)
    g = json.loads((out / "results-paired.json").read_text())
    assert [m["model"] for m in g[0]["models"]] == ["mot", "single"]
    mot = g[0]["models"][0]
    assert mot["runs"] == 2 and mot["ac@1_mean"] == pytest.approx(0.875)
    assert mot["ac@1_sd"] == pytest.approx(0.0353553, abs=1e-6)
    c, cat = g[0]["paired"]
    assert c["metric"] == "ac@1" and cat["metric"] == "category_accuracy"
    # per-sample mot scores: 1 (s000-s015), 0.5 (s016-s018), 0 (s019); single: 0 for s000-s003, else 1
    assert c["reference"] == "mot" and c["model"] == "single" and c["n"] == 20
    assert c["diff"] == pytest.approx(0.875 - 0.8)
    assert (c["better"], c["worse"]) == (4, 4)  # s000-s003 vs s016-s019
    assert c["p_sign"] == pytest.approx(1.0)
    assert c["lo"] < c["diff"] < c["hi"]
    # category (misses at odd ids keep the right cause): mot seed 0 misses s018, s019 (s019 odd),
    # seed 1 misses s016, s017, s019 (s017, s019 odd) -> 1 except s016 and s018 at 0.5; single misses
    # s000-s003 (s001, s003 odd) -> 0 at s000 and s002
    assert cat["diff"] == pytest.approx(19 / 20 - 18 / 20)
    assert (cat["better"], cat["worse"]) == (2, 2) and cat["p_sign"] == pytest.approx(1.0)
    assert "## Paired differences (same samples)" in text
    assert "| test | ac@1 | mot | single | 20 | +0.075 |" in text
    assert (
        "| test | mot | 2: mot-0, mot-1 | 0.875 ± 0.035 | 0.925 ± 0.035 | 0.030 |" in text
    )  # (the files' own accuracy; the mean ECE of the runs)
    assert "| test | single | 1: single-0 | 0.800 | 0.850 | - |" in text
    # an evaluation without per-sample records is pooled but not paired
    _eval(tmp_path / "old", "gbdt", "test", 0.5, {"normal": 0.5})
    summarize([tmp_path / "mot-0", tmp_path / "old"], tmp_path / "out2")
    g = json.loads((tmp_path / "out2" / "results-paired.json").read_text())
    assert g[0]["paired"] == [] and {m["model"] for m in g[0]["models"]} == {"mot", "gbdt"}
    assert "no per-sample records" in g[0]["not_paired"]["gbdt"]


def test_recipes_and_data_are_kept_apart(tmp_path: Path) -> None:
    h = [True] * 8 + [False, False]
    # two MoT recipes (e.g. with and without a weight average), one dataset: two kinds, paired
    _with_samples(tmp_path / "a0", "mot", "test", h, recipe="aaaa", data="/d/one")
    _with_samples(tmp_path / "a1", "mot", "test", h, recipe="aaaa", data="/d/one")
    _with_samples(tmp_path / "b0", "mot", "test", [True] * 10, recipe="bbbb", data="/d/one")
    # the same split name on other data: never pooled or paired with the first
    _with_samples(tmp_path / "c0", "mot", "test", [False] * 10, recipe="aaaa", data="/d/two")
    _with_samples(tmp_path / "c1", "single", "test", [True] * 10, recipe="cccc", data="/d/two")
    runs = [tmp_path / n for n in ("a0", "a1", "b0", "c0", "c1")]
    text = summarize(runs, tmp_path / "out")
    one, two = json.loads((tmp_path / "out" / "results-paired.json").read_text())
    assert one["split"] == "test (one)" and two["split"] == "test (two)"
    assert [(m["model"], m["runs"]) for m in one["models"]] == [("mot [bbbb]", 1), ("mot [aaaa]", 2)]
    assert {(c["reference"], c["model"]) for c in one["paired"]} == {("mot [bbbb]", "mot [aaaa]")}
    assert one["paired"][0]["diff"] == pytest.approx(0.2)
    assert [m["model"] for m in two["models"]] == ["single", "mot"]
    assert {(c["metric"], c["reference"], c["model"], c["diff"]) for c in two["paired"]} == {
        ("ac@1", "mot", "single", -1.0),
        ("category_accuracy", "mot", "single", -0.5),  # (odd misses keep the right cause)
    }
    assert "| test (one) | mot [aaaa] | 2: a0, a1 |" in text
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {(r["run"], r["recipe"], r["data"]) for r in rows if r["run"] == "c1"} == {
        ("c1", "cccc", "/d/two")
    }
    # a kind whose runs saw different samples is named, not paired
    _with_samples(tmp_path / "d0", "gbdt", "test", h[:9], recipe="dddd", data="/d/one")
    _with_samples(tmp_path / "d1", "gbdt", "test", h, recipe="dddd", data="/d/one")
    text = summarize([*runs[:3], tmp_path / "d0", tmp_path / "d1"], tmp_path / "out2")
    assert "* test: gbdt: its runs were evaluated on different samples" in text
    # data directories with one name in two places, and an evaluation that does not say its data
    _with_samples(tmp_path / "e0", "mot", "test", h, recipe="aaaa", data="/x/fresh")
    _with_samples(tmp_path / "e1", "mot", "test", h, recipe="aaaa", data="/y/fresh")
    _eval(tmp_path / "e2", "mot", "test", 0.5, {"normal": 0.5})
    summarize([tmp_path / n for n in ("e0", "e1", "e2")], tmp_path / "out3")
    sets = json.loads((tmp_path / "out3" / "results-paired.json").read_text())
    assert [g["split"] for g in sets] == ["test (x/fresh)", "test (y/fresh)", "test (data unknown)"]


def test_per_split_tables_and_plots_keep_data_apart(tmp_path: Path) -> None:
    # one split name, two datasets: every section and plot is per (split, data), never a mix
    _with_samples(tmp_path / "a", "mot", "test", [True] * 4, recipe="aaaa", data="/d/one")
    _with_samples(tmp_path / "b", "mot", "test", [False] * 4, recipe="aaaa", data="/d/two")
    text = summarize([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert "## F1 per fault type (test (one))" in text and "## F1 per fault type (test (two))" in text
    assert "## F1 per fault type (test)" not in text
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {(r["run"], r["split"], r["set"]) for r in rows} == {
        ("a", "test", "test (one)"),
        ("b", "test", "test (two)"),
    }
    assert "| a | mot | test (one) | 1.000 |" in text
    if "matplotlib is not installed" not in text:
        pngs = {p.name for p in (tmp_path / "out").glob("results-per-class-*.png")}
        assert pngs == {"results-per-class-test_one.png", "results-per-class-test_two.png"}


def test_empty_sample_list_is_named(tmp_path: Path) -> None:
    _with_samples(tmp_path / "m", "mot", "test", [True, False])
    _with_samples(tmp_path / "s", "single", "test", [True, True])
    f = tmp_path / "s" / "eval-test-single.json"
    f.write_text(json.dumps(json.loads(f.read_text()) | {"samples": []}))
    text = summarize([tmp_path / "m", tmp_path / "s"], tmp_path / "out")
    assert "* test: single: an evaluation of it has an empty list of samples" in text


def test_bad_sample_records_name_the_file(tmp_path: Path) -> None:
    _with_samples(tmp_path / "r", "mot", "test", [True, False])
    f = tmp_path / "r" / "eval-test-mot.json"
    m = json.loads(f.read_text())
    for bad in ({"rank": "first"}, {"pred": None}, {"id": 7}):
        m["samples"][1] = {**m["samples"][0], **bad}
        f.write_text(json.dumps(m))
        with pytest.raises(ConfigError, match=r"eval-test-mot.json: 'samples'"):
            summarize([tmp_path / "r"], tmp_path / "out")
    m["samples"][1] = m["samples"][0] | {"id": "s001"}
    for bad_recipe in (["x"], ""):
        m["recipe"] = bad_recipe
        f.write_text(json.dumps(m))
        with pytest.raises(ConfigError, match=r"eval-test-mot.json: 'recipe' must be a non-empty string"):
            summarize([tmp_path / "r"], tmp_path / "out")


def test_recipe_id_ignores_seed_and_fitted_fields(tmp_path: Path) -> None:
    from teller.models.report import recipe_id

    base = {"format": "teller-rca-checkpoint", "model": {"arch": "mot"}, "train": {"seed": 0, "ema": 0.0}}
    seed1 = {**base, "train": {"seed": 1, "ema": 0.0}}
    ema = {**base, "train": {"seed": 0, "ema": 0.999}}
    assert recipe_id(base) == recipe_id(seed1) != recipe_id(ema)
    assert base["train"]["seed"] == 0  # (not modified)
    gb = {"format": "teller-baselines", "data_dir": "/d", "info": {"gbdt": {"lr": 0.1}}}
    assert recipe_id(gb) == recipe_id({**gb, "info": {"gbdt": {"lr": 0.05}}})
    # an ensemble: its MoT's recipe, not its path or the weight val chose
    for name, cfg in (("m0", base), ("m1", seed1), ("m2", ema)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    ens = {"format": "teller-ensemble", "baselines": "/b"}
    e0 = recipe_id({**ens, "mot": str(tmp_path / "m0"), "weight": 0.25})
    assert e0 == recipe_id({**ens, "mot": str(tmp_path / "m1"), "weight": 0.5})
    assert e0 != recipe_id({**ens, "mot": str(tmp_path / "m2"), "weight": 0.25})
    # where files lie is not the recipe: shards by their content-addressed name, no tokenizer paths
    where = {**base, "data_dir": "/a/tok-123", "extra_train": ["/a/tok-9"], "tpe_dir": "/a/tpe"}
    moved = {**base, "data_dir": "/b/tok-123", "extra_train": ["/c/tok-9"], "tpe_dir": "/b/t/tpe.json"}
    assert recipe_id(where) == recipe_id(moved) != recipe_id({**moved, "data_dir": "/b/tok-456"})
    # an ensemble on another fit of the same baselines recipe
    for name in ("b1", "b2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**gb, "info": {"fit": name}}))
    mot0 = {"format": "teller-ensemble", "mot": str(tmp_path / "m0")}
    assert recipe_id({**mot0, "baselines": str(tmp_path / "b1")}) == recipe_id(
        {**mot0, "baselines": str(tmp_path / "b2")}
    )
    # where a run ran is recorded, not hashed: a run from before trained_on pools with a new one
    auto = {**base, "train": {"seed": 0, "ema": 0.0, "device": "auto"}}
    assert (
        recipe_id(auto)
        == recipe_id({**auto, "trained_on": "cpu"})
        == recipe_id({**auto, "trained_on": "cuda"})
    )
    assert recipe_id(auto) != recipe_id({**auto, "train": {"seed": 0, "ema": 0.0, "device": "cpu"}})
    # a whole number is one setting however it was written (the typed configuration records
    # `max_minutes: 14` as 14.0)
    whole = {**base, "train": {"seed": 0, "ema": 0.0, "max_minutes": 14, "lr": 0.002}}
    assert recipe_id(whole) == recipe_id({**whole, "train": {**whole["train"], "max_minutes": 14.0}})
    assert recipe_id(whole) != recipe_id({**whole, "train": {**whole["train"], "max_minutes": 14.5}})


def test_summarize_pools_by_the_recipe_of_the_runs_configuration(tmp_path: Path) -> None:
    from teller.models.report import recipe_id

    # two seeds of one configuration, one recorded before the typed configuration (max_minutes 14,
    # no ema), one after (14.0, ema 0.0); their evaluation files hold the recipe by the definition
    # of their day, which told them apart: the runs' configurations decide, and pool them
    h = [True, False, True, True]
    old = {
        "format": "teller-rca-checkpoint",
        "model": {"arch": "mot"},
        "train": {"seed": 0, "max_minutes": 14},
    }
    new = {**old, "train": {"seed": 1, "max_minutes": 14.0, "ema": 0.0}}
    then = {n: recipe_id(c, whole=False, dropped=()) for n, c in (("a", old), ("b", new))}
    assert then["a"] != then["b"] and recipe_id(old) == recipe_id(new)
    for name, c in (("a", old), ("b", new)):
        _with_samples(tmp_path / name, "mot", "test", h, recipe=then[name], data="/d")
        (tmp_path / name / "config.json").write_text(json.dumps(c))
    # kept as recorded: a lone evaluation file; one beside the configuration of another run (or a
    # run retrained with other settings since); an ensemble whose MoT has moved; a configuration of
    # the wrong shape
    _with_samples(tmp_path / "c", "mot", "test", h, recipe="lone", data="/d")
    _with_samples(tmp_path / "d", "mot", "test", h, recipe=then["b"], data="/d")
    other = {**old, "train": {"seed": 0, "max_minutes": 14, "lr": 0.5}}
    (tmp_path / "d" / "config.json").write_text(json.dumps(other))
    _with_samples(tmp_path / "e", "mot", "test", h, recipe="ens0", data="/d")
    ens = {"format": "teller-ensemble", "mot": str(tmp_path / "gone"), "baselines": str(tmp_path / "a")}
    (tmp_path / "e" / "config.json").write_text(json.dumps(ens))
    _with_samples(tmp_path / "f", "mot", "test", h, recipe="bad0", data="/d")
    (tmp_path / "f" / "config.json").write_text(json.dumps({"format": "teller-ensemble", "mot": 5}))
    # and one evaluated with a definition in between (whole numbers, only expert_tie dropped)
    mid = {**old, "train": {"seed": 2, "max_minutes": 14.0, "ema": 0.0, "expert_tie": 0.0}}
    _with_samples(tmp_path / "g", "mot", "test", h, recipe=recipe_id(mid, dropped=("expert_tie",)), data="/d")
    (tmp_path / "g" / "config.json").write_text(json.dumps(mid))
    assert recipe_id(mid, dropped=("expert_tie",)) not in then.values()
    # and one whose evaluation recorded no recipe: its configuration is all there is
    _with_samples(tmp_path / "h", "mot", "test", h, data="/d")
    (tmp_path / "h" / "config.json").write_text(json.dumps({**old, "train": {"seed": 3, "max_minutes": 14}}))
    text = summarize([tmp_path / x for x in "abcdefgh"], tmp_path / "out")
    assert f"| test | mot [{recipe_id(old)}] | 4: a, b, g, h |" in text
    for name, kept in (("c", "lone"), ("d", then["b"]), ("e", "ens0"), ("f", "bad0")):
        assert f"| test | mot [{kept}] | 1: {name} |" in text
    assert recipe_id(other) not in text


def test_model_settings_added_later_keep_the_recipe(tmp_path: Path) -> None:
    """A model setting added later is written into every new run's config.json at its default: a run
    of an unchanged configuration keeps the recipe of the runs before it, and their evaluations,
    hashed when the setting was still counted, pool with it."""
    from teller.models.report import recipe_id

    h = [True] * 4
    old = {"model": {"arch": "mot", "d_model": 64}, "train": {"seed": 0, "max_minutes": 14}}
    mid = {
        **old,
        "model": {**old["model"], "log_burst_features": False},
        "train": {**old["train"], "seed": 1},
    }
    new = {**old, "model": {**mid["model"], "trace_mean_columns": []}, "train": {**old["train"], "seed": 2}}
    on = {
        **old,
        "model": {**new["model"], "trace_mean_columns": [1, 2]},
        "train": {**old["train"], "seed": 3},
    }
    assert recipe_id(old) == recipe_id({**old, "train": {**old["train"], "seed": 4}})
    assert recipe_id(old) == recipe_id(mid) == recipe_id(new) != recipe_id(on)
    for later in ({"speed_aug": 0.0}, {"speed_aug": 0}):  # added after trace_mean_columns
        assert recipe_id({**new, "model": {**new["model"], **later}}) == recipe_id(old)
    assert recipe_id({**new, "model": {**new["model"], "speed_aug": 1.0}}) != recipe_id(old)
    # (and token_gpu_features, added after speed_aug)
    assert recipe_id({**new, "model": {**new["model"], "token_gpu_features": False}}) == recipe_id(old)
    assert recipe_id({**new, "model": {**new["model"], "token_gpu_features": True}}) != recipe_id(old)
    # evaluations of mid were hashed with the model setting counted (the definition before)
    assert recipe_id(mid, model_dropped=False) != recipe_id(mid)
    for name, c, stored in (
        ("a", old, recipe_id(old)),
        ("b", mid, recipe_id(mid, model_dropped=False)),
        ("c", new, recipe_id(new)),
        ("d", on, recipe_id(on)),
    ):
        _with_samples(tmp_path / name, "mot", "test", h, recipe=stored, data="/d")
        (tmp_path / name / "config.json").write_text(json.dumps(c))
    text = summarize([tmp_path / x for x in "abcd"], tmp_path / "out")
    assert f"| test | mot [{recipe_id(old)}] | 3: a, b, c |" in text
    assert f"| test | mot [{recipe_id(on)}] | 1: d |" in text


def test_two_spellings_of_one_setting_are_one_recipe(tmp_path: Path) -> None:
    """token_gpu_features: true is the relative reading: a run configured with `true` and one with
    `relative` pool, and so does an evaluation of the `true` run hashed before the two were one (it
    recorded the hash of `true` as written); `absolute` stays its own recipe."""
    from teller.models.report import recipe_id

    h = [True] * 4
    base = {"model": {"arch": "mot", "d_model": 64}, "train": {"seed": 0}}

    def cfg(v: object, seed: int) -> dict:
        return {"model": {**base["model"], "token_gpu_features": v}, "train": {"seed": seed}}

    t, r, a = cfg(True, 0), cfg("relative", 1), cfg("absolute", 2)
    assert recipe_id(t) == recipe_id(r) != recipe_id(a)
    assert recipe_id(t, synonyms=False) != recipe_id(r)  # the definition before
    assert recipe_id(cfg(1, 3)) != recipe_id(r)  # only the spelling `true`, not any truthy value
    for name, c, stored in (
        ("t", t, recipe_id(t, synonyms=False)),
        ("r", r, recipe_id(r)),
        ("a", a, recipe_id(a)),
    ):
        _with_samples(tmp_path / name, "mot", "test", h, recipe=stored, data="/d")
        (tmp_path / name / "config.json").write_text(json.dumps(c))
    text = summarize([tmp_path / x for x in "tra"], tmp_path / "out")
    assert f"| test | mot [{recipe_id(r)}] | 2: r, t |" in text  # (runs by directory)
    assert f"| test | mot [{recipe_id(a)}] | 1: a |" in text


def test_a_kind_trained_on_two_devices_says_so(tmp_path: Path) -> None:
    h = [True] * 4
    _with_samples(tmp_path / "c", "mot", "test", h, recipe="aaaa", data="/d", trained_on="cpu")
    _with_samples(tmp_path / "g", "mot", "test", h, recipe="aaaa", data="/d", trained_on="cuda")
    text = summarize([tmp_path / "c", tmp_path / "g"], tmp_path / "out")
    assert "| test | mot | 2: c, g (trained on cpu, cuda) |" in text
    g = json.loads((tmp_path / "out" / "results-paired.json").read_text())
    assert g[0]["models"][0]["trained_on"] == ["cpu", "cuda"]
    text = summarize([tmp_path / "c"], tmp_path / "out2")  # one device: nothing to say
    assert "trained on" not in text


def test_a_dataset_split_never_takes_the_shards_file(tmp_path: Path) -> None:
    from teller.models.report import write_metrics

    base = {"model": "mot", "split": "test", "n": 0}
    assert write_metrics(base, tmp_path).name == "eval-test-mot.json"
    assert write_metrics({**base, "dataset": "/d/cpu"}, tmp_path).name == "eval-cpu-test-mot.json"
    # a dataset directory named like a split
    assert write_metrics({**base, "dataset": "/d/test"}, tmp_path).name == "eval-test-test-mot.json"
    # a whole dataset (--split DIR): its name is the split
    assert write_metrics({**base, "split": "cpu", "dataset": "/d/cpu"}, tmp_path).name == "eval-cpu-mot.json"


def test_evaluate_text_view_shows_brier_and_temperature() -> None:
    from rich.console import Console
    from teller.models.report import print_metrics

    c = Console(record=True, width=100)
    print_metrics(
        {"model": "mot", "split": "test", "n": 3, "brier": 0.12, "temperature": 1.7, "per_class": {}}, c
    )
    text = c.export_text()
    assert "brier" in text and "0.120" in text and "temperature" in text and "1.700" in text


def test_evaluation_files_given_one_by_one(tmp_path: Path) -> None:
    """(from a review) An eval-*.json given itself was always refused as "given twice": the file
    was recorded as the run, then found again as its own file. The same file twice, or a file and
    its run directory, are still refused."""
    a, b = _runs(tmp_path)
    files = [a / "eval-test-mot.json", b / "eval-test-gbdt.json"]
    text = summarize(files, tmp_path / "out")
    assert "| mot | mot | test | 0.850 |" in text and "test_ood" not in text
    for twice in ([files[0], files[0]], [a, files[0]], [files[0], a]):
        with pytest.raises(ConfigError, match="given twice"):
            summarize(twice, tmp_path / "out2")


def test_evaluations_of_several_runs_in_one_output_directory_are_all_kept(tmp_path: Path) -> None:
    """(from a review) `teller evaluate -o DIR` of two runs wrote one eval-test-mot.json, the last
    run's; summarize then pooled a run and an -o copy of its evaluation as two runs and checked the
    -o directory, not the run, for changed weights."""
    from teller.models.report import write_metrics

    runs = [tmp_path / "s0", tmp_path / "s1"]
    base = {"model": "mot", "split": "test", "n": 10, "ac@1": 0.8}
    shared = tmp_path / "evals"
    names = []
    for r in runs:
        r.mkdir()
        m = {**base, "run_dir": str(r.resolve()), "weights": f"w-{r.name}"}
        write_metrics(m, r)
        names.append(write_metrics(m, shared).name)
    assert names[0] == "eval-test-mot.json" and names[1].startswith("eval-test-mot-s1-")
    assert len(list(shared.glob("eval-*.json"))) == 2
    # a run and the copy of its evaluation elsewhere: one evaluation, counted once
    with pytest.warns(UserWarning, match="counted once"):
        text = summarize([runs[0], runs[1], shared], tmp_path / "out")
    assert "| mot | 2: s0, s1 |" in text, text
    # the same file again (re-evaluated into the shared directory): replaced, not added
    write_metrics({**base, "run_dir": str(runs[0].resolve()), "weights": "w-s0", "ac@1": 0.9}, shared)
    assert len(list(shared.glob("eval-*.json"))) == 2


def test_a_copied_run_and_an_other_runs_file_in_a_run_directory(tmp_path: Path) -> None:
    """(from reviews) `cp -r s0 s0b`, then evaluate s0b: the copied file records s0, and the new one
    went beside it under another name (s0b's own evaluation replaces the copy: the same weights);
    summarize counts a run and its copy once. An evaluation of s1 written into s0 (`-o s0`: other
    weights) is s1's, and s0's own evaluation after it is kept beside it, not over it."""
    from teller.models.report import weights_id, write_metrics

    runs = {}
    for name, blob in (("s0", b"w0"), ("s0b", b"w0"), ("s1", b"w1")):
        r = tmp_path / name
        r.mkdir()
        (r / "config.json").write_text("{}")
        (r / "model.safetensors").write_bytes(blob)
        runs[name] = r

    def m(run: str, ac1: float) -> dict:
        r = runs[run]
        return {"model": "mot", "split": "test", "n": 10, "ac@1": ac1, "weights": weights_id(r),
                "run_dir": str(r.resolve())}  # fmt: skip

    s0, s0b = runs["s0"], runs["s0b"]
    write_metrics(m("s0", 0.8), s0)
    (s0b / "eval-test-mot.json").write_text((s0 / "eval-test-mot.json").read_text())  # (the copy)
    with pytest.warns(UserWarning, match="counted once"):
        text = summarize([s0, s0b], tmp_path / "out1")
    rows = [line for line in text.splitlines() if line.startswith(("| s0 |", "| s0b |"))]
    assert len(rows) == 1, text
    assert write_metrics(m("s0b", 0.8), s0b).name == "eval-test-mot.json"  # (the copy replaced)
    assert [p.name for p in s0b.glob("eval-*.json")] == ["eval-test-mot.json"]
    # another run's evaluation in s0, then s0's own: both kept, each its run's
    (s0 / "eval-test-mot.json").unlink()
    write_metrics(m("s1", 0.5), s0)
    own = write_metrics(m("s0", 0.8), s0)
    assert own.name != "eval-test-mot.json" and len(list(s0.glob("eval-*.json"))) == 2
    text = summarize([s0], tmp_path / "out2")
    rows = [line for line in text.splitlines() if line.startswith("| s")]
    assert any(r.startswith("| s1 |") for r in rows) and any(r.startswith("| s0 |") for r in rows), rows


def test_damaged_tables_and_names_in_an_evaluation_file_are_named(tmp_path: Path) -> None:
    """(from a review) per_class / per_severity / per_effect and the model name were not checked: a
    damaged file was an AttributeError or TypeError from deep in the tables."""
    bad = tmp_path / "bad"
    _eval(bad, "mot", "test", 0.8, {"normal": 0.7})
    m = json.loads((bad / "eval-test-mot.json").read_text())
    for k, v, said in (
        ("per_class", [1, 2], "'per_class' must map names to records"),
        ("per_severity", {"0.3-0.6": 5}, "'per_severity' must map names to records"),
        ("per_effect", "x", "'per_effect' must map names to records"),
        ("model", ["mot"], "'model' must be a non-empty string"),
        ("split", "", "'split' must be a non-empty string"),
    ):
        (bad / "eval-test-mot.json").write_text(json.dumps({**m, k: v}))
        with pytest.raises(ConfigError, match=rf"eval-test-mot.json: {said}"):
            summarize([bad], tmp_path / "out")


def test_tables_do_not_depend_on_the_order_the_runs_are_given_in(tmp_path: Path) -> None:
    """(from a review) Ties in AC@1 kept the order of the arguments: the same runs in another order
    gave other tables."""
    a, b = tmp_path / "a", tmp_path / "b"
    _eval(a, "mot", "test", 0.7, {"normal": 0.7})
    _eval(b, "single", "test", 0.7, {"normal": 0.6})
    one = summarize([a, b], tmp_path / "o1")
    two = summarize([b, a], tmp_path / "o2")
    assert one == two
