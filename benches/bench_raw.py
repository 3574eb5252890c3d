"""Raw-trace reading: `teller.trace.load` of the collector's MessagePack files against msgpack-python.

Inputs, each read in one process and one run by every tool:

* `h200_llama_tiny`: the real raw file the shim wrote on an H200 (tests/data/gpu, see its README).
* `synthetic_<N>k`: a seeded raw file written with `teller.rawfmt.RawWriter` in the shape the shim writes
  (engine-step ranges over host-operator ranges, each with a `cudaLaunchKernel` SPAN and its kernel),
  in two clock variants with the same records: `header` (the HEADER's pair only: one offset for the
  whole file) and `syncs` (a CLOCK_SYNC every `--sync-every` records with a realtime drift of 50 ppm,
  so the reader interpolates the offset between pairs for every timestamp; the shim writes one every
  10 s by default, so this is far denser than a real file: it bounds what the interpolation costs).

Tools:

* teller: `teller.trace.load(path, warn=False)`, the columnar model: BEGIN/END paired, clocks
  aligned, GPU work linked to its launch, the call-chain tree, steps.
* msgpack: `list(msgpack.Unpacker(f, raw=False))`, Python lists only: the decoding a Python reader
  of the format pays before pairing anything; and the same with the garbage collector off
  (`msgpack, gc off`: a million lists set it off again and again, which a reader can avoid).
  The shim's files hold zero padding (unwritten chunk tails), which msgpack reads as one value per
  byte: on the H200 file that is most of its time, so its row is no comparison of the formats' cost.

Per input: one unmeasured warm-up of each tool, then `--repeat` interleaved rounds; the median wall time.
Ratio = msgpack time / teller time (above 1: teller is faster). It measures and reports; it never
asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import teller
from teller.rawfmt import RawWriter

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "data" / "gpu" / "h200_llama_tiny" / "raw"
KERNELS = (
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
    "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, bf16>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1>>",
    "void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*, float, int, int)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
)
OPS = ("aten::mm", "aten::linear", "vllm::rms_norm", "aten::add", "vllm::unified_attention")


def write_synthetic(path: Path, groups: int, seed: int, sync_every: int | None) -> int:
    """A raw file of about 4 * `groups` records (see the module doc); returns the record count."""
    rng = np.random.default_rng(seed)
    mono0, real0 = 1_000_000_000_000, 1_765_000_000_000_000_000
    w = RawWriter(path, pid=4242, ppid=1, host="bench", argv=["bench"], clock_sync=(mono0, real0), env={})
    t, corr, n = mono0 + 1_000, 0, 1
    per_step = 1000
    step = 0
    durs = rng.integers(1_000, 4_000, size=groups)  # (launched every 3 us: the GPU keeps up, mostly)
    kend = 0
    for g in range(groups):
        if g % per_step == 0:
            if g:
                w.end(step, tid=11, ts=t)
                n += 1
            step = w.begin("annotation", "execute_model", tid=11, ts=t)
            n += 1
        k = int(rng.integers(len(OPS)))
        r = w.begin("host_op", OPS[k], tid=11, ts=t + 100)
        corr += 1
        w.span("runtime", "cudaLaunchKernel", tid=11, start=t + 300, end=t + 2_300, corr=corr)
        # (one stream: a kernel starts when it is launched and the one before it has ended)
        kstart = max(t + 5_000, kend)
        kend = kstart + int(durs[g])
        w.gpu("kernel", KERNELS[k], device=0, stream=7, start=kstart, end=kend, corr=corr)
        w.end(r, tid=11, ts=t + 2_600)
        n += 4
        t += 3_000
        if sync_every and n % sync_every < 4:
            # realtime drifts 50 ppm against the monotonic clock: the reader must interpolate
            w.clock_sync(t, real0 + (t - mono0) + (t - mono0) * 50 // 1_000_000)
            n += 1
    w.end(step, tid=11, ts=t)
    n += 1
    w.close()
    return n + len(w._strings)  # (and the HEADER: counted at the start)


def run_teller(path: Path) -> int:
    return len(teller.trace.load(path, warn=False))


def run_msgpack(path: Path) -> int:
    with open(path, "rb") as f:
        return len(list(msgpack.Unpacker(f, raw=False, strict_map_key=False)))


def run_msgpack_nogc(path: Path) -> int:
    gc.disable()
    try:
        return run_msgpack(path)
    finally:
        gc.enable()


TOOLS: dict[str, Callable[[Path], int]] = {
    "teller": run_teller,
    "msgpack": run_msgpack,
    "msgpack, gc off": run_msgpack_nogc,
}


def measure(path: Path, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    times: dict[str, list[float]] = {t: [] for t in TOOLS}
    for t, fn in TOOLS.items():  # warm-up (page cache, imports)
        out[t] = {"count": fn(path)}
    for _ in range(repeat):
        for t, fn in TOOLS.items():
            t0 = time.perf_counter()
            fn(path)
            times[t].append(time.perf_counter() - t0)
    for t in TOOLS:
        out[t]["times_s"] = times[t]
        out[t]["median_s"] = statistics.median(times[t])
    out["ratio"] = out["msgpack"]["median_s"] / out["teller"]["median_s"]
    out["ratio_gc_off"] = out["msgpack, gc off"]["median_s"] / out["teller"]["median_s"]
    return out


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the results (JSON) here")
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds per input (default 5)")
    ap.add_argument("--groups", type=int, default=250_000, help="synthetic launch groups (4 records each)")
    ap.add_argument(
        "--sync-every", type=int, default=1_000, help="records between CLOCK_SYNCs (syncs variant)"
    )
    ap.add_argument("--seed", type=int, default=20261207)
    ap.add_argument("--quick", action="store_true", help="1 round, 20k groups: a smoke test")
    args = ap.parse_args(argv)
    repeat, groups = (1, 20_000) if args.quick else (args.repeat, args.groups)

    info = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "teller": teller.__version__,
        "teller_build": getattr(teller, "build_profile", "?"),
        "msgpack": msgpack.version,
        "loadavg_start": list(os.getloadavg()),
    }
    print(
        f"teller {info['teller']} ({info['teller_build']} build), "
        f"msgpack {'.'.join(map(str, msgpack.version))}"
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="teller-bench-raw-") as tmp:
        inputs: list[tuple[str, Path, int | None]] = [
            (p.parent.parent.name, p, None) for p in sorted(REAL.glob("*.tmsgpack"))
        ]
        for variant, every in (("header", None), ("syncs", args.sync_every)):
            p = Path(tmp) / f"synthetic-{variant}.tmsgpack"
            t0 = time.perf_counter()
            n = write_synthetic(p, groups, args.seed, every)
            print(
                f"synthetic ({variant}): {n:,} records, {p.stat().st_size / 1e6:.1f} MB, "
                f"written in {time.perf_counter() - t0:.1f} s"
            )
            inputs.append((f"synthetic_{groups * 4 // 1000}k ({variant})", p, n))
        print(
            f"{'input':32} {'MB':>7} {'events':>9} {'teller ms':>10} {'msgpack ms':>11} {'ratio':>6} "
            f"{'gc off ms':>10} {'ratio':>6}"
        )
        for name, p, _ in inputs:
            m = measure(p, repeat)
            row = {
                "input": name,
                "bytes": p.stat().st_size,
                "events": m["teller"]["count"],
                "records": m["msgpack"]["count"],
                **m,
            }
            rows.append(row)
            print(
                f"{name:32} {row['bytes'] / 1e6:7.1f} {row['events']:9,} "
                f"{m['teller']['median_s'] * 1e3:10.1f} "
                f"{m['msgpack']['median_s'] * 1e3:11.1f} {m['ratio']:6.2f} "
                f"{m['msgpack, gc off']['median_s'] * 1e3:10.1f} {m['ratio_gc_off']:6.2f}"
            )
    syn = {r["input"].split(" ")[-1]: r for r in rows if r["input"].startswith("synthetic")}
    if len(syn) == 2:
        extra = syn["(syncs)"]["teller"]["median_s"] / syn["(header)"]["teller"]["median_s"] - 1
        print(
            f"interpolating between {syn['(syncs)']['records'] - syn['(header)']['records']:,} pairs: "
            f"teller {100 * extra:+.1f} %"
        )
    info["loadavg_end"] = list(os.getloadavg())
    if args.out:
        args.out.write_text(
            json.dumps(
                {"machine": info, "config": vars(args) | {"out": str(args.out)}, "results": rows}, indent=1
            )
            + "\n"
        )
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
