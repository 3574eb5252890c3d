"""What a library user relies on (found by a review written as one): error types and their
attributes, indexing, saved-tokenizer checks, settings that say how the vocabulary was made, and
writes from several threads at once."""

from __future__ import annotations

import errno
import json
import os
import pickle
import threading

import numpy as np
import pytest
import teller
import teller.trace as T
from conftest import TRACES
from teller import tpe
from teller.errors import (
    ConfigError,
    TellerFileNotFoundError,
    TellerIOError,
    TellerNotADirectoryError,
    TokenizerError,
)

MI250 = TRACES / "mi250_rocm62_tiny.kineto.json.gz"


@pytest.fixture(scope="module")
def tr():
    return T.load(MI250, warn=False)


def test_a_missing_file_is_an_os_error_with_its_errno_and_filename(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        T.load(tmp_path / "nope.json")
    assert isinstance(e.value, TellerFileNotFoundError) and isinstance(e.value, teller.TellerError)
    assert e.value.errno == errno.ENOENT and e.value.filename == str(tmp_path / "nope.json")
    back = pickle.loads(pickle.dumps(e.value))
    assert (type(back), back.errno, back.filename, str(back)) == (
        TellerFileNotFoundError,
        errno.ENOENT,
        e.value.filename,
        str(e.value),
    )
    # an I/O error with ENOENT is the not-found class, as OSError(2, ...) is FileNotFoundError
    assert isinstance(TellerIOError("x: gone", errno=errno.ENOENT, path="x"), TellerFileNotFoundError)
    with pytest.raises(FileNotFoundError):
        tpe.load(tmp_path / "nothing")


def test_event_indices_behave_as_a_sequence(tr):
    n = len(tr)
    assert tr.event(-1)["index"] == n - 1 and tr.args(-1) == tr.args(n - 1)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=f"event index {bad} is out of range"):
            tr.event(bad)
        with pytest.raises(IndexError):
            tr.args(bad)
    with pytest.raises(TypeError):
        tr.event(1.5)  # (not event 1)
    with pytest.raises(ConfigError, match="unknown layer 'kernal'"):
        tr.layer_mask("kernal")


def _saved(tmp_path, tr, edit) -> str:
    d = tmp_path / "tok"
    tpe.train([tr], num_merges=5).save(d)
    f = d / "tokenizer.json"
    j = json.loads(f.read_text())
    edit(j)
    f.write_text(json.dumps(j))
    return str(d)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda j: j["stats"]["count"].__setitem__(0, -5),
            r"stats\['count'\]\[0\] must be a non-negative integer",
        ),
        (lambda j: j["stats"]["count"].__setitem__(1, 1.5), r"stats\['count'\]\[1\] must be a non-negative"),
        (
            lambda j: j["stats"]["count"].__setitem__(0, 2**64),
            r"stats\['count'\]\[0\] .* below 2\^63, got 1844",
        ),
        (
            lambda j: j["stats"]["std"].__setitem__(0, -1.0),
            r"stats\['std'\]\[0\] must be a finite number >= 0",
        ),
        (lambda j: j["stats"]["mean"].pop(), "must be as long as each other"),
        (
            lambda j: j["settings"].__setitem__("step_names", []),
            r"settings\['step_names'\] must not be empty",
        ),
        (lambda j: j["settings"].__setitem__("step_names", [""]), "is an empty pattern"),
        (lambda j: j["settings"].__setitem__("normalize", {"foo": 1}), "unknown normalization option 'foo'"),
        (
            lambda j: j["settings"].__setitem__("max_token_events", 2**32),
            r"settings\['max_token_events'\] must be an integer in 1..4294967295 or null",
        ),
        (
            lambda j: j["settings"].__setitem__("min_frequency", 0),
            r"settings\['min_frequency'\] must be an integer >= 1, got 0",
        ),
    ],
)
def test_a_damaged_saved_tokenizer_is_refused_at_load_naming_its_file(tmp_path, tr, edit, said):
    d = _saved(tmp_path, tr, edit)
    with pytest.raises(TokenizerError, match=said) as e:
        tpe.load(d)
    assert "tokenizer.json" in str(e.value)


def test_fields_a_saved_tokenizer_has_that_this_teller_does_not_know_are_named_once(tmp_path, tr):
    """Same format version, so a newer teller's fields (or a hand edit's typo: ``close_layer`` would
    silently mean the default) are read past with one warning naming them and the file."""
    import warnings

    def edit(j):
        j["future"] = 1
        j["settings"]["close_layer"] = ["cpu"]
        j["teller_version"] = "9.9.9"

    d = _saved(tmp_path, tr, edit)
    with pytest.warns(teller.TellerWarning) as w:
        tok = tpe.load(d)
    said = [str(x.message) for x in w if "does not know" in str(x.message)]
    assert len(said) == 1, said
    assert "tokenizer.json" in said[0] and "'future', settings['close_layer']" in said[0]
    assert "written by teller 9.9.9" in said[0]
    assert list(tok._close_layers()) == list(tpe.train([tr], num_merges=5)._close_layers())  # (the default)
    with warnings.catch_warnings():  # (warn=False: a worker process, whose parent said it)
        warnings.simplefilter("error")
        tpe.load(d, warn=False)
    clean = tmp_path / "clean"
    tpe.train([tr], num_merges=5).save(clean)
    with warnings.catch_warnings():  # (what this teller writes: nothing to say)
        warnings.simplefilter("error")
        tpe.load(clean)


def test_a_tokenizer_trained_on_traces_records_how_they_were_loaded(tmp_path):
    short = T.load(MI250, normalize={"max_len": 8}, warn=False)
    tok = tpe.train([short], num_merges=5)
    assert tok.settings["normalize"] == {"max_len": 8}
    # so a path is encoded as the trace was: no [UNK] that the trace itself did not have
    unk = [i for i, s in enumerate(tok.base_vocab) if s.startswith("[UNK")]
    assert not np.isin(tok.encode(MI250).base_ids, unk).any()
    with pytest.raises(ConfigError, match="differs from how the Trace given was loaded"):
        tpe.train([T.load(MI250, warn=False)], num_merges=5, normalize={"max_len": 8})
    with pytest.raises(ConfigError, match="loaded with different options"):
        tpe.train([short, T.load(MI250, warn=False)], num_merges=5)
    # the defaults spelled out are the defaults: not refused
    plain = T.load(MI250, warn=False)
    tpe.train([plain], num_merges=5, step_names=list(T.DEFAULT_STEP_PATTERNS), normalize={})
    tpe.train([plain, T.load(MI250, normalize={}, warn=False)], num_merges=5)


def test_threads_writing_one_output_at_once_do_not_collide(tmp_path, tr):
    tok = tpe.train([tr], num_merges=5)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(15):
                tr.to_chrome(tmp_path / "same.json.gz")
                tok.save(tmp_path / "sametok")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(T.load(tmp_path / "same.json.gz", warn=False)) == len(tr)
    assert tpe.load(tmp_path / "sametok").merges == tok.merges
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_a_saved_tokenizer_keeps_its_mode_and_links(tmp_path, tr):
    tok = tpe.train([tr], num_merges=5)
    real = tmp_path / "real"
    tok.save(real)
    (real / "tokenizer.json").chmod(0o600)
    tok.save(real)
    assert (real / "tokenizer.json").stat().st_mode & 0o777 == 0o600
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(real / "tokenizer.json", linked / "tokenizer.json")
    tok.save(linked)
    assert (linked / "tokenizer.json").is_symlink()
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(TellerNotADirectoryError):
        tok.save(f)


def test_encode_given_a_list_of_trace_paths_says_to_use_encode_batch(tr):
    tok = tpe.train([tr], num_merges=5)
    with pytest.raises(ConfigError, match="encode_batch"):
        tok.encode([str(MI250)])  # (a list of strings is a symbol sequence: it was 1 [UNK] token)
    assert [len(e.base_ids) for e in tok.encode_batch([MI250])] == [len(tok.encode(MI250).base_ids)]


def test_wrong_argument_types_are_config_errors_naming_them(tr, tmp_path):
    from teller.compare import compare

    with pytest.raises(
        ConfigError,
        match=r"compare takes two teller.trace.Trace objects \(teller.trace.load\), got str as current",
    ):
        compare(tr, "x")
    with pytest.raises(ConfigError, match="to_chrome takes an output path, got NoneType"):
        tr.to_chrome(None)
    tok = tpe.train([tr], num_merges=5)
    with pytest.raises(TokenizerError, match="symbol id 9999 is not a base symbol"):
        tok.duration_z(9999, [1000])
    with pytest.warns(teller.TellerWarning, match="no merges are learned"):
        tpe.train([tr], vocab_size=3)


def test_a_saved_tokenizer_loads_back_exactly(tmp_path, tr):
    tok = tpe.train([tr], num_merges=5)
    tok.save(tmp_path / "t")
    back = tpe.load(tmp_path / "t")
    for k in ("count", "mean", "std"):
        assert np.array_equal(back.stats[k], tok.stats[k]), k  # (no rounding: the same features)
    assert np.array_equal(back.encode(tr).features, tok.encode(tr).features)


def _ticks_during(call) -> tuple[int, float]:
    """How often a Python thread ran (1 ms sleeps) while ``call`` ran in this one, and its duration."""
    import threading
    import time

    ticks, stop = [0], threading.Event()

    def tick() -> None:
        while not stop.is_set():
            time.sleep(0.001)
            ticks[0] += 1

    th = threading.Thread(target=tick)
    th.start()
    time.sleep(0.02)
    t0, k0 = time.perf_counter(), ticks[0]
    try:
        call()
    finally:
        k, dt = ticks[0] - k0, time.perf_counter() - t0
        stop.set()
        th.join()
    return k, dt


def test_the_rust_core_releases_the_gil():
    """Loading a trace and training TPE run without the GIL: another Python thread keeps running
    meanwhile (holding it, the thread would not tick once until the call returned)."""
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, 2_000_000).astype(np.uint32)
    starts = np.arange(0, len(ids), 2000, dtype=np.int64)
    names = [f"s{i}" for i in range(40)]
    for what, call in (
        ("tpe.train", lambda: teller.tpe.train((ids, starts), names=names, num_merges=200)),
        ("trace.load", lambda: teller.trace.load(TRACES / "a100_nccl_2rank.kineto.json.gz", warn=False)),
    ):
        k, dt = _ticks_during(call)
        assert k >= 5, f"{what}: another thread ran {k} times in {dt * 1000:.0f} ms"


def test_columns_are_zero_copy_read_only_views():
    """A column is a numpy view of the trace's own memory (no copy per access), and read-only."""
    tr = teller.trace.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", warn=False)
    ts = tr.ts
    assert not ts.flags.owndata and ts.base is not None and not ts.flags.writeable
    assert tr._col("ts").ctypes.data == ts.ctypes.data  # (a second view: the same memory)


def test_a_saved_tokenizer_with_null_close_layers_encodes_with_the_default(tmp_path, tr):
    """``close_layers: null`` reads as the default (it was accepted at load, then a TypeError at
    encode); an empty list means no layer closes."""
    d = _saved(tmp_path, tr, lambda j: j["settings"].__setitem__("close_layers", None))
    ref = _saved(tmp_path / "ref", tr, lambda j: None)
    assert (tpe.load(d).encode(tr).ids == tpe.load(ref).encode(tr).ids).all()


def test_odd_values_survive_a_round_trip(tmp_path):
    """A raw counter of NaN or infinity is written as null (JSON has neither: the file stayed
    unreadable), and a pid or tid of -2^63 is read back (it was refused as not an integer)."""
    from teller.rawfmt import RawWriter

    with RawWriter(tmp_path / "c.tmsgpack", pid=1, host="h", clock_sync=(1000, 10**18), env={}) as w:
        w.span("runtime", "cudaLaunchKernel", tid=-(2**63), start=2000, end=2100, corr=1)
        w.counter("mem", ts=2050, value=float("nan"))
        w.counter("mem", ts=2060, value=float("inf"))
        w.counter("mem", ts=2070, value=3.5)
    tr = T.load(tmp_path / "c.tmsgpack", warn=False)
    tr.to_chrome(tmp_path / "c.json")
    ev = json.loads((tmp_path / "c.json").read_text())["traceEvents"]
    assert [e["args"]["value"] for e in ev if e.get("ph") == "C"] == [None, None, 3.5]
    back = T.load(tmp_path / "c.json", warn=False)
    assert back.tid.tolist() == [-(2**63)]


def _same_trace(a: T.Trace, b: T.Trace, tmp_path) -> None:
    for c in ("layer", "name", "cat", "ts", "dur", "pid", "tid", "device", "corr", "ext", "flags"):
        assert np.array_equal(getattr(a, c), getattr(b, c)), c
    for c in ("link", "parent", "step", "symbol", "source"):
        assert np.array_equal(a._col(c), b._col(c)), c
    assert a.strings == b.strings and a.symbols == b.symbols and a.warnings == b.warnings
    assert a.steps() == b.steps() and a.sources == b.sources and a.load_options == b.load_options
    assert [a.args(i) for i in range(len(a))] == [b.args(i) for i in range(len(b))]
    assert a.summary() == b.summary()
    a.to_chrome(tmp_path / "a.json")
    b.to_chrome(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


@pytest.mark.parametrize(
    "name", ["mi300x_sglang_decode_hipgraph.kineto.json.gz", "b300_cuda13_moe.kineto.json.gz", "raw"]
)
def test_a_trace_pickles_and_copies_with_everything_it_holds(tmp_path, name):
    """pickle, copy.deepcopy and multiprocessing carry a loaded trace whole: columns, derived links,
    steps, args, sources, warnings, how it was loaded. (It used to raise "cannot pickle
    'teller._native.NativeTrace' object".)"""
    import copy

    if name == "raw":
        from teller.rawfmt import RawWriter

        with RawWriter(tmp_path / "c.tmsgpack", pid=7, host="h", clock_sync=(1000, 10**18), env={}) as w:
            w.span("runtime", "cudaLaunchKernel", tid=7, start=2000, end=2100, corr=1, args={"k": [1, 2]})
            w.gpu("kernel", "gemm", device=0, stream=7, start=2200, end=2600, corr=1)
            w.counter("mem", ts=2050, value=float("nan"))
            w.counter("mem", ts=2070, value=3.5)
        a = T.load(tmp_path / "c.tmsgpack", warn=False, step_names=["nothing*"])
    else:
        a = T.load(TRACES / name, warn=False, normalize={"max_len": 40})
    assert len(a) > 0
    _ = a.ts  # a cached column view is not what is pickled
    b = pickle.loads(pickle.dumps(a))
    assert b is not a and b._n is not a._n
    _same_trace(a, b, tmp_path)
    _same_trace(a, copy.deepcopy(a), tmp_path)
    # the same trace pickles to the same bytes
    assert pickle.dumps(a) == pickle.dumps(b)


def test_traces_come_back_from_worker_processes():
    """`Pool.map(teller.trace.load, paths)` in fresh (spawned) worker processes."""
    import multiprocessing as mp

    paths = [str(TRACES / n) for n in ("mi250_rocm62_tiny.kineto.json.gz", "b300_cuda13_moe.kineto.json.gz")]
    with mp.get_context("spawn").Pool(2) as pool:
        got = pool.map(T.load, paths)
    for p, t in zip(paths, got, strict=True):
        here = T.load(p, warn=False)
        assert np.array_equal(t.ts, here.ts) and t.summary() == here.summary()


def test_a_damaged_pickled_trace_is_a_format_error_not_a_crash(tr):
    from teller.errors import TraceFormatError

    data = tr._n.snapshot()
    for bad, said in (
        (data[: len(data) // 2], "truncated"),
        (data + b"\0", "after the end"),
        (b"{}" + data[2:], "not a teller trace snapshot"),
        (data[:8] + (99).to_bytes(4, "little") + data[12:], "snapshot version 99"),
    ):
        with pytest.raises(TraceFormatError, match=said) as e:
            T._from_snapshot(bad, tr.load_options)
        assert isinstance(e.value, ValueError) and "<trace snapshot>" in str(e.value)


def test_a_trace_at_the_edge_of_time_still_pickles(tmp_path):
    """Every trace that loads pickles: a step's end saturates where a capture's base offset and an
    event's start and duration are all near the readers' bound (it was refused as out of range). (A
    start beyond the bound once the base is added is refused when read: test_trace_fixtures.)"""
    doc = {
        "baseTimeNanoseconds": 3_900_000_000_000_000_000,
        "traceEvents": [
            {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 9.9e13, "dur": 3.9e15, "cat": "cpu_op"}
        ],
    }
    (tmp_path / "edge.json").write_text(json.dumps(doc))
    tr = T.load(tmp_path / "edge.json", warn=False)
    back = pickle.loads(pickle.dumps(tr))
    assert back.ts.tolist() == tr.ts.tolist() and back.steps() == tr.steps()


def _stub_column_dtypes() -> dict[str, str]:
    """Column name -> numpy dtype name, as `_native.pyi` declares them in `NativeTrace.column`'s
    overloads (read with `ast`, so the stub is what is checked, not a copy of it)."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(teller.__file__).parent / "_native.pyi").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NativeTrace")
    out = {}
    for f in cls.body:
        if not (isinstance(f, ast.FunctionDef) and f.name == "column"):
            continue
        ann, ret = f.args.args[1].annotation, f.returns
        if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "Literal"):
            continue  # (the catch-all `str` overload)
        names = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        dtype = ast.unparse(ret.slice).removeprefix("np.")
        for n in names:
            assert n.value not in out, f"column {n.value!r} declared twice in _native.pyi"
            out[n.value] = dtype
    return out


def test_the_type_stub_declares_each_columns_real_dtype(tr):
    """`_native.pyi` promises a dtype per column; a column whose Rust type changes must change the
    stub too. Every column is declared, none twice, none that does not exist."""
    declared = _stub_column_dtypes()
    native = tr._n
    assert len(declared) == 16, sorted(declared)
    for name, dtype in declared.items():
        assert native.column(name).dtype == np.dtype(dtype), name
    with pytest.raises(ValueError, match="unknown column"):
        native.column("nope")


def test_native_objects_are_made_by_their_functions_only():
    """`NativeTrace` has no constructor (the stub says so); `NativeLogVocab.encode` wants one stream
    flag per line (it used to read a missing flag as stdout and ignore extra ones)."""
    from teller import _native

    with pytest.raises(TypeError):
        _native.NativeTrace()
    vocab = _native.NativeLogVocab(["[UNK]", "[BOL]", "<stdout>", "<stderr>", "hello"])
    ids, line, num, deferred = vocab.encode(["hello"], [False])
    assert ids.dtype == np.uint32 and line.dtype == np.uint32 and num.dtype == np.float64
    for flags in ([], [False, True]):
        with pytest.raises(ValueError, match=f"1 lines but {len(flags)} stream flags"):
            vocab.encode(["hello"], flags)
