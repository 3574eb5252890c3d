"""Bad datasets, damaged shards and bad tokenize arguments: a TellerError naming the file and what is
wrong (one line from the CLI, no traceback), and nothing already written is lost or reused for
other data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from teller import tpe
from teller.data import generate, load_config, validate
from teller.data.tokenize import ShardedSplit, load_shard, split_names, tokenize_dataset
from teller.errors import (
    ConfigError,
    DatasetError,
    TellerError,
    TellerFileNotFoundError,
    TellerIOError,
    TellerWarning,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny dataset (val and test moved out of train by hand: the generator puts all 13 samples
    in train), its TPE tokenizer, and its shards (run id ``r``, 4 samples a shard)."""
    root = tmp_path_factory.mktemp("bad")
    data = root / "ds"
    generate(data, num_samples=13, seed=5, preset="tiny")
    man = json.loads((data / "manifest.json").read_text())
    ids = man["splits"]["train"]
    man["splits"] = {"train": ids[:9], "val": ids[9:11], "test": ids[11:], "test_ood": []}
    # (moved everywhere the dataset says a split: the samples, their annotations, the counts)
    counts: dict = {k: {} for k in man["splits"]}
    for split, sids in man["splits"].items():
        for sid in sids:
            man["samples"][sid]["split"] = split
            _edit_json(data / sid / "annotation.json", lambda a, s=split: {**a, "split": s})
            label = man["samples"][sid]["label"]
            counts.setdefault(split, {})[label] = counts.get(split, {}).get(label, 0) + 1
    man["counts"] = counts
    (data / "manifest.json").write_text(json.dumps(man, indent=1))
    assert validate(data) == []
    tdir = root / "tpe"
    tpe.train(data, vocab_size=300).save(tdir)
    run = tokenize_dataset(data, tdir, root / "out", run_id="r", shard_size=4, log_vocab_size=300)
    return data, tdir, run


def _files(d: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, fn) -> None:
    d = json.loads(path.read_text())
    d = fn(d) or d
    path.write_text(json.dumps(d))


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="300")
    return subprocess.run(
        [sys.executable, "-m", "teller", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _stamp_of(data: Path, tdir: Path) -> dict:
    import hashlib

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    return {
        "dataset": {"manifest_sha256": sha(data / "manifest.json")},
        "tokenizer": {"sha256": sha(tdir / "tokenizer.json")},
    }


# -- 1. a reused run id -------------------------------------------------------------------------


def test_a_reused_run_id_of_another_dataset_or_settings_is_refused_and_untouched(setup, tmp_path):
    data, tdir, run = setup
    out = _copy(run.parent, tmp_path / "out") / run.name
    before = _files(out)
    other = _copy(data, tmp_path / "ds2")
    _edit_json(other / "manifest.json", lambda m: m["splits"]["train"].reverse())
    with pytest.raises(ConfigError, match=r"run id 'r' already holds the shards of another dataset") as e:
        tokenize_dataset(other, tdir, out.parent, run_id="r", shard_size=4, log_vocab_size=300)
    assert str(out) in str(e.value) and "--run-id" in str(e.value)
    with pytest.raises(ConfigError, match=r"shard_size 4 \(this call: 3\)"):
        tokenize_dataset(data, tdir, out.parent, run_id="r", shard_size=3, log_vocab_size=300)
    assert _files(out) == before  # nothing rewritten, nothing reused
    # an interrupted run (no manifest.json yet) is recognized by its stamp
    (out / "manifest.json").unlink()
    (out / ".tokenize.json").write_text(json.dumps({**_stamp_of(data, tdir), "settings": {"x": 1}}))
    with pytest.raises(ConfigError, match="already holds"):
        tokenize_dataset(data, tdir, out.parent, run_id="r", shard_size=4, log_vocab_size=300)
    (out / ".tokenize.json").write_text("{trunc")
    with pytest.raises(DatasetError, match=r"\.tokenize\.json: not a readable record"):
        tokenize_dataset(data, tdir, out.parent, run_id="r", shard_size=4, log_vocab_size=300)
    # the same call resumes (its shards reused), and the stamp goes once manifest.json is written
    (out / ".tokenize.json").unlink()
    assert tokenize_dataset(data, tdir, out.parent, run_id="r", shard_size=4, log_vocab_size=300) == out
    assert (out / "manifest.json").read_bytes() == before["manifest.json"][0]
    assert not (out / ".tokenize.json").exists()
    shard = next(k for k in before if k.endswith("labels.npy"))
    assert (out / shard).stat().st_mtime_ns == before[shard][1]


def test_changed_sample_bytes_are_never_served_old_encodings(setup, tmp_path, monkeypatch):
    """The default run id is the dataset manifest's, tokenizer's and settings' (not the sample
    files'); the run's record holds the sample files' fingerprint (path, size, mtime of each) and
    content digest (path and bytes). The same bytes with new mtimes (a copy, a regeneration) reuse the
    run; other bytes under the same manifest are encoded into a run of their own under the default id
    (also `teller evaluate --split DATASET_DIR`'s cache) and refused by an explicit run id holding
    the old ones, whose shards are left as they are. A call whose fingerprint matches hashes nothing."""
    from teller.data import tokenize as tk
    from teller.models.report import _tokenize_for

    def shards_of(r: Path) -> dict:  # (manifest.json takes a new fingerprint on reuse)
        return {k: v for k, v in _files(r).items() if k != "manifest.json"}

    def recopy(src: Path, dst: Path) -> Path:  # (new mtimes, as `cp -r`)
        shutil.copytree(src, dst, copy_function=shutil.copyfile)
        return dst

    def no_hashing(*a, **k):
        raise AssertionError("hashed the sample files though their fingerprint matched")

    kw = {"shard_size": 4, "log_vocab_size": 300}
    data, tdir, run = setup
    d = _copy(data, tmp_path / "ds")
    o = tmp_path / "o"
    a = tokenize_dataset(d, tdir, o, **kw)
    before = shards_of(a)
    with monkeypatch.context() as m:
        m.setattr(tk, "shard_samples_digest", no_hashing)
        assert tokenize_dataset(d, tdir, o, **kw) == a and shards_of(a) == before
    # the same bytes, new mtimes: the same run, reused; its record takes the new fingerprint
    c = recopy(d, tmp_path / "copy")
    assert tokenize_dataset(c, tdir, o, **kw) == a and shards_of(a) == before
    rec = json.loads((a / "manifest.json").read_text())["dataset"]
    assert rec["path"] == str(c.resolve()) and rec["samples_fingerprint"] == tk.samples_fingerprint(
        c, json.loads((c / "manifest.json").read_text())
    )
    with monkeypatch.context() as m:
        m.setattr(tk, "shard_samples_digest", no_hashing)
        assert tokenize_dataset(c, tdir, o, **kw) == a
    # other bytes (same size, same manifest): a run of their own; the other left as it is
    sid = json.loads((d / "manifest.json").read_text())["splits"]["test"][0]
    log = d / sid / "log.txt"
    orig = log.read_bytes()
    log.write_bytes(orig.replace(b"INFO", b"WARN", 1))
    man_a = (a / "manifest.json").read_bytes()
    b = tokenize_dataset(d, tdir, o, **kw)
    assert b != a and shards_of(a) == before and (a / "manifest.json").read_bytes() == man_a
    rb = json.loads((b / "manifest.json").read_text())
    assert rb["dataset"]["samples_sha256"] != rec["samples_sha256"]
    key = [rb["dataset"]["manifest_sha256"], rb["tokenizer"]["sha256"], rb["settings"], tk.SHARDS_VERSION]
    assert b.name == tk._key_id([*key, rb["dataset"]["samples_sha256"]]) and a.name == tk._key_id(key)
    shard = next(sh["name"] for sh in rb["splits"]["test"]["shards"])
    assert not np.array_equal(load_shard(a, shard)["log_ids"], load_shard(b, shard)["log_ids"])
    after_b = shards_of(b)
    with monkeypatch.context() as m:  # (resumed there, found by its fingerprint: nothing hashed)
        m.setattr(tk, "shard_samples_digest", no_hashing)
        assert tokenize_dataset(d, tdir, o, **kw) == b and shards_of(b) == after_b
    # the old bytes back (another mtime): the first run again
    log.write_bytes(orig)
    assert tokenize_dataset(d, tdir, o, **kw) == a and shards_of(a) == before
    assert sorted(p.name for p in o.iterdir()) == sorted([a.name, b.name])
    (d / sid / "trace.json").write_bytes(b"")
    with pytest.raises(TellerError, match=f"{d / sid / 'trace.json'}: empty file"):
        tokenize_dataset(d, tdir, o, **kw)
    # an explicit run id that holds the samples as they were: other bytes refused, a copy reused
    out = _copy(run.parent, tmp_path / "out") / run.name
    kept = _files(out)
    x = recopy(data, tmp_path / "x")
    (x / sid / "log.txt").write_bytes(orig.replace(b"INFO", b"WARN", 1))
    with pytest.raises(
        ConfigError,
        match=r"run id 'r' already holds the shards of another dataset .*other sample files: their "
        r"contents differ",
    ):
        tokenize_dataset(x, tdir, out.parent, run_id="r", **kw)
    assert _files(out) == kept
    y = recopy(data, tmp_path / "y")
    assert tokenize_dataset(y, tdir, out.parent, run_id="r", **kw) == out
    assert shards_of(out) == {k: v for k, v in kept.items() if k != "manifest.json"}
    # a checkpoint's evaluation cache of a dataset directory: reused for the same bytes (a copy),
    # encoded again for other bytes, the cached encodings untouched
    cfg = {
        "tpe_dir": str(tdir),
        "log_tokenizer": str(run / "log_tokenizer.json"),
        "reference": str(run / "reference.json"),
        "shards_version": tk.SHARDS_VERSION,
    }
    ck = tmp_path / "ck"
    e = _tokenize_for(ck, cfg, data, 1)
    cached = shards_of(e)
    assert _tokenize_for(ck, cfg, y, 1) == e and shards_of(e) == cached
    f = _tokenize_for(ck, cfg, x, 1)
    assert f != e and shards_of(e) == cached
    assert not np.array_equal(load_shard(e, shard)["log_ids"], load_shard(f, shard)["log_ids"])


def test_a_record_from_before_the_content_digest(setup, tmp_path, monkeypatch):
    """A run recorded before the sample files were (no fingerprint) vouches for no bytes. Under the
    default run id it is never served: the data goes to a run of its own (content-addressed), the old
    run left as it is (its done.json files included). An explicit run id holding one is reused as
    named, its shards' records left without a digest (none is written for bytes it may not have
    encoded). One recorded with a fingerprint but no digest, asked for by files with other mtimes:
    their bytes cannot be checked against it, so an explicit run id refuses."""
    from teller.data import tokenize as tk

    kw = {"shard_size": 4, "log_vocab_size": 300}
    data, tdir, run = setup

    def shards_of(r: Path) -> dict:  # (manifest.json is written again on reuse)
        return {k: v for k, v in _files(r).items() if k != "manifest.json"}

    def strip(out: Path, keys: tuple[str, ...]) -> None:
        _edit_json(out / "manifest.json", lambda m: [m["dataset"].pop(k) for k in keys] and None)
        for p in (out / "shards").glob("*/done.json"):
            _edit_json(p, lambda d: d.pop("samples_sha256") and None)

    # the default run id: an old run, a sample's log.txt changed since
    d = _copy(data, tmp_path / "ds")
    o = tmp_path / "o"
    a = tokenize_dataset(d, tdir, o, **kw)
    strip(a, ("samples_fingerprint", "samples_sha256"))
    old = _files(a)
    sid = json.loads((d / "manifest.json").read_text())["splits"]["test"][0]
    log = d / sid / "log.txt"
    log.write_bytes(log.read_bytes().replace(b"INFO", b"WARN", 1))
    b = tokenize_dataset(d, tdir, o, **kw)
    assert b != a and _files(a) == old
    rb = json.loads((b / "manifest.json").read_text())
    key = [rb["dataset"]["manifest_sha256"], rb["tokenizer"]["sha256"], rb["settings"], tk.SHARDS_VERSION]
    assert b.name == tk._key_id([*key, rb["dataset"]["samples_sha256"]]) and a.name == tk._key_id(key)
    shard = next(sh["name"] for sh in rb["splits"]["test"]["shards"])
    assert not np.array_equal(load_shard(a, shard)["log_ids"], load_shard(b, shard)["log_ids"])
    after_b = shards_of(b)

    def no_hashing(*a, **k):
        raise AssertionError("hashed the sample files though a run records their fingerprint")

    with monkeypatch.context() as m:  # (found again by its fingerprint)
        m.setattr(tk, "shard_samples_digest", no_hashing)
        assert tokenize_dataset(d, tdir, o, **kw) == b and shards_of(b) == after_b and _files(a) == old
    # an explicit run id: reused as named, nothing of its record completed
    out = _copy(run.parent, tmp_path / "out") / run.name
    strip(out, ("samples_fingerprint", "samples_sha256"))
    kept = {k: v for k, v in _files(out).items() if k != "manifest.json"}
    x = tmp_path / "x"
    shutil.copytree(data, x, copy_function=shutil.copyfile)
    for _ in range(2):
        assert tokenize_dataset(x, tdir, out.parent, run_id="r", **kw) == out
        assert {k: v for k, v in _files(out).items() if k != "manifest.json"} == kept
        got = json.loads((out / "manifest.json").read_text())
        assert got["dataset"]["samples_sha256"] is None and got["dataset"]["samples_fingerprint"] is None
        assert all("samples_sha256" not in sh for sp in got["splits"].values() for sh in sp["shards"])
    # a fingerprint but no digest
    out2 = _copy(run.parent, tmp_path / "out2") / run.name
    _edit_json(out2 / "manifest.json", lambda m: m["dataset"].pop("samples_sha256") and None)
    y = tmp_path / "y"
    shutil.copytree(data, y, copy_function=shutil.copyfile)
    with pytest.raises(ConfigError, match="no digest of their contents to check them by"):
        tokenize_dataset(y, tdir, out2.parent, run_id="r", **kw)


# -- 2. a bad dataset, before anything is encoded -------------------------------------------------


@pytest.mark.parametrize(
    ("content", "err", "msg"),
    [
        (lambda t: t[:100], DatasetError, "not valid JSON"),
        (lambda t: "", DatasetError, "empty file"),
        (lambda t: "[1]", DatasetError, r"\$: not a dataset manifest \(a JSON object\)"),
        (
            lambda t: json.dumps({**json.loads(t), "splits": "train"}),
            DatasetError,
            r"\$\.splits: must map split names",
        ),
        (lambda t: json.dumps({**json.loads(t), "labels": 3}), DatasetError, r"\$\.labels"),
        (lambda t: b"\xff\xfe\x00binary", DatasetError, "not UTF-8 text"),
    ],
)
def test_tokenize_names_a_bad_manifest(setup, tmp_path, content, err, msg):
    data, tdir, _ = setup
    d = _copy(data, tmp_path / "ds")
    c = content((d / "manifest.json").read_text())
    if isinstance(c, bytes):
        (d / "manifest.json").write_bytes(c)
    else:
        (d / "manifest.json").write_text(c)
    with pytest.raises(err, match=msg) as e:
        tokenize_dataset(d, tdir, tmp_path / "o")
    assert str(d / "manifest.json") in str(e.value)
    assert not (tmp_path / "o").exists()


def _drop_log(d: Path, sid: str) -> None:
    (d / sid / "log.txt").unlink()


def _log_dir(d: Path, sid: str) -> None:
    (d / sid / "log.txt").unlink()
    (d / sid / "log.txt").mkdir()


def _drop_sample(d: Path, sid: str) -> None:
    shutil.rmtree(d / sid)


def _unknown_id(d: Path, sid: str) -> None:
    _edit_json(d / "manifest.json", lambda m: m["splits"]["test"].append("s999999"))


def _ann(**kv):
    def edit(d: Path, sid: str) -> None:
        _edit_json(d / sid / "annotation.json", lambda a: {**a, **kv})

    return edit


def _ann_list(d: Path, sid: str) -> None:
    (d / sid / "annotation.json").write_text("[]")


def _ann_binary(d: Path, sid: str) -> None:
    (d / sid / "annotation.json").write_bytes(b"\x00\xff" * 40)


@pytest.mark.parametrize(
    ("breakage", "err", "where", "msg"),
    [
        (_drop_log, TellerFileNotFoundError, "{sid}/log.txt", "missing"),
        (_log_dir, TellerIOError, "{sid}/log.txt", "a directory, not a file"),
        (_drop_sample, TellerFileNotFoundError, "{sid}", "no such sample directory"),
        (_unknown_id, TellerFileNotFoundError, "s999999", "no such sample directory"),
        (_ann(label=7), DatasetError, "{sid}/annotation.json", r"\$\.label: 7 is not one of"),
        (_ann(label="alien_fault"), DatasetError, "{sid}/annotation.json", "'alien_fault' is not one of"),
        (_ann(faults="gpu_throttle"), DatasetError, "{sid}/annotation.json", r"\$\.faults: must be a list"),
        (_ann(faults=[{"type": "x"}]), DatasetError, "{sid}/annotation.json", r"\$\.faults\[0\]\.start_ns"),
        (_ann(trace=None), DatasetError, "{sid}/annotation.json", r"\$\.trace\.start_ns"),
        (_ann_list, DatasetError, "{sid}/annotation.json", "not a sample annotation"),
        (_ann_binary, DatasetError, "{sid}/annotation.json", "not UTF-8 text"),
    ],
)
def test_tokenize_names_a_bad_sample(setup, tmp_path, breakage, err, where, msg):
    data, tdir, _ = setup
    d = _copy(data, tmp_path / "ds")
    sid = json.loads((d / "manifest.json").read_text())["splits"]["test"][0]
    breakage(d, sid)
    with pytest.raises(err, match=msg) as e:
        tokenize_dataset(d, tdir, tmp_path / "o")
    assert str(d / where.format(sid=sid)) in str(e.value)
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_cli_errors_are_one_line_also_from_worker_processes(setup, tmp_path):
    data, tdir, _ = setup
    d = _copy(data, tmp_path / "ds")
    man = json.loads((d / "manifest.json").read_text())
    # a trace.json that only the encoding reads (a test sample: the reference is fitted on train)
    bad = d / man["splits"]["test"][0] / "trace.json"
    bad.write_bytes(b"\xff\xfe" + b"\x00" * 62)
    args = [
        "tokenize",
        "--data-dir",
        str(d),
        "--tokenizer-dir",
        str(tdir),
        "--output-dir",
        str(tmp_path / "o"),
    ]
    r = _cli(*args, "--workers", "2", "--shard-size", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {bad}"), r.stderr
    _edit_json(d / man["splits"]["train"][0] / "annotation.json", lambda a: {**a, "label": "alien_fault"})
    r = _cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    ann = d / man["splits"]["train"][0] / "annotation.json"
    assert len(lines) == 1 and lines[0].startswith(f"error: {ann}: $.label: 'alien_fault' is not one of"), (
        lines
    )


# -- 6. bad tokenize arguments and binary logs ----------------------------------------------------


def test_tokenize_refuses_bad_arguments_before_writing(setup, tmp_path):
    data, tdir, _ = setup
    out = tmp_path / "o"
    for rid in ("../../escape", "..", "/abs", "a/b", ".hidden", ""):
        with pytest.raises(ConfigError, match="--run-id .*not a plain name"):
            tokenize_dataset(data, tdir, out, run_id=rid)
    for size in (-1, 0, 10):
        with pytest.raises(ConfigError, match="--log-vocab-size must be at least 11"):
            tokenize_dataset(data, tdir, out, log_vocab_size=size)
    assert not out.exists() and not (tmp_path.parent / "escape").exists()
    f = tmp_path / "file"
    f.write_text("keep")
    with pytest.raises(TellerIOError, match=f"{f}: exists and is not a directory"):
        tokenize_dataset(data, tdir, f)
    assert f.read_text() == "keep"
    r = _cli("tokenize", "--data-dir", str(data), "--tokenizer-dir", str(tdir), "--output-dir", str(f))
    lines = r.stderr.strip().splitlines()
    assert (
        r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {f}: exists and is not a")
    ), lines


def test_a_binary_log_is_warned_about(setup, tmp_path):
    data, tdir, _ = setup
    d = _copy(data, tmp_path / "ds")
    sid = json.loads((d / "manifest.json").read_text())["splits"]["val"][0]
    text = (d / sid / "log.txt").read_bytes()
    (d / sid / "log.txt").write_bytes(bytes(range(256)) * 20)
    with pytest.warns(TellerWarning, match=rf"{d / sid / 'log.txt'}: not text"):
        tokenize_dataset(d, tdir, tmp_path / "o", shard_size=4, log_vocab_size=300)
    probs = [str(p) for p in validate(d)]
    assert probs == [f"{sid}/log.txt: not text: it holds NUL bytes (a binary file?)"]
    # text with a stray undecodable byte is still text
    (d / sid / "log.txt").write_bytes(text + b"INFO caf\xe9 ready\n")
    assert validate(d) == []


def test_log_text_problem_counts_what_is_not_text(tmp_path):
    from teller.data.dataset import log_text_problem

    f = tmp_path / "log.txt"
    # control characters other than \t \n \v \f \r and ESC, and replaced bytes: 6 of 100 is too many
    f.write_bytes(b"a" * 94 + b"\x01\x02\x1c\x1f" + b"\xff\xfe")
    assert (
        log_text_problem(f) == "not text: 6 of its first 100 characters are not UTF-8 text (a binary file?)"
    )
    f.write_bytes(b"a" * 95 + b"\t\n\x0b\x0c\x1b" + b"\x01" * 5)  # (5 of 105: still text)
    assert log_text_problem(f) is None


# -- 3. damaged shards ---------------------------------------------------------------------------


def _shard(run: Path) -> Path:
    return run / "shards" / "test-00000"


def _save(path: Path, fn) -> None:
    a = np.load(path)
    np.save(path, fn(a))


def _set(a: np.ndarray, i: int, v: int) -> np.ndarray:
    a = a.copy()
    a[i] = v
    return a


@pytest.mark.parametrize(
    ("breakage", "err", "file", "msg"),
    [
        (lambda s: (s / "labels.npy").unlink(), TellerFileNotFoundError, "labels.npy", "missing"),
        (
            lambda s: ((s / "labels.npy").unlink(), (s / "labels.npy").mkdir()),
            TellerIOError,
            "labels.npy",
            "a directory",
        ),
        (lambda s: (s / "labels.npy").write_bytes(b""), DatasetError, "labels.npy", r"\(empty\)"),
        (
            lambda s: os.truncate(s / "trace_ids.npy", 200),
            DatasetError,
            "trace_ids.npy",
            "truncated",
        ),
        (
            lambda s: (s / "trace_ids.npy").write_bytes(os.urandom(300)),
            DatasetError,
            "trace_ids.npy",
            "no NumPy header",
        ),
        (
            lambda s: _save(s / "labels.npy", lambda a: a[:-1]),
            DatasetError,
            "labels.npy",
            "1 rows, the shard",
        ),
        (
            lambda s: _save(s / "labels.npy", lambda a: _set(a, 0, 99)),
            DatasetError,
            "labels.npy",
            "label value 99",
        ),
        (
            lambda s: _save(s / "labels.npy", lambda a: _set(a, 0, -1)),
            DatasetError,
            "labels.npy",
            "label value -1",
        ),
        (
            lambda s: _save(s / "trace_offsets.npy", lambda a: _set(a, 1, a[-1] + 5)),
            DatasetError,
            "trace_offsets.npy",
            "must start at 0 and never decrease",
        ),
        (
            lambda s: _save(s / "log_ids.npy", lambda a: a[:-3]),
            DatasetError,
            "log_ids.npy",
            "log_offsets.npy ends at",
        ),
        (
            lambda s: _save(s / "trace_features.npy", lambda a: a[:, :3]),
            DatasetError,
            "trace_features.npy",
            r"expected \[rows, 5\]",
        ),
        (
            lambda s: _save(s / "labels.npy", lambda a: a.astype(np.float32)),
            DatasetError,
            "labels.npy",
            "expected an integer array",
        ),
        (lambda s: (s / "done.json").write_bytes(b"\xff"), DatasetError, "done.json", "not UTF-8"),
        # an array the shard's version holds, gone: incomplete, not an older shard read as zeros
        (lambda s: (s / "token_gpu.npy").unlink(), TellerFileNotFoundError, "token_gpu.npy", "missing"),
        (
            lambda s: (s / "token_proc_log.npy").unlink(),
            TellerFileNotFoundError,
            "token_proc_log.npy",
            "missing",
        ),
        # token ids past the vocabularies the manifest records (an IndexError inside an embedding)
        (
            lambda s: _save(s / "trace_ids.npy", lambda a: _set(a, 0, 1_000_000)),
            DatasetError,
            "trace_ids.npy",
            r"token id 1000000 out of range \(manifest.json: a vocabulary of \d+\)",
        ),
        (
            lambda s: _save(s / "log_ids.npy", lambda a: _set(a, 2, 4096)),
            DatasetError,
            "log_ids.npy",
            "token id 4096 out of range",
        ),
        (
            lambda s: _save(s / "summary_ids.npy", lambda a: _set(a, 0, 1_000_000)),
            DatasetError,
            "summary_ids.npy",
            "token id 1000000 out of range",
        ),
    ],
)
def test_a_damaged_shard_is_named(setup, tmp_path, breakage, err, file, msg):
    _, _, run = setup
    r = _copy(run, tmp_path / "r")
    breakage(_shard(r))
    split = ShardedSplit(r, "test")
    with pytest.raises(err, match=msg) as e:
        split[0]
    assert str(_shard(r) / file) in str(e.value)


@pytest.mark.parametrize(
    ("breakage", "file", "msg"),
    [
        (lambda r: (r / "log_tokenizer.json").write_bytes(b""), "log_tokenizer.json", "empty file"),
        (lambda r: (r / "log_tokenizer.json").write_text("{trunc"), "log_tokenizer.json", "not a teller log"),
        (
            lambda r: (r / "reference.json").write_text("[1]"),
            "reference.json",
            "not a teller kernel reference",
        ),
        (lambda r: (r / "reference.fold1.json").write_bytes(b""), "reference.fold1.json", "empty file"),
        (lambda r: os.truncate(_shard(r) / "trace_ids.npy", 200), "trace_ids.npy", "truncated"),
        (lambda r: (_shard(r) / "labels.npy").unlink(), "labels.npy", "missing"),
        (
            lambda r: _save(_shard(r) / "log_ids.npy", lambda a: a[:-3]),
            "log_ids.npy",
            "log_offsets.npy ends at",
        ),
    ],
)
def test_a_resumed_run_checks_what_it_resumes(setup, tmp_path, breakage, file, msg):
    """Resuming a run whose log tokenizer, kernel reference or a shard marked done is damaged: a
    warning naming the file, and what depends on it made again (fitted again and every shard
    encoded again; the shard encoded again), so the run ends as it was: never a traceback, never a
    damaged shard taken as done."""
    data, tdir, run = setup
    out = _copy(run.parent, tmp_path / "out") / run.name
    breakage(out)
    where = out / file if file.endswith(".json") else _shard(out) / file
    with pytest.warns(TellerWarning, match=msg) as w:
        tokenize_dataset(data, tdir, out.parent, run_id="r", shard_size=4, log_vocab_size=300)
    assert any(str(x.message).startswith(f"{where}: ") for x in w), [str(x.message) for x in w]
    for f in ("manifest.json", "log_tokenizer.json", "reference.json", "reference.fold1.json"):
        assert (out / f).read_bytes() == (run / f).read_bytes(), f
    man = json.loads((run / "manifest.json").read_text())
    for sp in man["splits"].values():
        for sh in sp["shards"]:
            a, b = load_shard(out, sh["name"], mmap=False), load_shard(run, sh["name"], mmap=False)
            assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a), sh["name"]
    # from the CLI: one warning line, exit 0
    breakage(out)
    r = _cli(
        "tokenize", "--data-dir", str(data), "--tokenizer-dir", str(tdir), "--output-dir", str(out.parent),
        "--run-id", "r", "--shard-size", "4", "--log-vocab-size", "300",
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"warning: {where}: "), r.stderr


def test_a_resumed_run_restores_or_refuses_a_copied_in_file(setup, tmp_path):
    """A run made with --log-tokenizer / --reference (`teller evaluate`'s cache of a dataset): its
    damaged copy is copied again from this call's (the run's settings hold its hash); a readable
    other one is refused, as its shards were encoded with it."""
    data, tdir, run = setup
    kw = {
        "run_id": "c",
        "shard_size": 4,
        "log_tokenizer": run / "log_tokenizer.json",
        "hide_reference": False,
    }
    c = tokenize_dataset(data, tdir, tmp_path, **kw)
    before = _files(c)
    (c / "log_tokenizer.json").write_bytes(b"")
    (c / "reference.json").write_text("{")
    with pytest.warns(TellerWarning, match="copied again from"):
        tokenize_dataset(data, tdir, tmp_path, **kw)
    assert {k: v[0] for k, v in _files(c).items()} == {k: v[0] for k, v in before.items()}
    from teller.data.tokenize import LOG_PLACEHOLDERS, LOG_SPECIALS

    other = [*LOG_SPECIALS, *LOG_PLACEHOLDERS, "a"]  # (a readable log tokenizer, not the run's)
    (c / "log_tokenizer.json").write_text(json.dumps({"format": "teller-log-tokenizer", "vocab": other}))
    with pytest.raises(
        ConfigError, match=f"{c / 'log_tokenizer.json'}: run id 'c' already holds another log"
    ):
        tokenize_dataset(data, tdir, tmp_path, **kw)


def test_a_shard_disagreeing_with_the_manifest_is_named(setup, tmp_path):
    _, _, run = setup
    r = _copy(run, tmp_path / "r")
    _edit_json(r / "manifest.json", lambda m: m["splits"]["test"]["shards"][0].update(rows=[0, 1]) or None)
    _edit_json(
        r / "manifest.json", lambda m: m["splits"]["test"].update(samples=m["splits"]["test"]["samples"][:1])
    )
    with pytest.raises(DatasetError, match=r"holds 2 samples, .*manifest.json says 1"):
        ShardedSplit(r, "test")[0]


@pytest.mark.parametrize(
    ("content", "msg", "repairable"),
    [
        (lambda t: t[:150], "not valid JSON", False),
        (lambda t: "", "empty file", False),
        (lambda t: "[]", "not a shards manifest", False),
        (lambda t: json.dumps({**json.loads(t), "splits": []}), r"\$\.splits", True),
        (
            lambda t: json.dumps({**json.loads(t), "format": "teller-dataset"}),
            "a dataset: run `teller tokenize`",
            False,
        ),
    ],
)
def test_a_damaged_shards_manifest_is_named(setup, tmp_path, content, msg, repairable):
    _, _, run = setup
    r = _copy(run, tmp_path / "r")
    (r / "manifest.json").write_text(content((r / "manifest.json").read_text()))
    for read in (lambda: ShardedSplit(r, "test"), lambda: split_names(r, "all")):
        with pytest.raises(DatasetError, match=msg) as e:
            read()
        assert str(r / "manifest.json") in str(e.value)
    # tokenize resumes into it only where it still says what the run holds (and rewrites it)
    data, tdir, _ = setup
    if repairable:
        tokenize_dataset(data, tdir, r.parent, run_id="r", shard_size=4, log_vocab_size=300)
        assert (r / "manifest.json").read_bytes() == (run / "manifest.json").read_bytes()
    else:
        with pytest.raises(DatasetError, match="not a readable record"):
            tokenize_dataset(data, tdir, r.parent, run_id="r", shard_size=4, log_vocab_size=300)


def test_model_inputs_name_a_missing_log_tokenizer_and_bad_extra_shards(setup, tmp_path):
    from teller.models.data import check_extra_train, load_split

    _, _, run = setup
    r = _copy(run, tmp_path / "r")
    (r / "log_tokenizer.json").unlink()
    with pytest.raises(TellerFileNotFoundError, match=f"{r / 'log_tokenizer.json'}: no log tokenizer"):
        load_split(r, "test", 64, 64, log_summary=True)
    x = _copy(run, tmp_path / "x")
    (x / "manifest.json").write_text("{")
    with pytest.raises(DatasetError, match=f"{x / 'manifest.json'}: not a shards manifest"):
        check_extra_train(run, x)
    # extra shards of an older version: both versions named
    from teller.data.tokenize import SHARDS_VERSION
    from teller.errors import ConfigError

    v = _copy(run, tmp_path / "v")
    man = json.loads((v / "manifest.json").read_text())
    (v / "manifest.json").write_text(json.dumps({**man, "version": SHARDS_VERSION - 1}))
    with pytest.raises(
        ConfigError, match=f"shards version {SHARDS_VERSION - 1}, .* version {SHARDS_VERSION}"
    ):
        check_extra_train(run, v)
    # a damaged shard read for a model: the same named error
    r2 = _copy(run, tmp_path / "r2")
    _save(_shard(r2) / "labels.npy", lambda a: _set(a, 0, 99))
    with pytest.raises(DatasetError, match="label value 99"):
        load_split(r2, "test", 64, 64)


def test_load_shard_of_an_intact_run_is_unchanged(setup):
    _, _, run = setup
    man = json.loads((run / "manifest.json").read_text())
    for sp in man["splits"].values():
        for sh in sp["shards"]:
            a = load_shard(run, sh["name"], num_labels=len(man["label_names"]))
            b = load_shard(run, sh["name"], mmap=False)
            assert set(a) == set(b) and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
            assert len(a["labels"]) == sh["samples"]


# -- 4. dataset validate ---------------------------------------------------------------------------


def test_validate_reports_bad_manifests_and_sample_files(setup, tmp_path):
    data, _, _ = setup
    d = _copy(data, tmp_path / "ds")
    man = json.loads((d / "manifest.json").read_text())
    s1, s2 = man["splits"]["train"][:2]
    (d / "manifest.json").write_bytes(b"\xff\xfe\x00\x01")
    assert [str(p) for p in validate(d)] == ["manifest.json: not UTF-8 text (byte 0; a binary file?)"]
    (d / "manifest.json").write_text("[1]")
    assert [str(p) for p in validate(d)] == ["manifest.json $: [1] is not of type 'object'"]
    (d / "manifest.json").write_text(json.dumps({**man, "splits": {**man["splits"], "val": ["s999999"]}}))
    assert [str(p) for p in validate(d)] == [
        "manifest.json $.splits.val[0]: 's999999': no such sample directory",
        *(f"manifest.json $.samples.{sid}: in no split of $.splits" for sid in man["splits"]["val"]),
    ]
    (d / "manifest.json").write_text(
        json.dumps({**man, "splits": {**man["splits"], "val": [*man["splits"]["val"], s1]}})
    )
    assert [str(p) for p in validate(d)] == [
        f"manifest.json $.splits.val[2]: '{s1}' is listed twice (also in splits.train)",
        f"manifest.json $.splits.val[2]: '{s1}' is listed under val, $.samples says 'train'",
    ]
    (d / "manifest.json").write_text(json.dumps(man))
    for sid, name in ((s1, "log.txt"), (s2, "trace.json")):
        (d / sid / name).unlink()
        (d / sid / name).mkdir()
    assert [str(p) for p in validate(d)] == [
        f"{s1}/log.txt: a directory, not a file",
        f"{s2}/trace.json: a directory, not a file",
    ]
    e = _copy(data, tmp_path / "ds2")
    (e / "manifest.json").unlink()
    (e / "manifest.json").mkdir()
    assert [str(p) for p in validate(e)] == ["manifest.json: a directory, not a file"]
    r = _cli("dataset", "validate", str(e))
    assert r.returncode == 1 and "manifest.json: a directory, not a file" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


# -- 5. dataset generate --config --------------------------------------------------------------------


def test_generate_names_a_config_that_is_not_text(tmp_path):
    for raw in (b"\x00\xff\xfe binary", b"num_samples: 4\n# caf\xe9\n"):
        cfg = tmp_path / "c.yaml"
        cfg.write_bytes(raw)
        with pytest.raises(ConfigError, match=f"{cfg}: not a YAML configuration: not UTF-8 text"):
            load_config(config=cfg)
    r = _cli("dataset", "generate", "--config", str(cfg), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.startswith(f"error: {cfg}: not a YAML"), r.stderr
    assert not (tmp_path / "o").exists()


def test_every_error_here_is_a_teller_error():
    assert issubclass(DatasetError, TellerError) and issubclass(DatasetError, ValueError)
