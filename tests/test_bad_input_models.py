"""Bad input to `teller train baselines / ensemble`, `teller evaluate` and `teller results summarize`:
a one-line TellerError naming the file or directory and what is wrong, and nothing already written
overwritten."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

from teller import tpe  # noqa: E402
from teller.data import generate  # noqa: E402
from teller.data.tokenize import tokenize_dataset  # noqa: E402
from teller.errors import ConfigError, TellerError, TellerIOError  # noqa: E402
from teller.models.baselines import evaluate_baselines, train_baselines  # noqa: E402
from teller.models.ensemble import evaluate_ensemble, fit_ensemble  # noqa: E402
from teller.models.report import evaluate_any, summarize, write_metrics  # noqa: E402
from teller.models.train import evaluate, train  # noqa: E402

CFG = {
    "model": {
        "d_model": 16,
        "n_layers": 1,
        "n_heads": 2,
        "d_ff": 32,
        "max_trace_tokens": 64,
        "max_log_tokens": 64,
        "summary_tokens": True,
        "max_summary_tokens": 32,
        "feature_norm": True,
        "loc_per_class": True,
    },
    "train": {"seed": 1, "batch_size": 8, "epochs": 1, "lr": 3e-3, "patience": 5},
}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
QUIET = {"log": lambda _m: None}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny shards (train split only), other shards of the same tokenizers, shards of another TPE
    tokenizer, and a MoT run, a baselines run and an ensemble of them."""
    root = tmp_path_factory.mktemp("models-bad")
    generate(root / "ds", num_samples=30, seed=3, preset="tiny")
    tok = tpe.train(root / "ds", vocab_size=300)
    tok.save(root / "tpe")
    shards = tokenize_dataset(root / "ds", root / "tpe", root / "tok", shard_size=16, workers=1)
    generate(root / "ds2", num_samples=20, seed=4, preset="tiny")
    extra = tokenize_dataset(
        root / "ds2", root / "tpe", root / "tok2", workers=1, log_tokenizer=shards / "log_tokenizer.json"
    )
    tpe.train(root / "ds2", vocab_size=200).save(root / "tpe-other")
    other = tokenize_dataset(root / "ds2", root / "tpe-other", root / "tok-other", workers=1)
    mot = train(CFG, shards, root / "mot", tpe_dir=root / "tpe")
    base = train_baselines(shards, root / "base", **QUIET)
    ens = fit_ensemble(mot, base, root / "ens", split="train", **QUIET)
    return {
        "root": root,
        "shards": shards,
        "extra": extra,
        "other": other,
        "mot": mot,
        "base": base,
        "ens": ens,
    }


def _files(run: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(run.iterdir()) if f.is_file()}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "teller", *args], env=ENV, capture_output=True, text=True)


def _one_line_error(r: subprocess.CompletedProcess, msg: str) -> None:
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


def test_baselines_and_ensemble_refuse_a_directory_holding_a_run(runs, tmp_path) -> None:
    mot, base, ens, shards = runs["mot"], runs["base"], runs["ens"], runs["shards"]
    before = {r: _files(r) for r in (mot, base, ens)}
    for out in (mot, base, ens):
        with pytest.raises(ConfigError, match=f"{out}: already holds a run"):
            fit_ensemble(mot, base, out, split="train", **QUIET)
        with pytest.raises(ConfigError, match=f"{out}: already holds a run"):
            train_baselines(shards, out, **QUIET)
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(TellerIOError, match="afile: exists and is not a directory"):
        train_baselines(shards, f, **QUIET)
    with pytest.raises(TellerIOError, match="afile: exists and is not a directory"):
        fit_ensemble(mot, base, f, split="train", **QUIET)
    _one_line_error(
        _cli("train", "ensemble", "--mot", str(mot), "--baselines", str(base), "--output-dir", str(mot)),
        "already holds a run",
    )
    assert {r: _files(r) for r in (mot, base, ens)} == before
    # a new run is written whole, through temporary files
    new = fit_ensemble(mot, base, tmp_path / "ens2", split="train", **QUIET)
    assert sorted(p.name for p in new.iterdir()) == ["config.json"]


def test_evaluate_refuses_an_empty_split_and_writes_nothing(runs) -> None:
    mot, base, ens, shards = runs["mot"], runs["base"], runs["ens"], runs["shards"]
    for run, fn in ((mot, evaluate), (base, evaluate_baselines), (ens, evaluate_ensemble)):
        with pytest.raises(ConfigError, match=f"{shards}: its 'test' split holds no samples"):
            fn(run, None, "test")
    (mot / "eval-test-mot.json").write_text('{"model": "mot", "split": "test", "ac@1": 0.9}')
    keep = _files(mot)
    _one_line_error(
        _cli("evaluate", "--checkpoint", str(mot), "--split", "test"), "'test' split holds no samples"
    )
    assert _files(mot) == keep
    (mot / "eval-test-mot.json").unlink()


def test_evaluate_refuses_shards_of_another_tokenizer(runs, tmp_path) -> None:
    mot, base, ens, other = runs["mot"], runs["base"], runs["ens"], runs["other"]
    for run, fn in ((mot, evaluate), (base, evaluate_baselines), (ens, evaluate_ensemble)):
        with pytest.raises(ConfigError, match=f"{other}: encoded with another TPE tokenizer"):
            fn(run, other, "train")
    for run in (mot, base, ens):
        with pytest.raises(ConfigError, match="--data-dir DATASET"):
            evaluate_any(run, other, "train")
    # the training shards gone: the recorded TPE tokenizer file, else the vocabulary sizes
    cp = shutil.copytree(mot, tmp_path / "mot")
    c = json.loads((cp / "config.json").read_text())
    c["data_dir"] = str(tmp_path / "gone")
    (cp / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="another TPE tokenizer"):
        evaluate(cp, other, "train")
    c["tpe_dir"] = str(tmp_path / "gone-too")
    (cp / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="its TPE vocabulary size is 200, .* was trained on 300"):
        evaluate(cp, other, "train")
    # the same tokenizers (other data): evaluated
    assert evaluate(mot, runs["extra"], "train")["n"] == 20


@pytest.mark.parametrize(
    "edit, msg",
    [
        (lambda c: c.update(weight="x"), "weight: 'x' is not a number in [0, 1]"),
        (lambda c: c.update(weight=5.0), "weight: 5.0 is not a number in [0, 1]"),
        (lambda c: c.pop("baselines"), "baselines: None is not the path"),
        (lambda c: c.update(mot=3), "mot: 3 is not the path"),
        (lambda c: c.update(label_names="x"), "label_names: 'x' is not a list"),
    ],
)
def test_a_damaged_ensemble_config_is_named(runs, tmp_path, edit, msg) -> None:
    from teller.models.diagnose import diagnose

    ens = shutil.copytree(runs["ens"], tmp_path / "ens")
    c = json.loads((ens / "config.json").read_text())
    edit(c)
    (ens / "config.json").write_text(json.dumps(c))
    sample = next(p for p in (runs["root"] / "ds").iterdir() if p.is_dir())
    for call in (
        lambda: evaluate_any(ens, None, "train"),
        lambda: evaluate_ensemble(ens, None, "train"),
        lambda: diagnose(sample, ens),
    ):
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value).startswith(f"{ens / 'config.json'}: ") and msg in str(e.value)


def test_train_ensemble_names_a_damaged_run_config(runs, tmp_path) -> None:
    base = shutil.copytree(runs["base"], tmp_path / "base")
    c = json.loads((base / "config.json").read_text())
    del c["label_names"]
    (base / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="base/config.json: label_names: None"):
        fit_ensemble(runs["mot"], base, tmp_path / "e", split="train", **QUIET)
    mot = shutil.copytree(runs["mot"], tmp_path / "mot")
    c = json.loads((mot / "config.json").read_text())
    c["data_dir"] = 5
    (mot / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="mot/config.json: data_dir: 5"):
        fit_ensemble(mot, runs["base"], tmp_path / "e", split="train", **QUIET)
    assert not (tmp_path / "e").exists()


def test_train_baselines_checks_tpe_dir(runs, tmp_path) -> None:
    root = runs["root"]
    with pytest.raises(ConfigError, match="not the TPE tokenizer"):
        train_baselines(runs["shards"], tmp_path / "b", tpe_dir=root / "tpe-other", **QUIET)
    _one_line_error(
        _cli(
            "train", "baselines", "--data-dir", str(runs["shards"]),
            "--tpe-dir", str(root / "tpe-other"), "--output-dir", str(tmp_path / "b"),
        ),
        "not the TPE tokenizer",
    )  # fmt: skip
    assert not (tmp_path / "b").exists()


def test_extra_train_given_twice_is_refused(runs, tmp_path) -> None:
    shards, extra = runs["shards"], runs["extra"]
    twice = [extra, Path(str(extra) + "/../" + extra.name)]
    with pytest.raises(ConfigError, match="given twice as --extra-train"):
        train(CFG, shards, tmp_path / "m", tpe_dir=runs["root"] / "tpe", extra_train=twice)
    with pytest.raises(ConfigError, match="given twice as --extra-train"):
        train_baselines(shards, tmp_path / "b", extra_train=twice, **QUIET)
    assert not (tmp_path / "m").exists() and not (tmp_path / "b").exists()


def test_summarize_refuses_a_run_twice_and_names_directories_without_evaluations(runs, tmp_path) -> None:
    run = shutil.copytree(runs["mot"], tmp_path / "run")
    for m in evaluate_any(run, None, "train"):
        write_metrics(m, run)
    with pytest.raises(ConfigError, match="given twice"):
        summarize([run, tmp_path / "." / "run"], tmp_path / "out")
    notrun = tmp_path / "notrun"
    notrun.mkdir()
    with pytest.raises(TellerError, match=f"no eval-\\*.json in {notrun}"):
        summarize([notrun], tmp_path / "out")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        summarize([run, notrun], tmp_path / "out")
    assert any(f"{notrun}: no eval-*.json" in str(x.message) for x in w)
    _one_line_error(
        _cli("results", "summarize", str(run), str(run), "-o", str(tmp_path / "o2")), "given twice"
    )


def test_a_file_outside_any_run_given_as_checkpoint_is_named(runs, tmp_path) -> None:
    """(from a review) A file given to --checkpoint was read as the directory around it: the
    errors named `.`, or `DIR/config.json`, not the file given."""
    from teller.models.diagnose import load_checkpoint_for_diagnosis
    from teller.models.train import calibrate, load_checkpoint

    f = tmp_path / "notes.txt"
    f.write_text("hello\n")
    says = f"{f}: a file, not a checkpoint: give a run directory of teller train"
    for call in (
        lambda: evaluate_any(f, None, "train"),
        lambda: load_checkpoint(f),
        lambda: calibrate(f),
        lambda: load_checkpoint_for_diagnosis(f),
    ):
        with pytest.raises(ConfigError, match=f"^{says}"):
            call()
    _one_line_error(_cli("evaluate", "--checkpoint", str(f)), says)
    # a run's own weights file still names the run
    assert load_checkpoint(runs["mot"] / "model.safetensors")[1]["model"]
    # a baselines run has no network: said so, not "not a checkpoint"
    with pytest.raises(ConfigError, match="a baselines run \\(teller train baselines\\), not a MoT"):
        load_checkpoint_for_diagnosis(runs["base"])
