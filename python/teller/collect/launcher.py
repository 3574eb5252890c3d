"""``teller collect -- CMD ...``: run an unmodified program with the shim injected.

The launcher
* creates one run directory per invocation under the trace dir,
* injects the shim through ``NVTX_INJECTION64_PATH`` / ``CUDA_INJECTION64_PATH`` and points it at
  ``<run>/raw`` with ``TELLER_TRACE_DIR``,
* optionally wraps Python functions in NVTX ranges (``--nvtx-json``) through a ``sitecustomize``
  placed first on ``PYTHONPATH`` (inherited by children and spawned workers),
* passes stdout/stderr through to the terminal unchanged while writing them, line by line with a
  timestamp on the trace clock, to ``log.txt`` (and raw copies to ``stdout.log``/``stderr.log``),
* forwards SIGINT/SIGTERM, returns the child's exit status, and
* writes ``run.json`` and, unless told not to, the aligned ``trace.json`` and ``summary.json``.
"""

from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from teller import __version__
from teller._io import check_output_dir, make_output_dir, write_atomic
from teller.errors import ConfigError, TellerError, TellerFileNotFoundError

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


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def resolve_nvtx_json(spec: str) -> Path:
    """A path to a groups file, or the name of a built-in profile (``torch``, ``transformers``, ``vllm``)."""
    p = Path(spec)
    if not p.is_file() and (PROFILE_DIR / f"{spec}.json").is_file():
        p = PROFILE_DIR / f"{spec}.json"
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
        unknown = set(g) - {"module", "functions", "domain", "name", "color", "category", "subclasses"}
        if unknown:
            raise ConfigError(f"{path}: group #{i}: unknown keys {sorted(unknown)}", path=path, index=i)


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


class _LogTee:
    """Copies a child's stream to our own, unchanged, and to log files with a timestamp per line."""

    def __init__(
        self,
        src: IO[bytes],
        dst: IO[bytes],
        raw: IO[bytes],
        log: IO[str],
        name: str,
        lock: threading.Lock,
        offset_ns: int,
    ) -> None:
        self.src, self.dst, self.raw, self.log, self.name = src, dst, raw, log, name
        self.lock, self.offset_ns = lock, offset_ns
        self.lines = 0
        self.thread = threading.Thread(target=self._run, name=f"teller-tee-{name}", daemon=True)

    def _run(self) -> None:
        partial = b""
        while True:
            chunk = os.read(self.src.fileno(), 65536)
            if not chunk:
                break
            try:
                self.dst.write(chunk)
                self.dst.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass
            self.raw.write(chunk)
            data = partial + chunk
            *lines, partial = data.split(b"\n")
            if lines:
                with self.lock:
                    # The stamp is taken under the lock shared by both tees so log.txt is in time order
                    # even when one reader thread is scheduled late. It is the time teller read the line;
                    # the order of stdout vs stderr lines written within a few microseconds is best effort
                    # (two pipes carry no common sequence).
                    ts = time.monotonic_ns() + self.offset_ns
                    for line in lines:
                        self.log.write(
                            f"{ts} {self.name} {line.decode('utf-8', 'replace').rstrip(chr(13))}\n"
                        )
                    self.log.flush()
                self.lines += len(lines)
        if partial:
            with self.lock:
                self.log.write(
                    f"{time.monotonic_ns() + self.offset_ns} {self.name} "
                    f"{partial.decode('utf-8', 'replace')}\n"
                )
                self.log.flush()
            self.lines += 1
        self.raw.flush()

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join()


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
        "PYTHONUNBUFFERED": "1",
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
) -> RunResult:
    """Run ``cmd`` under the collector and return where everything went."""
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
        if not lib.is_file():
            raise TellerFileNotFoundError(f"{lib}: no such shim library", path=str(lib))
        with open(lib, "rb") as f:
            if f.read(4) != b"\x7fELF":
                # (the child's injection loader would skip it silently: a run with no events)
                raise ConfigError(f"{lib}: not a shared library (no ELF header)", path=str(lib))
        lib = lib.resolve()
    else:
        lib = shim_mod.build(cuda_home)
    nvtx_path = resolve_nvtx_json(nvtx_json) if nvtx_json else None
    from teller.cuda import find_cuda

    cupti = os.environ.get("TELLER_CUPTI_PATH") or find_cuda(cuda_home).libcupti
    run_dir = new_run_dir(td)
    (run_dir / "raw").mkdir()
    env, teller_env = child_env(dict(os.environ), run_dir, lib, nvtx_path, cupti, torch_nvtx)
    # Clock pair for the logs: the shim writes CLOCK_MONOTONIC, the logs carry realtime ns.
    mono0, real0 = time.monotonic_ns(), time.time_ns()
    offset = real0 - mono0
    out_stream = stdout or sys.stdout.buffer
    err_stream = stderr or sys.stderr.buffer
    start_ns = time.time_ns()
    lock = threading.Lock()
    with (
        open(run_dir / "log.txt", "w", encoding="utf-8") as log,
        open(run_dir / "stdout.log", "wb") as raw_out,
        open(run_dir / "stderr.log", "wb") as raw_err,
    ):
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=None)
        except OSError as e:
            # nothing ran: leave no empty run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
            if isinstance(e, FileNotFoundError):
                raise TellerFileNotFoundError(f"{cmd[0]}: command not found", path=cmd[0]) from None
            raise TellerError(f"{cmd[0]}: cannot execute: {e.strerror or e}") from None
        assert proc.stdout is not None and proc.stderr is not None
        tees = [
            _LogTee(proc.stdout, out_stream, raw_out, log, "stdout", lock, offset),
            _LogTee(proc.stderr, err_stream, raw_err, log, "stderr", lock, offset),
        ]
        for t in tees:
            t.start()
        forwarded: list[int] = []

        def forward(signum: int, _frame: Any) -> None:
            forwarded.append(signum)
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

        old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                old[s] = signal.signal(s, forward)
        try:
            rc = proc.wait()
            for t in tees:
                t.join()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
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
        "returncode": returncode,
        "clock_sync": {"clock": "CLOCK_MONOTONIC", "monotonic_ns": mono0, "realtime_ns": real0},
        "shim": shim_info,
        "nvtx_json": str(nvtx_path) if nvtx_path else None,
        # only what teller set and what describes topology: traces get shared, secrets must not
        "env": {**teller_env, **{k: os.environ[k] for k in TOPOLOGY_VARS if k in os.environ}},
        "log_lines": sum(t.lines for t in tees),
    }
    result = RunResult(run_dir=run_dir, returncode=returncode)
    if convert:
        _convert(run_dir, result)
        run["trace_json"] = str(result.trace_json) if result.trace_json else None
        run["warnings"] = result.warnings
    write_atomic(run_dir / "run.json", json.dumps(run, indent=2) + "\n")
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
