"""`teller collect` and terminals: the program's output streams are pseudo-terminals where teller's
are terminals (or with --pty), so that it buffers, colours and sizes its output as it would alone."""

from __future__ import annotations

import io
import json
import os
import select
import shlex
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import needs_shim
from teller.collect import launcher, shim

pytestmark = needs_shim()
termios = pytest.importorskip("termios")
fcntl = pytest.importorskip("fcntl")

TELLER = [sys.executable, "-m", "teller", "collect", "--no-convert", "--trace-dir", "traces"]

# Prints what it sees of its streams; on "go" (a file), waits for a window-size change and prints the
# size its SIGWINCH handler read last. Writes a coloured line to stderr.
PROBE = """
import os, signal, sys, time
seen = []
signal.signal(signal.SIGWINCH, lambda s, f: seen.append(os.get_terminal_size(1)))
# (each line in one write: unbuffered, print writes its pieces one by one, and through two pipes
# the stderr line below could land between them)
size = tuple(os.get_terminal_size(1)) if os.isatty(1) else None
print(f"tty {os.isatty(1)} {os.isatty(2)} {size}")
print(f"unbuffered {os.environ.get('PYTHONUNBUFFERED')}")
sys.stderr.write("\\x1b[31mred\\x1b[0m line\\n")
print("ready")
if len(sys.argv) > 1:
    t = time.time()
    while not any(tuple(s) == (120, 40) for s in seen) and time.time() - t < 20:
        time.sleep(0.01)
    print("resized", tuple(seen[-1]) if seen else None)
"""


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _under_terminal(tmp_path: Path, args: list[str], until: bytes, then=None) -> bytes:
    """Run ``args`` with a terminal (100x30) as its controlling terminal, stdin, stdout and stderr, as
    a shell would in a window; ``then(master)`` is called once ``until`` was output. All output."""
    try:
        master, slave = os.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here: {e}")
    _set_size(master, 100, 30)

    def ctty() -> None:  # (a session of its own, led by teller, whose terminal this is)
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen(
        args, stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, preexec_fn=ctty, env=env
    )
    os.close(slave)
    out, done, t0 = b"", False, time.monotonic()
    while time.monotonic() - t0 < 60:
        if select.select([master], [], [], 0.05)[0]:
            try:
                b = os.read(master, 65536)
            except OSError:  # (EIO: every writer closed it)
                break
            if not b:
                break
            out += b
        if not done and until in out:
            done = True
            if then is not None:
                then(master)
        if p.poll() is not None and not select.select([master], [], [], 0.2)[0]:
            break
    p.wait(10)
    os.close(master)
    return out


def _run(tmp_path: Path) -> Path:
    (run,) = sorted((tmp_path / "traces").glob("run-*"))[-1:]
    return run


def test_a_terminal_reaches_the_program_as_a_terminal(tmp_path):
    prog = tmp_path / "probe.py"
    prog.write_text(textwrap.dedent(PROBE))
    out = _under_terminal(
        tmp_path,
        [*TELLER, "--", sys.executable, str(prog), "resize"],
        b"ready",
        lambda m: _set_size(m, 120, 40),
    )
    assert b"tty True True (100, 30)" in out, out
    # (Python line-buffers a terminal by itself: not made unbuffered, as it is for a pipe)
    assert b"unbuffered None" in out, out
    # the window grew while it ran: the program's own terminal followed
    assert b"resized (120, 40)" in out, out
    assert b"\x1b[31mred\x1b[0m line" in out  # (the colours reach the real terminal)
    run = _run(tmp_path)
    info = json.loads((run / "run.json").read_text())
    assert info["pty"] == ["stderr", "stdout"] and "PYTHONUNBUFFERED" not in info["env"]
    log = (run / "log.txt").read_text()
    assert " stderr red line\n" in log and "\x1b" not in log  # (log.txt: the text)
    assert (run / "stderr.log").read_bytes() == b"\x1b[31mred\x1b[0m line\n"  # (as written: no \r\n)
    assert b"\r\n" not in (run / "stdout.log").read_bytes()


def test_no_pty_keeps_pipes_under_a_terminal(tmp_path):
    prog = tmp_path / "probe.py"
    prog.write_text(textwrap.dedent(PROBE))
    out = _under_terminal(tmp_path, [*TELLER, "--no-pty", "--", sys.executable, str(prog)], b"ready")
    assert b"tty False False None" in out and b"unbuffered 1" in out, out
    info = json.loads((_run(tmp_path) / "run.json").read_text())
    assert info["pty"] == [] and info["env"]["PYTHONUNBUFFERED"] == "1"


def test_c_stdio_output_is_line_buffered_on_the_terminal(tmp_path):
    """A C program's stdout reaches the terminal line by line while it runs, not at its exit."""
    gcc = "cc" if subprocess.run(["sh", "-c", "command -v cc"], capture_output=True).returncode == 0 else None
    if gcc is None:
        pytest.skip("no C compiler")
    (tmp_path / "slow.c").write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        'int main(void) { printf("first\\n");\n'
        '  for (int i = 0; i < 300 && access("go", F_OK) != 0; i++) usleep(100000);\n  return 0; }\n'
    )
    subprocess.run([gcc, "-o", str(tmp_path / "slow"), str(tmp_path / "slow.c")], check=True)
    seen: list[float] = []

    def go(master: int) -> None:
        seen.append(time.monotonic())
        (tmp_path / "go").touch()

    t0 = time.monotonic()
    out = _under_terminal(tmp_path, [*TELLER, "--", str(tmp_path / "slow")], b"first", go)
    # (through a pipe, "first" would wait in the program's buffer for the end of its 30 s wait)
    assert seen and seen[0] - t0 < 25, out


def test_forced_pty_without_a_terminal_loses_nothing(tmp_path):
    """--pty where teller's output is a pipe: a pseudo-terminal each, read to the end when the program
    exits (a pseudo-terminal's end reads as EIO), the bytes passed on unchanged."""
    prog = tmp_path / "big.py"
    prog.write_text(
        "import sys\nfor i in range(100000):\n    print(f'line {i:>8}')\n"
        "sys.stderr.write('e\\n')\nprint('tail', end='')\n"
    )
    p = subprocess.run(
        [*TELLER, "--pty", "--", sys.executable, str(prog)], capture_output=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    want = b"".join(b"line %8d\n" % i for i in range(100000)) + b"tail"
    assert p.stdout == want and p.stderr.startswith(b"e\n") and b"Traceback" not in p.stderr, p.stderr
    run = _run(tmp_path)
    assert (run / "stdout.log").read_bytes() == want
    log = (run / "log.txt").read_text().splitlines()
    # (the unfinished line too; the two streams are read by two threads, so where stderr's line falls
    # among stdout's depends on which read first)
    texts = [x.split(" ", 1)[1] for x in log]
    assert len(log) == 100002 and texts.count("stderr e") == 1
    out = [t for t in texts if t.startswith("stdout ")]
    assert out[-1] == "stdout tail" and out[:-1] == [f"stdout line {i:>8}" for i in range(100000)]
    assert json.loads((run / "run.json").read_text())["pty"] == ["stderr", "stdout"]


def test_a_background_process_holding_a_pty_does_not_hold_teller(tmp_path):
    t0 = time.monotonic()
    p = subprocess.run(
        [*TELLER, "--pty", "--", "sh", "-c", "(sleep 30 &); echo done"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert p.returncode == 0 and time.monotonic() - t0 < 20, p.stderr
    assert p.stdout == "done\n" and "still held its output" in p.stderr


@pytest.mark.parametrize("fails", ["openpty", "termios"])
def test_without_pseudo_terminals_the_program_gets_pipes(tmp_path, monkeypatch, fails):
    """Where no pseudo-terminal can be opened (no /dev/pts), or set up (termios.error, not an
    OSError), the run goes on with pipes and says so."""

    def no_pty(size_from):
        if fails == "termios":
            raise termios.error(5, "No such file or directory")
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(launcher, "_open_pty", no_pty)
    out, err = io.BytesIO(), io.BytesIO()
    res = launcher.collect(
        [sys.executable, "-c", "import os, sys; print(os.isatty(1), os.environ.get('PYTHONUNBUFFERED'))"],
        trace_dir=tmp_path / "traces",
        so=shim.locate(),
        convert=False,
        pty=True,
        stdout=out,
        stderr=err,
    )
    assert res.returncode == 0 and out.getvalue() == b"False 1\n"
    assert any("no pseudo-terminal could be opened (No such file or directory)" in w for w in res.warnings)
    info = json.loads((res.run_dir / "run.json").read_text())
    assert info["pty"] == [] and info["env"]["PYTHONUNBUFFERED"] == "1"


def test_an_interrupted_conversion_says_how_to_finish_it(tmp_path, monkeypatch):
    """A Ctrl-C during the conversion keeps the run; the command it prints writes trace.json into the
    run directory, where a finished run has it (not into the current directory)."""

    def interrupted(run_dir, result):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_convert", interrupted)
    monkeypatch.chdir(tmp_path)
    res = launcher.collect(
        [sys.executable, "-c", "print('hi')"],
        trace_dir=tmp_path / "traces dir",
        so=shim.locate(),
        pty=False,
        stdout=io.BytesIO(),
        stderr=io.BytesIO(),
    )
    assert res.interrupted
    said = next(w for w in res.warnings if "interrupted while converting" in w)
    cmd = said.split("`")[1]
    assert shlex.split(cmd) == [
        "teller",
        "trace",
        "convert",
        str(res.run_dir),
        "-o",
        str(res.run_dir / "trace.json"),
    ]
    assert json.loads((res.run_dir / "run.json").read_text())["warnings"] == res.warnings
