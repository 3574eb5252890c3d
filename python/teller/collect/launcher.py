"""``teller collect -- CMD ...``: run an unmodified program with the shim injected.

The launcher
* creates one run directory per invocation under the trace dir,
* injects the shim through ``NVTX_INJECTION64_PATH`` / ``CUDA_INJECTION64_PATH`` and points it at
  ``<run>/raw`` with ``TELLER_TRACE_DIR``,
* optionally wraps Python functions in NVTX ranges (``--nvtx-json``) through a ``sitecustomize``
  placed first on ``PYTHONPATH`` (inherited by children and spawned workers),
* passes stdout/stderr through to the terminal unchanged while writing them, line by line with a
  timestamp on the trace clock, to ``log.txt`` (and raw copies to ``stdout.log``/``stderr.log``);
  a stream that goes to a terminal reaches the program as a pseudo-terminal of the same size, so
  that it buffers, colours and sizes its output as it would without teller,
* passes on SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to teller (not those the terminal sent to the whole
  foreground group, which the program got itself; a signal sent to teller's process group by
  ``kill -- -PGID`` reaches the program twice: README), returns its exit status, and
* writes ``run.json`` and, unless told not to, the aligned ``trace.json`` and ``summary.json``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from teller import __version__
from teller._io import check_output_dir, make_output_dir, strip_escapes, write_atomic
from teller.errors import ConfigError, TellerError, TellerFileNotFoundError, TellerIOError, TellerWarning

TOPOLOGY_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "MASTER_ADDR",
    "MASTER_PORT",
)
HOOK_DIR = Path(__file__).resolve().parent / "_hook"
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


@dataclass
class RunResult:
    run_dir: Path
    returncode: int
    trace_json: Path | None = None
    summary: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False  # (stopped after the program's exit: the run is kept, unconverted)
    exit_signal: int | None = None  # (the signal that killed the program, where one did)


# si_code of a signal the kernel sent (a terminal's Ctrl-C, Ctrl-\\, hang-up), not another process
_SI_KERNEL = 0x80


def _interpreter(path: str) -> str:
    """The interpreter a script's ``#!`` line names, or ``"?"``."""
    try:
        with open(path, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return "?"
    if not first.startswith(b"#!"):
        return "?"
    words = first[2:].split()
    return words[0].decode("utf-8", "replace") if words else "?"


def _tty_fd(stream: Any) -> int | None:
    """The descriptor of ``stream`` where it is a terminal, else None."""
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None
    return fd if os.isatty(fd) else None


def _copy_winsize(src_fd: int | None, dst_fd: int) -> None:
    """Give the terminal ``dst_fd`` the window size of ``src_fd`` (where it has one)."""
    if src_fd is None:
        return
    import fcntl
    import termios

    with contextlib.suppress(OSError):
        fcntl.ioctl(dst_fd, termios.TIOCSWINSZ, fcntl.ioctl(src_fd, termios.TIOCGWINSZ, b"\0" * 8))


def _open_pty(size_from: int | None) -> tuple[int, int]:
    """A pseudo-terminal (master, slave) for one of the program's output streams, sized as
    ``size_from``. Output processing is off: the bytes the program writes arrive as written (no
    ``\\n`` -> ``\\r\\n``; the real terminal they are copied to does its own)."""
    import termios

    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        _copy_winsize(size_from, master)
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def resolve_nvtx_json(spec: str) -> Path:
    """A path to a groups file, or the name of a built-in profile (``torch``, ``transformers``, ``vllm``)."""
    p = Path(spec)
    builtin = PROFILE_DIR / f"{spec}.json"
    if not p.is_file() and os.sep not in spec and builtin.is_file():
        # (a bare profile name is the profile, also beside a directory of that name: a vllm checkout)
        p = builtin
    if p.is_dir():
        raise ConfigError(f"{p}: a directory, not an --nvtx-json file (a JSON list of groups)", path=str(p))
    if p.is_file():
        try:
            groups = json.loads(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{p}: not UTF-8 text (byte {e.start}): an --nvtx-json file is JSON", path=str(p)
            ) from None
        except json.JSONDecodeError as e:
            what = "empty" if not e.doc.strip() else f"not valid JSON: {e}"
            raise ConfigError(f"{p}: {what}", path=str(p)) from None
        except OSError as e:  # (a read error carries no file name: EIO, a special file)
            raise TellerIOError(
                f"{p}: cannot read it: {e.strerror or e}", path=str(p), errno=e.errno
            ) from None
    else:
        raise TellerFileNotFoundError(
            f"{spec}: no such file and no built-in NVTX profile of that name "
            f"(built-in: {', '.join(builtin_profiles())})",
            path=spec,
        )
    validate_groups(groups, str(p))
    return p.resolve()


def validate_groups(groups: Any, path: str) -> None:
    if not isinstance(groups, list):
        raise ConfigError(f"{path}: an --nvtx-json file must hold a JSON list of groups", path=path)
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise ConfigError(f"{path}: group #{i} must be an object", path=path, index=i)
        if not isinstance(g.get("module"), str):
            raise ConfigError(f"{path}: group #{i} needs a 'module' string", path=path, index=i)
        if g["module"] == "__main__":
            raise ConfigError(
                f"{path}: group #{i}: functions of the __main__ script cannot be wrapped without changing it "
                "(they are defined after start-up hooks run); move them into a module and name that module",
                path=path,
                index=i,
            )
        fns = g.get("functions")
        if not isinstance(fns, list) or not fns or not all(isinstance(f, str) for f in fns):
            raise ConfigError(
                f"{path}: group #{i} needs a non-empty 'functions' list of strings", path=path, index=i
            )
        for key in ("domain", "name", "color"):
            if key in g and not isinstance(g[key], str):
                raise ConfigError(f"{path}: group #{i}: '{key}' must be a string", path=path, index=i)
        if "name" in g:  # (checked here: in the program it would fail at every call)
            import string

            try:
                parsed = [(f, c) for _, f, _, c in string.Formatter().parse(g["name"]) if f is not None]
                fields = [f for f, _ in parsed]
                if any(c not in (None, "r", "s", "a") for _, c in parsed):
                    raise ValueError("a conversion other than !r, !s, !a")
            except ValueError as e:
                raise ConfigError(
                    f"{path}: group #{i}: 'name' is not a format: {e}", path=path, index=i
                ) from None
            bad = [f for f in fields if f not in ("module", "qualname", "function", "cls")]
            if bad:
                raise ConfigError(
                    f"{path}: group #{i}: 'name' uses unknown field {{{bad[0]}}} (known: module, qualname, "
                    "function, cls)",
                    path=path,
                    index=i,
                )
            try:  # (a format spec strings do not take, "{module:d}", fails here, not at every call)
                g["name"].format(module="m", qualname="q", function="f", cls="C")
            except (ValueError, TypeError, IndexError, KeyError) as e:
                raise ConfigError(
                    f"{path}: group #{i}: 'name' does not format the names it is given ({e})",
                    path=path,
                    index=i,
                ) from None
        if "color" in g:
            from teller.collect._hook._teller_nvtx_colors import color_argb

            try:
                color_argb(g["color"])
            except ValueError as e:
                raise ConfigError(f"{path}: group #{i}: 'color': {e}", path=path, index=i) from None
        unknown = set(g) - {"module", "functions", "domain", "name", "color"}
        if unknown:
            raise ConfigError(f"{path}: group #{i}: unknown keys {sorted(unknown)}", path=path, index=i)


def _convert_hint(run_dir: Path) -> str:
    """The command that converts a run left unconverted, into the run directory as a finished run has it."""
    import shlex

    return f"teller trace convert {shlex.quote(str(run_dir))} -o {shlex.quote(str(run_dir / 'trace.json'))}"


def nvtx_json_imports(run_dir: Path, nvtx_path: Path) -> str | None:
    """What to say about an --nvtx-json file once the program has exited: that no Python process of
    it ran the hook, or which modules none of them imported (a user's own file only: a built-in
    profile names modules of several versions). Reads and removes the hook's record of the run."""
    f = run_dir / ".nvtx-imports"
    try:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        f.unlink()
    except OSError:
        lines = []
    hooks = lines.count("hook")
    if hooks == 0:
        if "hook-off" in lines:  # (the processes said why, on their stderr)
            return None
        return (
            "--nvtx-json: no Python process of the program loaded teller's hook, so nothing was wrapped "
            "(it is loaded through PYTHONPATH: `python -I` and `-E` ignore it, and a program that is not "
            "Python has no functions to wrap)"
        )
    if nvtx_path.parent == PROFILE_DIR.resolve():
        return None
    try:
        groups = json.loads(nvtx_path.read_text(encoding="utf-8"))
        modules = {g["module"] for g in groups}
    except (OSError, ValueError, TypeError, KeyError):  # (changed during the run: nothing to say)
        return None
    imported = {ln[len("imported ") :] for ln in lines if ln.startswith("imported ")}
    missed = sorted(modules - imported)
    if not missed:
        return None
    procs = f"{hooks} Python process{'es' if hooks > 1 else ''}"
    return (
        f"--nvtx-json: module(s) {', '.join(missed)} never imported by the program ({procs} ran the "
        "hook): nothing of them was wrapped (a misspelt name?)"
    )


def new_run_dir(trace_dir: Path) -> Path:
    check_output_dir(trace_dir, "the trace directory")
    make_output_dir(trace_dir, "trace directory")
    stamp = time.strftime("run-%Y%m%d-%H%M%S")
    for k in range(1000):
        d = trace_dir / (stamp if k == 0 else f"{stamp}-{k}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise TellerError(f"{trace_dir}: could not create a fresh run directory")


# A line longer than this (a progress bar drawn with \r and no newline) is logged in pieces.
MAX_LOG_LINE = 1 << 20
# After the program exits, how long its output pipes are still read (a background process it started
# may hold them open for good): then teller stops copying and finishes.
DRAIN_S = 2.0


@contextlib.contextmanager
def _log_file(path: Path, mode: str, **kw: Any):  # type: ignore[no-untyped-def]
    """A log file that is closed quietly: what could not be written (a full disk, a file-size limit)
    is said by the copying thread, and must not end the run before run.json is written."""
    f = open(path, mode, **kw)  # noqa: SIM115
    try:
        yield f
    finally:
        with contextlib.suppress(OSError, ValueError):
            f.close()


class _LogTee:
    """Copies a child's stream to our own, unchanged, and to log files with a timestamp per line.

    Where our own stream is closed (``| head``), the program's pipe is closed too, so that the
    program sees the closed output (SIGPIPE, EPIPE) as it would without teller."""

    def __init__(
        self,
        src: IO[bytes],
        dst: IO[bytes] | None,
        raw: IO[bytes],
        log: IO[str],
        name: str,
        lock: threading.Lock,
        offset_ns: int,
    ) -> None:
        self.src, self.dst, self.raw, self.log, self.name = src, dst, raw, log, name
        self.lock, self.offset_ns = lock, offset_ns
        self.lines = 0
        self.stop = threading.Event()
        self.output_closed = False
        self.last_read = time.monotonic()  # (the drain after the program's exit waits while output flows)
        self.writing = False  # (in a write to our own output: a slow reader, not an idle pipe)
        # why the logs stopped being written (a full disk, a file-size limit), or None: the program's
        # output is still read and copied, so that it never blocks on a full pipe
        self.log_error: str | None = None
        self.read_error: str | None = None  # (the program's stream could not be read on)
        self.thread = threading.Thread(target=self._run, name=f"teller-tee-{name}", daemon=True)

    def _emit(self, lines: list[bytes]) -> None:
        with self.lock:
            if self.stop.is_set():
                return
            # The stamp is taken under the lock shared by both tees so log.txt is in time order even
            # when one reader thread is scheduled late. It is the time teller read the line; the order
            # of stdout vs stderr lines written within a few microseconds is best effort (two pipes
            # carry no common sequence).
            if self.log_error is not None:
                return
            ts = time.monotonic_ns() + self.offset_ns
            try:
                for line in lines:
                    # (log.txt holds the text: colour and cursor codes stay in stdout.log / stderr.log)
                    text = strip_escapes(line.decode("utf-8", "replace")).rstrip("\r")
                    self.log.write(f"{ts} {self.name} {text}\n")
                self.log.flush()
            except (OSError, ValueError) as e:
                self._log_failed("log.txt", e)
                return
        self.lines += len(lines)

    def _log_failed(self, what: str, e: BaseException) -> None:
        if self.log_error is None:
            self.log_error = f"{what}: {getattr(e, 'strerror', None) or e}"

    def _copy(self, chunk: bytes) -> None:
        """Write ``chunk`` to our own stream, whole; ``output_closed`` where it is gone."""
        import select

        if self.dst is None or self.output_closed:
            return
        fd = None
        with contextlib.suppress(AttributeError, ValueError, OSError):
            self.dst.flush()  # (anything buffered first)
            fd = self.dst.fileno()
        view = memoryview(chunk)
        try:
            if fd is None:  # (a stream without a descriptor: a test's BytesIO)
                self.dst.write(chunk)
                self.dst.flush()
                return
            while view:
                try:
                    n = os.write(fd, view)  # (short writes are written on, not dropped)
                except BlockingIOError:  # (a non-blocking output that is full: wait for room)
                    po = select.poll()
                    po.register(fd, select.POLLOUT)
                    po.poll(100)
                    continue
                view = view[n:]
        except (BrokenPipeError, ConnectionResetError, ValueError, OSError):
            # our output is gone (`teller collect ... | head`): the program's is closed too, so that it
            # sees the closed pipe (SIGPIPE, EPIPE) as it would alone
            self.output_closed = True

    def _run(self) -> None:
        import select

        fd = self.src.fileno()
        po = select.poll()  # (not select(): descriptors above 1024)
        po.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        pieces: list[bytes] = []  # the unfinished line (kept as pieces: joining per read is quadratic)
        size = 0
        while not self.stop.is_set():
            if not po.poll(100):
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError as e:  # (a pseudo-terminal whose last writer closed it reads as EIO)
                if e.errno != errno.EIO:  # (nothing more can be read: the copy ends here too)
                    self.read_error = f"{getattr(e, 'strerror', None) or e}"
                chunk = b""
            if not chunk:
                break
            self.last_read = time.monotonic()
            # the logs first: what reached the logs does not wait for a slow reader of our output
            with self.lock:
                if self.stop.is_set():
                    break
                if self.log_error is None:
                    try:
                        self.raw.write(chunk)
                    except (OSError, ValueError) as e:
                        self._log_failed(f"{self.name}.log", e)
            nl = chunk.rfind(b"\n")
            if nl < 0:
                pieces.append(chunk)
                size += len(chunk)
                if size >= MAX_LOG_LINE:
                    self._emit([b"".join(pieces)])
                    pieces, size = [], 0
            else:
                lines = (b"".join(pieces) + chunk[:nl]).split(b"\n")
                rest = chunk[nl + 1 :]
                pieces, size = ([rest], len(rest)) if rest else ([], 0)
                self._emit(lines)
            self.writing = True
            try:
                self._copy(chunk)
            finally:
                self.last_read = time.monotonic()
                self.writing = False
            if self.output_closed:
                break
        if pieces:
            self._emit([b"".join(pieces)])
        if self.output_closed or self.stop.is_set() or self.read_error is not None:
            # (closed: the program sees a closed pipe, not a full one it would wait on for good)
            with contextlib.suppress(OSError):
                self.src.close()
        with self.lock:
            if not self.stop.is_set() and self.log_error is None:
                try:
                    self.raw.flush()
                except (OSError, ValueError) as e:
                    self._log_failed(f"{self.name}.log", e)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Whether the stream ended (its last writer closed it) within ``timeout``."""
        self.thread.join(timeout)
        return not self.thread.is_alive()


def child_env(
    base: dict[str, str],
    run_dir: Path,
    so: Path | None,
    nvtx_json: Path | None,
    cupti_path: str | None,
    torch_nvtx: bool,
) -> tuple[dict[str, str], dict[str, str]]:
    """The child's environment and the subset teller set (recorded in run.json)."""
    env = dict(base)
    set_: dict[str, str] = {
        "TELLER_TRACE_DIR": str(run_dir),
        "TELLER_RUN_DIR": str(run_dir),
    }
    if so is not None:
        set_["NVTX_INJECTION64_PATH"] = str(so)
        set_["CUDA_INJECTION64_PATH"] = str(so)
    if cupti_path:
        set_["TELLER_CUPTI_PATH"] = cupti_path
    if nvtx_json is not None or torch_nvtx or "TELLER_FAULT_DELAY" in base:
        pp = env.get("PYTHONPATH", "")
        set_["PYTHONPATH"] = str(HOOK_DIR) + (os.pathsep + pp if pp else "")
        set_["TELLER_HOOK_DIR"] = str(HOOK_DIR)
        if nvtx_json is not None:
            set_["TELLER_NVTX_JSON"] = str(nvtx_json)
        if torch_nvtx:
            set_["TELLER_TORCH_NVTX"] = "1"
    env.update(set_)
    return env, set_


def unbuffer_python(env: dict[str, str], set_: dict[str, str]) -> None:
    """Python writes stdout in blocks to a pipe: unbuffered, its lines reach the log as they are
    printed. (Not for a pseudo-terminal: Python line-buffers one, as it does on a terminal.)"""
    env["PYTHONUNBUFFERED"] = set_["PYTHONUNBUFFERED"] = "1"


def collect(
    cmd: list[str],
    *,
    trace_dir: str | os.PathLike[str] | None = None,
    cuda_home: str | os.PathLike[str] | None = None,
    nvtx_json: str | None = None,
    so: str | os.PathLike[str] | None = None,
    convert: bool = True,
    torch_nvtx: bool = False,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
    pty: bool | None = None,
) -> RunResult:
    """Run ``cmd`` under the collector and return where everything went.

    ``pty``: whether the program's stdout and stderr are pseudo-terminals (each copied to ours) or
    pipes; None (the default): a pseudo-terminal for each of our streams that is a terminal."""
    from teller.collect import shim as shim_mod

    if not cmd:
        raise ConfigError("no command given: use `teller collect [OPTIONS] -- CMD ...`")
    td = Path(trace_dir or os.environ.get("TELLER_TRACE_DIR") or "teller-traces")
    check_output_dir(
        td,
        "--trace-dir names a directory"
        if trace_dir
        else "TELLER_TRACE_DIR names a directory"
        if os.environ.get("TELLER_TRACE_DIR")
        else "the default trace directory",
    )
    if so is not None:
        lib = Path(so)
        if lib.is_dir():
            raise ConfigError(
                f"{lib}: a directory, not a shim library (--so names libteller_shim.so)", path=str(lib)
            )
        if not lib.is_file():
            raise TellerFileNotFoundError(f"{lib}: no such shim library", path=str(lib))
        with open(lib, "rb") as f:
            head = f.read(4)
            if head != b"\x7fELF":
                # (the child's injection loader would skip it silently: a run with no events)
                raise ConfigError(f"{lib}: not a shared library (no ELF header)", path=str(lib))
            # its dynamic string table names the entry points NVTX and CUDA look up
            if b"InitializeInjectionNvtx2\0" not in head + f.read():
                raise ConfigError(
                    f"{lib}: not a teller shim (it exports no InitializeInjectionNvtx2: NVTX would not "
                    "load it); build one with `teller shim build`",
                    path=str(lib),
                )
        lib = lib.resolve()
    else:
        lib = shim_mod.build(cuda_home)
    nvtx_path = resolve_nvtx_json(nvtx_json) if nvtx_json else None
    from teller.cuda import find_cuda

    # (an explicit --cuda-home names the CUPTI to load, over a TELLER_CUPTI_PATH left in the environment)
    shim_mod.check_cuda_home(cuda_home)
    cupti = (
        find_cuda(cuda_home).libcupti
        if cuda_home
        else os.environ.get("TELLER_CUPTI_PATH") or find_cuda(None).libcupti
    )
    run_dir = new_run_dir(td)
    (run_dir / "raw").mkdir()
    # (absolute: a program that changes directory, or starts a child elsewhere, writes into the run)
    env, teller_env = child_env(dict(os.environ), run_dir.absolute(), lib, nvtx_path, cupti, torch_nvtx)
    out_stream = stdout if stdout is not None else getattr(sys.stdout, "buffer", None)
    err_stream = stderr if stderr is not None else getattr(sys.stderr, "buffer", None)
    # Terminals: a stream of ours that is one reaches the program as a pseudo-terminal (C stdio then
    # line-buffers it, and libraries colour and size their output as they would without teller). The
    # program stays in teller's process group and keeps the real terminal as its controlling one and
    # as its stdin: Ctrl-C and job control are unchanged. A window-size change reaches the program from
    # the terminal and again from teller once the pseudo-terminals have the new size (SIGWINCH).
    streams = (("stdout", out_stream), ("stderr", err_stream))
    want_pty = [n for n, st in streams if (pty if pty is not None else _tty_fd(st) is not None)]
    size_fd = next((fd for _, st in streams if (fd := _tty_fd(st)) is not None), None)
    if size_fd is None:
        size_fd = next((fd for fd in (0, 1, 2) if os.isatty(fd)), None)
    if "stdout" not in want_pty:
        unbuffer_python(env, teller_env)
    for var in ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH"):
        if os.environ.get(var) and os.environ[var] != str(lib):
            warnings.warn(
                f"{var}={os.environ[var]} is replaced by teller's shim for this run (one injection "
                "library per process: the other one is not loaded)",
                TellerWarning,
                stacklevel=2,
            )
    # Clock pair for the logs: the shim writes CLOCK_MONOTONIC, the logs carry realtime ns.
    mono0, real0 = time.monotonic_ns(), time.time_ns()
    offset = real0 - mono0
    start_ns = time.time_ns()
    lock = threading.Lock()
    # Signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT are blocked here (and in the copying threads, which
    # inherit the mask) and taken with sigtimedwait, which says who sent them. One the terminal sent
    # (Ctrl-C, Ctrl-\\, a hang-up) went to the whole foreground group, the program included: it is not
    # sent again (a second Ctrl-C means "force quit" to many servers). One sent to teller alone
    # (`kill`, a scheduler) is forwarded. The program starts with the mask teller had.
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
    wait_sigs = sigs | ({signal.SIGWINCH} if want_pty else set())
    masters: dict[str, int] = {}
    pty_error: str | None = None
    main = threading.current_thread() is threading.main_thread()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, wait_sigs) if main else None
    forwarded: list[int] = []
    seen: list[int] = []
    late: list[int] = []  # (signals after the program ended: the user wants teller to stop)
    exited: list[float] = []  # (when teller saw the program's exit)
    drain_end: str | None = None  # why the copying stopped early: "time" or "signal"
    try:
        with (
            _log_file(run_dir / "log.txt", "w", encoding="utf-8") as log,
            _log_file(run_dir / "stdout.log", "wb") as raw_out,
            _log_file(run_dir / "stderr.log", "wb") as raw_err,
        ):
            # (a signal already pending here, a Ctrl-C while the files were opened, never reached the
            # program, which starts after it: forwarded once it has started, whoever sent it)
            early = sorted(signal.sigpending() & sigs) if main else []
            slaves: dict[str, int] = {}
            try:
                import termios

                pty_errors: tuple[type[BaseException], ...] = (OSError, termios.error)
            except ImportError:
                pty_errors = (OSError,)
            try:
                for name in want_pty:
                    masters[name], slaves[name] = _open_pty(size_fd)
            except pty_errors as e:  # (no pseudo-terminals here, e.g. no /dev/pts in a container: pipes)
                pty_error = f"{getattr(e, 'strerror', None) or (e.args[-1] if e.args else e)}"
                if "stdout" in want_pty:  # (a pipe after all)
                    unbuffer_python(env, teller_env)
                for fd in (*masters.values(), *slaves.values()):
                    os.close(fd)
                masters.clear()
                slaves.clear()
            try:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=slaves.get("stdout", subprocess.PIPE),
                    stderr=slaves.get("stderr", subprocess.PIPE),
                    stdin=None,
                    preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old_mask))
                    if main
                    else None,
                )
            except OSError as e:
                for fd in masters.values():
                    os.close(fd)
                # nothing ran: leave no empty run directory behind
                shutil.rmtree(run_dir, ignore_errors=True)
                if isinstance(e, FileNotFoundError) or not cmd[0]:  # ("": not found, as a shell says)
                    what = "command not found"
                    found = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0])
                    if found and os.path.isfile(found):  # (it exists: its #! interpreter does not)
                        what = f"cannot execute: bad interpreter ({_interpreter(found)}: no such file)"
                    raise TellerFileNotFoundError(f"{cmd[0] or repr('')}: {what}", path=cmd[0]) from None
                if os.sep in cmd[0] and os.path.isdir(cmd[0]):  # (EACCES from exec; a shell says this)
                    raise TellerError(f"{cmd[0]}: cannot execute: is a directory", path=cmd[0]) from None
                raise TellerError(f"{cmd[0]}: cannot execute: {e.strerror or e}", path=cmd[0]) from None
            except BaseException:  # (a NUL in an argument, a failing preexec_fn: nothing ran either)
                for fd in masters.values():
                    os.close(fd)
                shutil.rmtree(run_dir, ignore_errors=True)
                raise
            finally:
                for fd in slaves.values():  # (the program holds them now: its exit ends the stream)
                    os.close(fd)
            srcs = {n: os.fdopen(fd, "rb", buffering=0) for n, fd in masters.items()}
            out_src, err_src = srcs.get("stdout", proc.stdout), srcs.get("stderr", proc.stderr)
            assert out_src is not None and err_src is not None
            tees = [
                _LogTee(out_src, out_stream, raw_out, log, "stdout", lock, offset),
                _LogTee(err_src, err_stream, raw_err, log, "stderr", lock, offset),
            ]
            try:
                for t in tees:
                    t.start()

                def take(timeout: float) -> str | None:
                    """Wait up to ``timeout`` for a signal and pass it on; what it was: "seen" (the
                    program got it too), "forwarded", "late" (after the program's exit: teller is asked
                    to stop), or None (none came)."""
                    if not main:
                        time.sleep(timeout)
                        return None
                    info = signal.sigtimedwait(wait_sigs, timeout)
                    if info is None:
                        return None
                    sig = info.si_signo
                    if sig == signal.SIGWINCH:
                        if info.si_pid == os.getpid():  # (the one sent below, to the group)
                            return "resized"
                        # The terminal's signal reached the group before the pseudo-terminals had
                        # the new size: sent again to the group (the program's children too, under
                        # a wrapper), once they have it
                        for f in srcs.values():
                            with contextlib.suppress(ValueError, OSError):  # (closed meanwhile)
                                _copy_winsize(size_fd, f.fileno())
                        if srcs and proc.poll() is None:
                            with contextlib.suppress(OSError):
                                os.killpg(os.getpgrp(), signal.SIGWINCH)
                        return "resized"
                    same_group = True
                    with contextlib.suppress(OSError):
                        same_group = os.getpgid(proc.pid) == os.getpgrp()
                    from_tty = info.si_code == _SI_KERNEL and same_group
                    if proc.poll() is not None:
                        if not exited:
                            exited.append(time.monotonic())
                        # (the terminal's signal that ended the program, taken just after it did, was
                        # the program's; one later, or one sent to teller, asks teller to stop)
                        if from_tty and time.monotonic() - exited[0] < 0.5:
                            seen.append(sig)
                            return "seen"
                        late.append(sig)
                        return "late"
                    if from_tty and sig not in early:
                        seen.append(sig)  # (the terminal sent it to the program as well)
                        return "seen"
                    forwarded.append(sig)
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
                    return "forwarded"

                for sig in early:
                    with contextlib.suppress(OSError):
                        signal.sigtimedwait({sig}, 0)
                    forwarded.append(sig)
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
                while proc.poll() is None:
                    take(0.02)
                rc = proc.returncode
                if not exited:
                    exited.append(time.monotonic())
                # Its output: until the pipes close. Where a process it started in the background still
                # holds them, DRAIN_S after the last byte came (not counting time spent writing to a slow
                # reader of our own output); a signal now ends the wait at once.
                while not all(t.join(0) for t in tees):
                    if take(0.02) == "late":  # (not the terminal's Ctrl-C that ended the program)
                        drain_end = "signal"
                        break
                    writing = any(t.writing for t in tees)
                    if not writing and time.monotonic() - max(t.last_read for t in tees) > DRAIN_S:
                        drain_end = "time"
                        break
                while take(0) is not None:  # (signals that came after the last wait)
                    pass
            except BaseException:
                # (teller itself failed or was stopped: the program is not left running unwatched)
                if proc.poll() is None:
                    with contextlib.suppress(OSError):
                        proc.terminate()
                    try:
                        proc.wait(5)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                drain_end = drain_end or "signal"
                raise
            finally:
                if drain_end is not None:
                    for t in tees:
                        t.stop.set()
                with lock:  # (a copying thread still running writes nothing more into these files)
                    pass
    finally:
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    end_ns = time.time_ns()
    exit_signal = -rc if rc < 0 else None
    returncode = 128 + exit_signal if exit_signal else rc
    shim_info: dict[str, Any] = {"path": str(lib)}
    try:
        shim_info.update(json.loads((lib.parent / "build.json").read_text()))
    except (OSError, ValueError):
        pass
    run = {
        "teller_version": __version__,
        "command": cmd,
        "command_line": shlex.join(cmd),
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "start_ns": start_ns,
        "end_ns": end_ns,
        "duration_s": round((end_ns - start_ns) / 1e9, 6),
        "exit_code": rc if rc >= 0 else None,
        "exit_signal": exit_signal,
        "forwarded_signals": forwarded,
        # (sent by the terminal to the program's group too: not sent again)
        "terminal_signals": seen,
        # (after the program had exited: teller stopped without converting)
        "late_signals": late,
        "returncode": returncode,
        "clock_sync": {"clock": "CLOCK_MONOTONIC", "monotonic_ns": mono0, "realtime_ns": real0},
        "shim": shim_info,
        "nvtx_json": str(nvtx_path) if nvtx_path else None,
        # only what teller set and what describes topology: traces get shared, secrets must not
        "env": {**teller_env, **{k: os.environ[k] for k in TOPOLOGY_VARS if k in os.environ}},
        "log_lines": sum(t.lines for t in tees),
        # (the streams the program saw as a terminal)
        "pty": sorted(masters),
    }
    result = RunResult(run_dir=run_dir, returncode=returncode, exit_signal=exit_signal)
    if nvtx_path is not None and (said := nvtx_json_imports(run_dir, nvtx_path)) is not None:
        result.warnings.append(said)
    if pty_error is not None:
        result.warnings.append(
            f"no pseudo-terminal could be opened ({pty_error}): the program's output went through pipes "
            "(C stdio buffers stdout in blocks, and isatty() is false)"
        )
    for t in tees:
        if t.read_error is not None:
            result.warnings.append(
                f"the program's {t.name} could not be read on ({t.read_error}): what it wrote after that "
                "is neither in the logs nor in teller's own output"
            )
        elif t.log_error is not None:
            result.warnings.append(
                f"the logs of the program's {t.name} are incomplete: {t.log_error} (its output was "
                "still copied to teller's own, whole)"
            )
    if drain_end == "time":
        result.warnings.append(
            "the program exited while a process it started still held its output: teller stopped "
            f"copying that output after {DRAIN_S:g} s without any (what it writes now is not in the logs)"
        )
    elif drain_end == "signal" or late:
        result.interrupted = True
        result.warnings.append(
            "stopped by a signal after the program exited: "
            + ("its output was still being copied; " if drain_end else "")
            + f"{run_dir} keeps the raw files, logs and run.json, unconverted "
            f"(`{_convert_hint(run_dir)}` converts it)"
        )
    run["warnings"] = result.warnings
    # written now, and again after the conversion: an interrupted conversion keeps the run's record.
    # (A run.json that cannot be written, a full disk, is said; the program's exit status still stands.)
    try:
        write_atomic(run_dir / "run.json", json.dumps(run, indent=2) + "\n")
    except TellerError as e:
        result.warnings.append(
            f"run.json not written: {e}; {run_dir} keeps the raw files and logs, unconverted "
            f"(`{_convert_hint(run_dir)}` converts it)"
        )
        return result
    if convert and not result.interrupted:
        try:
            _convert(run_dir, result)
        except TellerError as e:  # (trace.json or summary.json not written: a full disk, say)
            result.warnings.append(f"conversion failed: {e}")
        except KeyboardInterrupt:
            result.warnings.append(
                f"interrupted while converting: {run_dir} keeps the raw files, logs and run.json "
                f"(`{_convert_hint(run_dir)}` converts it)"
            )
            result.interrupted = True
        run["trace_json"] = str(result.trace_json) if result.trace_json else None
        run["warnings"] = result.warnings
        try:
            write_atomic(run_dir / "run.json", json.dumps(run, indent=2) + "\n")
        except TellerError as e:
            result.warnings.append(f"run.json not updated after the conversion: {e}")
    return result


def _convert(run_dir: Path, result: RunResult) -> None:
    from teller import trace

    raw = sorted((run_dir / "raw").glob("*.tmsgpack"))
    if not raw:
        result.warnings.append(
            "no events were recorded (the program made no NVTX/CUDA calls, or the shim was not loaded)"
        )
        return
    try:
        tr = trace.load(run_dir, warn=False)
    except TellerError as e:
        result.warnings.append(f"conversion failed: {e}")
        return
    result.warnings.extend(tr.warnings)
    out = run_dir / "trace.json"
    tr.to_chrome(out)
    result.trace_json = out
    result.summary = tr.summary()
    from teller.findings import findings

    result.summary["findings"] = findings(tr, result.summary)  # (what stands out: docs/findings.md)
    write_atomic(run_dir / "summary.json", json.dumps(result.summary, indent=2) + "\n")
