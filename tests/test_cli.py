"""The command line, run as a user would (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import teller
from conftest import TRACES

FIX = str(TRACES / "b300_cuda13_moe.kineto.json.gz")


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "teller", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_version():
    out = run("--version").stdout
    assert teller.__version__ in out and teller.build_profile in out


def test_help_lists_commands():
    out = run("--help").stdout
    for cmd in ("doctor", "trace"):
        assert cmd in out
    out = run("trace", "--help").stdout
    for cmd in ("convert", "summary", "tree"):
        assert cmd in out


def test_command_lists_are_one_line_each():
    """A group's command list shows one short line per command (`short_help`, or a one-line first
    paragraph): rich keeps a docstring's line breaks there, so a long first paragraph would print
    as a broken block of text."""
    import inspect

    import typer.main
    from teller.cli import app

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            text = inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0]
            yield f"{prefix}{name}", text
            if hasattr(cmd, "commands"):
                yield from walk(cmd, f"{prefix}{name} ")

    rows = dict(walk(typer.main.get_command(app), ""))
    assert {"diagnose", "tokenize", "dataset generate", "train mot"} <= set(rows)
    bad = {k: v for k, v in rows.items() if not v or "\n" in v or len(v) > 110}
    assert not bad, bad
    out = run("--help").stdout
    assert "Name the likely root causes" in out


def test_doctor_json():
    rep = json.loads(run("doctor", "--json").stdout)
    assert rep["teller"] == teller.__version__
    assert rep["build_profile"] in ("release", "debug")
    assert set(rep["cuda"]) >= {"cuda_h", "cupti_h", "nvtx_h", "libcupti", "include_dirs"}
    assert "torch" in rep and "torch_cuda_available" in rep


def test_doctor_with_missing_cuda_home(tmp_path):
    rep = json.loads(run("doctor", "--json", "--cuda-home", str(tmp_path)).stdout)
    assert rep["cuda"]["cupti_h"] is None and rep["cuda"]["libcupti"] is None
    f = tmp_path / "afile"
    f.write_text("x")
    r = run("doctor", "--cuda-home", str(f), check=False)
    assert r.returncode == 2 and "a file, not a directory" in r.stderr


def test_a_cuda_home_variable_that_names_no_toolkit_is_said_and_ignored(tmp_path):
    import os

    for v, why in ((tmp_path / "nope", "no such directory"), (tmp_path, "no include/cuda.h under it")):
        env = {**os.environ, "CUDA_HOME": str(v)}
        p = subprocess.run(
            [sys.executable, "-m", "teller", "doctor", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        cuda = json.loads(p.stdout)["cuda"]
        assert cuda["notes"] == [f"$CUDA_HOME={v}: {why}" + ("; ignored" if why == "no such directory" else
                                 " (not a CUDA toolkit's root); ignored")]  # fmt: skip
        assert str(v) not in cuda["roots"]


def test_summary_json_keys():
    s = json.loads(run("trace", "summary", FIX, "--json").stdout)
    for k in ("events", "by_category", "steps", "gpu_events", "linked_gpu_events", "top_kernels", "devices"):
        assert k in s
    assert s["gpu_events"] == 30 and s["linked_gpu_events"] == 30


def test_convert_to_stdout_holds_the_trace_alone():
    p = run("trace", "convert", FIX, "-o", "/dev/stdout")
    assert json.loads(p.stdout)["traceEvents"] and "wrote /dev/stdout" in p.stderr.replace("\n", "")


def test_summary_human():
    out = run("trace", "summary", FIX).stdout
    assert "events per layer" in out and "GPU busy/idle" in out


def test_summary_breakdown_headers_fit_80_columns():
    """At 80 columns the breakdown table's headers are whole ("comm overlapped" and "device" were cut
    to "overl…" and "devi…"), its numbers too, and the table is no wider than the terminal."""
    import os

    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run(
        [sys.executable, "-m", "teller", "trace", "summary", str(TRACES / "a100_nccl_2rank.kineto.json.gz")],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("where each GPU's time went"))
    table = lines[at + 1 : at + 8]
    assert all(len(ln.rstrip()) <= 80 for ln in table)
    assert not any("…" in ln for ln in table), "\n".join(table)
    head = " ".join(table[1:4])
    for word in (
        "GPU",
        "compute",
        "comm",
        "overlap",
        "memory",
        "idle:",
        "host",
        "launch",
        "queued",
        "unlinked",
    ):
        assert f" {word} " in head, word


def test_summary_gpu_tables_with_long_per_rank_names_never_cut_a_number(tmp_path):
    """Two ranks' files with long names: the GPU tables were squeezed until "157.500 ms" folded over
    two lines and both names were cut to one prefix ("0 of rank0_wo…"), or at 100 columns folded
    inside the table. Where the table does not fit whole, names included, it is listed per GPU, each
    name whole and every value whole on one line."""
    import os
    import shutil

    files = []
    for r in (0, 1):
        f = tmp_path / f"rank{r}_worker_with_a_long_hostname.kineto.json.gz"
        shutil.copy(TRACES / "a100_nccl_2rank.kineto.json.gz", f)
        files.append(str(f))
    s = json.loads(run("trace", "summary", *files, "--json").stdout)
    busy = {_fmt(d["busy_ns"]) for d in s["devices"]}
    for cols in ("60", "80", "100", "200"):
        out = subprocess.run(
            [sys.executable, "-m", "teller", "trace", "summary", *files],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": cols},
            check=True,
        ).stdout
        block = out[out.index("GPU busy/idle") : out.index("top 10 kernels")]
        assert "…" not in block, block
        # (a name longer than the line has a line of its own, left to the terminal to wrap)
        named = {f"  {i}. GPU 0 of rank{r}_" for i, r in ((1, 0), (2, 1))}
        rest = [ln for ln in block.splitlines() if not any(ln.startswith(n) for n in named)]
        assert all(len(ln.rstrip()) <= int(cols) for ln in rest), block
        for r in (0, 1):  # (whole: on one line)
            assert f"rank{r}_worker_with_a_long_hostname.kineto.json.gz" in block, block
        # every value on one line, whole (in a table row or as a busy=... field)
        assert all(b in block for b in busy), (busy, block)
        if cols != "200":
            assert "busy=" in block and "idle_host=" in block and "GPU 0 of rank1_" in block, block
        else:
            assert "busy=" not in block and "┃" in block, block


def _fmt(ns: int) -> str:
    from teller.cli import _fmt_ns

    return _fmt_ns(ns)


def test_convert_then_summary(tmp_path):
    out = tmp_path / "o.json.gz"
    p = run("trace", "convert", FIX, "-o", str(out))
    # (the note is on stderr: with `-o /dev/stdout` stdout holds the trace alone)
    assert str(out) in p.stderr.replace("\n", "") and not p.stdout
    s1 = json.loads(run("trace", "summary", FIX, "--json").stdout)
    s2 = json.loads(run("trace", "summary", str(out), "--json").stdout)
    assert s1["events"] == s2["events"] and s1["by_category"] == s2["by_category"]


def test_summary_keeps_collector_notes_apart_from_warnings(tmp_path):
    from teller.rawfmt import RawWriter

    f = tmp_path / "p.tmsgpack"
    w = RawWriter(f, pid=7, clock_sync=(0, 0))
    w.span("runtime", "cudaLaunchKernel_v7000", tid=7, start=10, end=20)
    w.diag(5, 0, "CUPTI version 130001 (built against 130001)")
    w.diag(6, 1, "cuptiActivityEnable(DRIVER): not supported")
    w.close()
    out = run("trace", "summary", str(f)).stdout
    notes, _, warns = out.partition("parse warning(s):")
    assert "1 collector note(s):" in notes and "CUPTI version 130001" in notes
    assert "collector info" not in out
    assert "collector warning: cuptiActivityEnable(DRIVER)" in warns and "CUPTI version" not in warns
    # the API version suffix is dropped at load, as Kineto names the call
    import teller.trace as T

    tr = T.load(f, warn=False)
    assert [tr.name_of(i) for i in range(len(tr.ts))] == ["cudaLaunchKernel"]
    # load(warn=True) raises the warning, not the note (both stay in Trace.warnings)
    import warnings

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        tr = T.load(f)
    assert [str(w.message).split(": ", 1)[1] for w in got] == [
        "collector warning: cuptiActivityEnable(DRIVER): not supported"
    ]
    assert len(tr.warnings) == 2


def test_tree():
    out = run("trace", "tree", str(TRACES / "mi250_rocm62_tiny.kineto.json.gz"), "--max-lines", "20").stdout
    assert "ProfilerStep#1" in out and "runtime: hipMemcpyWithStream" in out


def test_errors_are_clean(tmp_path):
    p = run("trace", "summary", str(tmp_path / "missing.json"), check=False)
    assert p.returncode == 2
    assert "missing.json" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": "x"}]}')
    p = run("trace", "convert", str(bad), "-o", str(tmp_path / "o.json"), check=False)
    assert p.returncode == 2 and "bad.json" in p.stderr and "'ts' must be a number" in p.stderr
    assert not (tmp_path / "o.json").exists()
    p = run("trace", "tree", FIX, "--step", "99", check=False)
    assert p.returncode == 2 and "out of range" in p.stderr


def test_tpe_train_encode_inspect(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("mi250_rocm62_tiny.kineto.json.gz", "b300_cuda13_moe.kineto.json.gz"):
        (data / name).write_bytes((TRACES / name).read_bytes())
    p = run(
        "tpe", "train", "--data-dir", str(data), "--output-dir", str(tmp_path / "tok"), "--vocab-size", "300"
    )
    tokdir = p.stdout.strip().splitlines()[-1]
    assert (tmp_path / "tok") in __import__("pathlib").Path(tokdir).parents
    assert (__import__("pathlib").Path(tokdir) / "tokenizer.json").exists()
    # a training finishing in a second whose directory is taken gets a directory of its own (claimed
    # by mkdir, so also against a second process doing the same) and leaves the other's alone
    import time as _t

    now = _t.time()
    taken = [tmp_path / "tok" / _t.strftime("tpe-%Y%m%d-%H%M%S", _t.localtime(now + d)) for d in range(120)]
    for d in taken:
        d.mkdir(exist_ok=True)
        (d / "theirs").write_text("x")
    p2 = run(
        "tpe", "train", "--data-dir", str(data), "--output-dir", str(tmp_path / "tok"), "--vocab-size", "300"
    )
    mine = __import__("pathlib").Path(p2.stdout.strip().splitlines()[-1])
    assert mine.name.endswith("-1") and (mine / "tokenizer.json").exists() and not (mine / "theirs").exists()
    first = __import__("pathlib").Path(tokdir)
    assert all(sorted(x.name for x in d.iterdir()) == ["theirs"] for d in taken if d not in (mine, first))
    out = run(
        "tpe", "encode", "--tokenizer-dir", tokdir, str(data / "mi250_rocm62_tiny.kineto.json.gz")
    ).stdout
    assert "tokens for" in out and "step 0" in out and "▸" in out
    # the count names what it counts: the steps' events and their range ends (<close>)
    assert __import__("re").search(r"tokens for (\d+) base symbols \((\d+) events, (\d+) range ends;", out)
    # the columns are named: the second number of a row is the token id, not a count of events
    lines = out.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("step 0"))) + 1
    assert lines[head].split() == [
        "#",
        "token",
        "id",
        "positions",
        "max",
        "log-dur",
        "dur",
        "z",
        "call-chain",
        "fragment",
    ]
    row = lines[head + 1].split()
    assert row[0] == "0" and row[1].isdigit() and __import__("re").fullmatch(r"0\.\.\d+", row[2]), row
    # a directory of several traces is not one trace (tpe train took each file apart): refused
    p = run("tpe", "encode", "--tokenizer-dir", tokdir, str(data), check=False)
    err = " ".join(p.stderr.split())
    assert p.returncode == 2 and "a directory of 2 trace files, not a run directory" in err
    assert "give one file" in err and not p.stdout
    # fewer merges than asked: said, with the reason, in the options' own spelling
    p = run(
        "tpe", "train", "--data-dir", str(data), "--output-dir", str(tmp_path / "tok"), "--num-merges", "5",
        "--min-frequency", "1000000",
    )  # fmt: skip
    err = " ".join(p.stderr.split())
    assert "warning: training made 0 of the 5 merges asked (--num-merges 5)" in err, p.stderr
    assert "frequency >= --min-frequency (1000000)" in err
    enc = json.loads(
        run(
            "tpe",
            "encode",
            "--tokenizer-dir",
            tokdir,
            "--json",
            str(data / "mi250_rocm62_tiny.kineto.json.gz"),
        ).stdout
    )
    assert len(enc["offsets"]) == len(enc["ids"]) + 1
    out = run("tpe", "inspect", tokdir, "--top", "5").stdout
    assert "merged tokens" in out and "▸" in out
    bad = run("tpe", "inspect", str(tmp_path / "nope"), check=False)
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_piped_output_is_wide_unless_columns_says_otherwise():
    """Redirected output (a file, a CI log) is 160 columns, not rich's 80, so tables keep whole
    kernel names; COLUMNS, where set, decides."""
    import os

    code = "import teller.cli as c; print(c.console.width)"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert piped.stdout.strip() == "160", piped.stderr
    env["COLUMNS"] = "100"
    told = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert told.stdout.strip() == "100", told.stderr


def test_output_cut_short_by_its_reader_ends_quietly(tmp_path):
    """`teller ... | head`: no error and no traceback once the reader has gone, whether the output was
    printed (summary) or written as a file to /dev/stdout (convert)."""
    a100 = TRACES / "a100_nccl_2rank.kineto.json.gz"
    teller_cmd = f"{sys.executable} -m teller"
    for cmd in (f"trace summary {a100} --json", f"trace convert {a100} -o /dev/stdout"):
        sh = f"{teller_cmd} {cmd} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}"
        p = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        # (0 where everything fitted in the pipe before the reader left)
        assert p.stdout.split()[0] in ("0", "1") and p.stderr == "", (cmd, p.stdout, p.stderr)


def test_text_from_a_trace_is_never_rich_markup(tmp_path):
    """Names, categories and paths are the trace's and the user's text: "[experts=16]" vanished and
    "[/]" raised rich's MarkupError (a traceback; after `collect`, the program's exit status lost)."""
    evs = [
        {"ph": "X", "name": "step[/bold]", "cat": "io[/]", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "name": "MoE[experts=16]", "cat": "io[bold]x", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(evs))
    out = run("trace", "tree", str(p), "--step-name", "step*").stdout
    assert "step 0: step[/bold]" in out
    out = run("trace", "summary", str(p)).stdout
    assert "io[/]" in out and "io[bold]x" in out
    d = tmp_path / "td[/]"
    r = run("collect", "--trace-dir", str(d), "--", sys.executable, "-c", "raise SystemExit(3)", check=False)
    assert r.returncode == 3, r.stderr
    assert f"run directory: {d}" in r.stderr.replace("\n", "")


def test_an_unwritable_output_is_refused_before_the_work(tmp_path, monkeypatch):
    """evaluate ran the whole evaluation, then failed to write beside a checkpoint this user cannot
    write; an --output-dir under a read-only directory likewise failed only at the end. (In-process,
    with os.access saying no for two directories: root writes anywhere.)"""
    import os

    from teller.cli import app
    from typer.testing import CliRunner

    ck, ro = tmp_path / "ck", tmp_path / "ro"
    ck.mkdir()
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m, **kw: False if str(p) in (str(ck), str(ro)) else real(p, m, **kw)
    )
    r = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(ck)])
    assert r.exit_code == 2 and "not writable" in r.output and "pass -o DIR" in r.output, r.output
    r = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(tmp_path), "-o", str(ro / "out")])
    assert r.exit_code == 2 and "not writable (--output" in r.output, r.output
    assert not (ro / "out").exists()
