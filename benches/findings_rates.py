"""How often each model-free finding (``teller.findings``) fires on a labelled dataset, per class.

The table of docs/findings.md ("How often each fires on the simulator's captures"): for every sample of
the chosen splits, ``findings(trace)``; the share of each class's captures where a kind fired, and for
``nccl_straggler`` captures how often the ``straggler`` finding named the injected rank's GPU.

    .venv/bin/python benches/findings_rates.py DATASET [--splits val test test_ood] [--out rates.json]

A dataset of the docs' table: ``teller dataset generate --output-dir D --preset default --seed 0``.
It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

KINDS = ("communication", "host_wait", "launch_overhead", "queued", "slow_step", "straggler")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", type=Path, help="a dataset directory (manifest.json)")
    ap.add_argument("--splits", nargs="+", default=["val", "test", "test_ood"])
    ap.add_argument("--out", type=Path, help="write the rates as JSON here too")
    a = ap.parse_args(argv)

    from teller import trace
    from teller.findings import findings

    man = json.loads((a.dataset / "manifest.json").read_text())
    ids = [s for sp in a.splits for s in man["splits"].get(sp, [])]
    if not ids:
        print(f"{a.dataset}: no samples in {a.splits}", file=sys.stderr)
        return 2
    per_label: Counter[str] = Counter()
    fired: dict[str, Counter[str]] = defaultdict(Counter)
    straggler_rank = Counter()  # (nccl_straggler captures where `straggler` fired: right rank or not)
    t0 = time.perf_counter()
    for sid in ids:
        d = a.dataset / sid
        ann = json.loads((d / "annotation.json").read_text())
        label = ann["label"]
        per_label[label] += 1
        fs = findings(trace.load(d / "trace.json", warn=False))
        for k in {f["kind"] for f in fs}:
            fired[label][k] += 1
        st = next((f for f in fs if f["kind"] == "straggler"), None)
        if label == "nccl_straggler" and st is not None:
            rank = (ann["faults"][0].get("target") or {}).get("rank")
            straggler_rank["right" if st["device"] == rank else "wrong"] += 1
    dt = time.perf_counter() - t0
    rates = {
        lab: {k: fired[lab][k] / n for k in sorted({*KINDS, *fired[lab]})}
        for lab, n in sorted(per_label.items())
    }
    print(f"{len(ids)} captures of {a.dataset} ({', '.join(a.splits)}), {dt:.1f} s\n")
    print("| label | n | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for lab, n in sorted(per_label.items(), key=lambda x: (x[0] != "normal", x[0])):
        print(f"| {lab} | {n} | " + " | ".join(f"{rates[lab].get(k, 0.0):.2f}" for k in KINDS) + " |")
    if straggler_rank:
        print(
            f"\nstraggler on nccl_straggler captures: the injected rank's GPU {straggler_rank['right']} "
            f"times in {sum(straggler_rank.values())}"
        )
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "dataset": str(a.dataset.resolve()),
                    "splits": a.splits,
                    "n": per_label,
                    "rates": rates,
                    "straggler_rank": straggler_rank,
                    "seconds": dt,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
