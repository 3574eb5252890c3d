"""TPE (Trace Pair Encoding) against HuggingFace `tokenizers` and `tiktoken`: training and encoding.

Same synthetic corpus (`teller._native.tpe_synth_corpus`, seed 42, 1500 symbols), same run. Every
measurement runs in a fresh subprocess (this script with ``--worker``), so peak memory (VmHWM, reset
with /proc/self/clear_refs right before the timed call) and thread settings are per tool.

* Training: teller (`_native.tpe_train`) vs `tokenizers` `BpeTrainer`, each base symbol mapped to one
  private-use character (U+E000 + id), one segment per training sequence and no pre-tokenizer (so a
  merge can never cross a segment), `vocab_size = base + merges`, `min_frequency = 2`, the whole base
  alphabet as `initial_alphabet`.
* Encoding: teller's merges loaded into each tool. tokenizers: a `models.BPE` with vocab = expansion
  string of each token, merges = pairs of strings. tiktoken: each symbol as the 2-byte UTF-8 of
  U+0080 + id (lead byte 0xC2-0xDF, continuation 0x80-0xBF: a byte pair across a symbol boundary is
  never a token), ranks 0..base-1 for the symbols, then base + r for teller's merge r; tiktoken
  starts from bytes, so it does one extra merge per event. Events/s counts trace events for all.
* Token boundaries (in events) are compared between the three tools on a sample of segments.

The script measures and reports; it never asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEED, N_SYMBOLS = 42, 1500
PUA = 0xE000  # tokenizers: one private-use char per symbol
TIK = 0x80  # tiktoken: U+0080 + id, 2 bytes in UTF-8 while id < 1920


# ------------------------------------------------------------------------------------------------
# worker side (fresh process per measurement)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _corpus(n: int, step: int) -> tuple[Any, Any, int]:
    from teller import _native

    ids, starts, _dur, _start, base = _native.tpe_synth_corpus(
        n, seed=SEED, n_symbols=N_SYMBOLS, step_events=step
    )
    return ids, starts, int(base)


def _segments(ids: Any, starts: Any, offset: int) -> list[str]:
    import numpy as np

    bounds = starts.tolist() + [len(ids)]
    raw = (ids.astype(np.uint32) + np.uint32(offset)).astype("<u4").tobytes()
    return [raw[4 * a : 4 * b].decode("utf-32-le") for a, b in zip(bounds, bounds[1:], strict=False)]


def _timed(fn: Any) -> tuple[Any, float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def _expansions(base: int, merges: list[tuple[int, int]], offset: int) -> list[str]:
    exp = [chr(offset + i) for i in range(base)]
    for a, b in merges:
        exp.append(exp[a] + exp[b])
    return exp


def w_train(task: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    n, step, tool = task["n"], task["step"], task["tool"]
    ids, starts, base = _corpus(n, step)
    if tool == "teller":
        from teller import _native

        gc.collect()
        baseline = _status_kb("VmRSS")
        hwm_ok = _reset_hwm()
        (merges, _counts), wall, cpu = _timed(
            lambda: _native.tpe_train(ids, starts, base, task["merges"], 2, None, None)
        )
        peak = _status_kb("VmHWM")
        np.save(task["merges_out"], np.asarray(merges, dtype=np.uint32).reshape(-1, 2))
        learned, same = len(merges), None
    else:
        from tokenizers import Tokenizer, models, trainers

        segs = _segments(ids, starts, PUA)
        del ids, starts
        tk = Tokenizer(models.BPE())
        trainer = trainers.BpeTrainer(
            vocab_size=base + task["merges"],
            min_frequency=2,
            show_progress=False,
            initial_alphabet=[chr(PUA + i) for i in range(base)],
        )
        gc.collect()
        baseline = _status_kb("VmRSS")
        hwm_ok = _reset_hwm()
        _, wall, cpu = _timed(lambda: tk.train_from_iterator(segs, trainer))
        peak = _status_kb("VmHWM")
        hf_merges = json.loads(tk.to_str())["model"]["merges"]
        learned, same = len(hf_merges), None
        ref = task.get("teller_merges")
        if ref and Path(ref).exists():
            tm = np.load(ref).tolist()
            exp = _expansions(base, [tuple(x) for x in tm], PUA)
            tm_s = [[exp[a], exp[b]] for a, b in tm]
            same = sum(1 for x, y in zip(tm_s, hf_merges, strict=False) if list(y) == x)
            # length of the common prefix of the two merge lists
            prefix = 0
            for x, y in zip(tm_s, hf_merges, strict=False):
                if list(y) != x:
                    break
                prefix += 1
            same = {"equal_rank_for_rank": same, "common_prefix": prefix, "teller_merges": len(tm)}
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "baseline_kb": baseline,
        "peak_kb": peak,
        "hwm_reset": hwm_ok,
        "extra_bytes": max(0, peak - baseline) * 1024,
        "merges_learned": learned,
        "merges_vs_teller": same,
        "base_size": base,
    }


def _tiktoken_encoding(base: int, merges: list[tuple[int, int]]) -> tuple[Any, list[int]]:
    import tiktoken

    if base > 0x800 - TIK:
        raise ValueError(f"base alphabet {base} does not fit the 2-byte UTF-8 range")
    exp = [chr(TIK + i).encode() for i in range(base)]
    for a, b in merges:
        exp.append(exp[a] + exp[b])
    ranks: dict[bytes, int] = {}
    for i, s in enumerate(exp):
        ranks.setdefault(s, i)  # a duplicate expansion keeps its lowest rank
    enc = tiktoken.Encoding("teller-tpe", pat_str=r"(?s).+", mergeable_ranks=ranks, special_tokens={})
    return enc, [len(s) // 2 for s in exp]


def w_encode(task: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    n, tool, threads = task["n"], task["tool"], task["threads"]
    ids, starts, base = _corpus(n, task["step"])
    merges = [tuple(x) for x in np.load(task["merges"]).tolist()]
    setup_s = 0.0
    if tool == "teller":
        from teller import _native

        tok = _native.NativeTpe(base, merges)
        # the first call builds the backtracking tables: time it separately, on one segment
        end = int(starts[1]) if len(starts) > 1 else len(ids)
        _, setup_s, _ = _timed(lambda: tok.encode_ids(ids[:end], starts[:1]))

        def run() -> int:
            return len(tok.encode_ids(ids, starts)[0])
    elif tool.startswith("tokenizers"):
        from tokenizers import Tokenizer, models

        exp = _expansions(base, merges, PUA)
        vocab = {s: i for i, s in reversed(list(enumerate(exp)))}
        tk = Tokenizer(models.BPE(vocab=vocab, merges=[(exp[a], exp[b]) for a, b in merges]))
        segs = _segments(ids, starts, PUA)
        fn = {
            "tokenizers": tk.encode_batch,
            "tokenizers-fast": tk.encode_batch_fast,
        }.get(tool)

        if tool == "tokenizers-loop":

            def run() -> int:
                return sum(len(tk.encode(s).ids) for s in segs)
        else:

            def run() -> int:
                return sum(len(e.ids) for e in fn(segs))  # type: ignore[misc]
    else:
        enc, _ = _tiktoken_encoding(base, merges)
        segs = _segments(ids, starts, TIK)

        def run() -> int:
            return sum(len(t) for t in enc.encode_ordinary_batch(segs, num_threads=threads))

    walls, cpus, n_tokens = [], [], 0
    t_end = time.perf_counter() + task["budget_s"]
    for _ in range(task["reps"]):
        n_tokens, wall, cpu = _timed(run)
        walls.append(wall)
        cpus.append(cpu)
        if time.perf_counter() > t_end:
            break
    walls_s, cpus_s = sorted(walls), sorted(cpus)
    return {
        "n_events": int(len(ids)),
        "n_tokens": int(n_tokens),
        "reps": len(walls),
        "wall_best_s": walls_s[0],
        "wall_median_s": walls_s[len(walls_s) // 2],
        "cpu_median_s": cpus_s[len(cpus_s) // 2],
        "setup_s": setup_s,
    }


def w_check(task: dict[str, Any]) -> dict[str, Any]:
    """Token boundaries (event offsets inside each segment) of the three tools on a sample."""
    import numpy as np
    from teller import _native
    from tokenizers import Tokenizer, models

    ids, starts, base = _corpus(task["n"], task["step"])
    merges = [tuple(x) for x in np.load(task["merges"]).tolist()]
    bounds = starts.tolist() + [len(ids)]
    nseg = len(starts)
    pick = list(range(0, nseg, max(1, nseg // task["sample_segments"])))
    sub = np.concatenate([ids[bounds[i] : bounds[i + 1]] for i in pick]).astype(np.uint32)
    lens = [bounds[i + 1] - bounds[i] for i in pick]
    sub_starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    tok = _native.NativeTpe(base, merges)
    _t, offs, seg_tok = tok.encode_ids(sub, sub_starts)
    offs = offs.tolist()
    seg_tok = seg_tok.tolist() + [len(_t)]
    teller_ends = [
        [offs[k + 1] - int(sub_starts[j]) for k in range(seg_tok[j], seg_tok[j + 1])]
        for j in range(len(pick))
    ]
    exp = _expansions(base, merges, PUA)
    vocab = {s: i for i, s in reversed(list(enumerate(exp)))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[(exp[a], exp[b]) for a, b in merges]))
    segs = _segments(sub, sub_starts, PUA)
    hf_ends = [[e for _s, e in x.offsets] for x in tk.encode_batch(segs)]
    enc, tlen = _tiktoken_encoding(base, merges)
    tik_ends = [
        np.cumsum([tlen[t] for t in toks]).tolist()
        for toks in enc.encode_ordinary_batch(_segments(sub, sub_starts, TIK))
    ]
    dup = len(exp) - len(set(exp))
    diff_hf = sum(1 for a, b in zip(teller_ends, hf_ends, strict=True) if a != b)
    diff_tik = sum(1 for a, b in zip(teller_ends, tik_ends, strict=True) if a != b)
    return {
        "segments": len(pick),
        "events": int(len(sub)),
        "tokenizers_differs": diff_hf,
        "tiktoken_differs": diff_tik,
        "duplicate_expansions": dup,
    }


# ------------------------------------------------------------------------------------------------
# driver side


def _load() -> float:
    return os.getloadavg()[0]


def spawn(task: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Runs one measurement in a fresh interpreter; returns its JSON (or an error/timeout record)."""
    e = dict(os.environ)
    e.update(env or {})
    l0 = _load()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(task)],
            env=e,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {
            "error": f"timeout: > {timeout:.0f} s",
            "timeout_s": timeout,
            "load": [round(l0, 2), round(_load(), 2)],
        }
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["load"] = [round(l0, 2), round(_load(), 2)]
    out["process_s"] = time.perf_counter() - t0
    return out


def machine() -> dict[str, Any]:
    import numpy as np
    import teller

    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "teller": teller.__version__,
        "teller_build": getattr(teller, "build_profile", "?"),
        "load_start": round(_load(), 2),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            info["ram_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    for mod in ("tokenizers", "tiktoken"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    return info


def _fmt_n(n: float) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7", help="corpus sizes in events (training and encoding)")
    ap.add_argument("--long-sizes", default="1e6,1e7", help="sizes for the 100k-event-step variant")
    ap.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="per-measurement limit in seconds (a slower one shows as > limit)",
    )
    ap.add_argument("--encode-sizes", default=None, help="sizes to encode (default: sizes up to 1e7)")
    ap.add_argument("--merges", type=int, default=30000)
    ap.add_argument("--reps", type=int, default=5, help="encoding repetitions per tool (bounded by time)")
    ap.add_argument("--quick", action="store_true", help="1M events only, 1 encoding rep, 1M long steps")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        task = json.loads(args.worker)
        fn = {"train": w_train, "encode": w_encode, "check": w_check}[task["kind"]]
        print(json.dumps(fn(task)))
        return

    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(170, shutil.get_terminal_size().columns))
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    long_sizes = [int(float(s)) for s in args.long_sizes.split(",") if s]
    enc_sizes = [int(float(s)) for s in args.encode_sizes.split(",")] if args.encode_sizes else None
    reps, budget = args.reps, 20.0
    if args.quick:
        sizes, long_sizes, reps, budget = [1_000_000], [1_000_000], 1, 5.0
    if enc_sizes is None:
        enc_sizes = [n for n in sizes if n <= 10_000_000]
    info = machine()
    con.print(info)
    res: dict[str, Any] = {"machine": info, "merges": args.merges, "train": [], "encode": [], "check": []}
    tmp = Path(tempfile.mkdtemp(prefix="teller-bench-tpe."))
    one = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    all_ = {"RAYON_NUM_THREADS": str(os.cpu_count() or 1), "TOKENIZERS_PARALLELISM": "true"}

    # training: all cores (both trainers parallelize their initial counting)
    for step, ns in ((2000, sizes), (100_000, long_sizes)):
        for n in ns:
            mfile = str(tmp / f"merges_{n}_{step}.npy")
            for tool in ("teller", "tokenizers"):
                task = {"kind": "train", "tool": tool, "n": n, "step": step, "merges": args.merges}
                task |= {"merges_out": mfile, "teller_merges": mfile}
                r = spawn(task, all_, args.timeout)
                r |= {"tool": tool, "n": n, "step": step}
                res["train"].append(r)
                con.print(f"train {tool:10} n={_fmt_n(n)} step={step}: {r}")

    # encoding (teller's merges at that size, 2k-event steps)
    tools = ["teller", "tokenizers", "tokenizers-fast", "tiktoken"]
    for n in enc_sizes:
        mfile = str(tmp / f"merges_{n}_2000.npy")
        if not Path(mfile).exists():
            continue
        for threads, env in ((1, one), (os.cpu_count() or 1, all_)):
            for tool in tools + (["tokenizers-loop"] if threads == 1 else []):
                task = {"kind": "encode", "tool": tool, "n": n, "step": 2000, "merges": mfile}
                task |= {"threads": threads, "reps": reps, "budget_s": budget}
                r = spawn(task, env, args.timeout)
                r |= {"tool": tool, "n": n, "threads": threads}
                res["encode"].append(r)
                con.print(f"encode {tool:16} n={_fmt_n(n)} threads={threads}: {r}")
        task = {"kind": "check", "n": n, "step": 2000, "merges": mfile, "sample_segments": 300}
        r = spawn(task, one, args.timeout) | {"n": n}
        res["check"].append(r)
        con.print(f"check n={_fmt_n(n)}: {r}")
    res["machine"]["load_end"] = round(_load(), 2)

    # ---- tables
    t = Table(
        title=f"TPE training ({args.merges} merges requested, min_frequency 2, {os.cpu_count()} threads)"
    )
    for c in ("events", "step", "tool", "merges", "wall s", "CPU s", "peak MB", "B/event", "load"):
        t.add_column(c, justify="right")
    for c in ("tok/teller wall", "tok/teller CPU", "tok/teller mem"):
        t.add_column(c, justify="right")
    by = {(r["tool"], r["n"], r["step"]): r for r in res["train"]}
    for r in res["train"]:
        if "error" in r:
            wall = f"> {r['timeout_s']:.0f}" if "timeout_s" in r else "FAIL: " + r["error"][:60]
            t.add_row(_fmt_n(r["n"]), f"{r['step']:,}", r["tool"], "", wall, *[""] * 7)
            continue
        ratios = ["", "", ""]
        ref = by.get(("teller", r["n"], r["step"]))
        if r["tool"] == "tokenizers" and ref and "error" not in ref:
            ratios = [
                f"{r['wall_s'] / ref['wall_s']:.1f}×",
                f"{r['cpu_s'] / max(ref['cpu_s'], 1e-9):.1f}×",
                f"{r['extra_bytes'] / max(ref['extra_bytes'], 1):.1f}×",
            ]
        t.add_row(
            _fmt_n(r["n"]),
            f"{r['step']:,}",
            r["tool"],
            f"{r['merges_learned']:,}",
            f"{r['wall_s']:.2f}",
            f"{r['cpu_s']:.2f}",
            f"{r['extra_bytes'] / 2**20:,.0f}",
            f"{r['extra_bytes'] / r['n']:.1f}",
            f"{r['load'][0]:.1f}-{r['load'][1]:.1f}",
            *ratios,
        )
    con.print(t)
    long_ratio = []
    for n in sorted(set(sizes) & set(long_sizes)):
        for tool in ("teller", "tokenizers"):
            a, b = by.get((tool, n, 2000)), by.get((tool, n, 100_000))
            if a and b and "error" not in a and "error" not in b:
                long_ratio.append((tool, n, b["wall_s"] / a["wall_s"], b["cpu_s"] / max(a["cpu_s"], 1e-9)))
            elif a and b and "error" not in a and "timeout_s" in b:
                long_ratio.append((tool, n, b["timeout_s"] / a["wall_s"], None))  # a lower bound
    for tool, n, w, c in long_ratio:
        if c is None:
            con.print(
                f"100k-event steps / 2k-event steps, {tool}, {_fmt_n(n)} events: wall > {w:.1f}× (timed out)"
            )
        else:
            con.print(
                f"100k-event steps / 2k-event steps, {tool}, {_fmt_n(n)} events: wall {w:.2f}×, CPU {c:.2f}×"
            )
    res["long_step_ratio"] = [dict(zip(("tool", "n", "wall", "cpu"), x, strict=True)) for x in long_ratio]

    t = Table(title="TPE encoding (teller's merges in every tool; events/s in trace events)")
    for c in ("events", "threads", "tool", "reps", "best Mev/s", "median Mev/s", "Mev/CPU-s", "ev/token"):
        t.add_column(c, justify="right")
    t.add_column("teller/tool (median)", justify="right")
    t.add_column("teller/tool (CPU)", justify="right")
    t.add_column("load", justify="right")
    eby = {(r["tool"], r["n"], r["threads"]): r for r in res["encode"]}
    for r in res["encode"]:
        if "error" in r:
            wall = f"> {r['timeout_s']:.0f} s" if "timeout_s" in r else "FAIL: " + r["error"][:60]
            t.add_row(_fmt_n(r["n"]), str(r["threads"]), r["tool"], "", wall, *[""] * 6)
            continue
        ev = r["n_events"]
        r["mev_s_best"] = ev / r["wall_best_s"] / 1e6
        r["mev_s_median"] = ev / r["wall_median_s"] / 1e6
        r["mev_cpu_s"] = ev / max(r["cpu_median_s"], 1e-9) / 1e6
        ref = eby.get(("teller", r["n"], r["threads"]))
        rw = rc = ""
        if r["tool"] != "teller" and ref and "error" not in ref:
            rw = f"{r['wall_median_s'] / ref['wall_median_s']:.1f}×"
            rc = f"{r['cpu_median_s'] / max(ref['cpu_median_s'], 1e-9):.1f}×"
        t.add_row(
            _fmt_n(r["n"]),
            str(r["threads"]),
            r["tool"],
            str(r["reps"]),
            f"{r['mev_s_best']:.1f}",
            f"{r['mev_s_median']:.1f}",
            f"{r['mev_cpu_s']:.1f}",
            f"{ev / max(r['n_tokens'], 1):.1f}",
            rw,
            rc,
            f"{r['load'][0]:.1f}-{r['load'][1]:.1f}",
        )
    con.print(t)
    for r in res["check"]:
        con.print(f"token boundaries, {_fmt_n(r['n'])} corpus sample: {r}")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
        con.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
