"""Diagnosis latency: ``teller.models.diagnose.diagnose`` per capture, on CPU.

For a checkpoint and a dataset split: the first call of this process (the checkpoint and tokenizers
loaded, the first forward pass; torch already imported), then every sample diagnosed ``--passes``
times in one process, as ``teller diagnose PATH...`` does; prints the median, p90 and max per call and
the model's own share (``inference_ms``), and writes them as JSON with ``--out``.

    .venv/bin/python benches/bench_diagnose.py --checkpoint RUN --dataset DATASET \\
        [--split test] [--samples 30] [--passes 3] [--out docs/benchmarks-diagnose.json]

The docs' figures used the seed-0 benchmark MoT on 30 test samples of the ``default`` dataset; the
demo's checkpoint (``output/demo/checkpoints/mot``, ``output/demo/dataset``) is smaller. It
measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--dataset", required=True, type=Path)
    ap.add_argument("--split", default="test")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)

    import numpy as np
    from teller.models.diagnose import diagnose

    man = json.loads((a.dataset / "manifest.json").read_text())
    ids = man["splits"].get(a.split, [])[: a.samples]
    if not ids:
        print(f"{a.dataset}: no samples in {a.split!r}", file=sys.stderr)
        return 2
    paths = [a.dataset / s for s in ids]
    t0 = time.perf_counter()
    diagnose(paths[0], a.checkpoint)
    first_ms = 1000 * (time.perf_counter() - t0)
    calls, model = [], []
    for _ in range(a.passes):
        for p in paths:
            t0 = time.perf_counter()
            d = diagnose(p, a.checkpoint)
            calls.append(1000 * (time.perf_counter() - t0))
            model.append(d["inference_ms"])
    c, m = np.asarray(calls), np.asarray(model)
    res = {
        "checkpoint": str(a.checkpoint),
        "dataset": str(a.dataset),
        "split": a.split,
        "samples": len(paths),
        "passes": a.passes,
        "first_call_ms": first_ms,
        "median_ms": float(np.median(c)),
        "p90_ms": float(np.percentile(c, 90)),
        "max_ms": float(c.max()),
        "model_median_ms": float(np.median(m)),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "loadavg": os.getloadavg(),
    }
    print(
        f"{len(paths)} {a.split} samples x {a.passes}: median {res['median_ms']:.1f} ms, p90 "
        f"{res['p90_ms']:.1f} ms, max {res['max_ms']:.1f} ms per call (the model's forward pass and "
        f"ranking: median {res['model_median_ms']:.1f} ms); the first call {first_ms:.0f} ms; load "
        f"{res['loadavg'][0]:.1f}"
    )
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
