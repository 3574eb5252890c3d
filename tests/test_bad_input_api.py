"""Bad arguments to the Python API and the command line: a TellerError subclass (ConfigError,
TokenizerError, TellerIOError) naming the argument or file and what is wrong, never a raw
TypeError/OverflowError from deep inside, and nothing written before the refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from teller import tpe, trace
from teller.cli import app
from teller.data import generate
from teller.errors import ConfigError, EmptyTraceError, TellerError, TellerIOError, TokenizerError
from typer.testing import CliRunner

GOLDEN = Path(__file__).parent / "data" / "tpe" / "golden_tokenizer"


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
        ({"min_frequency": "x"}, "min_frequency must be an integer >= 1, got 'x'"),
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
        "error: max_token_events must be an integer",
    )
    refused(
        cli(
            "tpe", "train", "--data-dir", str(dataset), "--output-dir", str(tmp_path / "x"), "--step-name", ""
        ),
        "error: step_names[0] is an empty pattern",
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
    with pytest.raises(ConfigError, match=r"--num-samples must be an integer in \[1, 1000000\]"):
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
