"""Bad input to `teller train`: a clear TellerError naming the file and what is wrong, checked before
anything is written, and a failed, refused or interrupted run never breaks the run it was pointed at."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

from teller import tpe  # noqa: E402
from teller.data import generate  # noqa: E402
from teller.data.tokenize import tokenize_dataset  # noqa: E402
from teller.errors import (  # noqa: E402
    ConfigError,
    TellerError,
    TellerFileNotFoundError,
    TellerIOError,
    TellerWarning,
)
from teller.models.train import load_checkpoint, load_config, train  # noqa: E402

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
    },
    "train": {"seed": 1, "batch_size": 8, "epochs": 1, "lr": 3e-3, "patience": 5},
}
RUN_FILES = ("config.json", "model.safetensors", "last.safetensors", "state.pt", "history.json")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tiny shards, other shards (another dataset, the same TPE tokenizer) and a run of one epoch."""
    root = tmp_path_factory.mktemp("train-bad")
    generate(root / "ds", num_samples=30, seed=3, preset="tiny")
    tok = tpe.train(root / "ds", vocab_size=300)
    tok.save(root / "tpe")
    shards = tokenize_dataset(root / "ds", root / "tpe", root / "tok", shard_size=16, workers=1)
    generate(root / "ds2", num_samples=30, seed=4, preset="tiny")
    other = tokenize_dataset(
        root / "ds2",
        root / "tpe",
        root / "tok2",
        shard_size=16,
        workers=1,
        log_tokenizer=shards / "log_tokenizer.json",
    )
    run = train(CFG, shards, root / "run", tpe_dir=root / "tpe")
    return root, shards, other, run


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def _snapshot(run: Path) -> dict[str, bytes]:
    return {f: (run / f).read_bytes() for f in RUN_FILES if (run / f).exists()}


def _cfg(epochs: int, **model) -> dict:
    return {"model": {**CFG["model"], **model}, "train": {**CFG["train"], "epochs": epochs}}


def test_training_into_a_trained_run_needs_resume(data, tmp_path) -> None:
    root, shards, _other, run = data
    ck = _copy(run, tmp_path / "ck")
    before = _snapshot(ck)
    with pytest.raises(
        ConfigError, match=r"ck: already holds a trained run .*pass --resume .*another --output-dir"
    ):
        train(_cfg(1, d_model=32), shards, ck)
    assert _snapshot(ck) == before
    # an empty directory (or one a run interrupted in its first epoch left) is trained into
    (tmp_path / "empty").mkdir()
    assert (train(CFG, shards, tmp_path / "empty") / "model.safetensors").is_file()
    # --resume into one: trained from the start, and said (not silently)
    with pytest.warns(TellerWarning, match=r"fresh: holds no saved run to resume .*training from the start"):
        assert (train(CFG, shards, tmp_path / "fresh", resume=True) / "model.safetensors").is_file()


def test_resume_refuses_a_damaged_state_and_keeps_the_run(data, tmp_path) -> None:
    """Each damage: a TellerError naming the file, before anything is rewritten; the checkpoint
    (config.json + model.safetensors) still loads."""
    _root, shards, _other, run = data

    def truncate(name: str, keep: int):
        return lambda ck: (ck / name).write_bytes((ck / name).read_bytes()[:keep])

    def other_epoch(ck: Path):  # last.safetensors of another epoch than state.pt's (a torn save)
        st = torch.load(ck / "state.pt", weights_only=False)
        torch.save({**st, "epoch": st["epoch"] + 1}, ck / "state.pt")

    damages = [
        ("last.safetensors: not readable safetensors", truncate("last.safetensors", 1000)),
        (
            "last.safetensors: not readable safetensors .*not fully covered",
            truncate("last.safetensors", (run / "last.safetensors").stat().st_size - 100),
        ),
        ("state.pt: not a readable training state", truncate("state.pt", 1000)),
        ("state.pt: not a readable training state", lambda ck: (ck / "state.pt").write_bytes(b"garbage")),
        (
            "state.pt: not a training state teller wrote .*epoch",
            lambda ck: torch.save({"x": 1}, ck / "state.pt"),
        ),
        ("state.pt: missing, so .* cannot be resumed", lambda ck: (ck / "state.pt").unlink()),
        (r"last.safetensors \(epoch 1\) and state.pt \(epoch 2\) are of different epochs", other_epoch),
    ]
    for i, (msg, damage) in enumerate(damages):
        ck = _copy(run, tmp_path / f"ck{i}")
        damage(ck)
        before = _snapshot(ck)
        with pytest.raises(TellerError, match=msg) as ei:
            train(_cfg(3), shards, ck, resume=True)
        assert "\n" not in str(ei.value)
        assert _snapshot(ck) == before, msg
        load_checkpoint(ck)
        assert not list(ck.glob(".*.tmp"))


def test_resume_refuses_other_data_or_another_model(data, tmp_path) -> None:
    _root, shards, other, run = data
    ck = _copy(run, tmp_path / "ck")
    before = _snapshot(ck)
    with pytest.raises(ConfigError, match=r"ck: the run was trained on the shards .*tok2.* holds other ones"):
        train(_cfg(2), other, ck, resume=True)
    with pytest.raises(
        ConfigError, match=r"another model configuration \(model.d_model: the run has 16, now 32"
    ):
        train(_cfg(2, d_model=32), shards, ck, resume=True)
    with pytest.raises(ConfigError, match=r"trained with --extra-train none, this resume gives .*tok2"):
        train(_cfg(2), shards, ck, resume=True, extra_train=[other])
    assert _snapshot(ck) == before
    # a run saved before state.pt recorded its data: told apart by its config.json's data_dir
    st = torch.load(ck / "state.pt", weights_only=False)
    del st["data"], st["model"]
    torch.save(st, ck / "state.pt")
    with pytest.raises(ConfigError, match="the run was trained on the shards"):
        train(_cfg(2), other, ck, resume=True)
    # the same shards moved elsewhere: the same data, resumed
    moved = tmp_path / "moved" / shards.name
    shutil.copytree(shards, moved)
    train(_cfg(2), moved, ck, resume=True)
    assert len(json.loads((ck / "history.json").read_text())) == 2


def test_an_interrupted_run_leaves_the_files_of_its_last_epoch(data, tmp_path, monkeypatch) -> None:
    root, shards, _other, run = data
    ck = _copy(run, tmp_path / "ck")
    before = _snapshot(ck)

    def stop_in_epoch_2(what: str, done: int, total: int, rec: dict) -> None:
        if what == "train" and done > total // 2:
            raise KeyboardInterrupt

    def stop_at_once(*_a) -> None:
        raise KeyboardInterrupt

    # interrupted before its first save: the resumed run's files are as they were
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(2), shards, ck, resume=True, progress=stop_in_epoch_2)
    assert _snapshot(ck) == before
    # a new run interrupted in its first epoch writes nothing at all; in its second, keeps its first
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(2), shards, tmp_path / "new", progress=stop_at_once)
    assert not (tmp_path / "new").exists()
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(2), shards, tmp_path / "new", progress=stop_in_epoch_2)
    assert torch.load(tmp_path / "new" / "state.pt", weights_only=False)["epoch"] == 1
    load_checkpoint(tmp_path / "new")
    # Ctrl-C while an epoch's files are renamed in: it waits until all of them are
    import teller.models.train as tr

    real, calls = os.replace, []

    def replace(a, b) -> None:
        calls.append(b)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        real(a, b)

    monkeypatch.setattr(tr.os, "replace", replace)
    # (Python's own Ctrl-C handler, whatever this process inherited: a shell's background job starts
    # with SIGINT ignored, and then the deferred Ctrl-C is rightly dropped)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train(_cfg(3), shards, ck, resume=True)
    finally:
        signal.signal(signal.SIGINT, old_int)
    monkeypatch.undo()
    assert len(calls) >= 4  # (config.json, last.safetensors, state.pt, history.json)
    st = torch.load(ck / "state.pt", weights_only=False)
    assert st["epoch"] == 2 == len(json.loads((ck / "history.json").read_text()))
    assert json.loads((ck / "config.json").read_text())["train"]["epochs"] == 3
    load_checkpoint(ck)
    # a failure writing a file: a TellerIOError naming it, the earlier files kept, no temporary left
    before = _snapshot(ck)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tr.torch, "save", full)
    with pytest.raises(TellerIOError, match=r"state.pt: cannot write it \(No space left on device\)"):
        train(_cfg(3), shards, ck, resume=True)
    monkeypatch.undo()
    assert _snapshot(ck) == before and not list(ck.glob(".*.tmp"))

    # (what a real full disk raises: torch.save a RuntimeError from its writer, not an OSError)
    def full_torch(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")

    monkeypatch.setattr(tr.torch, "save", full_torch)
    with pytest.raises(TellerIOError, match=r"state.pt: cannot write it \(RuntimeError: "):
        train(_cfg(3), shards, ck, resume=True)
    monkeypatch.undo()
    assert _snapshot(ck) == before and not list(ck.glob(".*.tmp"))
    train(_cfg(3), shards, ck, resume=True)
    assert len(json.loads((ck / "history.json").read_text())) == 3


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("modle:\n  d_model: 8\n", r"unknown top-level key\(s\) modle \(allowed: base, model, train\)"),
        ("", "the configuration is empty"),
        ("# only a comment\n", "the configuration is empty"),
        (b"\x80\x04\x95binary\xff", r"not UTF-8 text: byte 0x80 at offset 0"),
        ("model: 5\n", "model: must be a mapping of settings, got 5"),
        ("train: fast\n", "train: must be a mapping of settings, got 'fast'"),
        ("- model\n- train\n", "must be a mapping of model and train"),
        ("model:\n  d_model: [1\n  x: 2\n", r"not valid YAML: line 3, column 4: .*expected ',' or ']'"),
        ("model:\n  d_model: big\n", r"model.d_model: 'big' is not an integer"),
        ("train:\n  epochs: 2\n  lrr: 1\n", r"train: unknown key\(s\) lrr"),
    ],
)
def test_a_bad_configuration_file_is_named(tmp_path, text, msg) -> None:
    p = tmp_path / "c.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=msg) as ei:
        load_config(p, "demo")
    assert str(ei.value).startswith(f"{p}: ") and "\n" not in str(ei.value)


def test_a_bad_configuration_mapping_and_options_are_refused_up_front(data, tmp_path) -> None:
    _root, shards, _other, _run = data
    for cfg, msg in (
        ({"modle": {}}, r"unknown top-level key\(s\) modle"),
        ({"model": 5}, "model: must be a mapping"),
        ({"train": "fast"}, "train: must be a mapping"),
    ):
        with pytest.raises(ConfigError, match=msg):
            train(cfg, shards, tmp_path / "a")
    with pytest.raises(ConfigError, match="'tpu' is not auto, cpu or cuda"):
        train(CFG, shards, tmp_path / "a", overrides={"device": "tpu"})
    # `teller train mot` sets model.arch; a configuration's own value must still be one
    with pytest.raises(ConfigError, match="model.arch: 'gpt' is not one of mot, single"):
        train(
            {**CFG, "model": {**CFG.get("model", {}), "arch": "gpt"}},
            shards,
            tmp_path / "a",
            overrides={"arch": "mot"},
        )
    assert not (tmp_path / "a").exists()
    f = tmp_path / "file"
    f.write_text("keep")
    for target in (f, f / "sub"):  # (the file itself, or a path under it)
        with pytest.raises(TellerIOError, match=f"{f}: exists and is not a directory"):
            train(CFG, shards, target)
    assert f.read_text() == "keep"
    with pytest.raises(TellerFileNotFoundError, match="no such configuration file"):
        load_config(tmp_path / "missing.yaml", "demo")
    assert load_config("demo", "mot")["model"]["d_model"] == 32  # (a shipped name still works)
    # (from a review) a path is a path: a directory, or a name with a directory part, is not taken
    # for a shipped configuration's name
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(TellerIOError, match="emptydir: a directory, not a configuration file"):
        load_config(tmp_path / "emptydir", "demo")
    with pytest.raises(TellerFileNotFoundError, match="nope: no such configuration file"):
        load_config(str(tmp_path / "nope"), "demo")


def test_a_checkpoint_config_of_the_wrong_shape_names_config_json(data, tmp_path) -> None:
    _root, _shards, _other, run = data
    cfg = json.loads((run / "config.json").read_text())
    for bad, msg in (
        ({"label_names": 5}, "label_names: 5 is not a list of strings"),
        ({"label_names": cfg["label_names"][:2]}, "label_names has 2 names, model.n_classes is"),
        ({"model": {**cfg["model"], "d_model": "big"}}, "model.d_model: 'big' is not an integer"),
        ({"model": {**cfg["model"], "n_heads": 5}}, r"must be a multiple of n_heads \(5\)"),
        ({"format": "teller-baselines"}, "not an RCA model checkpoint .*'teller-baselines'"),
        ({"version": 2}, "checkpoint version 2, this teller reads version 1"),
        ({"version": "1"}, "version: '1' is not a checkpoint version"),
        ({"tpe_dir": 5}, "tpe_dir: 5 is not a string or null"),
        ({"shards_version": "11"}, "shards_version: '11' is not an integer or null"),
        # two orders of the causes (a hand-edited file): every cause would be named by another's logit
        ({"label_names": cfg["label_names"][::-1]}, "label_names and model.label_names differ"),
    ):
        ck = tmp_path / f"ck-{len(list(tmp_path.iterdir()))}"
        _copy(run, ck)
        (ck / "config.json").write_text(json.dumps({**cfg, **bad}))
        with pytest.raises(ConfigError, match=msg) as ei:
            load_checkpoint(ck)
        assert str(ei.value).startswith(f"{ck / 'config.json'}: "), str(ei.value)
    with pytest.raises(
        ConfigError, match=r"config.json: a JSON file, not a checkpoint: give the run directory"
    ):
        load_checkpoint(run / "config.json")
    (tmp_path / "lone.json").write_text("{}")  # (no run beside it: none is suggested)
    with pytest.raises(
        ConfigError, match=r"lone.json: a JSON file, not a checkpoint: give a run directory of"
    ):
        load_checkpoint(tmp_path / "lone.json")


def test_cli_train_errors_are_one_line(data, tmp_path) -> None:
    root, shards, _other, run = data
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "teller", "train", "mot", "--data-dir", str(shards)]
    typo = tmp_path / "typo.yaml"
    typo.write_text("modle:\n  d_model: 8\n")
    ck = _copy(run, tmp_path / "ck")
    (ck / "state.pt").write_bytes((ck / "state.pt").read_bytes()[:500])
    for args, msg in (
        (
            ["--config", str(typo), "--output-dir", str(tmp_path / "o")],
            "typo.yaml: unknown top-level key(s) modle",
        ),
        (["--output-dir", str(run), "--config", "demo"], "already holds a trained run"),
        (
            ["--output-dir", str(ck), "--config", "demo", "--resume"],
            "state.pt: not a readable training state",
        ),
        # (from a review) a value given as an option is named as that option, not its config key
        (["--epochs", "0", "--output-dir", str(tmp_path / "o")], "error: --epochs must be >= 1, got 0"),
        (["--device", "tpu", "--output-dir", str(tmp_path / "o")], "error: --device: 'tpu' is not"),
        (["--modalities", "x", "--output-dir", str(tmp_path / "o")], "error: --modalities: 'x' is not"),
    ):
        r = subprocess.run([*cli, *args], env=env, capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not (tmp_path / "o").exists()


def test_a_run_stopped_by_max_minutes_says_so(data, tmp_path) -> None:
    """train.max_minutes ends a run before its last epoch with a warning naming both, not silently
    (a run beside another CPU-heavy process can take several times as long)."""
    from teller.errors import TellerWarning

    _root, shards, _other, _run = data
    cfg = {"model": CFG["model"], "train": {**CFG["train"], "epochs": 3, "max_minutes": 0}}
    with pytest.warns(TellerWarning, match=r"stopped after epoch 1 of 3: train.max_minutes \(0\) reached"):
        out = train(cfg, shards, tmp_path / "capped")
    assert torch.load(out / "state.pt", weights_only=False)["epoch"] == 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TellerWarning)  # (the last epoch: nothing was cut)
        train({**cfg, "train": {**cfg["train"], "epochs": 1}}, shards, tmp_path / "whole")


_KILL_MID_COMMIT = """
import json, os, sys
import torch
torch.set_num_threads(1)
import teller.models.train as tr
real = os.replace
def replace(a, b):
    real(a, b)
    if os.path.basename(str(b)) == "last.safetensors":
        os._exit(9)  # (SIGKILL's effect: no finally, no handler, in the middle of the renames)
tr.os.replace = replace
cfg, shards, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
tr.train(cfg, shards, out, resume=True)
"""


def test_a_run_killed_between_the_renames_of_a_save_is_finished(data, tmp_path) -> None:
    """SIGKILL cannot be deferred: a process killed after renaming some of an epoch's files leaves
    the journal of the renames (.commit.json), and the next `teller train` into the directory
    finishes them, so the run holds one epoch's files (it used to refuse to resume: two epochs)."""
    import warnings

    from safetensors import safe_open
    from teller.models.train import COMMIT_JOURNAL, recover_commit

    root, shards, _other, run = data
    ck = _copy(run, tmp_path / "ck")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _KILL_MID_COMMIT, json.dumps(_cfg(2)), str(shards), str(ck)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 9, r.stderr

    def last_epoch() -> str:
        with safe_open(str(ck / "last.safetensors"), framework="pt") as fh:
            return fh.metadata()["epoch"]

    # killed half way: epoch 2's weights, epoch 1's state, the journal and the rest still to rename
    assert last_epoch() == "2" and torch.load(ck / "state.pt", weights_only=False)["epoch"] == 1
    assert (ck / COMMIT_JOURNAL).is_file() and (ck / ".state.pt.tmp").is_file()
    # a reader (evaluate, diagnose) says so and changes nothing: a trainer may be renaming right now
    from teller.errors import TellerWarning

    with pytest.warns(TellerWarning, match=r"ck: a save of this run is in progress or was cut short"):
        load_checkpoint(ck)
    assert (ck / COMMIT_JOURNAL).is_file() and (ck / ".state.pt.tmp").is_file()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        train(_cfg(2), shards, ck, resume=True)  # (epoch 2 is done: nothing left to train)
    assert any("finished the save of an epoch" in str(x.message) for x in w)
    st = torch.load(ck / "state.pt", weights_only=False)
    assert last_epoch() == "2" and st["epoch"] == 2 == len(json.loads((ck / "history.json").read_text()))
    assert not (ck / COMMIT_JOURNAL).exists() and not list(ck.glob(".*.tmp"))
    load_checkpoint(ck)
    assert recover_commit(ck) == []  # (nothing left: a no-op)
    # a journal that is not one is named, and nothing is renamed (a real temporary file beside it)
    (ck / ".state.pt.tmp").write_bytes(b"not a state")
    for bad in (
        "{",
        '{"renames": 3}',
        '{"renames": [["state.pt", ".state.pt.tmp"], ["history.json", "../x"]]}',
        '{"renames": [["state.pt", ".state.pt.tmp"], ["config.json", "model.safetensors"]]}',
    ):
        (ck / COMMIT_JOURNAL).write_text(bad)
        before = {**_snapshot(ck), "tmp": (ck / ".state.pt.tmp").read_bytes()}
        with pytest.raises(ConfigError, match=r"\.commit\.json: not a commit journal teller wrote"):
            train(_cfg(3), shards, ck, resume=True)
        assert {**_snapshot(ck), "tmp": (ck / ".state.pt.tmp").read_bytes()} == before
        assert (ck / COMMIT_JOURNAL).read_text() == bad
    # a baselines or ensemble --output-dir with a save in progress (or left half done) is refused,
    # untouched: another process may be writing it
    from teller.models.train import check_new_run_dir

    d = tmp_path / "half"
    d.mkdir()
    (d / COMMIT_JOURNAL).write_text('{"renames": [["config.json", ".config.json.tmp"]]}')
    (d / ".config.json.tmp").write_text("{}")
    with pytest.raises(ConfigError, match=r"half: already holds a run \(\.commit\.json\)"):
        check_new_run_dir(d)
    assert (d / ".config.json.tmp").is_file() and not (d / "config.json").exists()


def test_sigterm_waits_for_the_commit_too():
    """A scheduler's SIGTERM (or `timeout`) during the renames of one checkpoint is held until they
    are done, then delivered to the handler that was there."""
    import os
    import signal

    from teller.models.train import _interrupts_deferred

    got: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda *a: got.append(a[0]))
    try:
        with _interrupts_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == []  # (held)
        assert got == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not None and got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_config_file_can_start_from_a_shipped_one(tmp_path, monkeypatch) -> None:
    """`base: demo` (or a file) is read first and the file's settings replace its one by one; a
    chain that comes back to itself, or a base that does not exist, is refused naming the file."""
    from teller.models.train import load_config

    (tmp_path / "a.yaml").write_text("base: demo\ntrain:\n  epochs: 1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nmodel:\n  d_model: 32\n")
    demo = load_config("demo", "mot")
    a = load_config(tmp_path / "a.yaml", "mot")
    assert a["model"] == demo["model"] and a["train"] == {**demo["train"], "epochs": 1}
    b = load_config(tmp_path / "b.yaml", "mot")
    assert b["model"] == {**demo["model"], "d_model": 32} and b["train"]["epochs"] == 1 and "base" not in b
    # a shipped configuration on a shipped base: the demo's single-stream one is the demo's without
    # the summary-row culprit head (make demo)
    single = load_config("demo_single", "single")
    assert demo["model"]["summary_loc"] is True
    assert single["model"] == {**demo["model"], "summary_loc": False} and single["train"] == demo["train"]
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "mine.yaml").write_text("base: demo\ntrain:\n  epochs: 2\n")
    (tmp_path / "f.yaml").write_text("base: ~/mine.yaml\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_config(tmp_path / "f.yaml", "mot")["train"]["epochs"] == 2
    (tmp_path / "c.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ConfigError, match="c.yaml leads back to itself"):
        load_config(tmp_path / "c.yaml", "mot")
    (tmp_path / "d.yaml").write_text("base: nosuch\n")
    with pytest.raises(ConfigError, match=r"d.yaml: base: no shipped configuration 'nosuch'"):
        load_config(tmp_path / "d.yaml", "mot")
    (tmp_path / "e.yaml").write_text("base: [demo]\n")
    with pytest.raises(ConfigError, match="base: must be a shipped configuration's name"):
        load_config(tmp_path / "e.yaml", "mot")


def test_a_train_split_without_samples_is_refused(data, tmp_path, monkeypatch) -> None:
    """(from a review) No training samples: the summary-row configs failed in np.concatenate (a bare
    ValueError), the others saved random weights as a trained run."""
    import teller.models.train as M
    from teller.errors import DatasetError

    _root, shards, _other, _run = data
    real = M.load_model_split
    monkeypatch.setattr(M, "load_model_split", lambda d, s, mc: ([], []) if s == "train" else real(d, s, mc))
    for model in ({}, {"summary_tokens": False}):
        out = tmp_path / f"empty{len(model)}"
        with pytest.raises(DatasetError, match=r"its train split holds no samples") as ei:
            train(_cfg(1, **model), shards, out)
        assert ei.value.path == str(shards)
        assert not (out / "model.safetensors").exists()


def test_a_resume_with_the_extra_data_in_another_order_is_refused(data, tmp_path) -> None:
    """(from a review) The extra sets were compared sorted, but their samples are concatenated in the
    order given and each epoch's shuffle picks by position: another order trained other batches."""
    root, shards, other, _run = data
    generate(root / "ds3", num_samples=20, seed=5, preset="tiny", train_only=True)
    third = tokenize_dataset(
        root / "ds3",
        root / "tpe",
        root / "tok3",
        shard_size=16,
        workers=1,
        log_tokenizer=shards / "log_tokenizer.json",
    )
    run = train(_cfg(1), shards, tmp_path / "ab", extra_train=[other, third])
    before = _snapshot(run)
    with pytest.raises(
        ConfigError, match=r"trained with --extra-train .*tok2.*tok3.*, this resume gives .*tok3.*tok2"
    ):
        train(_cfg(2), shards, run, resume=True, extra_train=[third, other])
    assert _snapshot(run) == before
    train(_cfg(2), shards, run, resume=True, extra_train=[other, third])  # (the same order: resumed)
    assert len(json.loads((run / "history.json").read_text())) == 2


class _Planted:
    """A pickled object whose loading would run code (a run directory from someone else)."""

    def __reduce__(self):
        return (os.system, (f"touch {os.environ['TELLER_TEST_MARKER']}",))


def test_a_state_that_would_run_code_when_loaded_is_refused(data, tmp_path, monkeypatch) -> None:
    """(from a review) state.pt was unpickled with weights_only=False: --resume of someone else's run
    directory ran what it held. It holds tensors, numbers, strings and containers only."""
    _root, shards, _other, run = data
    ck = _copy(run, tmp_path / "ck")
    marker = tmp_path / "ran"
    monkeypatch.setenv("TELLER_TEST_MARKER", str(marker))
    st = torch.load(ck / "state.pt", weights_only=True)
    torch.save({**st, "history": [_Planted()]}, ck / "state.pt")
    with pytest.raises(ConfigError, match=r"state.pt: not a readable training state"):
        train(_cfg(2), shards, ck, resume=True)
    assert not marker.exists()


def test_a_damaged_checkpoint_names_its_file_in_path(data, tmp_path) -> None:
    _root, _shards, _other, run = data
    ck = _copy(run, tmp_path / "ck")
    (ck / "config.json").write_text("{")
    with pytest.raises(ConfigError, match="not a readable checkpoint configuration") as ei:
        load_checkpoint(ck)
    assert ei.value.path == str(ck / "config.json")
    ck = _copy(run, tmp_path / "ck2")
    (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ConfigError, match="not readable safetensors") as ei:
        load_checkpoint(ck)
    assert ei.value.path == str(ck / "model.safetensors")


def test_a_loss_that_turns_nan_stops_the_run(data, tmp_path, monkeypatch) -> None:
    """A diverged run stopped with a TrainingDivergedError (a FloatingPointError), not trained on into
    NaN weights saved as a trained run; what an earlier epoch saved is kept."""
    import teller.models.train as M
    from teller.errors import TrainingDivergedError

    _root, shards, _other, run = data
    ck = _copy(run, tmp_path / "ck")
    before = _snapshot(ck)
    real = M.loss_fn
    monkeypatch.setattr(M, "loss_fn", lambda *a, **k: (lambda lo, p: (lo * float("nan"), p))(*real(*a, **k)))
    with pytest.raises(TrainingDivergedError, match=r"the training loss is nan at epoch 2, step 1") as ei:
        train(_cfg(2), shards, ck, resume=True)
    assert isinstance(ei.value, FloatingPointError) and ei.value.path == str(ck)
    assert _snapshot(ck) == before


def test_the_training_state_weights_are_not_taken_for_the_trained_ones(data, tmp_path) -> None:
    """(from a review) `teller evaluate --checkpoint RUN/last.safetensors` scored the last epoch with
    the temperature fitted for model.safetensors and filed the result under model.safetensors'
    fingerprint, over the run's own evaluation file."""
    _root, _shards, _other, run = data
    with pytest.raises(
        ConfigError, match=r"last.safetensors: not a run's trained weights .*give the run directory"
    ):
        load_checkpoint(run / "last.safetensors")
    load_checkpoint(run / "model.safetensors")
