"""How often `teller diagnose`'s culprit-operators table puts a culprit first.

For every faulty sample of a split, the capture is diagnosed (``teller.models.diagnose.diagnose``,
every operator kept) and its culprit events are marked by the dataset's rule
(``teller.data.culprit_mask``); an operator is a hit when its symbol holds a culprit event. The
table's order (``operator_rank_key``: the summary-row head's symbol score first, where the model
has that head) is compared with the token-head evidence alone (the same key without the symbol
score), on the same diagnoses.

    python benches/diagnose_culprits.py --checkpoint RUN --data-dir DATASET [--split test] [--json OUT]

It measures; it asserts nothing. docs/models.md ("teller diagnose") quotes its numbers.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a MoT / single-stream run directory")
    ap.add_argument("--data-dir", required=True, help="a generated dataset (sample directories)")
    ap.add_argument("--split", default="test", help="the samples' split (annotation.json)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many faulty samples (0: all)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    a = ap.parse_args()

    from teller import trace as _trace
    from teller.data.dataset import culprit_mask, read_json
    from teller.models.diagnose import diagnose, load_checkpoint_for_diagnosis, operator_rank_key

    warnings.simplefilter("ignore")  # (diagnose's notes on each capture)
    _, _, _, tok, _ = load_checkpoint_for_diagnosis(a.checkpoint)
    order = {
        "table": operator_rank_key,
        "evidence only": lambda o: operator_rank_key({**o, "symbol_score": 0.0}),
    }
    hits = {k: Counter() for k in order}
    per_label: Counter[str] = Counter()
    n = 0
    t0 = time.perf_counter()
    for d in sorted(p for p in Path(a.data_dir).iterdir() if (p / "annotation.json").is_file()):
        ann = read_json(d / "annotation.json", "sample annotation")
        if ann.get("split") != a.split or ann.get("label") == "normal":
            continue
        r = diagnose(d, a.checkpoint, top=10_000)  # (every operator: the table shows twice --top)
        tr = _trace.load(
            d / "trace.json",
            step_names=tok.settings.get("step_names"),
            normalize=tok.settings.get("normalize"),
            warn=False,
        )
        sym = np.asarray(tr.symbol, np.int64)[culprit_mask(tr, ann)]
        culprits = {tr.symbols[int(i)] for i in np.unique(sym)}
        per_label[ann["label"]] += 1
        for k, key in order.items():
            ranked = [o["symbol"] for o in sorted(r["operators"], key=key)]
            hits[k]["top1"] += bool(ranked[:1] and ranked[0] in culprits)
            hits[k]["top3"] += bool(set(ranked[:3]) & culprits)
            hits[k][f"top1 {ann['label']}"] += bool(ranked[:1] and ranked[0] in culprits)
        n += 1
        if a.limit and n >= a.limit:
            break
    if not n:
        raise SystemExit(f"{a.data_dir}: no faulty sample of split {a.split!r}")
    res = {
        "checkpoint": str(a.checkpoint),
        "split": a.split,
        "n": n,
        "seconds": round(time.perf_counter() - t0, 1),
        **{
            k: {
                "top1": h["top1"] / n,
                "top3": h["top3"] / n,
                "top1_by_label": {lab: h[f"top1 {lab}"] / c for lab, c in sorted(per_label.items())},
            }
            for k, h in hits.items()
        },
    }
    print(f"{a.checkpoint} {a.split}: {n} faulty samples, {res['seconds']} s")
    for k in order:
        print(f"  {k:14s} top-1 {res[k]['top1']:.3f}  top-3 {res[k]['top3']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
