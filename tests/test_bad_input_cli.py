"""Bad input at the command line and the tokenizer API: one line naming the path and what is wrong,
exit code 2, no traceback, and nothing already written overwritten (an input named as the output,
an output directory that is a file: refused before any work)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from teller import tpe
from teller.errors import TellerError, TellerIOError, TokenizerError

GOLDEN = Path(__file__).parent / "data" / "tpe" / "golden_tokenizer"
A100 = Path(__file__).parent / "data" / "traces" / "a100_nccl_2rank.kineto.json.gz"


def teller(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teller", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
    )


def refused(p: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, (n, p.stderr)


def test_convert_refuses_to_overwrite_its_input(tmp_path):
    t = tmp_path / "t.json.gz"
    t.write_bytes(A100.read_bytes())
    refused(teller("trace", "convert", str(t), "-o", str(t)), f"{t}: is one of the inputs")
    assert t.read_bytes() == A100.read_bytes()
    # (a run directory's raw file, reached through the directory, counts too)
    refused(teller("trace", "convert", str(tmp_path), "-o", str(t)), "is one of the inputs")
    refused(teller("trace", "convert", str(t), "-o", str(tmp_path)), "a directory")
    p = teller("trace", "convert", str(t), "-o", str(tmp_path / "out.json.gz"))
    assert p.returncode == 0, p.stderr


def test_convert_into_its_run_directory_can_be_rerun(tmp_path):
    """Only the files the loader reads are inputs: a run directory's own earlier conversion is not."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "gpu" / "h200_llama_tiny", run)
    for _ in range(2):
        p = teller("trace", "convert", str(run), "-o", str(run / "merged.json.gz"))
        assert p.returncode == 0, p.stderr
    raw = next((run / "raw").glob("*.tmsgpack"))
    refused(teller("trace", "convert", str(run), "-o", str(raw)), "is one of the inputs")


@pytest.mark.parametrize(
    "args",
    [
        ("results", "summarize", "RUN", "-o", "FILE"),
        ("evaluate", "--checkpoint", "RUN", "--split", "test", "-o", "FILE"),
        ("tpe", "train", "--data-dir", "DATA", "--output-dir", "FILE"),
        ("collect", "--trace-dir", "FILE", "--", "true"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_an_output_directory_that_is_a_file_is_refused_first(tmp_path, args):
    f = tmp_path / "afile"
    f.write_text("keep me")
    (tmp_path / "run").mkdir()
    sub = {"FILE": str(f), "RUN": str(tmp_path / "run"), "DATA": str(A100)}
    refused(teller(*[sub.get(a, a) for a in args]), f"{f}: exists and is not a directory")
    assert f.read_text() == "keep me"


def test_negative_counts_are_usage_errors():
    p = teller("trace", "summary", str(A100), "--top", "-1")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "--top" in p.stderr


def test_gzip_errors_read_path_colon_message(tmp_path):
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(A100.read_bytes()[:1000])
    p = teller("trace", "summary", str(cut))
    refused(p, f"{cut}: corrupt or truncated gzip stream")
    assert "::" not in p.stderr


def test_os_errors_on_a_path_are_one_line(tmp_path):
    # a tokenizer "file" that is a directory: TellerIOError from the API, one line from the CLI
    d = tmp_path / "tok"
    (d / "tokenizer.json").mkdir(parents=True)
    with pytest.raises(TellerIOError, match="tokenizer.json: not a file") as e:
        tpe.load(d)
    assert isinstance(e.value, OSError) and isinstance(e.value, TellerError)
    refused(teller("tpe", "encode", str(A100), "--tokenizer-dir", str(d)), "tokenizer.json: not a file")


def _golden() -> dict:
    return json.loads((GOLDEN / "tokenizer.json").read_text())


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["settings"].update(close_layers=5),
            r"settings\['close_layers'\] must be an array of strings",
        ),
        (lambda d: d["settings"].update(step_names="step*"), r"settings\['step_names'\] must be an array"),
        (lambda d: d["settings"].update(normalize=[1]), r"settings\['normalize'\] must be an object"),
        (lambda d: d.update(stats={}), r"stats lacks 'count', 'mean', 'std'"),
        (lambda d: d.update(stats=None), r"stats lacks"),
        (lambda d: d["stats"].update(mean="x"), r"stats\['mean'\] must be an array of numbers"),
        (lambda d: d["base_vocab"].append(7), r"base_vocab\[\d+\] must be a string, got int"),
    ],
)
def test_saved_tokenizer_fields_are_checked_at_load(tmp_path, change, message):
    """Fields the constructor takes and uses only later: wrong, they are named when the file loads,
    not as a TypeError at the first encode (or silently different features)."""
    d = _golden()
    change(d)
    (tmp_path / "tokenizer.json").write_text(json.dumps(d))
    with pytest.raises(TokenizerError, match=message):
        tpe.load(tmp_path)
    tpe.load(GOLDEN)  # (the unchanged file loads)


def test_decode_names_a_negative_id():
    tok = tpe.load(GOLDEN)
    with pytest.raises(TokenizerError, match=r"token id -1 at index 0 is out of range"):
        tok.decode([-1])
    with pytest.raises(TokenizerError, match=rf"token id {2**40} at index 0 is out of range"):
        tok.decode([2**40])
    assert tok.decode([]) == []


def test_collect_refuses_bad_inputs_and_leaves_no_empty_run(tmp_path):
    traces = tmp_path / "traces"
    for content in ("", "[{", b"\xff\xfe\x00garbage"):
        nv = tmp_path / "nvtx.json"
        nv.write_bytes(content.encode() if isinstance(content, str) else content)
        p = teller("collect", "--trace-dir", str(traces), "--nvtx-json", str(nv), "--", "true")
        refused(p, f"{nv}: ")
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library")
    refused(
        teller("collect", "--trace-dir", str(traces), "--so", str(junk), "--", "true"),
        f"{junk}: not a shared library",
    )
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")  # not executable
    # (as a shell: 126 cannot be executed, 127 not found)
    refused(teller("collect", "--trace-dir", str(traces), "--", str(script)), "cannot execute", code=126)
    refused(
        teller("collect", "--trace-dir", str(traces), "--", "no-such-command-xyz"),
        "command not found",
        code=127,
    )
    assert not list(traces.glob("run-*")) if traces.exists() else True


def test_damaged_fitted_baselines_are_named(tmp_path):
    import pickle

    from teller.errors import ConfigError
    from teller.models.baselines import load_baselines

    p = tmp_path / "baselines.pkl"
    with pytest.raises(FileNotFoundError, match="baselines.pkl: no fitted baselines"):
        load_baselines(p)
    for content, message in ((b"garbage", "not readable fitted baselines"), (b"", "EOFError")):
        p.write_bytes(content)
        with pytest.raises(ConfigError, match=message):
            load_baselines(p)
    p.write_bytes(pickle.dumps([1]))
    with pytest.raises(ConfigError, match="holds a list, not fitted baselines"):
        load_baselines(p)
    (tmp_path / "config.json").write_text('{"format": "teller-baselines", "data_dir": "x"}')
    refused(teller("evaluate", "--checkpoint", str(tmp_path)), "baselines.pkl: holds a list")


def test_doctor_refuses_a_cuda_home_that_is_not_a_directory(tmp_path):
    """An explicit --cuda-home naming nothing (a typo) is a usage error, not a table of 'not found'
    with exit 0; a directory without a toolkit is still reported (test_cli)."""
    missing = tmp_path / "cuda-12.4"
    refused(teller("doctor", "--cuda-home", str(missing)), f"--cuda-home {missing}: no such directory")
    f = tmp_path / "file"
    f.write_text("x")
    refused(teller("doctor", "--json", "--cuda-home", str(f)), "a file, not a directory")
