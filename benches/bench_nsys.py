"""teller's collector vs Nsight Systems, same programs, same run.

1. Cost per NVTX push/pop pair (benches/nvtx_overhead.c times its own loop): no tool, teller's shim,
   ``nsys profile --trace=nvtx --sample=none --cpuctxsw=none``. Median of N runs, interleaved.
2. Which ranges each tool captured for a program that forks a child (no exec) and also starts a
   thread: counts by range name in teller's trace vs nsys's NVTX_EVENTS (``nsys export --type sqlite``).

Nsight Systems comes from ``benches/nsys_setup.sh`` (Debian's 2022.4 package unpacked locally, not
installed). Measures and prints; never asserts a time.

    python benches/bench_nsys.py [--nsys PATH] [--repeat 7] [--pairs 2000000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FORK_PROGRAM = r"""
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void ranges(const char *name, int n) {
    for (int i = 0; i < n; i++) { nvtxRangePushA(name); usleep(100); nvtxRangePop(); }
}
static void *thread_main(void *arg) { (void)arg; ranges("thread-range", 10); return NULL; }

int main(void) {
    ranges("parent-before-fork", 10);
    pid_t pid = fork();
    if (pid == 0) { ranges("forked-child-range", 10); _exit(0); }
    pthread_t th;
    pthread_create(&th, NULL, thread_main, NULL);
    pthread_join(th, NULL);
    waitpid(pid, NULL, 0);
    ranges("parent-after-fork", 10);
    return 0;
}
"""


def nvtx_include() -> str:
    from teller.cuda import find_cuda

    info = find_cuda()
    if not info.nvtx_h:
        sys.exit("NVTX headers not found (make build installs the nvidia-nvtx wheel)")
    return str(Path(info.nvtx_h).parents[1])


def compile_c(src: str, out: Path, inc: str) -> Path:
    c = out.with_suffix(".c")
    c.write_text(src)
    subprocess.run(
        ["cc", "-O2", "-std=c11", f"-I{inc}", str(c), "-o", str(out), "-pthread", "-ldl"], check=True
    )
    return out


def run_pairs(cmd: list[str], env: dict[str, str]) -> float:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    # nvtx_overhead prints ns/pair as its last stdout line; nsys adds its own chatter before it
    nums = [ln for ln in p.stdout.splitlines() if ln.strip().replace(".", "", 1).isdigit()]
    return float(nums[-1])


def nsys_ranges(nsys: str, report: Path) -> dict[str, int]:
    sqlite = report.with_suffix(".sqlite")
    subprocess.run(
        [nsys, "export", "--type", "sqlite", "-o", str(sqlite), "-f", "true", str(report)],
        check=True,
        capture_output=True,
    )
    con = sqlite3.connect(sqlite)
    cols = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
    if "textId" in cols:
        q = (
            "SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON e.textId = s.id "
            "WHERE e.end IS NOT NULL"
        )
    else:
        q = "SELECT text FROM NVTX_EVENTS WHERE end IS NOT NULL"
    counts: dict[str, int] = {}
    for (name,) in con.execute(q):
        counts[name] = counts.get(name, 0) + 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nsys", default=None, help="nsys binary (default: run benches/nsys_setup.sh)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from teller.collect import shim

    nsys = (
        args.nsys
        or subprocess.run(
            ["bash", str(ROOT / "benches" / "nsys_setup.sh")], check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    lib = str(shim.build())
    inc = nvtx_include()
    tmp = Path(tempfile.mkdtemp(prefix="teller-bench-nsys-"))
    bench = compile_c((ROOT / "benches" / "nvtx_overhead.c").read_text(), tmp / "nvtx_overhead", inc)
    forker = compile_c(FORK_PROGRAM, tmp / "forker", inc)
    base_env = {
        k: v for k, v in os.environ.items() if k not in ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")
    }
    version = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"{version}; teller shim {lib}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; "
        f"{platform.platform()}"
    )

    # 1. cost per pair, interleaved
    results: dict[str, list[float]] = {"no tool": [], "teller": [], "nsys": []}
    for r in range(args.repeat):
        results["no tool"].append(run_pairs([str(bench), str(args.pairs)], base_env))
        env = dict(base_env, NVTX_INJECTION64_PATH=lib, TELLER_TRACE_DIR=str(tmp / f"teller-{r}"))
        results["teller"].append(run_pairs([str(bench), str(args.pairs)], env))
        rep = tmp / f"nsys-{r}"
        results["nsys"].append(
            run_pairs(
                [
                    nsys,
                    "profile",
                    "--trace=nvtx",
                    "--sample=none",
                    "--cpuctxsw=none",
                    "-o",
                    str(rep),
                    "-f",
                    "true",
                    str(bench),
                    str(args.pairs),
                ],
                base_env,
            )
        )
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nNVTX push/pop, {args.pairs} pairs, median of {args.repeat} interleaved runs (ns per pair)")
    print(f"{'tool':<10} {'ns/pair':>9}  runs")
    for k, v in results.items():
        print(f"{k:<10} {med[k]:>9.1f}  {' '.join(f'{x:.1f}' for x in v)}")
    ratio = med["nsys"] / med["teller"] if med["teller"] else float("nan")
    print(f"teller costs 1/{ratio:.1f} of nsys per pair (aim: at most 1/5, and under 100 ns)")

    # 2. which ranges each tool captured (fork without exec, a second thread)
    t0 = time.perf_counter()
    env = dict(base_env, NVTX_INJECTION64_PATH=lib, TELLER_TRACE_DIR=str(tmp / "teller-fork"))
    subprocess.run([str(forker)], env=env, check=True)
    import teller.trace as T

    tr = T.load(tmp / "teller-fork", warn=False)
    teller_counts: dict[str, int] = {}
    for i in range(len(tr)):
        teller_counts[tr.name_of(i)] = teller_counts.get(tr.name_of(i), 0) + 1
    rep = tmp / "nsys-fork"
    subprocess.run(
        [
            nsys,
            "profile",
            "--trace=nvtx,osrt",
            "--sample=none",
            "--cpuctxsw=none",
            "-o",
            str(rep),
            "-f",
            "true",
            str(forker),
        ],
        env=base_env,
        check=True,
        capture_output=True,
    )
    nsys_counts = nsys_ranges(nsys, rep.with_suffix(".nsys-rep"))
    names = ["parent-before-fork", "thread-range", "forked-child-range", "parent-after-fork"]
    print(
        "\nranges captured for a program that forks a child (no exec) and starts a thread (10 each expected)"
    )
    print(f"{'range':<22} {'teller':>7} {'nsys':>7}")
    for n in names:
        print(f"{n:<22} {teller_counts.get(n, 0):>7} {nsys_counts.get(n, 0):>7}")
    print(f"(teller processes in the trace: {len(set(tr.pid.tolist()))}; {time.perf_counter() - t0:.1f} s)")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "nsys": version,
                    "pairs": args.pairs,
                    "repeat": args.repeat,
                    "ns_per_pair": results,
                    "median_ns_per_pair": med,
                    "nsys_over_teller": ratio,
                    "ranges": {
                        n: {"teller": teller_counts.get(n, 0), "nsys": nsys_counts.get(n, 0)} for n in names
                    },
                    "load": os.getloadavg()[0],
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
