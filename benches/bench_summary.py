"""Per-sample encoders in Rust against the Python they replaced: summary rows and log lines.

1. Per-symbol summary rows (`teller.data.summary.symbol_summary`): the Rust loop against the numpy one.

The peer here is teller's own previous implementation, kept as `symbol_summary_reference` (the
definition of every column, and the oracle of `tests/test_data_summary.py`): the same per-event
inputs (numpy in both), then the loop over symbols in numpy or in `teller_core::symrows`. Same
traces, same process, interleaved per trace; every trace's rows are also compared (they must be
identical to the bit, float32). Data: `teller dataset generate --preset default` samples (seed 0,
into a temporary directory), a TPE base vocabulary of their symbols, and each trace once without
reference residuals and once with seeded synthetic ones (columns 17-22, as `teller tokenize` and
`teller diagnose` compute them for a deployment the reference knows).

2. Log encoding (`LogTokenizer.encode_lines`, `teller_core::logtok`) against the pure-Python
definition (`encode_lines_reference`: `re` and `split_log_line`), on the same samples' `log.txt`, with
a vocabulary trained on them; ids and features compared bit for bit.

The script measures and reports; it never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _time(fn, repeat: int, tr=None) -> float:
    """The fastest of ``repeat`` calls; ``tr``'s cached step loads dropped before each (a sample is
    encoded once: the cache saves repeats within one encoding, not across these calls)."""
    best = []
    for _ in range(repeat):
        if tr is not None:
            for k in [k for k in tr.__dict__ if isinstance(k, tuple) and k[:1] == ("_step_arg",)]:
                del tr.__dict__[k]
        t = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t)
    return min(best)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=60, help="default-preset samples to generate (default 60)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed calls per trace and variant; the fastest counts"
    )
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    import teller
    from teller import _native, tpe
    from teller.data.dataset import generate
    from teller.data.summary import _event_inputs, symbol_summary, symbol_summary_reference
    from teller.data.tokenize import LogTokenizer, parse_log

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        generate(Path(tmp) / "d", num_samples=args.samples, preset="default", seed=0)
        print(f"generated {args.samples} default samples in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        traces = [teller.trace.load(p, warn=False) for p in sorted((Path(tmp) / "d").glob("s*/trace.json"))]
        log_paths = sorted((Path(tmp) / "d").glob("s*/log.txt"))
        lt = LogTokenizer.train(log_paths)
        logs = [parse_log(p) for p in log_paths]
    tok = tpe.train(tpe.corpus_from_symbols([sorted({s for tr in traces for s in tr.symbols})]), vocab_size=0)
    rng = np.random.default_rng(0)
    rows = []
    for tr in traces:
        r = rng.normal(0.0, 0.05, len(tr))
        r[rng.random(len(tr)) < 0.5] = np.nan
        for ref in (None, r):
            a_ids, a = symbol_summary(tr, tok, ref_resid=ref)
            b_ids, b = symbol_summary_reference(tr, tok, ref_resid=ref)
            same = bool(np.array_equal(a_ids, b_ids) and np.array_equal(a, b))
            rows.append(
                {
                    "events": len(tr),
                    "symbols": len(a_ids),
                    "reference_residuals": ref is not None,
                    "identical": same,
                    "inputs_ms": 1e3
                    * _time(lambda tr=tr, ref=ref: _event_inputs(tr, tok, 0.1, ref), args.repeat, tr),
                    "rust_ms": 1e3
                    * _time(lambda tr=tr, ref=ref: symbol_summary(tr, tok, ref_resid=ref), args.repeat, tr),
                    "numpy_ms": 1e3
                    * _time(
                        lambda tr=tr, ref=ref: symbol_summary_reference(tr, tok, ref_resid=ref),
                        args.repeat,
                        tr,
                    ),
                }
            )

    log_rows = []
    for lines in logs:
        a, fa = lt.encode_lines(lines, 0)
        b, fb = lt.encode_lines_reference(lines, 0)
        log_rows.append(
            {
                "lines": len(lines),
                "tokens": len(a),
                "identical": bool(
                    np.array_equal(a, b) and np.array_equal(fa.view(np.uint32), fb.view(np.uint32))
                ),
                "rust_ms": 1e3 * _time(lambda lines=lines: lt.encode_lines(lines, 0), args.repeat),
                "python_ms": 1e3
                * _time(lambda lines=lines: lt.encode_lines_reference(lines, 0), args.repeat),
            }
        )

    def med(k: str, sel=lambda r: True) -> float:
        return statistics.median(r[k] for r in rows if sel(r))

    summary = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "native_build": _native.build_profile,
        },
        "traces": len(traces),
        "median_events": statistics.median(r["events"] for r in rows),
        "median_symbols": statistics.median(r["symbols"] for r in rows),
        "all_identical": all(r["identical"] for r in rows),
        "median_ms": {
            k: {
                "without_reference": med(k, lambda r: not r["reference_residuals"]),
                "with": med(k, lambda r: r["reference_residuals"]),
            }
            for k in ("inputs_ms", "rust_ms", "numpy_ms")
        },
        "median_ratio_numpy_over_rust": statistics.median(r["numpy_ms"] / r["rust_ms"] for r in rows),
        "rows": rows,
        "log": {
            "median_lines": statistics.median(r["lines"] for r in log_rows),
            "median_tokens": statistics.median(r["tokens"] for r in log_rows),
            "all_identical": all(r["identical"] for r in log_rows),
            "median_ms": {k: statistics.median(r[k] for r in log_rows) for k in ("python_ms", "rust_ms")},
            "median_ratio_python_over_rust": statistics.median(
                r["python_ms"] / r["rust_ms"] for r in log_rows
            ),
            "rows": log_rows,
        },
    }
    m = summary["median_ms"]
    print(
        f"{len(traces)} traces, median {summary['median_events']:.0f} events / "
        f"{summary['median_symbols']:.0f} symbols, {_native.build_profile} build; "
        f"rows identical: {summary['all_identical']}"
    )
    print(f"{'median per trace (ms)':<34}{'without reference':>18}{'with':>10}")
    for k, name in (
        ("numpy_ms", "numpy loop (reference)"),
        ("rust_ms", "Rust loop (symbol_summary)"),
        ("inputs_ms", "  of which per-event inputs"),
    ):
        print(f"{name:<34}{m[k]['without_reference']:>18.2f}{m[k]['with']:>10.2f}")
    print(f"median ratio numpy / Rust per call: {summary['median_ratio_numpy_over_rust']:.1f}x")
    lg = summary["log"]
    print(
        f"log encoding: {len(log_rows)} logs, median {lg['median_lines']:.0f} lines / "
        f"{lg['median_tokens']:.0f} tokens; identical: {lg['all_identical']}; "
        f"median {lg['median_ms']['python_ms']:.2f} ms (Python) vs "
        f"{lg['median_ms']['rust_ms']:.2f} ms (Rust), {lg['median_ratio_python_over_rust']:.1f}x"
    )
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
