"""TPE through the Python API, checked against the pure-Python reference oracle."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import teller
from conftest import DATA, FIXTURES, TRACES
from hypothesis import given, settings
from hypothesis import strategies as st
from teller import _native
from teller._reference import tpe as ref
from teller.errors import ConfigError, TellerFileNotFoundError, TokenizerError


@st.composite
def corpora(draw, max_base=6):
    base = draw(st.integers(1, max_base))
    segs = draw(st.lists(st.lists(st.integers(0, base - 1), max_size=25), min_size=1, max_size=8))
    return base, segs


def flat(segs):
    ids = np.asarray([x for s in segs for x in s], dtype=np.uint32)
    starts, n = [], 0
    for s in segs:
        starts.append(n)
        n += len(s)
    return ids, np.asarray(starts, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(
    c=corpora(),
    num_merges=st.integers(0, 30),
    min_freq=st.integers(1, 3),
    cap=st.one_of(st.none(), st.integers(2, 5)),
)
def test_rust_trainer_equals_reference(c, num_merges, min_freq, cap):
    base, segs = c
    ids, starts = flat(segs)
    merges, counts = _native.tpe_train(ids, starts, base, num_merges, min_freq, cap, None)
    want, want_counts = ref.train_with_counts(segs, base, num_merges, min_freq, cap)
    assert [tuple(m) for m in merges] == [tuple(m) for m in want]
    assert list(counts) == want_counts


@settings(max_examples=150, deadline=None)
@given(c=corpora(), num_merges=st.integers(0, 30), data=st.data())
def test_rust_encoding_equals_reference_and_round_trips(c, num_merges, data):
    base, segs = c
    ids, starts = flat(segs)
    merges, _ = _native.tpe_train(ids, starts, base, num_merges, 1, None, None)
    t = _native.NativeTpe(base, merges)
    # encode other random data with these merges too
    other = data.draw(st.lists(st.lists(st.integers(0, base - 1), max_size=25), min_size=1, max_size=5))
    for corpus in (segs, other):
        ids2, starts2 = flat(corpus)
        toks, offs, seg = t.encode_ids(ids2, starts2)
        pos = 0
        for k, s in enumerate(corpus):
            rt, ro = ref.encode(s, merges, base)
            a = int(seg[k])
            b = int(seg[k + 1]) if k + 1 < len(corpus) else len(toks)
            assert toks[a:b].tolist() == rt
            assert (offs[a : b + 1] - pos).tolist()[: len(ro)] == ro
            pos += len(s)
        assert t.decode(toks).tolist() == ids2.tolist()


def test_features_equal_reference():
    rng = np.random.default_rng(0)
    base = 7
    segs = [rng.integers(0, base, size=int(rng.integers(1, 30))).tolist() for _ in range(6)]
    ids, starts = flat(segs)
    dur = rng.integers(0, 50_000, size=len(ids)).astype(np.int64)
    st_ = np.cumsum(rng.integers(0, 20_000, size=len(ids))).astype(np.int64)
    merges, _ = _native.tpe_train(ids, starts, base, 10, 2, None, None)
    t = _native.NativeTpe(base, merges)
    toks, offs, seg = t.encode_ids(ids, starts)
    cnt, mean, std = _native.tpe_symbol_stats(ids, dur, base)
    rc, rm, rs = ref.symbol_stats(ids.tolist(), dur.tolist(), base)
    assert cnt.tolist() == rc
    np.testing.assert_allclose(mean, rm, rtol=1e-12)
    np.testing.assert_allclose(std, rs, rtol=1e-9)
    f = t.features(ids, dur, st_, offs, seg, cnt, mean, std)
    assert f.shape == (len(toks), 5) and f.dtype == np.float32
    pos = 0
    for k, s in enumerate(segs):
        a = int(seg[k])
        b = int(seg[k + 1]) if k + 1 < len(segs) else len(toks)
        o = (offs[a : b + 1] - pos).tolist()
        want = ref.features(
            s, dur[pos : pos + len(s)].tolist(), st_[pos : pos + len(s)].tolist(), o, (rc, rm, rs)
        )
        np.testing.assert_allclose(f[a:b], np.asarray(want, dtype=np.float32), rtol=1e-5, atol=1e-5)
        pos += len(s)


def test_training_is_deterministic_and_thread_independent():
    ids, starts, _dur, _st, nb = _native.tpe_synth_corpus(200_000, seed=3, n_symbols=300, step_events=500)
    a = _native.tpe_train(ids, starts, nb, 500, 2, None, None)
    b = _native.tpe_train(ids, starts, nb, 500, 2, None, None)
    assert a == b
    import subprocess
    import sys

    code = (
        "import numpy as np; from teller import _native as n;"
        "ids,st,_,_,nb=n.tpe_synth_corpus(200_000, seed=3, n_symbols=300, step_events=500);"
        "m,_=n.tpe_train(ids,st,nb,500,2,None,None); print(hash(tuple(map(tuple,m))))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**__import__("os").environ, "RAYON_NUM_THREADS": str(k)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for k in (1, 2)
    }
    assert len(outs) == 1


def test_segment_boundaries_never_merged():
    segs = [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]] * 5
    tok = teller.tpe.train(segs, num_merges=10, min_frequency=1)
    enc = tok.encode(segs)
    for a, b in enc.segments():
        assert int(enc.offsets[b] - enc.offsets[a]) == 2
    # no token spans "b a" across the boundary "a b | b a"
    assert all(int(n) <= 2 for n in tok.token_lens)


def test_symbol_api_and_unknowns():
    segs = [["kernel:gemm", "runtime:cudaLaunchKernel", "kernel:gemm"]] * 3
    tok = teller.tpe.train(segs, vocab_size=40)
    assert tok.base_vocab[:5] == list(teller.tpe.SPECIALS)
    ids = tok.symbol_ids(["kernel:gemm", "kernel:never_seen", "weird"])
    assert tok.base_vocab[ids[0]] == "kernel:gemm"
    assert tok.base_vocab[ids[1]] == "kernel:[UNK]"
    assert tok.base_vocab[ids[2]] == "[UNK]"
    enc = tok.encode(["kernel:gemm", "runtime:cudaLaunchKernel", "kernel:gemm", "kernel:new"])
    assert tok.decode(enc.ids) == ["kernel:gemm", "runtime:cudaLaunchKernel", "kernel:gemm", "kernel:[UNK]"]
    assert enc.events is None


def test_min_symbol_count_maps_rare_to_layer_unk():
    segs = [["kernel:a", "kernel:b"]] * 5 + [["kernel:rare"]]
    tok = teller.tpe.train(segs, num_merges=0, min_symbol_count=2)
    assert "kernel:rare" not in tok.base_vocab
    assert tok.decode(tok.encode([["kernel:rare"]]).ids) == ["kernel:[UNK]"]


@pytest.mark.parametrize("name", FIXTURES)
def test_real_traces_train_and_encode_losslessly(name, tmp_path):
    tr = teller.trace.load(TRACES / name, warn=False)
    tok = teller.tpe.train([tr], vocab_size=2000)
    enc = tok.encode(tr)
    corpus = teller.tpe.corpus_from_trace(tr)
    assert tok.decode(enc.ids) == [corpus.names[i] for i in corpus.ids]
    assert len(enc) <= len(corpus.ids)
    assert enc.features.shape == (len(enc), 5) and np.isfinite(enc.features).all()
    # every event of every step is covered exactly once
    ev = enc.events[enc.events >= 0]
    assert len(np.unique(ev)) == len(ev) == int((tr.step >= 0).sum())
    assert int(enc.features[:, 0].sum()) == int(enc.offsets[-1])
    # save -> load -> identical encodings
    tok.save(tmp_path / "tok")
    tok2 = teller.tpe.load(tmp_path / "tok")
    enc2 = tok2.encode(tr)
    assert np.array_equal(enc.ids, enc2.ids) and np.array_equal(enc.offsets, enc2.offsets)
    np.testing.assert_allclose(enc.features, enc2.features, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FIXTURES[:2])
def test_duration_z_is_the_max_dur_z_feature_of_a_single_event(name):
    """diagnose's "how far from normal" (duration_z) is in the units of the Rust features: a token of
    one event has max_dur_z equal to that event's duration_z (it once took ln(ns), some 15 off)."""
    tr = teller.trace.load(TRACES / name, warn=False)
    tok = teller.tpe.train([tr], num_merges=0)  # every token one symbol
    enc = tok.encode(tr)
    one = np.flatnonzero((np.diff(enc.offsets) == 1) & (enc.events[enc.offsets[:-1]] >= 0))
    assert len(one) > 10
    for k in one[:200].tolist():
        b = int(enc.offsets[k])
        want = tok.duration_z(int(enc.base_ids[b]), tr.dur[int(enc.events[b])])
        assert enc.features[k, 3] == pytest.approx(want, rel=1e-4, abs=1e-4)
    # by hand: 1000 ns is ln(1 + 1) us; a symbol's std is floored at STD_FLOOR
    assert teller.tpe.log_duration([1000.0])[0] == pytest.approx(math.log(2.0))
    sid = next(i for i, c in enumerate(tok.stats["count"]) if c > 0)
    mu, sd = float(tok.stats["mean"][sid]), float(tok.stats["std"][sid])
    want = (math.log(2.0) - mu) / max(sd, teller.tpe.STD_FLOOR)
    assert tok.duration_z(sid, [1000.0]) == pytest.approx(want)
    assert tok.duration_z(sid, []) == 0.0
    # a tokenizer trained without durations has no statistics to measure against
    bare = teller.tpe.train([["kernel:a", "kernel:b"]] * 3, num_merges=0)
    assert not bare.has_duration_stats and tok.has_duration_stats
    assert bare.duration_z(bare.symbol_id("kernel:a"), [1e6]) == 0.0
    # ... and so its encodings have no z-score either (the features' z divided by the std floor:
    # 39.3 for one 50 us event); nor do plain symbols encoded by a timed tokenizer (no durations)
    c = teller.tpe.Corpus(
        names=["kernel:a"],
        ids=np.zeros(1, np.uint32),
        starts=np.zeros(1, np.int64),
        dur_ns=np.array([50_000], np.int64),
        start_ns=np.zeros(1, np.int64),
    )
    assert bare.encode(c).features[0, 3] == 0.0
    assert tok.encode([[tok.base_vocab[sid]]]).features[0, 3] == 0.0


def test_small_edges_of_the_api():
    tok = teller.tpe.train([["kernel:a", "kernel:b"]] * 3, num_merges=1)
    # an encoding of no segments has no segments (zip(strict) raised ValueError)
    assert tok.encode([]).segments() == []
    assert tok.encode([[]]).segments() == [(0, 0)]
    # token_events of a symbol encoding is a TokenizerError (a teller error)
    with pytest.raises(TokenizerError, match="made from symbols"):
        tok.encode([["kernel:a"]]).token_events(0)
    # an int past the native u64 is a ConfigError, not an OverflowError
    with pytest.raises(ConfigError, match="min_frequency"):
        teller.tpe.train([["kernel:a", "kernel:b"]] * 3, num_merges=1, min_frequency=2**64)


def test_fast_path_matches_symbol_path():
    ids, starts, _d, _s, nb = _native.tpe_synth_corpus(50_000, seed=1, n_symbols=200, step_events=400)
    names = [f"kernel:k{i}" for i in range(nb)]
    tok = teller.tpe.train((ids, starts), names=names, num_merges=300)
    b = tok.symbol_ids(names)[ids]
    toks, offs = tok.encode_ids(b, starts)
    segs = [
        [names[i] for i in ids[s:e]]
        for s, e in zip(starts.tolist(), starts.tolist()[1:] + [len(ids)], strict=True)
    ]
    enc = tok.encode(segs)
    assert np.array_equal(toks, enc.ids) and np.array_equal(offs, enc.offsets)


def test_golden_file_stays_readable():
    import warnings

    with warnings.catch_warnings():  # (nothing in it this teller does not know)
        warnings.simplefilter("error")
        tok = teller.tpe.load(DATA / "tpe" / "golden_tokenizer")
    d = json.loads((DATA / "tpe" / "golden_tokenizer" / "tokenizer.json").read_text())
    assert d["format"] == "teller-tpe" and d["version"] == 1
    # (what it encodes to lies beside it: a field of its own in tokenizer.json was one this teller
    # does not know, said at every load)
    expected = json.loads((DATA / "tpe" / "golden_tokenizer" / "expected.json").read_text())
    enc = tok.encode([expected["input"]])
    assert tok.decode(enc.ids) == ["annotation:step", "runtime:cudaLaunchKernel", "kernel:gemm", "<close>"]
    assert enc.ids.tolist() == expected["ids"]


def test_bad_input(tmp_path):
    with pytest.raises(ConfigError):
        teller.tpe.train([["a"]], vocab_size=10, num_merges=3)
    with pytest.raises(ConfigError, match="num_merges must be an integer >= 0, got -1"):
        teller.tpe.train([["a", "b"]], num_merges=-1)
    for bad in (-1, True, 2.5, "8"):
        with pytest.raises(ConfigError, match="vocab_size must be an integer >= 0"):
            teller.tpe.train([["a", "b"]], vocab_size=bad)
    assert teller.tpe.train([["a", "b", "a", "b"]], vocab_size=np.int64(64), min_frequency=1).merges
    with pytest.warns(UserWarning, match=r"vocab_size 2 is not above the corpus's \d+ base symbols"):
        assert len(teller.tpe.train([["a", "b", "a", "b"]], vocab_size=2, min_frequency=1).merges) == 0
    with pytest.raises(ConfigError):
        teller.tpe.train((np.zeros(3, np.uint32), np.zeros(1, np.int64)), num_merges=3)
    with pytest.raises(TokenizerError, match="out of range"):
        _native.tpe_train(np.asarray([0, 5], np.uint32), np.asarray([0], np.int64), 3, 2, 2, None, None)
    with pytest.raises(TokenizerError, match="offsets"):
        _native.tpe_train(np.asarray([0, 1], np.uint32), np.asarray([1], np.int64), 3, 2, 2, None, None)
    with pytest.raises(TokenizerError):
        _native.NativeTpe(3, [(0, 7)])
    with pytest.raises(TellerFileNotFoundError):
        teller.tpe.load(tmp_path / "nope")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        teller.tpe.load(tmp_path / "bad")
    (tmp_path / "bad" / "tokenizer.json").write_text(json.dumps({"format": "teller-tpe", "version": 99}))
    with pytest.raises(TokenizerError, match="version 99"):
        teller.tpe.load(tmp_path / "bad")
    # a field of the wrong JSON type is named (was an AttributeError on first use)
    good = teller.tpe.train([["a", "b", "a", "b"]], num_merges=1, min_frequency=1).to_dict()
    for key, bad in (("stats", [1]), ("settings", [1]), ("merges", "x"), ("base_vocab", 5)):
        (tmp_path / "bad" / "tokenizer.json").write_text(json.dumps({**good, key: bad}))
        with pytest.raises(TokenizerError, match=f"field '{key}' must be a JSON"):
            teller.tpe.load(tmp_path / "bad")


def test_progress_callback_and_cancel():
    ids, starts, _d, _s, nb = _native.tpe_synth_corpus(100_000, seed=2, n_symbols=200, step_events=400)
    seen = []
    _native.tpe_train(ids, starts, nb, 400, 2, None, lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][1] == 400 and all(a <= b for a, b in zip(seen, seen[1:], strict=False))

    def stop(done, total):
        if done >= 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _native.tpe_train(ids, starts, nb, 400, 2, None, stop)


def test_log_dur_matches():
    assert math.isclose(ref.log_dur(1500), math.log1p(1.5))


def test_a_tokenizer_says_what_other_normalization_rules_mean(tmp_path) -> None:
    import warnings

    from teller.errors import TellerWarning

    # trained now: the rules' version is recorded and loading says nothing
    tok = teller.tpe.train([["kernel:gemm", "kernel:gemm", "runtime:cudaLaunchKernel"]] * 3, num_merges=2)
    assert tok.settings["normalization_version"] == _native.NORMALIZATION_VERSION >= 2
    tok.save(tmp_path / "now")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        teller.tpe.load(tmp_path / "now")
    # an older tokenizer holding a mangled kernel name: that kernel is now demangled, so it is unknown
    d = json.loads((tmp_path / "now" / "tokenizer.json").read_text())
    mangled = "kernel:_ZN5aiter24add_rmsnorm_quant_kernelIDF16bLi256EEEvPT_"
    assert teller.trace.symbol("kernel", mangled[len("kernel:") :]) != mangled
    old = json.loads(json.dumps(d))
    old["base_vocab"].append(mangled)
    old["stats"] = {k: [*v, 0] for k, v in d["stats"].items()}
    del old["settings"]["normalization_version"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "tokenizer.json").write_text(json.dumps(old))
    with pytest.warns(TellerWarning, match=r"1 kernel symbol\(s\) are mangled names .* before 2"):
        teller.tpe.load(tmp_path / "old")
    # one whose mangled name this teller keeps whole (a wrapper it cannot read): still matches
    kept = json.loads(json.dumps(old))
    wrapper = "kernel:_ZN7cutlass6KernelIN4gemm5KernelILi128EEEEvTnT_"
    assert teller.trace.symbol("kernel", wrapper[len("kernel:") :]) == wrapper
    kept["base_vocab"][-1] = wrapper
    (tmp_path / "kept.json").write_text(json.dumps(kept))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        teller.tpe.load(tmp_path / "kept.json")
    # said once by the parent; worker processes load with warn=False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        teller.tpe.load(tmp_path / "old", warn=False)
    # an older one without mangled names: nothing changed for it
    del d["settings"]["normalization_version"]
    (tmp_path / "plain.json").write_text(json.dumps(d))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        teller.tpe.load(tmp_path / "plain.json")
    # a newer one: said; a wrong type: an error naming the field
    (tmp_path / "new.json").write_text(
        json.dumps(dict(d, settings={**d["settings"], "normalization_version": 99}))
    )
    with pytest.warns(TellerWarning, match="version 99, newer than this teller's"):
        teller.tpe.load(tmp_path / "new.json")
    (tmp_path / "bad.json").write_text(
        json.dumps(dict(d, settings={**d["settings"], "normalization_version": "2"}))
    )
    with pytest.raises(TokenizerError, match="normalization_version"):
        teller.tpe.load(tmp_path / "bad.json")


def test_a_list_of_strings_is_read_as_paths_and_says_so():
    # (strings that name no file and do not look like paths were meant as one symbol sequence)
    with pytest.raises(TellerFileNotFoundError, match=r"a list of lists, train\(\[\['a', 'b'\]\]\)") as e:
        teller.tpe.train(["a", "b"], num_merges=2)
    assert isinstance(e.value, FileNotFoundError) and e.value.path == "a"
    # a missing path that reads as one is just missing
    with pytest.raises(TellerFileNotFoundError) as e:
        teller.tpe.train(["nope/run1", "x.json.gz"], num_merges=2)
    assert "list of lists" not in str(e.value)
    tok = teller.tpe.train([["a", "b"], ["a", "b"]], num_merges=1)  # (the form the message gives)
    assert tok.decode([tok.base_size]) == ["a", "b"]


def test_fast_path_input_is_checked():
    names = ["a", "b"]
    starts = np.asarray([0], np.int64)

    def train(ids, offsets=starts, names=names):
        return teller.tpe.train((np.asarray(ids), offsets), names=names, num_merges=1, min_frequency=1)

    with pytest.raises(TokenizerError, match="must be an array of integers, got dtype float64"):
        train(np.asarray([0.0, 1.7]))  # (was truncated to [0, 1] silently)
    with pytest.raises(TokenizerError, match="symbol id -1 at index 1 is negative"):
        train(np.asarray([0, -1]))  # (was "symbol id 4294967295 is out of range")
    with pytest.raises(
        TokenizerError, match=r"1-d array of integers, got a 2-d array of shape \(1, 2\)"
    ) as e:
        train(np.asarray([[0, 1]]))
    assert isinstance(e.value, ValueError)
    with pytest.raises(TokenizerError, match="symbol id 5 at index 1 is out of range for 2 names"):
        train(np.asarray([0, 5]))
    with pytest.raises(TokenizerError, match="offsets .* must be an array of integers, got dtype float64"):
        train(np.asarray([0, 1]), np.asarray([0.0]))
    with pytest.raises(TokenizerError, match="must start at 0, got 2 ") as e:
        train(np.asarray([0, 1, 0, 1]), np.asarray([2, 4]))
    assert "Some" not in str(e.value)
    with pytest.raises(ConfigError, match=r"names has 'a' twice \(at 0 and 2\)"):
        train(np.asarray([0, 1]), names=["a", "b", "a"])
    tok = train(np.asarray([0, 1, 0, 1], np.int64))  # (any integer dtype)
    assert tok.decode([tok.base_size]) == ["a", "b"]


def test_fewer_merges_than_asked_is_a_warning():
    from teller.errors import TellerWarning

    seqs = [["a", "b", "a", "b"]]
    with pytest.warns(
        TellerWarning,
        match=r"training made 0 of the 5 merges asked \(num_merges 5\), vocabulary \d+: no pair of "
        r"adjacent tokens was left with frequency >= min_frequency \(3\)",
    ):
        assert teller.tpe.train(seqs, num_merges=5, min_frequency=3).merges == []
    nb = teller.tpe.train(seqs, num_merges=0).base_size
    with pytest.warns(TellerWarning, match=rf"made 1 of the 8 merges asked \(vocab_size {nb + 8} over {nb}"):
        assert len(teller.tpe.train(seqs, vocab_size=nb + 8).merges) == 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TellerWarning)  # (all the merges asked: nothing to say)
        teller.tpe.train(seqs, num_merges=1)
        teller.tpe.train(seqs, vocab_size=0)


def test_encode_takes_one_trace_not_a_directory_of_traces(tmp_path):
    from teller.rawfmt import RawWriter

    tok = teller.tpe.train([["runtime:cudaLaunchKernel", "kernel:gemm"]] * 2, num_merges=1)
    both = tmp_path / "two"
    both.mkdir()
    for name in FIXTURES[:2]:
        (both / name).write_bytes((TRACES / name).read_bytes())
    # (the loader would merge them onto one timeline; train reads each as a trace of its own)
    with pytest.raises(
        ConfigError, match=r"a directory of 2 trace files, not a run directory: .*give one file"
    ):
        tok.encode(both)
    one = tmp_path / "sample"  # a dataset sample: one trace beside its annotation
    one.mkdir()
    (one / "trace.json.gz").write_bytes((TRACES / FIXTURES[0]).read_bytes())
    (one / "annotation.json").write_text("{}")
    assert len(tok.encode(one)) == len(tok.encode(one / "trace.json.gz"))
    # a run directory (teller collect): raw files of several processes, its own trace.json, run.json
    run = tmp_path / "run"
    (run / "raw").mkdir(parents=True)
    for pid in (1, 2):
        with RawWriter(run / "raw" / f"p{pid}.tmsgpack", pid=pid, clock_sync=(0, 0)) as w:
            w.span("runtime", "cudaLaunchKernel", tid=pid, start=10 * pid, end=10 * pid + 5)
    (run / "trace.json").write_bytes((TRACES / FIXTURES[1]).read_bytes())
    (run / "summary.json").write_text("{}")
    (run / "run.json").write_text("{}")
    enc = tok.encode(run)
    assert int(enc.offsets[-1]) == len(tok.encode(teller.trace.load(run / "raw", warn=False)).base_ids)


def test_tokenizers_pickle_compare_and_refuse_what_a_mature_library_refuses(tmp_path):
    """(from a review) A tokenizer pickles and deep-copies (worker processes, DataLoaders), compares
    by content, and odd input gets a TellerError that says what is wrong: a negative token index
    counts from the end, a float id is not truncated, hostile JSON, null fields, other specials, an
    empty path, an empty corpus, a bare symbol where a path is read."""
    import copy
    import pickle

    tok = teller.tpe.load(DATA / "tpe" / "golden_tokenizer")
    back = pickle.loads(pickle.dumps(tok))
    assert back == tok and back is not tok and copy.deepcopy(tok) == tok
    assert back.encode([["kernel:gemm"]]).ids.tolist() == tok.encode([["kernel:gemm"]]).ids.tolist()
    assert tok != teller.tpe.train([["a", "b", "a", "b"]], num_merges=1, min_frequency=1)
    tr = teller.trace.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", warn=False)
    e = tok.encode(tr)
    assert pickle.loads(pickle.dumps(e)).ids.tolist() == e.ids.tolist()
    assert e.token_events(-1).tolist() == e.token_events(len(e) - 1).tolist()
    for k in (len(e), -len(e) - 1):
        with pytest.raises(IndexError, match=f"token index {k} out of range"):
            e.token_events(k)
    with pytest.raises(TokenizerError, match="ids must be an array of integers"):
        tok.encode_ids(np.array([18.9, 19.2]), np.array([0]))
    with pytest.raises(TokenizerError, match="symbol id -1 out of range"):
        tok.encode_ids(np.array([-1]), np.array([0]))
    with pytest.raises(TokenizerError, match="token id -1 at index 1 is out of range"):
        tok.decode([0, -1])
    # hostile JSON: digits past Python's limit, nesting past the recursion limit
    for name, text in (
        ("digits", '{"format": "teller-tpe", "version": 1' + "0" * 5000 + "}"),
        ("deep", "[" * 100_000 + "]" * 100_000),
    ):
        p = tmp_path / f"{name}.json"
        p.write_text(text)
        with pytest.raises(TokenizerError, match=f"^{p}: not valid JSON"):
            teller.tpe.load(p)
    good = tok.to_dict()
    for key, bad, says in (
        ("merges", None, "field 'merges' must be a JSON array, got null"),
        ("base_vocab", None, "field 'base_vocab' must be a JSON array, got null"),
        ("specials", ["x"], "field 'specials' is"),
        ("base_vocab", ["a", *good["base_vocab"][1:]], "base_vocab must start with the specials"),
    ):
        with pytest.raises(TokenizerError, match=f"^f.json: {re.escape(says)}"):
            teller.tpe.TPETokenizer.from_dict({**good, key: bad}, path="f.json")
    for call in (
        lambda: teller.tpe.load(""),
        lambda: tok.save(""),
        lambda: teller.trace.load(""),
        lambda: tr.to_chrome(""),
    ):
        with pytest.raises(ConfigError, match="path is empty"):
            call()
    with pytest.raises(ConfigError, match="the corpus has no events"):
        teller.tpe.train([[]], num_merges=0)
    with pytest.raises(TellerFileNotFoundError, match=r"a symbol sequence must be given as a list"):
        tok.encode("kernel:gemm")
    with pytest.raises(ConfigError, match="names= goes with the fast path"):
        teller.tpe.train([["a", "b"]], num_merges=0, names=["a", "b"])
    with pytest.raises(ConfigError, match="symbol: name must be a string, got int"):
        teller.trace.symbol("kernel", 5)  # type: ignore[arg-type]
