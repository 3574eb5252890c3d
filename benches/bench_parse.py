#!/usr/bin/env python3
"""Trace-parsing throughput: teller.trace.load against json.load, orjson and HolisticTraceAnalysis.

Every tool reads the same files in the same process and run: each real fixture in
tests/data/traces as shipped (.json.gz) and decompressed to a temporary directory (.json), plus a
deterministic synthetic Kineto-like trace (~1M events). For each file every tool runs once to warm
up, then ``--repeat`` rounds run every tool once each (interleaved, so background load on a shared
machine hits all tools alike); the median wall time is reported. Throughput is
uncompressed JSON bytes per second and teller events (``len(trace)``) per second; ratios are
``peer_time / teller_time`` (above 1 means teller is faster).

What each tool produces differs (see docs/benchmarks.md): json.load and orjson only build Python
dicts; HTA builds a pandas DataFrame (plus its fwd/bwd links, correlation and iteration columns);
teller builds its columnar model, links events, builds the call-chain tree and finds steps.

This script measures and reports. It never asserts a time.

    python benches/bench_parse.py --out docs/benchmarks-parse.json
    python benches/bench_parse.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import gzip
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import teller
import teller.trace
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO / "tests" / "data" / "traces"
TOOLS = ("teller", "json.load", "orjson", "HTA")
PEERS = TOOLS[1:]
HTA_CALL = "hta.common.trace.parse_trace_file(path)  # default ParserConfig"


# --- the tools --------------------------------------------------------------------------------------


def _open_bytes(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def run_teller(path: Path) -> tuple[Any, int]:
    tr = teller.trace.load(path, warn=False)
    return tr, len(tr)


def _n_trace_events(doc: Any) -> int:
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return len(events)


def run_json(path: Path) -> tuple[Any, int]:
    with _open_bytes(path) as fh:
        doc = json.load(fh)
    return doc, _n_trace_events(doc)


def run_orjson(path: Path) -> tuple[Any, int]:
    with _open_bytes(path) as fh:
        doc = orjson.loads(fh.read())
    return doc, _n_trace_events(doc)


def _hta_parse() -> tuple[Callable[[str], Any] | None, dict[str, str]]:
    """HTA's public single-file loader and a description of how it is configured."""
    info: dict[str, str] = {"call": HTA_CALL}
    try:
        info["version"] = importlib.metadata.version("HolisticTraceAnalysis")
        from hta.common.trace import parse_trace_file
        from hta.common.trace_parser import get_default_trace_parsing_backend
    except Exception as exc:  # not installed, or broken against this pandas/numpy
        info["error"] = f"{type(exc).__name__}: {exc}"
        return None, info
    # HTA logs a WARNING per parsed file (timings, ns rounding); keep the table readable.
    logging.getLogger("hta").setLevel(logging.ERROR)
    info["backend"] = str(get_default_trace_parsing_backend())
    try:
        import ijson

        info["ijson_backend"] = ijson.backend
    except ImportError:
        info["ijson_backend"] = "not installed"
    return parse_trace_file, info


def make_run_hta(parse: Callable[[str], Any]) -> Callable[[Path], tuple[Any, int]]:
    def run_hta(path: Path) -> tuple[Any, int]:
        meta, df, symbols = parse(str(path))
        return (meta, df, symbols), len(df)

    return run_hta


# --- timing -----------------------------------------------------------------------------------------


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise _Timeout in the main thread after ``seconds`` (checked between Python bytecodes)."""
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise _Timeout(f"timed out after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _call(fn: Callable[[Path], tuple[Any, int]], path: Path, timeout: float | None) -> dict:
    """One call: wall and process-CPU seconds and the item count, or the error. Never raises."""
    gc.collect()
    try:
        with _deadline(timeout):
            c0, t0 = time.process_time(), time.perf_counter()
            result, count = fn(path)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        del result
    except _Timeout as exc:
        return {"error": f"timeout: {exc}"}
    except Exception as exc:
        msg = " ".join(str(exc).split())
        return {"error": f"{type(exc).__name__}: {msg[:160]}"}
    return {"wall": wall, "cpu": cpu, "count": count}


def measure(tools: dict, path: Path, repeat: int, timeouts: dict) -> dict[str, dict]:
    """One warm-up call per tool, then ``repeat`` rounds that run every tool once, interleaved.

    Interleaving spreads background load on a shared machine over all tools alike, so the ratios
    are less skewed than when each tool's runs are back to back. A tool that fails or times out
    is recorded and dropped from later rounds.
    """
    live = {t: fn for t, fn in tools.items() if fn is not None}
    out: dict[str, dict] = {t: {"error": "skipped"} for t in tools if tools[t] is None}
    runs: dict[str, list[dict]] = {t: [] for t in live}
    for rnd in range(repeat + 1):  # round 0 is the warm-up
        for tool, fn in list(live.items()):
            r = _call(fn, path, timeouts.get(tool))
            if "error" in r:
                out[tool] = {"error": r["error"], "times_s": [x["wall"] for x in runs[tool]]}
                del live[tool]
            elif rnd:
                runs[tool].append(r)
            else:
                out[tool] = {"count": r["count"]}
    for tool in live:
        walls = [r["wall"] for r in runs[tool]]
        cpus = [r["cpu"] for r in runs[tool]]
        out[tool] = {
            "median_s": statistics.median(walls),
            "min_s": min(walls),
            "max_s": max(walls),
            "times_s": walls,
            "cpu_median_s": statistics.median(cpus),
            "count": runs[tool][-1]["count"],
        }
    return {t: out[t] for t in tools}


# --- synthetic trace --------------------------------------------------------------------------------

# (parent op, child op, kernel name templates): realistic, long, template-heavy names.
_OPS: list[tuple[str, str, list[str]]] = [
    (
        "aten::linear",
        "aten::addmm",
        [
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_{m}x{n}_{k}x{s}_tn_align8>"
            "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_{m}x{n}_{k}x{s}_tn_align8::Params)",
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize{m}x{n}x{k}_warpgroupsize1x1x1"
            "_execute_segment_k_off_kernel__5x_cublas",
        ],
    ),
    (
        "aten::layer_norm",
        "aten::native_layer_norm",
        [
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
            "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
            "c10::BFloat16*)",
        ],
    ),
    (
        "aten::softmax",
        "aten::_softmax",
        [
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<{s}, c10::BFloat16, float, "
            "c10::BFloat16, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>"
            "(c10::BFloat16*, c10::BFloat16 const*, int)",
        ],
    ),
    (
        "aten::add",
        "aten::add_",
        [
            "void at::native::vectorized_elementwise_kernel<{s}, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "at::detail::Array<char*, 3>)",
        ],
    ),
    (
        "aten::scaled_dot_product_attention",
        "aten::_flash_attention_forward",
        [
            "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<{m}, {n}, {k}, {s}, false, false, "
            "cutlass::bfloat16_t, Flash_kernel_traits<{m}, {n}, {k}, {s}, cutlass::bfloat16_t> >, "
            "false, true, false, false, true, true, false>(flash::Flash_fwd_params)",
        ],
    ),
    (
        "aten::mean",
        "aten::sum",
        [
            "void at::native::reduce_kernel<{m}, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
            "float, float, float>, unsigned int, float, {s}> >(at::native::ReduceOp<float, "
            "at::native::MeanOps<float, float, float, float>, unsigned int, float, {s}>)",
        ],
    ),
    (
        "c10d::allreduce_",
        "record_param_comms",
        ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<{m}ul>)"],
    ),
]
_TILES = (64, 128, 256)
_GROUPS_PER_STEP = 1000


def _us(ns: int) -> str:
    """Float µs with exactly 3 decimals, as Kineto writes them."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def write_synthetic_trace(path: Path, n_events: int, seed: int) -> None:
    """A Kineto-like trace with about ``n_events`` X events (cpu_op, cuda_runtime, kernel, steps).

    Each op group is a cpu_op parent, its cpu_op child, a cudaLaunchKernel runtime call and the kernel
    on a GPU stream, tied by an ``External id``, a correlation id and an ac2g flow (s on the launch,
    f on the kernel). Groups are wrapped in ``ProfilerStep#N`` user annotations. Deterministic in seed.
    """
    rng = random.Random(seed)
    pid, tid, gpu_tid = 2910249, 2919752, 7
    n_groups = max(1, n_events // 4)
    t_cpu = 4458676388068_000  # ns
    t_gpu = t_cpu
    # Real CUPTI correlation / external ids are large and keep growing over a process's lifetime.
    ext = rng.randint(10_000, 100_000)
    corr = rng.randint(100_000, 1_000_000)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(
            '{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, '
            '"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912, '
            '"computeMajor": 9, "computeMinor": 0, "numSms": 132}], "traceEvents": [\n'
        )
        fh.write(
            f'{{"name": "process_name", "ph": "M", "ts": {_us(t_cpu)}, "pid": {pid}, "tid": 0, '
            f'"args": {{"name": "python3.11"}}}},\n'
            f'{{"name": "process_name", "ph": "M", "ts": {_us(t_cpu)}, "pid": 0, "tid": 0, '
            f'"args": {{"name": "python3.11"}}}},\n'
            f'{{"name": "thread_name", "ph": "M", "ts": {_us(t_cpu)}, "pid": 0, "tid": {gpu_tid}, '
            f'"args": {{"name": "stream {gpu_tid}"}}}},\n'
        )
        step = 0
        done = 0
        while done < n_groups:
            groups = min(_GROUPS_PER_STEP, n_groups - done)
            step_start = t_cpu
            out: list[str] = []
            for _ in range(groups):
                parent, child, kernels = _OPS[rng.randrange(len(_OPS))]
                kname = rng.choice(kernels).format(
                    m=rng.choice(_TILES),
                    n=rng.choice(_TILES),
                    k=rng.choice((32, 64)),
                    s=rng.choice((2, 4, 8)),
                )
                p_ts = t_cpu + rng.randint(1_000, 5_000)
                c_ts = p_ts + rng.randint(500, 3_000)
                r_ts = c_ts + rng.randint(1_000, 4_000)
                r_dur = rng.randint(2_000, 9_000)
                c_end = r_ts + r_dur + rng.randint(300, 2_000)
                p_end = c_end + rng.randint(300, 2_000)
                k_ts = max(t_gpu, r_ts + r_dur // 2) + rng.randint(1_000, 20_000)
                k_dur = rng.randint(1_500, 400_000)
                out.append(
                    f'{{"ph": "X", "cat": "cpu_op", "name": "{parent}", "pid": {pid}, "tid": {tid}, '
                    f'"ts": {_us(p_ts)}, "dur": {_us(p_end - p_ts)}, "args": {{"External id": {ext}, '
                    f'"Record function id": 0, "Ev Idx": {ext}}}}},\n'
                    f'{{"ph": "X", "cat": "cpu_op", "name": "{child}", "pid": {pid}, "tid": {tid}, '
                    f'"ts": {_us(c_ts)}, "dur": {_us(c_end - c_ts)}, "args": {{"External id": {ext + 1}, '
                    f'"Record function id": 0, "Sequence number": {ext}, "Fwd thread id": 0, '
                    f'"Ev Idx": {ext + 1}}}}},\n'
                    f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
                    f'"tid": {tid}, "ts": {_us(r_ts)}, "dur": {_us(r_dur)}, "args": {{"External id": '
                    f'{ext + 1}, "cbid": 211, "correlation": {corr}}}}},\n'
                    f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {_us(r_ts)}, '
                    f'"cat": "ac2g", "name": "ac2g"}},\n'
                    f'{{"ph": "X", "cat": "kernel", "name": "{kname}", "pid": 0, "tid": {gpu_tid}, '
                    f'"ts": {_us(k_ts)}, "dur": {_us(k_dur)}, "args": {{"External id": {ext + 1}, '
                    f'"queued": 0, "device": 0, "context": 1, "stream": {gpu_tid}, "correlation": {corr}, '
                    f'"registers per thread": {rng.choice((32, 40, 64, 128, 168))}, "shared memory": '
                    f'{rng.choice((0, 4096, 49152, 101376))}, "blocks per SM": {rng.random() * 8:.6f}, '
                    f'"warps per SM": {rng.random() * 64:.6f}, "grid": [{rng.randint(1, 4096)}, 1, 1], '
                    f'"block": [{rng.choice((128, 256, 512))}, 1, 1], "est. achieved occupancy %": '
                    f"{rng.randint(0, 100)}}}}},\n"
                    f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": {gpu_tid}, "ts": {_us(k_ts)}, '
                    f'"cat": "ac2g", "name": "ac2g", "bp": "e"}},\n'
                )
                t_cpu = p_end
                t_gpu = k_ts + k_dur
                ext += 2
                corr += 1
            t_cpu += rng.randint(1_000, 10_000)
            fh.write(
                f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {pid}, '
                f'"tid": {tid}, "ts": {_us(step_start)}, "dur": {_us(t_cpu - step_start)}, '
                f'"args": {{"External id": {ext}, "Record function id": 0}}}},\n'
            )
            fh.write("".join(out))
            ext += 1
            step += 1
            done += groups
        fh.write(
            f'{{"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces", '
            f'"tid": "Trace PyTorch Profiler", "ts": {_us(4458676388068_000)}}}\n'
        )
        fh.write('], "traceName": "synthetic", "displayTimeUnit": "ms", "baseTimeNanoseconds": 0}\n')


# --- machine info -----------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def teller_build() -> dict[str, Any]:
    """Which extension binary was measured: the tree is rebuilt often, so record the file itself."""
    info: dict[str, Any] = {"profile": teller.build_profile}
    native = getattr(teller.trace._native, "__file__", None)
    if native:
        st = os.stat(native)
        info["native_mtime_utc"] = dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
        info["native_sha256"] = hashlib.sha256(Path(native).read_bytes()).hexdigest()[:16]
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        info["git_head"] = head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def machine_info(hta_info: dict[str, str]) -> dict[str, Any]:
    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": _cpu_model(),
        "cores_online": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_start": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "orjson": orjson.__version__,
        "pandas": _version("pandas"),
        "teller": teller.__version__,
        "teller_build_profile": teller.build_profile,
        "teller_build": teller_build(),
        "hta": hta_info,
    }


# --- reporting --------------------------------------------------------------------------------------


def _fmt_ms(t: dict) -> str:
    return f"{t['median_s'] * 1e3:,.1f}" if "median_s" in t else "FAIL"


def _rate(num: float, secs: float, scale: float) -> str:
    return f"{num / secs / scale:,.1f}" if secs > 0 else "-"


def _ratio(peer: dict, mine: dict) -> str:
    if "median_s" not in peer or "median_s" not in mine:
        return "-"
    return f"{peer['median_s'] / mine['median_s']:,.1f}x"


def _agg_cell(agg: dict, tool: str, key: str, scale: float = 1.0, suffix: str = "") -> str:
    d = agg["tools"][tool]
    if not d.get("files_ok"):
        return "FAIL"
    n = agg["files"]
    mark = "" if d["files_ok"] == n else f" ({d['files_ok']}/{n})"
    return f"{d[key] / scale:,.1f}{suffix}{mark}"


def aggregate(rows: list[dict], variant: str) -> dict:
    """Total bytes / total time per tool, over the fixtures where that tool succeeded."""
    sel = [r for r in rows if r["variant"] == variant]
    agg: dict[str, Any] = {"variant": variant, "files": len(sel), "tools": {}}
    for tool in TOOLS:
        ok = [r for r in sel if "median_s" in r["tools"][tool] and "median_s" in r["tools"]["teller"]]
        if not ok:
            agg["tools"][tool] = {"files_ok": 0}
            continue
        secs = sum(r["tools"][tool]["median_s"] for r in ok)
        teller_secs = sum(r["tools"]["teller"]["median_s"] for r in ok)
        nbytes = sum(r["bytes"] for r in ok)
        events = sum(r["events"] for r in ok)
        agg["tools"][tool] = {
            "files_ok": len(ok),
            "total_s": secs,
            "bytes": nbytes,
            "events": events,
            "mb_per_s": nbytes / secs / 1e6,
            "events_per_s": events / secs,
            "ratio_vs_teller": secs / teller_secs,
        }
    return agg


def print_report(console: Console, info: dict, rows: list[dict], aggs: list[dict], repeat: dict) -> None:
    tb = info["teller_build"]
    if info.get("teller_build_end", tb) != tb:
        console.print("[bold red]the teller extension changed on disk during the run[/]")
    console.print(
        f"[bold]teller trace-parse benchmark[/]  {info['date_utc']}\n"
        f"CPU: {info['cpu_model']}  cores online/usable: {info['cores_online']}/{info['cores_usable']}  "
        f"loadavg at start: {', '.join(f'{x:.2f}' for x in info['loadavg_start'])}\n"
        f"python {info['python']}  numpy {info['numpy']}  orjson {info['orjson']}  "
        f"pandas {info['pandas']}  teller {info['teller']} ({info['teller_build_profile']}; "
        f"_native {tb.get('native_sha256', '?')} built {tb.get('native_mtime_utc', '?')}, "
        f"git {tb.get('git_head', '?')})\n"
        f"HTA {info['hta'].get('version', '-')}: {info['hta']['call']}; "
        f"backend {info['hta'].get('backend', '-')} (ijson: {info['hta'].get('ijson_backend', '-')})\n"
        f"median of {repeat['real']} interleaved runs after 1 warm-up (synthetic: {repeat['large']} runs); "
        "ratio = peer time / teller time"
    )

    t1 = Table(title="Median wall time (ms)", show_lines=False)
    for col in ("file", "fmt", "MB", "events"):
        t1.add_column(col, justify="left" if col in ("file", "fmt") else "right")
    for tool in TOOLS:
        t1.add_column(tool, justify="right")
    t2 = Table(title="Throughput and ratios")
    t2.add_column("file")
    t2.add_column("fmt")
    t2.add_column("teller MB/s", justify="right")
    t2.add_column("teller Mev/s", justify="right")
    for peer in PEERS:
        t2.add_column(f"{peer} MB/s", justify="right")
    for peer in PEERS:
        t2.add_column(f"{peer}/teller", justify="right")

    failures: list[str] = []
    for r in rows:
        tl = r["tools"]
        t1.add_row(
            r["file"],
            r["variant"],
            f"{r['bytes'] / 1e6:,.1f}",
            f"{r['events']:,}",
            *(_fmt_ms(tl[t]) for t in TOOLS),
        )
        te = tl["teller"]
        t2.add_row(
            r["file"],
            r["variant"],
            _rate(r["bytes"], te.get("median_s", 0), 1e6),
            _rate(r["events"], te.get("median_s", 0), 1e6),
            *(_rate(r["bytes"], tl[p].get("median_s", 0), 1e6) for p in PEERS),
            *(_ratio(tl[p], te) for p in PEERS),
        )
        for tool in TOOLS:
            if "error" in tl[tool]:
                failures.append(f"{r['file']} ({r['variant']}) {tool}: {tl[tool]['error']}")

    for a in aggs:
        at = a["tools"]
        label = f"ALL {a['files']} real"

        t1.add_section()
        t1.add_row(
            label,
            a["variant"],
            f"{at['teller'].get('bytes', 0) / 1e6:,.1f}",
            f"{at['teller'].get('events', 0):,}",
            *(_agg_cell(a, t, "total_s", 1e-3) for t in TOOLS),
        )
        t2.add_section()
        t2.add_row(
            label,
            a["variant"],
            _agg_cell(a, "teller", "mb_per_s"),
            _agg_cell(a, "teller", "events_per_s", 1e6),
            *(_agg_cell(a, p, "mb_per_s") for p in PEERS),
            *(_agg_cell(a, p, "ratio_vs_teller", suffix="x") for p in PEERS),
        )
    t3 = Table(
        title="Cross-check: process-CPU-time ratios (peer CPU s / teller CPU s; all tools single-threaded)"
    )
    t3.add_column("file")
    t3.add_column("fmt")
    t3.add_column("teller CPU / wall", justify="right")
    for peer in PEERS:
        t3.add_column(f"{peer}/teller CPU", justify="right")
    for r in rows:
        tl = r["tools"]
        te = tl["teller"]
        if "cpu_median_s" not in te:
            continue
        t3.add_row(
            r["file"],
            r["variant"],
            f"{te['cpu_median_s'] / te['median_s']:.2f}",
            *(
                f"{tl[p]['cpu_median_s'] / te['cpu_median_s']:,.1f}x" if "cpu_median_s" in tl[p] else "-"
                for p in PEERS
            ),
        )
    console.print(t1)
    console.print(t2)
    console.print(t3)
    console.print(
        "ALL rows: total bytes / total median time over the real fixtures; (k/n) = only the k fixtures the "
        "tool parsed, with teller's time over the same k. Synthetic rows are not in ALL."
    )
    if failures:
        console.print("[bold]Failures[/]")
        for f in failures:
            console.print(f"  {f}", markup=False)


# --- main -------------------------------------------------------------------------------------------


def bench_file(
    name: str,
    variant: str,
    path: Path,
    nbytes: int,
    tools: dict,
    repeat: int,
    timeouts: dict,
    console: Console,
) -> dict:
    row: dict[str, Any] = {"file": name, "variant": variant, "bytes": nbytes}
    row["disk_bytes"] = path.stat().st_size
    console.print(f"  {name} ({variant}) ...", end="", markup=False, highlight=False)
    results = measure({t: tools.get(t) for t in TOOLS}, path, repeat, timeouts)
    summary = ", ".join(f"{t} {_fmt_ms(results[t])}" for t in TOOLS)
    console.print(f" ms: {summary}", markup=False, highlight=False)
    row["tools"] = results
    row["events"] = results["teller"].get("count", 0)
    row["json_events"] = results["json.load"].get("count")
    row["hta_rows"] = results["HTA"].get("count")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write raw results (JSON) here")
    ap.add_argument("--repeat", type=int, help="timed runs per (file, tool); default 5 (1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1 run, small synthetic trace: a smoke test")
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="directory of *.kineto.json.gz")
    ap.add_argument("--large-events", type=int, help="synthetic trace size (default 1,000,000)")
    ap.add_argument("--large-repeat", type=int, help="timed runs on the synthetic trace (default 3)")
    ap.add_argument("--seed", type=int, default=20240522, help="synthetic trace seed")
    ap.add_argument("--no-large", action="store_true", help="skip the synthetic trace")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA everywhere")
    ap.add_argument("--no-hta-large", action="store_true", help="skip HTA on the synthetic trace")
    ap.add_argument("--hta-timeout", type=float, default=600.0, help="seconds per HTA call before giving up")
    args = ap.parse_args(argv)

    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    large_events = args.large_events or (50_000 if args.quick else 1_000_000)
    large_repeat = args.large_repeat or (1 if args.quick else min(3, repeat))
    console = Console(width=max(Console().width, 150))

    if args.no_hta:
        hta_parse, hta_info = None, {"call": HTA_CALL, "error": "skipped (--no-hta)"}
    else:
        hta_parse, hta_info = _hta_parse()
    tools: dict[str, Callable | None] = {
        "teller": run_teller,
        "json.load": run_json,
        "orjson": run_orjson,
        "HTA": make_run_hta(hta_parse) if hta_parse else None,
    }
    timeouts = {"HTA": args.hta_timeout}
    info = machine_info(hta_info)

    fixtures = sorted(args.traces.glob("*.kineto.json.gz"))
    if not fixtures:
        console.print(f"no *.kineto.json.gz under {args.traces}")
        return 2

    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="teller-bench-"))
    try:
        for gz_path in fixtures:
            name = gz_path.name.removesuffix(".kineto.json.gz")
            plain = tmp / gz_path.name.removesuffix(".gz")
            with gzip.open(gz_path, "rb") as src, open(plain, "wb") as dst:
                shutil.copyfileobj(src, dst)
            nbytes = plain.stat().st_size
            for variant, path in (("gz", gz_path), ("json", plain)):
                rows.append(bench_file(name, variant, path, nbytes, tools, repeat, timeouts, console))
        aggs = [aggregate(rows, v) for v in ("gz", "json")]

        if not args.no_large:
            big = tmp / "synthetic.kineto.json"
            t0 = time.perf_counter()
            write_synthetic_trace(big, large_events, args.seed)
            big_gz = tmp / "synthetic.kineto.json.gz"
            with open(big, "rb") as src, gzip.open(big_gz, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            big_bytes = big.stat().st_size
            console.print(
                f"synthetic trace: {big_bytes / 1e6:,.1f} MB ({big_gz.stat().st_size / 1e6:,.1f} MB gz), "
                f"seed {args.seed}, written in {time.perf_counter() - t0:.1f} s"
            )
            big_tools = dict(tools)
            if args.no_hta_large:
                big_tools["HTA"] = None
            label = f"synthetic_{large_events // 1000}k"
            for variant, path in (("gz", big_gz), ("json", big)):
                row = bench_file(label, variant, path, big_bytes, big_tools, large_repeat, timeouts, console)
                rows.append(row)
                rows[-1]["synthetic"] = {"requested_events": large_events, "seed": args.seed}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    info["loadavg_end"] = list(os.getloadavg())
    info["teller_build_end"] = teller_build()
    print_report(console, info, rows, aggs, {"real": repeat, "large": large_repeat})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": info,
            "config": {
                "repeat": repeat,
                "large_repeat": large_repeat,
                "large_events": None if args.no_large else large_events,
                "seed": args.seed,
                "hta_timeout_s": args.hta_timeout,
                "quick": args.quick,
            },
            "results": rows,
            "aggregate": aggs,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        console.print(f"raw results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
