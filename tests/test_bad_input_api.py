"""Bad arguments to the Python API and the command line: a TellerError subclass (ConfigError,
TokenizerError, TellerIOError) naming the argument or file and what is wrong, never a raw
TypeError/OverflowError from deep inside, and nothing written before the refusal."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import run_permission_checked
from teller import tpe, trace
from teller._io import write_atomic
from teller.cli import app
from teller.data import generate
from teller.errors import (
    ConfigError,
    EmptyTraceError,
    TellerError,
    TellerIOError,
    TellerIsADirectoryError,
    TellerPermissionError,
    TokenizerError,
)
from typer.testing import CliRunner

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "tpe" / "golden_tokenizer"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ds") / "d"
    generate(d, num_samples=2, preset="tiny", seed=3)
    return d


@pytest.fixture(scope="module")
def sample(dataset) -> Path:
    return dataset / "s000000" / "trace.json"


@pytest.fixture(scope="module")
def tr(sample):
    return trace.load(sample, warn=False)


def cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def refused(r, *needles: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    for n in needles:
        assert n in r.output, (n, r.output)


# -- 1. tpe.train: every argument's type and range --------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"max_token_events": -1}, "max_token_events must be an integer in 1..4294967295, got -1"),
        ({"max_token_events": "x"}, "max_token_events"),
        ({"max_token_events": 2**40}, "max_token_events"),
        ({"min_frequency": "x"}, "min_frequency must be an integer in 1..18446744073709551615, got 'x'"),
        ({"min_symbol_count": 0}, "min_symbol_count"),
        ({"num_merges": 2**40}, "num_merges must be an integer in 0..4294967295"),
        ({"close_layers": ["nope"]}, "close_layers: unknown layer 'nope'"),
        ({"progress": 5}, "progress must be a callable"),
        ({"normalize": {"max_len": -1}}, "max_len"),
        ({"step_names": ""}, "empty pattern"),
    ],
)
def test_tpe_train_checks_arguments(kw, needle):
    with pytest.raises(ConfigError, match=None) as ei:
        tpe.train([["a", "b", "a", "b"]], **{"num_merges": 2, **kw})
    assert needle in str(ei.value)


def test_tpe_train_cli_max_token_events(tmp_path, dataset):
    refused(
        cli(
            "tpe",
            "train",
            "--data-dir",
            str(dataset),
            "--output-dir",
            str(tmp_path / "x"),
            "--max-token-events",
            "-1",
        ),
        "error: --max-token-events must be an integer",
    )
    refused(
        cli(
            "tpe", "train", "--data-dir", str(dataset), "--output-dir", str(tmp_path / "x"), "--step-name", ""
        ),
        "error: --step-name[0] is an empty pattern",
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("source", [[1, 2], [None], [{}], [[1, 2]], 5, None, [["a"], "b"]], ids=repr)
def test_tpe_train_bad_source(source):
    with pytest.raises(ConfigError):
        tpe.train(source, num_merges=2)


# -- 2. dataset generate: seed and num_samples checked before anything is written ---------------------


def test_generate_bad_seed_writes_nothing(tmp_path):
    out = tmp_path / "g"
    for seed in (-1, 2**32, "x", True):
        with pytest.raises(ConfigError, match="--seed must be an integer in"):
            generate(out, num_samples=2, preset="tiny", seed=seed)
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"--num-samples must be an integer in \[1, 300000\]"):
        generate(out, num_samples=10**9, preset="tiny")  # (was a silent hang building the plan)
    assert not out.exists()
    # a stamp left by a run that produced no sample does not block a rerun
    out.mkdir()
    (out / ".generate.json").write_text(json.dumps({"seed": 99}))
    man = generate(out, num_samples=1, preset="tiny", seed=1)
    assert man["num_samples"] == 1 and not (out / ".generate.json").exists()


def test_generate_cli_bad_seed(tmp_path):
    refused(
        cli(
            "dataset",
            "generate",
            "--output-dir",
            str(tmp_path / "g"),
            "--num-samples",
            "2",
            "--preset",
            "tiny",
            "--seed",
            "-1",
        ),
        "--seed must be an integer",
    )
    assert not (tmp_path / "g").exists()


# -- 3. dataset generate --config: every field's type and range, messages naming the file -------------


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("jitter: -1", "jitter must be a finite number in [0, 1]"),
        ("jitter: 100", "jitter must be a finite number"),
        ("jitter: .nan", "jitter must be a finite number"),
        ("log_every_steps: x", "log_every_steps must be an integer"),
        ("log_every_steps: -3", "log_every_steps must be an integer"),
        ("keep_raw: maybe", "keep_raw must be true or false"),
        ("splits: {train: .inf, val: 0, test: 1}", "splits must map"),
        ("workloads: {rate: [1, .inf]}", "workloads.rate must be a [min, max] pair of finite numbers"),
        ("num_samples: true", "num_samples must be a positive integer"),
    ],
)
def test_generate_config_fields(tmp_path, line, needle):
    c = tmp_path / "c.yaml"
    c.write_text(f"base: tiny\n{line}\n")
    with pytest.raises(ConfigError) as ei:
        generate(tmp_path / "g", num_samples=2, config=c)
    msg = str(ei.value)
    assert msg.startswith(f"{c}: ") and needle in msg, msg
    assert not (tmp_path / "g").exists()


def test_generate_config_yaml_error_is_one_line(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text("base: tiny\n\tjitter: 1\n")
    with pytest.raises(ConfigError) as ei:
        generate(tmp_path / "g", num_samples=2, config=c)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{c}: not valid YAML") and "line 2, column 1" in msg, msg


# -- 4. the trace and tokenizer API: types and ranges --------------------------------------------------


@pytest.mark.parametrize("paths", [None, 5, [[]], [1]], ids=repr)
def test_trace_load_bad_paths(paths):
    with pytest.raises(ConfigError, match="path"):
        trace.load(paths)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_trace_load_of_an_endless_device_fails_at_its_first_bytes():
    """/dev/zero has no size: it was read until memory ran out (and said "out of memory"). Its first
    bytes open no trace, so it is refused there, as a file of zeros is."""
    import time

    from teller.errors import TraceFormatError

    t0 = time.monotonic()
    with pytest.raises(TraceFormatError, match=r"^/dev/zero: at byte 0: not a Chrome trace") as e:
        trace.load("/dev/zero")
    assert isinstance(e.value, ValueError) and time.monotonic() - t0 < 10


def test_trace_load_reads_a_trace_through_a_pipe(tmp_path):
    """A pipe (`teller trace summary <(zcat t.json.gz)`) has no size either: its first bytes open a
    trace, so it is read to its end."""
    src = Path(__file__).parent / "data" / "traces" / "mi250_rocm62_tiny.kineto.json.gz"
    fifo = tmp_path / "t.json.gz"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(src.read_bytes())

    # (a daemon: were the load to fail before opening the FIFO, the writer blocked in open() must not
    # hold pytest at exit)
    w = threading.Thread(target=feed, daemon=True)
    w.start()
    tr = trace.load(str(fifo))
    w.join()
    assert len(tr) == len(trace.load(str(src)))


def test_trace_load_step_names_and_normalize(sample):
    for bad in (5, [1], "", [""], b"x"):
        with pytest.raises(ConfigError, match="step_names"):
            trace.load(sample, step_names=bad, warn=False)
    # one string is one pattern, not a list of characters ('*' alone would match every range)
    one = trace.load(sample, step_names="engine_step*", warn=False)
    lst = trace.load(sample, step_names=["engine_step*"], warn=False)
    assert len(one.steps()) == len(lst.steps())
    for bad in (
        {"max_len": "x"},
        {"strip_namespaces": "yes"},
        ["a"],
        "s",
        {"max_len": -1},
        {"max_len": 2**70},
    ):
        with pytest.raises(ConfigError, match="normaliz"):
            trace.load(sample, normalize=bad, warn=False)
    assert len(trace.load(sample, normalize={"max_len": np.int64(20)}, warn=False))


def test_trace_methods_check_ranges(tr):
    n = len(tr.steps())
    for bad in (-1, n, 999):
        with pytest.raises(
            ConfigError, match=rf"step {bad} out of range: the trace has {n} step\(s\) \(0..{n - 1}\)"
        ):
            tr.tree(bad)
    for bad in ("a", 1.5, True):
        with pytest.raises(ConfigError, match="step must be an integer"):
            tr.tree(bad)
    with pytest.raises(ConfigError, match="top must be an integer >= 0, got -1"):
        tr.summary(-1)
    assert tr.summary(2**70)["top_kernels"]  # (a large top: every kernel, not an OverflowError)
    with pytest.raises(ConfigError, match="max_lines must be an integer >= 0, got -5"):
        tr.tree(0).render(max_lines=-5)
    t = tr.tree(0)
    out = t.render(max_lines=3).splitlines()
    assert len(out) == 4 and out[-1] == f"... ({len(t) - 3} more)"


def test_tokenizer_encode_decode_bad_input(tmp_path):
    tok = tpe.load(GOLDEN)
    for bad in (None, 5, b"abc", np.array([1, 2]), {"a": 1}, [["a"], "b"], [["a", 1]]):
        with pytest.raises(TokenizerError, match="encode takes"):
            tok.encode(bad)
    assert len(tok.encode(["annotation:step"])) == len(tok.encode([["annotation:step"]])) == 1
    for bad in ("ab", [1.5], [[1]], None, 5):
        with pytest.raises(TokenizerError, match="decode takes"):
            tok.decode(bad)
    assert tok.decode([]) == [] and len(tok.decode(np.array([1, 2]))) == 2
    with pytest.raises(TokenizerError, match="a symbol name must be a string"):
        tok.symbol_id(5)
    f = tmp_path / "file"
    f.write_text("keep")
    with pytest.raises(TellerIOError, match="exists and is not a directory"):
        tok.save(f)
    assert f.read_text() == "keep"
    with pytest.raises(ConfigError, match="tpe.load takes a directory or file path"):
        tpe.load(None)


# -- 5. tpe encode: --step range-checked, honoured with --json; --max-tokens >= 1 -----------------------


def test_tpe_encode_step(sample, tr):
    n = len(tr.steps())
    # (trace tree says which trace too)
    refused(cli("trace", "tree", str(sample), "--step", "9999"), f"{sample}: step 9999 out of range")
    for bad in ("-1", "9999"):
        refused(
            cli("tpe", "encode", str(sample), "--tokenizer-dir", str(GOLDEN), "--step", bad),
            f"step {bad} out of range: the trace has {n} step(s)",
        )
        refused(cli("tpe", "encode", str(sample), "--tokenizer-dir", str(GOLDEN), "--step", bad, "--json"))
    refused(cli("tpe", "encode", str(sample), "--tokenizer-dir", str(GOLDEN), "--max-tokens", "0"))
    r = cli("tpe", "encode", str(sample), "--tokenizer-dir", str(GOLDEN), "--step", "1", "--json")
    assert r.exit_code == 0, r.output
    one = json.loads(r.stdout)
    full = json.loads(cli("tpe", "encode", str(sample), "--tokenizer-dir", str(GOLDEN), "--json").stdout)
    a, b = full["segment_starts"][1], full["segment_starts"][2]
    assert one["step"] == 1 and one["ids"] == full["ids"][a:b] and len(one["features"]) == b - a


# -- 6. negative limits ----------------------------------------------------------------------------------


def test_negative_limits(sample, dataset):
    refused(cli("trace", "tree", str(sample), "--max-lines", "-5"), "--max-lines")
    refused(cli("dataset", "validate", str(dataset), "--max-problems", "-1"), "--max-problems")


# -- 7. output directories that are files: refused before any work ------------------------------------


def test_output_dir_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    r = cli("collect", "--", "true", env={"TELLER_TRACE_DIR": str(f)})
    refused(r, f"{f}: exists and is not a directory")
    refused(cli("dataset", "collect-cpu", "--output-dir", str(f)), f"{f}: exists and is not a directory")
    refused(
        cli("dataset", "collect-cpu", "--output-dir", str(f / "sub")), f"{f}: exists and is not a directory"
    )
    with pytest.raises(TellerIOError, match="exists and is not a directory"):
        generate(f, num_samples=1, preset="tiny")
    assert f.read_text() == "keep"


# -- 8. a dataset directory given to trace summary ------------------------------------------------------


def test_trace_summary_of_a_dataset_dir(dataset):
    with pytest.raises(EmptyTraceError, match="a dataset directory") as ei:
        trace.load(dataset)
    assert str(dataset / "s000000" / "trace.json") in str(ei.value)
    refused(cli("trace", "summary", str(dataset)), "a dataset directory", "s000000")
    assert isinstance(ei.value, TellerError)


def test_make_output_dir_names_what_it_could_not_create(tmp_path):
    """One wording wherever a command creates its output directory (collect, generate, collect-cpu,
    train, tpe save): the path, what it is for, and the OS's reason."""
    from teller._io import make_output_dir

    assert make_output_dir(tmp_path / "a" / "b").is_dir()
    assert make_output_dir(tmp_path / "a" / "b").is_dir()  # (already there: fine)
    (tmp_path / "f").write_text("x")
    with pytest.raises(TellerIOError, match=r"f/run: cannot create the run directory: \S"):
        make_output_dir(tmp_path / "f" / "run", "run directory")


# -- 5. found by an audit (session 33) -------------------------------------------------------------


def test_paths_that_are_not_utf8_are_named(tmp_path, sample):
    # a file name whose bytes are not UTF-8 (Python holds them as surrogate escapes): named, not a
    # UnicodeEncodeError from the binding; in a directory, not read under another ("lossy") name
    import os
    import shutil

    bad = os.fsdecode(bytes(tmp_path) + b"/n\xffm.json")
    shutil.copyfile(sample, bad)
    with pytest.raises(TellerIOError, match="not valid UTF-8") as e:
        trace.load(bad)
    assert isinstance(e.value, OSError) and "n\ufffdm.json" in str(e.value)
    d = tmp_path / "dir"
    d.mkdir()
    shutil.copyfile(sample, os.fsdecode(bytes(d) + b"/t\xff.json"))
    with pytest.raises(TellerError, match="file name is not valid UTF-8"):
        trace.load(d)
    tr = trace.load(sample, warn=False)
    with pytest.raises(TellerIOError, match="not valid UTF-8"):
        tr.to_chrome(os.fsdecode(bytes(tmp_path) + b"/o\xff.json"))
    r = cli("trace", "summary", bad)
    assert r.exit_code == 2 and "not valid UTF-8" in r.output


def test_to_chrome_checks_highlight(tmp_path, tr):
    out = tmp_path / "o.json"
    n = len(tr)
    for bad, needle in (
        ([-1], rf"highlight\[0\] = -1 is not an event of this trace \(0..{n - 1}\)"),
        ([0, n], rf"highlight\[1\] = {n} is not an event"),
        (["a"], r"highlight\[0\] must be an event index \(int\), got str"),
        ([True], r"highlight\[0\] must be an event index"),
        (5, "highlight must be a sequence of event indices"),
    ):
        with pytest.raises(ConfigError, match=needle):
            tr.to_chrome(out, highlight=bad)
        assert not out.exists()
    tr.to_chrome(out, highlight=np.array([0, n - 1]))
    assert out.is_file()


def test_output_under_a_file_says_so(tmp_path, tr):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(TellerIOError, match=r"afile: exists and is not a directory"):
        tr.to_chrome(f / "out.json")
    with pytest.raises(TellerError, match="no such file or directory"):
        tr.to_chrome(tmp_path / "nodir" / "out.json")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            lambda d: d["merges"].__setitem__(0, [-1, 1]),
            r"merges\[0\] = \[-1, 1\]: token ids must be in 0\.\.",
        ),
        (lambda d: d["merges"].__setitem__(0, [10**9, 1]), r"merges\[0\] = \[1000000000, 1\]: token ids"),
        (lambda d: d["merges"].__setitem__(0, [1, 2, 3]), r"merges\[0\] must be a pair of token ids"),
        (lambda d: d["merges"].__setitem__(0, ["a", "b"]), r"merges\[0\] must be a pair of token ids"),
        (lambda d: d["merges"].__setitem__(0, [True, 1]), r"merges\[0\] must be a pair of token ids"),
        # merge k may only join earlier tokens (the base symbols and merges 0..k-1)
        (lambda d: d["merges"].__setitem__(0, [len(d["base_vocab"]), 0]), r"merges\[0\] = .*: token ids"),
        (lambda d: d.__setitem__("version", "1"), r"field 'version' must be an integer .*got str '1'"),
        (
            lambda d: d["settings"].__setitem__("normalize", {"max_len": -5}),
            r"settings\['normalize'\]: normalization option 'max_len' must be an integer",
        ),
        # used at the first encode, so said at load, naming the file
        (
            lambda d: d["settings"].__setitem__("close_layers", ["nope"]),
            r"settings\['close_layers'\]: unknown layer 'nope'",
        ),
        (lambda d: d.__setitem__("merge_counts", d["merge_counts"][:1]), r"merge_counts has 1 entries for 4"),
        (lambda d: d["merge_counts"].__setitem__(0, -1), r"merge_counts\[0\] must be a non-negative"),
        (
            lambda d: d["settings"].__setitem__("min_frequency", "x"),
            r"'min_frequency'\] must be an integer >= 1",
        ),
        (
            lambda d: d["settings"].__setitem__("max_token_events", -3),
            r"'max_token_events'\] must be .* or null",
        ),
    ],
)
def test_tokenizer_file_fields_are_checked(tmp_path, edit, needle):
    d = json.loads((GOLDEN / "tokenizer.json").read_text())
    assert d["merges"], "the golden tokenizer has merges"
    edit(d)
    (tmp_path / "tokenizer.json").write_text(json.dumps(d))
    with pytest.raises(TokenizerError, match=needle) as e:
        tpe.load(tmp_path)
    assert isinstance(e.value, ValueError) and str(tmp_path / "tokenizer.json") in str(e.value)


def test_step_names_that_match_nothing_are_said(sample):
    tr = trace.load(sample, step_names=["zzz*"], warn=False)
    assert any("no range matches the step patterns" in w and "zzz*" in w for w in tr.warnings)
    with pytest.warns(Warning, match="no range matches the step patterns"):
        trace.load(sample, step_names=["zzz*"])
    assert not any("step patterns" in w for w in trace.load(sample, warn=False).warnings)  # (defaults)


# --- outputs: what is at the path is respected; errors name the path and subclass the right built-in


def _fifo_reader(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


def test_outputs_write_into_a_fifo_in_place(tmp_path, tr):
    """A rename over a named pipe (or /dev/null, a device) would replace the node with a file."""
    for write in (lambda p: tr.to_chrome(p), lambda p: write_atomic(p, b"hello")):
        fifo = tmp_path / "pipe.json"
        os.mkfifo(fifo)
        t, got = _fifo_reader(fifo)
        write(fifo)
        t.join(10)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
        assert got and got[0] and not list(tmp_path.glob(".*tmp*")), got
        fifo.unlink()


def test_outputs_write_through_links_and_keep_modes(tmp_path, tr):
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to("real.json")
    tr.to_chrome(link)
    assert link.is_symlink() and json.loads(real.read_text())["traceEvents"]
    assert stat.S_IMODE(real.stat().st_mode) == 0o600, "a private file became readable by others"
    write_atomic(link, "x")
    assert link.is_symlink() and real.read_text() == "x" and stat.S_IMODE(real.stat().st_mode) == 0o600


def test_io_errors_subclass_the_matching_builtin(tmp_path, tr):
    e = TellerIOError("p: cannot read it (Permission denied)", path="p", errno=errno.EACCES)
    assert (
        type(e) is TellerPermissionError and isinstance(e, PermissionError) and isinstance(e, TellerIOError)
    )
    assert (e.errno, e.strerror, str(e), e.path) == (
        13,
        os.strerror(13),
        "p: cannot read it (Permission denied)",
        "p",
    )
    assert type(TellerIOError("plain")) is TellerIOError and TellerIOError("plain").errno is None
    with pytest.raises(TellerIsADirectoryError) as d:
        tr.to_chrome(tmp_path)
    assert isinstance(d.value, IsADirectoryError) and d.value.errno == errno.EISDIR
    assert str(d.value).startswith(f"{tmp_path}: ")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    src = tmp_path / "in.json"
    tr.to_chrome(src)
    # (in a process that obeys permission bits: root's would write into the read-only directory)
    code = """
import errno, sys
from pathlib import Path
from teller import trace
from teller._io import write_atomic
from teller.errors import TellerPermissionError
tr, out = trace.load(sys.argv[1], warn=False), Path(sys.argv[2]) / "out.json"
for write in (lambda p: tr.to_chrome(p), lambda p: write_atomic(p, "x")):
    try:
        write(out)
    except TellerPermissionError as e:
        assert e.errno == errno.EACCES and str(e).startswith(f"{out}: "), str(e)
        assert ".out.json" not in str(e) and "not writable" in str(e), str(e)
        print("refused:", e)
    else:
        raise SystemExit(f"{out} was written")
"""
    try:
        r = run_permission_checked(code, str(src), str(ro))
        assert r.returncode == 0 and r.stdout.count("refused:") == 2, r.stdout + r.stderr
        assert not (ro / "out.json").exists()
    finally:
        ro.chmod(0o755)


def test_unstarted_raw_files_in_a_run_directory_are_skipped(tmp_path):
    """A process killed between creating its raw file and writing its HEADER leaves an empty (or
    all-zero, pre-allocated) file: the run's other files are read, that one is named in a warning."""
    good = sorted((DATA / "gpu" / "h200_llama_tiny" / "raw").glob("*.tmsgpack"))
    assert good
    run = tmp_path / "run"
    (run / "raw").mkdir(parents=True)
    for f in good:
        shutil.copy(f, run / "raw" / f.name)
    (run / "raw" / "teller-h-999-0.tmsgpack").write_bytes(b"")
    (run / "raw" / "teller-h-998-0.tmsgpack").write_bytes(bytes(65536))
    (run / "raw" / "teller-h-997-0.tmsgpack").write_bytes(good[0].read_bytes()[:5])  # cut in its HEADER
    whole = trace.load(good, warn=False)
    t = trace.load(run, warn=False)
    assert len(t) == len(whole)
    skipped = [w for w in t.warnings if "skipped (a process that stopped" in w]
    assert sorted(Path(w.split(":")[0]).name for w in skipped) == [
        "teller-h-997-0.tmsgpack",
        "teller-h-998-0.tmsgpack",
        "teller-h-999-0.tmsgpack",
    ]
    # named on its own, or the only file of a run, it is still an error
    with pytest.raises(EmptyTraceError):
        trace.load(run / "raw" / "teller-h-999-0.tmsgpack")
    only = tmp_path / "only"
    (only / "raw").mkdir(parents=True)
    (only / "raw" / "teller-h-1-0.tmsgpack").write_bytes(b"")
    with pytest.raises(EmptyTraceError, match="teller-h-1-0.tmsgpack"):
        trace.load(only)


def test_the_same_file_twice_is_read_once(sample):
    t = trace.load([sample, Path(str(sample.parent) + "/./" + sample.name)], warn=False)
    assert len(t) == len(trace.load(sample, warn=False))
    assert any("the same file as" in w and "read once" in w for w in t.warnings)


def test_a_fifo_is_read_as_a_file(tmp_path, sample):
    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    data = sample.read_bytes()

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    got = trace.load(fifo, warn=False)
    t.join(10)
    assert len(got) == len(trace.load(sample, warn=False))


def test_tpe_load_of_an_unsearchable_directory(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    shutil.copy(GOLDEN / "tokenizer.json", d / "tokenizer.json")
    d.chmod(0o600)  # readable listing, but no search: tokenizer.json cannot be opened or stat'ed
    # (in a process that obeys permission bits: root's searches any directory)
    code = """
import sys
from teller import tpe
from teller.errors import TellerPermissionError
try:
    tpe.load(sys.argv[1])
except TellerPermissionError as e:
    assert "tokenizer.json" in str(e), str(e)
    print("refused:", e)
"""
    try:
        r = run_permission_checked(code, str(d))
        assert r.returncode == 0 and "refused:" in r.stdout, r.stdout + r.stderr
    finally:
        d.chmod(0o755)


def test_outputs_inside_the_input_dataset_are_refused(dataset, tmp_path):
    from teller.data.tokenize import tokenize_dataset

    before = sorted(p.name for p in dataset.iterdir())
    with pytest.raises(ConfigError, match=r"inside the dataset .*write --output-dir elsewhere"):
        tokenize_dataset(dataset, GOLDEN, dataset)
    r = cli(
        "tpe", "train", "--data-dir", str(dataset), "--output-dir", str(dataset / "tok"), "--num-merges", "3"
    )
    assert r.exit_code == 2 and "inside --data-dir" in r.output, r.output
    assert sorted(p.name for p in dataset.iterdir()) == before


def test_cli_errors_name_options_not_api_arguments(dataset, tmp_path):
    train = ("tpe", "train", "--data-dir", str(dataset), "--output-dir", str(tmp_path / "t"))
    for args, said in (
        ((*train, "--vocab-size", "-5"), "--vocab-size must be an integer >= 0"),
        (
            (*train, "--num-merges", "3", "--vocab-size", "9"),
            "give exactly one of --vocab-size and --num-merges",
        ),
        (
            ("dataset", "collect-cpu", "--output-dir", str(tmp_path / "c"), "--num-samples", "0"),
            "--num-samples must be >= 1",
        ),
    ):
        r = cli(*args)
        assert r.exit_code == 2 and said in r.output, r.output


def test_writing_to_our_own_stdout_shares_its_position(tmp_path, sample):
    """`-o /dev/stdout` with stdout redirected to a file: the trace goes where stdout is, and what is
    printed next follows it (a reopened path has a position of its own and was overwritten)."""
    import subprocess
    import sys

    code = (
        "import sys; from teller._io import write_atomic; import teller.trace as T\n"
        "print('before', flush=False)\n"
        "write_atomic('/dev/stdout', 'PY\\n')\n"
        f"T.load({str(sample)!r}, warn=False).to_chrome('/dev/stdout')\n"
        "print('after')\n"
    )
    out = tmp_path / "out.txt"
    link = tmp_path / "link"
    link.symlink_to("/dev/stdout")  # (a chain of links ending in a descriptor alias: the same)
    code += f"write_atomic({str(link)!r}, 'LINK\\n')\n"
    with open(out, "wb") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, timeout=60)
    text = out.read_text()
    assert text.startswith("before\nPY\n{") and text.endswith("}\nafter\nLINK\n"), text[:80] + text[-80:]
    assert json.loads(text[len("before\nPY\n") : -len("after\nLINK\n")])["traceEvents"]


def test_teller_own_directories_are_named_when_read_as_a_capture(tmp_path):
    """(from a review) A checkpoint, shards or tokenizer directory given where a capture goes said
    "config.json: at byte 0: not a Chrome trace": what the directory is, and where it goes, now."""
    from teller.errors import TraceFormatError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {}}))
    (run / "model.safetensors").write_bytes(b"\0" * 8)
    shards = tmp_path / "tok"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"format": "teller-shards"}))
    tok = tmp_path / "tpe"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps({"format": "teller-tpe"}))
    runs = tmp_path / "traces"
    (runs / "run-1").mkdir(parents=True)
    (runs / "run-1" / "run.json").write_text("{}")
    (runs / "run-1" / "trace.json").write_text('{"traceEvents": []}')
    for d, says in (
        (run, "a run directory of teller train, not a capture (give it as --checkpoint)"),
        (shards, "tokenized shards of teller tokenize, not a capture"),
        (tok, "a TPE tokenizer directory of teller tpe train, not a capture"),
        (runs, "a directory of 1 collected run(s) of teller collect, not one capture: give one run"),
    ):
        with pytest.raises(TraceFormatError, match=f"^{d}: {re.escape(says)}"):
            trace.load(d)
    # a dataset whose samples hold run.json too (`dataset collect-cpu`) is still a dataset
    ds = tmp_path / "cpu-ds"
    (ds / "s000000").mkdir(parents=True)
    (ds / "manifest.json").write_text(json.dumps({"format": "teller-dataset"}))
    (ds / "s000000" / "run.json").write_text("{}")
    (ds / "s000000" / "trace.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match=f"^{ds}: a dataset directory"):
        trace.load(ds)


def test_os_errors_say_the_systems_words_without_the_rust_suffix(tmp_path):
    """(from a review) Messages ended in "(os error 20)"; the errno is an attribute already."""
    from teller.errors import TellerNotADirectoryError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TellerNotADirectoryError) as e:
        trace.load(f / "sub")
    assert str(e.value) == f"{f / 'sub'}: Not a directory" and e.value.errno == errno.ENOTDIR
