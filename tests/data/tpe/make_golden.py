"""Regenerates golden.json: small corpora with the merges, encodings and features produced by the
pure-Python reference (python/teller/_reference/tpe.py). The Rust test rust/teller-core/tests/tpe_golden.rs
asserts that the Rust core reproduces them exactly (features to 1e-5).

    /work/main/.venv/bin/python tests/data/tpe/make_golden.py
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "_ref_tpe", HERE.parents[2] / "python/teller/_reference/tpe.py"
)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def trace_like(
    seed: int, n_steps: int, base: int
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """A tiny inference-shaped corpus: repeated per-layer motifs with occasional edits, plus timings."""
    rng = random.Random(seed)
    motifs = [
        [rng.randrange(0, 4) if i % 2 == 0 else rng.randrange(0, base) for i in range(rng.randrange(4, 12))]
        for _ in range(5)
    ]
    templates = []
    for _ in range(3):
        block = [x for _ in range(rng.randrange(2, 4)) for x in rng.choice(motifs)]
        templates.append(
            [rng.randrange(0, base) for _ in range(3)]
            + block * rng.randrange(2, 5)
            + [rng.randrange(0, base)]
        )
    segs, durs, starts = [], [], []
    t = 1_000_000
    for _ in range(n_steps):
        s = list(rng.choice(templates))
        if rng.random() < 0.4:
            p = rng.randrange(len(s))
            s[p] = rng.randrange(0, base)
        d = [int(rng.lognormvariate(3 + (x % 5), 0.3) * 1000) for x in s]
        st = []
        for di in d:
            t += rng.randrange(0, 3000) if rng.random() < 0.9 else rng.randrange(0, 10**6)
            st.append(t)
            t += di
        segs.append(s)
        durs.append(d)
        starts.append(st)
    return segs, durs, starts


def case(name, segs, base, num_merges, min_frequency=2, max_token_events=None, extra=(), timing=None):
    merges, counts = ref.train_with_counts(segs, base, num_merges, min_frequency, max_token_events)
    to_encode = [list(s) for s in segs] + [list(s) for s in extra]
    encodings = []
    for s in to_encode:
        toks, offs = ref.encode(s, merges, base)
        encodings.append({"segment": s, "tokens": toks, "offsets": offs})
    out = {
        "name": name,
        "base_size": base,
        "num_merges": num_merges,
        "min_frequency": min_frequency,
        "max_token_events": max_token_events,
        "segments": [list(s) for s in segs],
        "merges": [list(m) for m in merges],
        "merge_counts": counts,
        "encodings": encodings,
    }
    if timing is not None:
        durs, starts = timing
        flat_ids = [x for s in segs for x in s]
        flat_dur = [x for s in durs for x in s]
        stats = ref.symbol_stats(flat_ids, flat_dur, base)
        feats = []
        for s, d, st_ in zip(segs, durs, starts, strict=True):
            _, offs = ref.encode(s, merges, base)
            feats.extend(ref.features(s, d, st_, offs, stats))
        out["dur_ns"] = durs
        out["start_ns"] = starts
        out["stats"] = {"count": stats[0], "mean": stats[1], "std": stats[2]}
        out["features"] = feats
    return out


def main() -> None:
    rng = random.Random(7)
    cases = [
        case("runs", [[0] * 7, [0] * 4, [1, 0, 0, 0, 1]], 2, 10, min_frequency=1, extra=[[0] * 9, [1, 1, 0]]),
        case("alternating", [[0, 1] * 6 + [0], [1, 0, 1]], 2, 8, min_frequency=1),
        case("ties", [[2, 3, 0, 1], [2, 3, 0, 1], [4, 4, 4]], 5, 10, min_frequency=2),
        case(
            "random_small",
            [[rng.randrange(4) for _ in range(rng.randrange(0, 30))] for _ in range(12)],
            4,
            20,
            min_frequency=2,
            extra=[[rng.randrange(4) for _ in range(40)]],
        ),
        case(
            "max_token_events",
            [[rng.randrange(3) for _ in range(50)] for _ in range(5)],
            3,
            30,
            min_frequency=1,
            max_token_events=4,
        ),
    ]
    segs, durs, starts = trace_like(11, 40, 24)
    cases.append(
        case(
            "trace_like",
            segs,
            24,
            60,
            min_frequency=2,
            max_token_events=32,
            extra=trace_like(12, 3, 24)[0],
            timing=(durs, starts),
        )
    )
    (HERE / "golden.json").write_text(
        json.dumps({"version": 1, "cases": cases}, separators=(",", ":")) + "\n"
    )


if __name__ == "__main__":
    main()
