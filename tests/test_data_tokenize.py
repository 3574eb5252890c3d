"""`teller tokenize`: shards readable (memory-mapped), consistent with their manifest, resumable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import teller
from teller import tpe
from teller.data import culprit_mask, generate
from teller.data.reference import KernelReference, deployment_key, event_residuals
from teller.data.summary import symbol_summary
from teller.data.tokenize import (
    ARRAYS,
    LogTokenizer,
    load_shard,
    parse_log,
    reference_fold,
    reference_hidden,
    split_log_line,
    tokenize_dataset,
)
from teller.errors import TokenizerError


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    data = root / "ds"
    generate(data, num_samples=26, seed=5, preset="tiny")
    tok = tpe.train(data, vocab_size=400)
    tdir = root / "tpe"
    tok.save(tdir)
    out = tokenize_dataset(data, tdir, root / "out", shard_size=6, workers=1, log_vocab_size=512)
    return data, tdir, out


def test_manifest_and_shards_consistent(setup):
    data, tdir, out = setup
    man = json.loads((out / "manifest.json").read_text())
    dman = json.loads((data / "manifest.json").read_text())
    assert man["format"] == "teller-shards" and man["label_names"] == dman["labels"]
    assert man["tokenizer"]["sha256"] and man["log_tokenizer"]["vocab_size"] <= 512
    assert set(man["arrays"]) == set(ARRAYS)
    tok = tpe.load(tdir)
    ref = KernelReference.load(out / "reference.json")
    folds = [KernelReference.load(out / f"reference.fold{g}.json") for g in (0, 1)]
    assert man["reference"]["entries"] == len(ref) > 0 and man["reference"]["path"] == "reference.json"
    assert man["reference"]["out_of_fold"] and all(0 < len(f) < len(ref) for f in folds)
    covered = {False: 0, True: 0}
    n_hidden = 0
    for split, sp in man["splits"].items():
        assert sp["samples"] == dman["splits"][split]
        rows = 0
        for sh in sp["shards"]:
            a = load_shard(out, sh["name"])
            n = sh["samples"]
            assert sh["rows"] == [rows, rows + n]
            rows += n
            assert isinstance(a["trace_ids"], np.memmap)
            assert a["labels"].shape == (n,)
            assert a["trace_offsets"].shape == (n + 1,) and a["trace_offsets"][-1] == sh["tokens"]
            assert a["trace_ids"].dtype == np.uint32 and len(a["trace_ids"]) == sh["tokens"]
            assert a["trace_features"].shape == (sh["tokens"], 5) and a["trace_features"].dtype == np.float32
            assert a["trace_culprit"].dtype == np.bool_ and a["trace_culprit"].sum() == sh["culprit_tokens"]
            assert a["log_offsets"][-1] == sh["log_tokens"] == len(a["log_ids"])
            assert a["log_features"].shape == (sh["log_tokens"], 2)
            assert int(a["trace_ids"].max()) < tok.vocab_size
            for i, sid in enumerate(sp["samples"][sh["rows"][0] : sh["rows"][1]]):
                ann = json.loads((data / sid / "annotation.json").read_text())
                assert man["label_names"][int(a["labels"][i])] == ann["label"]
                sev = next((f["severity"] for f in ann["faults"] if f["type"] == ann["label"]), 0.0)
                assert a["severity"][i] == pytest.approx(sev, rel=1e-6)
                eff = [f["effect"] for f in ann["faults"] if f["type"] == ann["label"]]
                assert a["effect_events"][i] == sum(e["events"] for e in eff)
                shares = [e["share"] for e in eff if "share" in e]  # (counted in events only: no share)
                want = max(shares) if shares else (np.nan if eff else 0.0)
                assert a["effect_share"][i] == pytest.approx(want, nan_ok=True)
                tr = teller.trace.load(data / sid / "trace.json", warn=False)
                enc = tok.encode(tr)
                o0, o1 = a["trace_offsets"][i], a["trace_offsets"][i + 1]
                np.testing.assert_array_equal(a["trace_ids"][o0:o1], enc.ids)
                b0, b1 = a["base_offsets"][i], a["base_offsets"][i + 1]
                ev = a["base_events"][b0:b1]
                np.testing.assert_array_equal(a["token_event_pos"][o0:o1], enc.offsets[:-1])
                # token k covers events ev[pos[k]:pos[k+1]]; its culprit flag = any culprit event
                m = culprit_mask(tr, ann)
                pos = np.append(a["token_event_pos"][o0:o1], b1 - b0)
                for k in range(0, o1 - o0, max(1, (o1 - o0) // 7)):
                    e = ev[pos[k] : pos[k + 1]]
                    assert bool(a["trace_culprit"][o0 + k]) == bool(m[e[e >= 0]].any())
                assert bool(a["trace_culprit"][o0:o1].any()) == bool(m.any() and m[ev[ev >= 0]].any())
                # token_work: ln(1 + num_tokens) of the step of the token's first event
                tw = a["token_work"][o0:o1]
                steps = {s.index: s for s in tr.steps()}
                for k in range(0, o1 - o0, max(1, (o1 - o0) // 7)):
                    e = ev[pos[k]]
                    if e < 0:
                        continue
                    st = steps.get(int(tr.step[e]))
                    args = tr.args(st.event) if st is not None and st.event >= 0 else {}
                    assert tw[k] == pytest.approx(np.log1p(args.get("num_tokens", 0)), rel=1e-6)
                assert (tw > 0).any()
                u0, u1 = a["summary_offsets"][i], a["summary_offsets"][i + 1]
                # columns 17-19 against the run's kernel reference, left 0 for the hidden training samples
                hidden = split == "train" and reference_hidden(dman["seed"], sid)
                key = deployment_key(tr, (data / sid / "log.txt").read_text())
                assert key is not None
                # a training sample's residuals come from the reference fitted without its half
                r = folds[reference_fold(dman["seed"], sid)] if split == "train" else ref
                resid = None if hidden else event_residuals(tr, r, key)
                su_ids, su_f = symbol_summary(tr, tok, ref_resid=resid)
                covered[hidden] += int((su_f[:, 19] > 0).any())
                n_hidden += int(hidden)
                np.testing.assert_array_equal(a["summary_ids"][u0:u1], su_ids)
                np.testing.assert_array_equal(a["summary_features"][u0:u1], su_f)
                assert u1 > u0
                # summary_culprit: the row's symbol is that of some culprit event (one event at a time)
                sym = np.asarray(tr.symbol)
                cul_syms = {int(tok.symbol_ids([tr.symbols[int(sym[e])]])[0]) for e in np.flatnonzero(m)}
                expect = [int(r) in cul_syms for r in su_ids]
                np.testing.assert_array_equal(a["summary_culprit"][u0:u1], expect)
                assert a["summary_culprit"][u0:u1].any() == (ann["label"] != "normal" and bool(m.any()))
        assert rows == len(sp["samples"])
    # (the tiny dataset's deployments repeat between train and the other splits; hidden rows read 0)
    assert covered[False] > 0 and n_hidden > 0 and covered[True] == 0


def test_resume_skips_complete_shards(setup):
    data, tdir, out = setup
    man = json.loads((out / "manifest.json").read_text())
    name = man["splits"]["train"]["shards"][0]["name"]
    done = out / "shards" / name / "done.json"
    mtime = done.stat().st_mtime_ns
    other = man["splits"]["train"]["shards"][1]["name"]
    import shutil

    shutil.rmtree(out / "shards" / other)
    again = tokenize_dataset(data, tdir, out.parent, shard_size=6, log_vocab_size=512)
    assert again == out
    assert done.stat().st_mtime_ns == mtime
    assert (out / "shards" / other / "done.json").is_file()
    assert json.loads((out / "manifest.json").read_text()) == man
    # a shard encoded under other culprit rules (as if before they changed) is encoded again
    d = json.loads(done.read_text())
    done.write_text(json.dumps({**d, "culprit_rules": 0}))
    tokenize_dataset(data, tdir, out.parent, shard_size=6, log_vocab_size=512)
    assert done.stat().st_mtime_ns != mtime and json.loads(done.read_text())["culprit_rules"] == 1


def test_simulated_shards_key_is_unchanged_by_the_culprit_rules(setup):
    """A simulated dataset's shards keep the key they had before ``culprit_rules`` existed (the
    field enters the key only where it is not 1), so shards encoded before are still reused. The key
    is the dataset manifest's, tokenizer's and settings' hashes and the shards version, not the
    sample files' (the run ids of before the sample files were recorded); the run's manifest records
    the sample files' fingerprint and content digest."""
    import hashlib

    from teller.data.tokenize import (
        SHARDS_VERSION,
        samples_digest,
        samples_fingerprint,
        shard_plan,
        shard_samples_digest,
    )

    data, tdir, out = setup
    man = json.loads((out / "manifest.json").read_text())
    # the settings are pinned, so a new field entering them (and the key) fails here too
    assert man["settings"] == {"shard_size": 6, "log_vocab_size": 512}
    key = [man["dataset"]["manifest_sha256"], man["tokenizer"]["sha256"], man["settings"], SHARDS_VERSION]
    assert out.name == "tok-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    dman = json.loads((data / "manifest.json").read_text())
    assert man["dataset"]["samples_fingerprint"] == samples_fingerprint(data, dman)
    plan = shard_plan(dman, 6)
    assert [n for _, n, _, _ in plan] == [sh["name"] for sp in man["splits"].values() for sh in sp["shards"]]
    shard_digests = [shard_samples_digest(data, ids) for _, _, ids, _ in plan]
    assert man["dataset"]["samples_sha256"] == samples_digest(shard_digests)
    for (_, name, _, _), dg in zip(plan, shard_digests, strict=True):
        assert json.loads((out / "shards" / name / "done.json").read_text())["samples_sha256"] == dg
    # the content digest is over each file's path and bytes (a copy's is the same)
    sid = dman["splits"]["train"][0]
    h = hashlib.sha256()
    for f in ("trace.json", "log.txt", "annotation.json"):
        h.update(f"{sid}/{f}\0{hashlib.sha256((data / sid / f).read_bytes()).hexdigest()}\n".encode())
    assert shard_samples_digest(data, [sid]) == h.hexdigest()


def test_a_regenerated_dataset_gets_the_same_run_id(setup, tmp_path):
    """The same `teller dataset generate` command run again writes the same bytes with other mtimes:
    its default run id is the same, and the run's shards are reused (its record takes the new
    fingerprint), so `teller results summarize` still finds one recipe."""
    import shutil

    data, tdir, out = setup
    o = tmp_path / "o"
    shutil.copytree(out.parent, o)
    run = o / out.name
    runs = sorted(o.iterdir())
    npy = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != "manifest.json"}
    again = tmp_path / "ds"
    generate(again, num_samples=26, seed=5, preset="tiny")
    old = json.loads((run / "manifest.json").read_text())["dataset"]
    assert (again / "manifest.json").read_bytes() == (data / "manifest.json").read_bytes()
    assert tokenize_dataset(again, tdir, o, shard_size=6, workers=1, log_vocab_size=512) == run
    assert {p: p.stat().st_mtime_ns for p in npy} == npy  # nothing encoded again
    new = json.loads((run / "manifest.json").read_text())["dataset"]
    assert new["samples_fingerprint"] != old["samples_fingerprint"] and new["path"] == str(again.resolve())
    assert new["samples_sha256"] == old["samples_sha256"]
    assert sorted(o.iterdir()) == runs  # (no second run)


def test_culprit_rules_version_per_generator():
    from teller.data.tokenize import culprit_rules

    assert culprit_rules({"generator": {"name": "teller-sim", "version": 3}}) == 1
    assert culprit_rules({"generator": {"name": "teller-cpu-runs", "version": 1}}) == 2
    assert culprit_rules({}) == 1 and culprit_rules({"generator": "odd"}) == 1


def test_log_tokenizer_templates():
    toks = split_log_line(
        "INFO 11-24 16:00:01 [loggers.py:116] (EngineCore_DP0 pid=4211) Engine 000: Avg prompt throughput: "
        "1,234.5 tokens/s, Running: 12 reqs, GPU KV cache usage: 97.3%"
    )
    words = [t for t, _ in toks]
    assert words[:3] == ["info", "<time>", "["]
    assert "<path>" in words and "engine" in words and "kv" in words
    nums = [v for t, v in toks if t == "<num>"]
    assert pytest.approx(nums[-1], rel=1e-6) == np.log1p(97.3)
    assert [t for t, _ in split_log_line("Received request cmpl-0a1b2c3d4e5f0001: x")][2] == "<id>"
    assert "<ip>" in [
        t for t, _ in split_log_line('INFO:     10.0.3.7:5512 - "POST /v1/completions HTTP/1.1" 200 OK')
    ]


def test_log_tokenizer_roundtrip(setup, tmp_path):
    data, _tdir, _out = setup
    logs = sorted(data.glob("s*/log.txt"))
    lt = LogTokenizer.train(logs, vocab_size=300)
    assert len(lt.vocab) <= 300 and lt.vocab[0] == "[PAD]"
    assert LogTokenizer.from_dict(json.loads(json.dumps(lt.to_dict()))).vocab == lt.vocab
    lines = parse_log(logs[0])
    ids, feats = lt.encode_lines(lines, lines[-1][0])
    assert (ids == lt.index["[BOL]"]).sum() == len(lines)
    assert feats.shape == (len(ids), 2)


def _same_encoding(lt, lines, t0=0):
    a_ids, a_f = lt.encode_lines(lines, t0)
    b_ids, b_f = lt.encode_lines_reference(lines, t0)
    assert a_ids.dtype == b_ids.dtype == np.uint32 and a_f.dtype == b_f.dtype == np.float32
    np.testing.assert_array_equal(a_ids, b_ids)
    assert a_f.shape == b_f.shape and np.array_equal(a_f.view(np.uint32), b_f.view(np.uint32)), lines


def test_native_log_encoding_equals_the_python_definition(setup, tmp_path):
    # the Rust splitter (teller_core::logtok) against re and split_log_line, bit for bit: every log of
    # the dataset, and seeded random lines of the characters where the pattern's alternatives and
    # classes meet (Python's \s holds \x1c-\x1f; a line with non-ASCII text is split in Python)
    import random

    data, _tdir, _out = setup
    logs = sorted(data.glob("s*/log.txt"))
    lt = LogTokenizer.train(logs, vocab_size=300)
    for p in logs:
        _same_encoding(lt, parse_log(p), 10**18)
    rng = random.Random(7)
    pieces = [
        *"aAfFxXeE_09.,:;/-+%'\"()[]=<>\t \x0b\x0c\x1c\x1f\x01\x7f",
        "0x1f",
        "cmpl-",
        "req-ab",
        ".py",
        ".json:",
        "/usr",
        "1.2.3.4",
        "11-24 16:00:01",
        "deadbeef0123",
        "1e5",
        "1,000",
        "é",
        "█",
        "\u00a0",
        "\u0663",
    ]
    for _ in range(2000):
        lines = [
            (
                rng.choice([0, 10**18 + rng.randrange(10**9)]),
                rng.choice(["stdout", "stderr"]),
                "".join(
                    rng.choice(pieces[:-4] if rng.random() < 0.8 else pieces)
                    for _ in range(rng.randrange(30))
                ),
            )
            for _ in range(rng.randrange(1, 5))
        ]
        _same_encoding(lt, lines, 10**18)
    assert lt.encode_lines([], 0)[0].shape == (0,)
    # what the Rust path cannot take is encoded by the Python definition: a time stamp past int64, a
    # lone surrogate (parse_log replaces undecodable bytes, a caller's own lines may hold one)
    _same_encoding(lt, [(10**30, "stdout", "Running: 3"), (1, "stderr", "x")], 0)
    _same_encoding(lt, [(0, "stdout", "bad \ud800 line 7")], 0)
    # training counts tokens with the same splitter: the vocabulary of the Python definition
    from collections import Counter

    cnt = Counter(t for p in logs for _, _, text in parse_log(p) for t, _ in split_log_line(text))
    from teller.data.tokenize import LOG_PLACEHOLDERS, LOG_SPECIALS

    fixed = [*LOG_SPECIALS, *LOG_PLACEHOLDERS]
    words = sorted((w for w, c in cnt.items() if c >= 2 and w not in fixed), key=lambda w: (-cnt[w], w))
    assert lt.vocab == (fixed + words)[:300]
    p = tmp_path / "log.txt"  # (non-ASCII lines are counted in Python)
    p.write_text(
        "\n".join("".join(rng.choice(pieces) for _ in range(20)) for _ in range(300)), encoding="utf-8"
    )
    cnt = Counter(t for _, _, text in parse_log(p) for t, _ in split_log_line(text))
    got = LogTokenizer.train([p], vocab_size=100_000, min_count=1).vocab
    assert got[len(fixed) :] == sorted((w for w in cnt if w not in fixed), key=lambda w: (-cnt[w], w))
    # a vocabulary without the specials every line is encoded with: refused when it is made (and so
    # when a log_tokenizer.json without them is loaded), not a KeyError at the first line
    with pytest.raises(
        TokenizerError, match=r"lacks the specials \['\[UNK\]', '\[BOL\]', '<stdout>', '<stderr>'\]"
    ):
        LogTokenizer(["[PAD]", "word"])


def test_reference_fit_in_workers_is_the_serial_one(setup):
    # the samples read and the three references fitted in two processes: the same references
    from teller.data.tokenize import fit_reference

    data, tdir, _out = setup
    man = json.loads((data / "manifest.json").read_text())
    tok = tpe.load(tdir)
    serial = fit_reference(data, man, tok)
    par = fit_reference(data, man, tok, tok_file=tdir / tpe.FILE_NAME, workers=2)
    dump = [json.dumps(r.to_dict(), sort_keys=True) for r in (serial[0], *serial[1])]
    assert len(serial[0]) and dump == [json.dumps(r.to_dict(), sort_keys=True) for r in (par[0], *par[1])]


def test_cli_tokenize(setup, tmp_path):
    data, tdir, _ = setup
    env = dict(os.environ, COLUMNS="200")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "teller",
            "tokenize",
            "--data-dir",
            str(data),
            "--tokenizer-dir",
            str(tdir),
            "--output-dir",
            str(tmp_path),
            "--run-id",
            "r1",
            "--shard-size",
            "13",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = Path(r.stdout.strip())
    assert out == tmp_path / "r1"
    man = json.loads((out / "manifest.json").read_text())
    assert sum(len(s["samples"]) for s in man["splits"].values()) == 26
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "teller",
            "tokenize",
            "--data-dir",
            str(tmp_path / "none"),
            "--tokenizer-dir",
            str(tdir),
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "manifest" in r.stderr


def test_sharded_split_random_access(setup):
    from teller.data.tokenize import ShardedSplit

    data, tdir, out = setup
    man = json.loads((out / "manifest.json").read_text())
    ds = ShardedSplit(out, "train")
    assert len(ds) == len(man["splits"]["train"]["samples"])
    tok = tpe.load(tdir)
    for i in (0, len(ds) // 2, len(ds) - 1, -1):
        x = ds[i]
        sid = x["sample_id"]
        ann = json.loads((data / sid / "annotation.json").read_text())
        assert ds.label_names[x["label"]] == ann["label"]
        enc = tok.encode(teller.trace.load(data / sid / "trace.json", warn=False))
        np.testing.assert_array_equal(x["trace_ids"], enc.ids)
        np.testing.assert_array_equal(x["segment_starts"], enc.segment_starts)
        assert x["trace_features"].shape == (len(enc.ids), 5) and len(x["trace_culprit"]) == len(enc.ids)
        assert len(x["log_ids"]) == len(x["log_features"]) > 0
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_labelled_effect():
    from teller.data.tokenize import _labelled_effect

    assert _labelled_effect({"label": "normal", "faults": []}) == (0, 0.0)
    two = {
        "label": "gpu_throttle",
        "faults": [
            {"type": "gpu_throttle", "effect": {"events": 3, "share": 0.02}},
            {"type": "gpu_throttle", "effect": {"events": 4, "share": 0.05}},
            {"type": "cpu_contention", "effect": {"events": 100, "share": 0.9}},  # a secondary fault
        ],
    }
    assert _labelled_effect(two) == (7, 0.05)
    n, share = _labelled_effect({"label": "oom_error", "faults": [{"type": "oom_error"}]})  # a real run
    assert n == -1 and np.isnan(share)
    n, share = _labelled_effect(
        {"label": "oom_error", "faults": [{"type": "oom_error", "effect": {"events": 2}}]}
    )
    assert n == 2 and np.isnan(share)
    n, share = _labelled_effect({"label": "oom_error", "faults": [{"type": "oom_error", "effect": {}}]})
    assert n == -1 and np.isnan(share)  # no count: unknown, not "did nothing"


def test_shards_without_effect_arrays_read_unknown(setup, tmp_path):
    """Shards encoded before the effect arrays existed (same version) read -1 / NaN: unknown."""
    import shutil

    from teller.data.tokenize import ShardedSplit

    _, _, out = setup
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for f in old.glob("shards/*/effect_*.npy"):
        f.unlink()
    for f in old.glob("shards/*/done.json"):  # (encoded before: their done.json has no "effect")
        info = json.loads(f.read_text())
        del info["effect"]
        f.write_text(json.dumps(info))
    d = ShardedSplit(old, "train")[0]
    assert d["effect_events"] == -1 and np.isnan(d["effect_share"])
    # tokenizing again into that directory encodes those shards again, so a split is never half
    # with and half without the arrays
    data, tdir, _ = setup
    tokenize_dataset(data, tdir, tmp_path, run_id="old", shard_size=6, workers=1, log_vocab_size=512)
    assert all(json.loads(f.read_text())["effect"] for f in old.glob("shards/*/done.json"))
    # (re-encoded from the samples' annotations: a faulty sample's effect is back, not 0)
    split = ShardedSplit(old, "train")
    assert max(int(split[k]["effect_events"]) for k in range(len(split))) > 0


def test_reference_reuse_and_no_hiding(setup, tmp_path):
    # the same data encoded for a trained model (evaluate --split DIR does this): the run's
    # reference comes along with its log tokenizer, no fold files, and with hide_reference=False no
    # training sample is left without its columns
    data, tdir, out = setup
    ref = KernelReference.load(out / "reference.json")
    runs = {
        hide: tokenize_dataset(
            data,
            tdir,
            tmp_path / "again",
            shard_size=6,
            workers=1,
            log_tokenizer=out / "log_tokenizer.json",
            hide_reference=hide,
        )
        for hide in (True, False)
    }
    assert runs[True] != runs[False]  # (a setting of the run id)
    for hide, run in runs.items():
        man = json.loads((run / "manifest.json").read_text())
        assert (
            man["reference"]["sha256"]
            == json.loads((out / "manifest.json").read_text())["reference"]["sha256"]
        )
        assert not man["reference"]["out_of_fold"] and not (run / "reference.fold0.json").exists()
        assert man["reference"]["hidden_train_frac"] == (0.3 if hide else 0.0)
        dman = json.loads((data / "manifest.json").read_text())
        zero = 0
        for sh in man["splits"]["train"]["shards"]:
            a = load_shard(run, sh["name"])
            for i, sid in enumerate(man["splits"]["train"]["samples"][sh["rows"][0] : sh["rows"][1]]):
                rows = a["summary_features"][a["summary_offsets"][i] : a["summary_offsets"][i + 1]]
                tr = teller.trace.load(data / sid / "trace.json", warn=False)
                known = deployment_key(tr, (data / sid / "log.txt").read_text()) in ref.table
                covered = bool((rows[:, 19] > 0).any())
                if hide and reference_hidden(dman["seed"], sid):
                    assert not covered
                    zero += 1
                else:
                    assert covered == known, sid
        assert (zero > 0) == hide


def test_a_stale_reference_is_refitted_only_when_this_run_fitted_it(setup, tmp_path):
    """A reused --run-id whose own reference.json (fitted here, fold files beside it) is of another
    version is fitted again and every shard encoded again; one copied in (--reference, no fold
    files) is not replaced; another --reference than the run's is refused."""
    import shutil

    from teller.errors import ConfigError

    data, tdir, out = setup
    run = tmp_path / "run"
    shutil.copytree(out, run)
    old_ref = {
        "format": "teller-kernel-reference",
        "version": 1,
        "table": {"A|m|tp1": {"k\t0": [0, 0, 1, 0, 1, 3]}},
    }
    (run / "reference.json").write_text(json.dumps(old_ref))
    done = sorted(run.glob("shards/*/done.json"))
    before = {f: f.stat().st_mtime_ns for f in done}
    tokenize_dataset(data, tdir, tmp_path, run_id="run", shard_size=6, workers=1, log_vocab_size=512)
    assert (
        KernelReference.load(run / "reference.json").table
        == KernelReference.load(out / "reference.json").table
    )
    assert all(f.is_file() and f.stat().st_mtime_ns != before[f] for f in done)  # encoded again
    # copied in by an earlier run (no fold files): refused, and nothing is deleted
    for g in (0, 1):
        (run / f"reference.fold{g}.json").unlink()
    (run / "reference.json").write_text(json.dumps(old_ref))
    with pytest.raises(ConfigError, match="copied in by an earlier run") as e:
        tokenize_dataset(data, tdir, tmp_path, run_id="run", shard_size=6, workers=1, log_vocab_size=512)
    assert str(run / "reference.json") in str(e.value)
    assert json.loads((run / "reference.json").read_text()) == old_ref
    # another --reference into a run id that holds one
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps({**old_ref, "table": {"B|m|tp1": {"k\t0": [0, 0, 2, 0, 1, 3]}}}))
    with pytest.raises(ConfigError, match="already holds another kernel reference"):
        tokenize_dataset(
            data, tdir, tmp_path, run_id="run", shard_size=6, workers=1, log_vocab_size=512, reference=v1
        )


def test_a_bad_log_tokenizer_is_named(setup, tmp_path):
    """--log-tokenizer (and a checkpoint's): missing, not JSON, not an object, or a vocabulary that
    is not a list of words, each a named error before anything is encoded."""
    from teller.data.tokenize import LogTokenizer

    data, tdir, _out = setup
    lt = tmp_path / "lt.json"
    with pytest.raises(FileNotFoundError, match="lt.json: no log tokenizer"):
        tokenize_dataset(data, tdir, tmp_path / "o", log_tokenizer=lt)
    for text, msg in (
        ("{not json", "not a teller log tokenizer"),
        ("[1]", "not a teller log tokenizer"),
        (json.dumps({"format": "teller-log-tokenizer", "vocab": 5}), "'vocab' must be a list of words"),
    ):
        lt.write_text(text)
        with pytest.raises(TokenizerError, match=f"lt.json: .*{msg}"):
            tokenize_dataset(data, tdir, tmp_path / "o", log_tokenizer=lt)
        with pytest.raises(TokenizerError, match=msg):
            LogTokenizer.load(lt)
    assert not (tmp_path / "o").exists()


def test_a_log_reads_as_a_terminal_shows_it(tmp_path):
    """A program that saw a terminal colours its lines and redraws progress bars with \\r: the log is
    read as the text a terminal showed, so it holds the words a program without one would log."""
    from teller._io import strip_escapes, terminal_text

    assert strip_escapes("\x1b[1;32mINFO\x1b[0m 12-01 ok") == "INFO 12-01 ok"
    assert strip_escapes("\x1b]8;;https://x\x1b\\link\x1b]8;;\x07 \x1b(Bdone\x1b") == "link done"
    assert terminal_text("\x1b[2K\rLoading 1/5\rLoading 5/5\r") == "Loading 5/5"
    assert terminal_text("plain") == "plain" and terminal_text("\r") == ""
    p = tmp_path / "log.txt"
    p.write_bytes(
        b"5 stderr \x1b[33mWARNING\x1b[0m slow\n"
        b"6 stderr \r 10%|#   |\r100%|####|\r\n"
        b"7 stdout page\x0cbreak\n"  # (a form feed is no line end: splitlines() made it one)
        b"no prefix \x1b[31mred\x1b[0m\r\n"
    )
    assert parse_log(p) == [
        (5, "stderr", "WARNING slow"),
        (6, "stderr", "100%|####|"),
        (7, "stdout", "page\x0cbreak"),
        (0, "stdout", "no prefix red"),
    ]


def test_a_shard_that_lost_an_array_it_was_written_with_is_named_and_encoded_again(setup, tmp_path):
    """(from a review) A shard whose done.json says it carries severity and effect, with one of them
    gone, read as "unknown" (-1 / NaN) and a resume kept it; an id past its tokenizer's vocabulary
    was resumed as complete and failed only when a model read it."""
    import shutil

    from teller.data.tokenize import load_shard
    from teller.errors import TellerFileNotFoundError

    data, tdir, out = setup
    run = tmp_path / "r"
    shutil.copytree(out, run)
    man = json.loads((run / "manifest.json").read_text())
    a, b = man["splits"]["train"]["shards"][0]["name"], man["splits"]["train"]["shards"][1]["name"]
    (run / "shards" / a / "effect_share.npy").unlink()
    with pytest.raises(TellerFileNotFoundError, match=r"effect_share.npy"):
        load_shard(run, a)
    ids = np.load(run / "shards" / b / "trace_ids.npy")
    ids[0] = 10**6
    np.save(run / "shards" / b / "trace_ids.npy", ids)
    with pytest.warns(UserWarning, match="a damaged shard of a resumed run, encoded again") as w:
        tokenize_dataset(data, tdir, tmp_path, run_id="r", shard_size=6, workers=1, log_vocab_size=512)
    said = " ".join(str(x.message) for x in w)
    assert "effect_share.npy" in said and "out of range" in said, said
    load_shard(run, a)
    assert int(np.load(run / "shards" / b / "trace_ids.npy")[0]) < 10**6


def test_a_log_line_starting_with_a_unicode_digit_is_text(tmp_path):
    """(from a review) "²".isdigit() is true and int("²") fails: parse_log raised a bare ValueError."""
    from teller.data.tokenize import parse_log

    p = tmp_path / "log.txt"
    p.write_text("\u00b2 stdout hello\n12 stdout ok\n", encoding="utf-8")
    assert parse_log(p) == [(0, "stdout", "\u00b2 stdout hello"), (12, "stdout", "ok")]
