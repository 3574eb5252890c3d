"""Collector overhead: NVTX push/pop cost with teller's shim, and end-to-end slowdown of a tiny model.

1. NVTX pair cost: runs `benches/nvtx_overhead.sh` (the shim author's C benchmark: no tool, teller's
   shim in BEGIN/END and SPAN mode, shim with clock_gettime, and the Python `nvtx` package if
   installed), which builds the shim with `cupti_shim/build.sh` into a private build directory, and
   parses its ns/pair medians.
2. End to end: `examples/tiny_inference.py` plain vs under
   `teller collect --nvtx-json transformers`, same arguments, `--repeat` runs of each, interleaved
   (plain, collect, plain, collect, ...) after one unmeasured warm-up of each. Per run: the model time
   (sum of the script's own `request N: ... in X ms` log lines; also without request 0, the warm-up
   request), the whole process wall time, and the CPU time of the process tree (`os.wait4`).
3. Which ranges were captured: the names in the last collected `trace.json`; Nsight Systems (`nsys`) is
   looked up on PATH and reported as absent when it is not there.

The script measures and reports; it never asserts a time.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
REQ_RE = re.compile(r"request (\d+):.*? in ([\d.]+) ms")
NVTX_RE = re.compile(r"^(.*?)\s+([\d.]+) ns/pair\s+\(runs: ([^)]*)\)")


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def nvtx_pairs(build_dir: Path, runs: int, pairs: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHON=PY)
    l0, t0 = _load(), time.perf_counter()
    p = subprocess.run(
        ["bash", str(ROOT / "benches" / "nvtx_overhead.sh"), str(build_dir), str(runs), str(pairs)],
        env=env,
        capture_output=True,
        text=True,
    )
    out: dict[str, Any] = {
        "returncode": p.returncode,
        "stdout": p.stdout,
        "stderr": p.stderr[-2000:],
        "load": [l0, _load()],
        "wall_s": time.perf_counter() - t0,
        "rows": [],
    }
    for line in p.stdout.splitlines():
        m = NVTX_RE.match(line.strip())
        if m:
            out["rows"].append(
                {
                    "label": m.group(1).strip(),
                    "ns_per_pair": float(m.group(2)),
                    "runs": [float(x) for x in m.group(3).split()],
                }
            )
    return out


def run_once(cmd: list[str], cwd: Path) -> dict[str, Any]:
    """One process: wall time, CPU time of the process tree, and the per-request times it logged."""
    l0 = _load()
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    reqs = {int(m.group(1)): float(m.group(2)) for m in REQ_RE.finditer(text)}
    ms = [reqs[k] for k in sorted(reqs)]
    return {
        "returncode": p.returncode,
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "maxrss_kb": ru.ru_maxrss,
        "request_ms": ms,
        "model_ms": sum(ms),
        "model_ms_no_first": sum(ms[1:]),
        "load": [l0, _load()],
        "tail": text[-600:] if p.returncode else "",
    }


def end_to_end(args: argparse.Namespace, trace_root: Path) -> dict[str, Any]:
    workload = [
        str(ROOT / "examples" / "tiny_inference.py"),
        "--requests",
        str(args.requests),
        "--new-tokens",
        str(args.new_tokens),
    ]
    teller_bin = str(Path(PY).parent / "teller")
    plain = [PY, *workload]
    collect = [teller_bin, "collect", "--trace-dir", str(trace_root), "--nvtx-json", "transformers", "--", PY]
    collect += workload
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "collect": []}
    for i in range(args.repeat + 1):  # round 0 is the warm-up (file cache, shim build cache)
        for kind, cmd in (("plain", plain), ("collect", collect)):
            r = run_once(cmd, ROOT)
            if kind == "collect":
                dirs = sorted(trace_root.glob("run-*"), key=lambda d: d.stat().st_mtime)
                if dirs:
                    r["run_dir"] = str(dirs[-1])
                    try:
                        r["child_s"] = json.loads((dirs[-1] / "run.json").read_text())["duration_s"]
                    except (OSError, KeyError, ValueError):
                        pass
            r["warmup"] = i == 0
            print(
                f"  {kind:8} round {i}: {json.dumps({k: v for k, v in r.items() if k != 'tail'})}", flush=True
            )
            if r["returncode"]:
                print(r["tail"], flush=True)
            runs[kind].append(r)
    return {"plain_cmd": plain, "collect_cmd": collect, "runs": runs}


def _median(rs: list[dict[str, Any]], key: str) -> float | None:
    xs = [r[key] for r in rs if not r["warmup"] and r["returncode"] == 0 and key in r]
    return statistics.median(xs) if xs else None


def ranges(run_dir: Path | None) -> dict[str, Any]:
    if run_dir is None or not (run_dir / "trace.json").exists():
        return {}
    d = json.loads((run_dir / "trace.json").read_text())
    events = d["traceEvents"] if isinstance(d, dict) else d
    names = collections.Counter()
    domains = collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            names[e.get("name")] += 1
            domains[(e.get("cat"), (e.get("args") or {}).get("domain"))] += 1
    summary = {}
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "names": dict(names.most_common()),
        "by_cat_domain": {f"{c}/{d}": n for (c, d), n in domains.most_common()},
        "summary": summary,
    }


def machine() -> dict[str, Any]:
    import teller

    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "teller": teller.__version__,
        "load_start": _load(),
        "nsys": shutil.which("nsys"),
    }
    for mod in ("torch", "transformers", "nvtx"):
        try:
            info[mod] = importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            info[mod] = None
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="measured runs of each variant (after one warm-up)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--nvtx-runs", type=int, default=7, help="runs per NVTX configuration (median)")
    ap.add_argument("--nvtx-pairs", type=int, default=10_000_000, help="push/pop pairs per NVTX run")
    ap.add_argument("--build-dir", type=Path, help="shim build directory (default: a temporary one)")
    ap.add_argument("--skip-nvtx", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(150, shutil.get_terminal_size().columns))
    info = machine()
    con.print(info)
    res: dict[str, Any] = {"machine": info, "args": {k: str(v) for k, v in vars(args).items()}}
    tmp = Path(tempfile.mkdtemp(prefix="teller-bench-collect."))
    try:
        if not args.skip_nvtx:
            bdir = args.build_dir or tmp / "shim"
            res["nvtx"] = nv = nvtx_pairs(bdir, args.nvtx_runs, args.nvtx_pairs)
            con.print(nv["stdout"] or nv["stderr"])
            t = Table(
                title=f"NVTX push/pop pair cost ({args.nvtx_pairs:,} pairs, median of {args.nvtx_runs})"
            )
            for c in ("configuration", "ns/pair", "min", "max", "tool - none"):
                t.add_column(c, justify="right")
            base = {r["label"]: r["ns_per_pair"] for r in nv["rows"]}
            for r in nv["rows"]:
                ref = base.get("python: no tool" if r["label"].startswith("python") else "no tool")
                delta = (
                    f"{r['ns_per_pair'] - ref:.1f}" if ref is not None and "no tool" not in r["label"] else ""
                )
                t.add_row(
                    r["label"],
                    f"{r['ns_per_pair']:.1f}",
                    f"{min(r['runs']):.1f}",
                    f"{max(r['runs']):.1f}",
                    delta,
                )
            con.print(t)
            con.print(
                f"load {nv['load'][0]} -> {nv['load'][1]}; Nsight Systems (nsys) on PATH: {info['nsys']}"
            )
        if not args.skip_e2e:
            e2e = end_to_end(args, tmp / "traces")
            res["e2e"] = e2e
            rp, rc = e2e["runs"]["plain"], e2e["runs"]["collect"]
            t = Table(
                title=f"tiny_inference.py --requests {args.requests} --new-tokens {args.new_tokens}: "
                f"median of {args.repeat} interleaved runs"
            )
            for c in ("measure", "plain", "teller collect", "slowdown", "paired median"):
                t.add_column(c, justify="right")
            summary = {}
            for key, label in (
                ("model_ms", "model: sum of requests (ms)"),
                ("model_ms_no_first", "model: requests 1.. (ms)"),
                ("wall_s", "whole process wall (s)"),
                ("cpu_s", "whole process CPU (s)"),
            ):
                a, b = _median(rp, key), _median(rc, key)
                pairs = [
                    y[key] / x[key] - 1
                    for x, y in zip(rp, rc, strict=True)
                    if not x["warmup"] and x["returncode"] == 0 and y["returncode"] == 0 and x[key] > 0
                ]
                pm = statistics.median(pairs) if pairs else None
                slow = b / a - 1 if a and b else None
                summary[key] = {"plain": a, "collect": b, "slowdown": slow, "paired_median": pm}
                t.add_row(
                    label,
                    f"{a:.3f}" if a is not None else "–",
                    f"{b:.3f}" if b is not None else "–",
                    f"{slow:+.1%}" if slow is not None else "–",
                    f"{pm:+.1%}" if pm is not None else "–",
                )
            child = _median(rc, "child_s")
            if child is not None:
                t.add_row("collect: child process only (s)", "", f"{child:.3f}", "", "")
                summary["child_s"] = child
            e2e["summary"] = summary
            con.print(t)
            last = next((Path(r["run_dir"]) for r in reversed(rc) if r.get("run_dir")), None)
            res["ranges"] = rg = ranges(last)
            t = Table(title="Ranges captured for the same program")
            for c in ("range name", "teller collect", "nsys"):
                t.add_column(c, justify="right")
            nsys_cell = "not measured" if info["nsys"] else "not installed"
            for name, n in rg.get("names", {}).items():
                t.add_row(str(name), f"{n:,}", nsys_cell)
            con.print(t)
            con.print({"by category/domain": rg.get("by_cat_domain"), "summary": rg.get("summary")})
        res["machine"]["load_end"] = _load()
        if args.out:
            args.out.write_text(json.dumps(res, indent=1, default=str))
            con.print(f"wrote {args.out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
