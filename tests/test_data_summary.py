"""Per-symbol summaries (teller.data.summary) against hand-computed values on a small built trace."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import teller
from teller import tpe
from teller.data.summary import N_SUMMARY_FEATURES, SUMMARY_FEATURE_NAMES, symbol_summary


def _x(us: float) -> float:
    return math.log1p(us)


@pytest.fixture()
def trace_and_tok(tmp_path):
    # Two GPU "ranks" (pids 1 and 2) run kernel "gemm" every 100 us over 1000 us. The opening window
    # (first 10 % = 100 us) holds the first launch of each rank (10 us). After it, rank 1's gemm takes
    # 40 us, rank 2's stays 10 us. Kernel "norm" runs on rank 1 only, 5 us, every 100 us until 500 us,
    # then every 200 us (its inter-arrival doubles).
    ev = []
    for pid in (1, 2):
        for k in range(10):
            dur = 10 if (k == 0 or pid == 2) else 40
            ev.append(
                {"ph": "X", "cat": "kernel", "name": "gemm", "pid": pid, "tid": 7, "ts": 100 * k, "dur": dur}
            )
    norm_ts = [0, 100, 200, 300, 400, 500, 700, 900]
    for t in norm_ts:
        ev.append({"ph": "X", "cat": "kernel", "name": "norm", "pid": 1, "tid": 7, "ts": t + 50, "dur": 5})
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    tok = tpe.train(tpe.corpus_from_symbols([["kernel:gemm", "kernel:norm"]]), vocab_size=0)
    return tr, tok


def test_hand_computed(trace_and_tok):
    tr, tok = trace_and_tok
    ids, f = symbol_summary(tr, tok)
    assert f.shape == (len(ids), N_SUMMARY_FEATURES) == (2, len(SUMMARY_FEATURE_NAMES))
    names = [tok.token_str(int(i)) for i in ids]
    g = f[names.index("kernel:gemm")]
    n = f[names.index("kernel:norm")]
    # gemm: 20 events; baseline = median of the two opening events = x(10)
    assert g[0] == 20
    assert g[1] == pytest.approx(np.median([_x(10)] * 11 + [_x(40)] * 9), rel=1e-6)
    assert g[2] == pytest.approx(_x(40) - _x(10), rel=1e-6)
    assert g[3] == pytest.approx(_x(40) - _x(10), rel=1e-6)
    assert g[4] == pytest.approx(_x(40) - _x(10), rel=1e-6)  # rank 1 after the window
    assert g[5] == pytest.approx(_x(40) - _x(10), rel=1e-6)  # rank 1 vs rank 2
    # 2 opening events, 18 after: ln((18+1)/0.9) - ln((2+1)/0.1)
    assert g[6] == pytest.approx(math.log(19 / 0.9) - math.log(3 / 0.1), rel=1e-6)
    assert g[7] == pytest.approx(0.0, abs=1e-6)  # inter-arrival unchanged (100 us)
    # norm: unchanged duration; inter-arrival 100 us five times, then 200 us twice
    assert n[0] == 8
    assert n[2] == pytest.approx(0.0, abs=1e-6) and n[5] == pytest.approx(0.0, abs=1e-6)
    assert n[7] == pytest.approx(_x(200) - _x(100), rel=1e-6)


def test_empty_and_unknown_symbols(tmp_path, trace_and_tok):
    _, tok = trace_and_tok
    p = tmp_path / "e.json"
    p.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "never_seen_a",
                        "pid": 1,
                        "tid": 1,
                        "ts": 0,
                        "dur": 3,
                    },
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "never_seen_b",
                        "pid": 1,
                        "tid": 1,
                        "ts": 10,
                        "dur": 3,
                    },
                ]
            }
        )
    )
    tr = teller.trace.load(p, warn=False)
    ids, f = symbol_summary(tr, tok)
    # both unknown kernels pool into one [UNK] row
    assert len(ids) == 1 and f[0, 0] == 2


def test_window_scan_hand_computed():
    from teller.data.summary import window_scan

    # a change in bins 3-4: inside 5, outside 0
    assert window_scan(np.array([0, 0, 0, 5, 5, 0, 0, 0.0])) == (5.0, 3, 5)
    # a change that lasts to the end
    assert window_scan(np.array([0, 0, 0, 0, 2, 2, 2, 2.0])) == (2.0, 4, 8)
    # windows never hold the first bin: a different opening shows as the rest being lower
    d, i, j = window_scan(np.array([3, 3, 0, 0, 0, 0, 0, 0.0]))
    assert (d, i, j) == (-3.0, 2, 8)
    assert window_scan(np.array([1.0, 2.0, 3.0])) == (0.0, 0, 0)  # too few bins


def _engine_trace(
    tmp_path, fault_pid=None, fault_steps=range(8, 12), factor=2.0, us_per_token=(0.5,), by_position=True
):
    """Two processes, 16 engine steps of 1 000 us each, alternating 100 / 1 000 scheduled tokens; a
    ``gemm`` op takes 0.5 us per token, ``factor`` times longer on ``fault_pid`` in ``fault_steps``
    (``fault_pid`` 0: both). ``us_per_token`` with several entries: that many ``gemm`` ops per step,
    of different shapes (the QKV and output projections of one kernel name)."""
    ev = []
    for pid in (1, 2):
        for k in range(16):
            tokens = 100 if k % 2 == 0 else 1000
            ev.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"engine_step#{k}",
                    "pid": pid,
                    "tid": pid,
                    "ts": 1000 * k,
                    "dur": 999,
                    "args": {"num_tokens": tokens, "num_seqs": 8},
                }
            )
            for j, upt in enumerate(us_per_token):
                slow = pid == fault_pid or fault_pid == 0
                dur = upt * tokens * (factor if slow and k in fault_steps else 1.0)
                ev.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "gemm",
                        "pid": pid,
                        "tid": pid,
                        "ts": 1000 * k + 10 + 2 * j,
                        "dur": dur / len(us_per_token),
                    }
                )
    p = tmp_path / "engine.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    tok = tpe.train(tpe.corpus_from_symbols([["host_op:gemm"]]), vocab_size=0)
    ids, f = symbol_summary(tr, tok, by_position=by_position)
    return f[[tok.token_str(int(i)) for i in ids].index("host_op:gemm")]


def test_step_load_is_kept_on_the_trace(tmp_path):
    from teller.data.summary import _step_arg_uncached, step_seqs, step_work

    _engine_trace(tmp_path)
    tr = teller.trace.load(tmp_path / "engine.json", warn=False)
    w = step_work(tr)
    assert step_work(tr) is w and not w.flags.writeable  # (read-only: shared by every caller)
    np.testing.assert_array_equal(w, _step_arg_uncached(tr, ("num_tokens", "num_seqs")))
    assert w.max() == pytest.approx(np.log1p(1000)) and step_seqs(tr).max() == pytest.approx(np.log1p(8))


def test_positions_hand_computed():
    from teller.data.summary import _positions

    pid = np.array([1, 1, 1, 1, 1, 2, 2, 2])
    step = np.array([0, 0, 0, 1, 1, 0, 0, 1])
    assert _positions(pid, step).tolist() == [0, 1, 2, 0, 1, 0, 1, 0]
    assert _positions(pid[:0], step[:0]).tolist() == []
    assert _positions(np.array([1, 1, 1]), np.array([-1, 0, 0])).tolist() == [0, 0, 1]  # outside steps


def test_shift_without_step_ranges(tmp_path):
    """A trace with no step ranges (one ``<whole trace>`` step) keeps the pooled line: numbered per
    position, every event would be alone at its position and the shift would vanish."""
    from teller.data.summary import _positions, _positions_recur

    names = list(SUMMARY_FEATURE_NAMES)
    # one process, 200 "gemm" ops 50 us apart, two shapes alternating (20 / 60 us), 30 % slower in
    # ops 80-119; no engine-step ranges anywhere
    ev = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "gemm",
            "pid": 1,
            "tid": 1,
            "ts": 50 * k,
            "dur": (20 if k % 2 else 60) * (1.3 if 80 <= k < 120 else 1.0),
        }
        for k in range(200)
    ]
    p = tmp_path / "nosteps.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    step = np.asarray(tr.step)
    assert len(np.unique(step)) == 1  # one synthetic step (or none) for everything
    pos = _positions(np.ones(len(step), np.int64), step)
    assert not _positions_recur(pos, step)
    tok = tpe.train(tpe.corpus_from_symbols([["host_op:gemm"]]), vocab_size=0)
    ids, f = symbol_summary(tr, tok)
    g = f[[tok.token_str(int(i)) for i in ids].index("host_op:gemm")]
    assert g[names.index("shift")] > 0.2  # ln 1.3 = 0.26, diluted by the bins the window cuts
    assert g[names.index("shift_z")] > 0.3  # the two shapes stay in the pooled residuals


def test_shift_fitted_per_position(tmp_path):
    # two GEMM shapes per step (0.1 and 0.9 us per token: 9x apart at the same load), both 15 %
    # slower on both processes in steps 8-11. Per position the fit is exact outside the fault, so
    # the scan finds ln(1.15) with a residual spread of the fault alone; pooled under one line, the
    # 9x spread between the shapes sits in the residuals and hides it.
    names = list(SUMMARY_FEATURE_NAMES)
    kw = {"fault_pid": 0, "factor": 1.15, "us_per_token": (0.2, 1.8)}
    f = _engine_trace(tmp_path, **kw)
    assert f[names.index("shift")] == pytest.approx(math.log(1.15), abs=0.01)
    assert f[names.index("shift_z")] > 1.5
    assert abs(f[names.index("shift_pid_spread")]) < 1e-3  # both processes alike
    pooled = _engine_trace(tmp_path, by_position=False, **kw)
    assert pooled[names.index("shift_z")] < 0.5 * f[names.index("shift_z")]
    # no fault: nothing moves at either position
    g = _engine_trace(tmp_path, fault_pid=None, factor=1.15, us_per_token=(0.2, 1.8))
    assert abs(g[names.index("shift")]) < 1e-4


def test_work_normalized_columns(tmp_path):
    from teller.data.summary import step_seqs, step_work

    names = list(SUMMARY_FEATURE_NAMES)
    # no fault: the durations follow the load exactly. The opening-window columns see a slower gemm
    # (a 1 000-token step against the opening's median of one 100- and one 1 000-token step), the
    # work-normalized ones see nothing.
    g = _engine_trace(tmp_path)
    assert g[names.index("max_dev")] == pytest.approx((_x(500) - _x(50)) / 2, rel=1e-5)
    slope = (_x(500) - _x(50)) / (math.log1p(1000) - math.log1p(100))
    assert g[names.index("work_slope")] == pytest.approx(slope, rel=1e-5)
    assert abs(g[names.index("shift")]) < 1e-5
    assert abs(g[names.index("shift_pid_spread")]) < 1e-5
    # the load alternates evenly: no window has a different mean load... except by the parity of
    # its bins, which the scan may pick (at most half the 100/1000 difference)
    assert abs(g[names.index("work_shift")]) <= 0.5 * (math.log1p(1000) - math.log1p(100)) + 1e-6
    assert g[names.index("rate_shift")] == pytest.approx(0.0, abs=1e-6)  # two events in every bin
    # process 1 twice as slow in steps 8-11: a positive shift, one process against the other
    f = _engine_trace(tmp_path, fault_pid=1)
    assert f[names.index("shift")] > 0.25
    assert f[names.index("shift_z")] > 1.0
    assert f[names.index("shift_pid_spread")] > 0.4
    assert f[names.index("max_dev")] == pytest.approx(g[names.index("max_dev")] + math.log(2), abs=0.01)
    # the step's work is attached to every event of the step
    tr = teller.trace.load(tmp_path / "engine.json", warn=False)
    w = step_work(tr)
    assert sorted(set(np.round(w, 6))) == [round(math.log1p(100), 6), round(math.log1p(1000), 6)]
    # and its sequence count (the range records both), 0 outside the steps
    s = step_seqs(tr)
    inside = np.asarray(tr.step) >= 0
    assert inside.any() and np.allclose(s[inside], math.log1p(8)) and not s[~inside].any()


def test_process_log_levels_and_token_process_log():
    from types import SimpleNamespace

    from teller.data.summary import process_log_levels, token_process_log

    lines = [
        (1, "stdout", "INFO 12-18 08:01:40 [core.py:58] (EngineCore_DP0 pid=100) Initializing"),
        (2, "stderr", "WARNING 12-18 08:01:41 [x.py:1] (VllmWorker rank=1 pid=200) slow"),
        (3, "stderr", "ERROR 12-18 08:01:44 [core.py:526] (VllmWorker rank=1 pid=200) fatal error."),
        (4, "stderr", "Traceback (most recent call last):"),  # continuation: no level, no prefix
        (5, "stderr", "torch.OutOfMemoryError: CUDA out of memory. Process 200 has 78 GiB in use"),
        (6, "stderr", "ERROR 12-18 08:01:44 [async_llm.py:399] (APIServer pid=50) output_handler failed."),
        (7, "stderr", "CRITICAL 12-18 08:01:45 [a.py:2] (VllmWorker rank=1 pid=200) dead"),
        (8, "stdout", 'INFO:     10.0.0.1:4 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error'),
    ]
    lv = process_log_levels(lines)
    assert lv == {200: (2, 1), 50: (1, 0)}
    # the prefix first (the multiprocessing stdout decorator), coloured
    other = [(9, "stderr", "\x1b[1;31m(VllmWorker rank=2 pid=300) ERROR\x1b[0m 12-18 08:01:44 [a.py:1] x")]
    assert process_log_levels(other) == {300: (1, 0)}
    # records, not lines (shards version 15): a logged traceback repeats its record's header on each
    # line; another line of the process (INFO included) ends the record, another process's does not
    h = "(Worker_TP1 pid=200) ERROR 12-18 08:01:44 [multiproc_executor.py:596] "
    tb = [h + "WorkerProc hit an exception.", h + "Traceback (most recent call last):", h + "torch.Out..."]
    core = "(EngineCore_DP0 pid=100) ERROR 12-18 08:01:44 [core.py:526] "
    recs = [(k, "stdout", t) for k, t in enumerate([tb[0], core + "fatal", tb[1], core + "Traceback", tb[2]])]
    assert process_log_levels(recs) == {200: (1, 0), 100: (1, 0)}
    assert process_log_levels(recs, records=False) == {200: (3, 0), 100: (2, 0)}
    info = (9, "stdout", "(Worker_TP1 pid=200) INFO 12-18 08:01:44 [a.py:1] step")
    assert process_log_levels([*recs, info, recs[0]]) == {200: (2, 0), 100: (1, 0)}
    old = [
        (1, "stderr", lines[2][2]),
        (2, "stdout", "INFO 12-18 08:01:44 [b.py:1] (VllmWorker rank=1 pid=200) x"),
    ]
    assert process_log_levels([*old, old[0]]) == {200: (2, 0)}
    assert process_log_levels([old[0], old[0]]) == {200: (1, 0)}
    # events: 0 a range on pid 100, 1 a range on pid 200, 2 a launch on pid 200, 3 its kernel (pid 0
    # = the GPU, linked to event 2), 4 a range on pid 300 (no log line), 5 an unlinked kernel on
    # GPU 1 (its "pid" 1 must not match a log line's pid=1)
    cols = SimpleNamespace(
        pid=np.array([100, 200, 200, 0, 300, 1]),
        link=np.array([-1, -1, -1, 2, -1, -1]),
        device=np.array([-1, -1, -1, 0, -1, 1]),
    )
    tr = type(
        "T", (), {"pid": cols.pid, "link": cols.link, "device": cols.device, "__len__": lambda self: 6}
    )()
    # base positions -> events (-1: <close>); tokens: [0], [1, 2], [-1], [3], [4], [-1]
    ev = np.array([0, 1, 2, -1, 3, 4, -1, 5])
    offs = np.array([0, 1, 3, 4, 5, 6, 7, 8])
    f = token_process_log(tr, ev, offs, {**lv, 1: (5, 5)})
    err, warn = math.log1p(2), math.log1p(1)
    expect = [[0, 0], [err, warn], [err, warn], [err, warn], [0, 0], [0, 0], [0, 0]]
    np.testing.assert_allclose(f, np.array(expect, np.float32), rtol=1e-6)
    assert f.dtype == np.float32 and f.shape == (7, 2)
    assert not token_process_log(tr, ev, offs, {}).any()
    assert token_process_log(tr, ev[:0], offs[:1], lv).shape == (0, 2)


def test_token_process_log_marks_the_oom_rank(tmp_path):
    """On a simulated OOM sample, the tokens of the culprit (the crashed rank's ranges) are the ones
    whose process logged the error, as teller tokenize stores them."""
    from teller.data import generate
    from teller.data.dataset import culprit_mask
    from teller.data.summary import process_log_levels, token_process_log
    from teller.data.tokenize import parse_log

    data = tmp_path / "ds"
    generate(data, num_samples=13, seed=5, preset="tiny")  # one sample per class
    sd = next(d for d in sorted(data.glob("s0*")) if '"oom_error"' in (d / "annotation.json").read_text())
    ann = json.loads((sd / "annotation.json").read_text())
    tok = tpe.train(data, vocab_size=0)  # the base symbols alone (64 was not above them either)
    tr = teller.trace.load(sd / "trace.json", warn=False)
    enc = tok.encode(tr)
    ev, offs = np.asarray(enc.events, np.int64), np.asarray(enc.offsets, np.int64)
    f = token_process_log(tr, ev, offs, process_log_levels(parse_log(sd / "log.txt")))
    mask = culprit_mask(tr, ann)
    base = np.zeros(len(ev), bool)
    base[ev >= 0] = mask[ev[ev >= 0]]
    cs = np.r_[0, np.cumsum(base)]
    culprit = (cs[offs[1:]] - cs[offs[:-1]]) > 0
    assert culprit.any() and (f[culprit, 0] > 0).all()
    if ann["workload"]["tp"] > 1:  # another rank's tokens stay unmarked
        assert (f[:, 0] == 0).any()


def _allreduce_trace(tmp_path, slow_link=(), stall=(), ranks=2, missing=(), dup=False, late=False):
    """A merged multi-process trace as teller writes one: ``ranks`` host processes (pids 101, 102,
    ...), each with its own ``engine_step#k`` ranges (16 steps of 1 000 us, alternating 100 / 1 000
    scheduled tokens) and its own correlation counter (the ids overlap), launching two all-reduce
    kernels per step (positions 0 and 1) on its GPU (device pid = rank), linked by ``ac2g`` flows.
    Each rank launches at its own time; the kernel ends on every rank when the last has arrived plus
    the transfer (as NCCL's does), 40 and 80 us at 100 tokens, x sqrt(tokens / 100).
    ``slow_link``: steps with the transfer 2x longer (a degraded link); ``stall``: steps where rank
    0 launches 120 us late (a host hiccup on one rank: the others wait); ``missing``: (rank, step)
    pairs where that rank's capture has no all-reduce; ``dup``: rank 0 launches its first all-reduce
    of step 9 twice; ``late``: rank 1's capture starts at step 1 (no range, no kernel in step 0), so
    its k-th step is everyone else's (k+1)-th."""
    ev = []
    corr = dict.fromkeys(range(ranks), 0)
    sym = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    for k in range(16):
        tokens = 100 if k % 2 == 0 else 1000
        for r in range(ranks):
            if late and r == 1 and k == 0:
                continue
            ev.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"engine_step#{k}",
                    "pid": 101 + r,
                    "tid": 101 + r,
                    "ts": 1000 * k + r,
                    "dur": 990,
                    "args": {"num_tokens": tokens, "num_seqs": 8},
                }
            )
        for j, xfer in enumerate((40.0, 80.0)):
            launch = {r: 1000 * k + 100 + 400 * j + 7 * r for r in range(ranks)}
            if k in stall:
                launch[0] += 120
            t_all = max(launch.values())
            t = xfer * (tokens / 100) ** 0.5 * (2.0 if k in slow_link else 1.0)
            for r in range(ranks):
                if (r, k) in missing or (late and r == 1 and k == 0):
                    continue
                for rep in range(2 if dup and r == 0 and k == 9 and j == 0 else 1):
                    corr[r] += 1
                    c, fid, ls = corr[r], 1000 * (r + 1) + corr[r], launch[r] - 5 + rep
                    host = {"pid": 101 + r, "tid": 101 + r}
                    dev = {"pid": r, "tid": 7}
                    launch_ev = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 3}
                    flow = {"cat": "ac2g", "name": "ac2g", "id": fid}
                    dur = t_all + t - launch[r] + (300 if rep else 0)
                    ev += [
                        {**launch_ev, **host, "ts": ls, "args": {"correlation": c}},
                        {"ph": "X", "cat": "kernel", "name": sym, **dev, "ts": launch[r] + rep, "dur": dur,
                         "args": {"correlation": c}},
                        {**flow, "ph": "s", **host, "ts": ls},
                        {**flow, "ph": "f", **dev, "ts": launch[r], "bp": "e"},
                    ]  # fmt: skip
    p = tmp_path / "allreduce.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    tok = tpe.train(tpe.corpus_from_symbols([[f"kernel:{sym}"]]), vocab_size=0)
    ids, f = symbol_summary(tr, tok)
    return tr, f[[tok.token_str(int(i)) for i in ids].index(f"kernel:{sym}")]


def test_step_ordinal_matches_steps_across_processes(tmp_path):
    from teller.data.summary import step_ordinal

    tr, _ = _allreduce_trace(tmp_path)
    o = step_ordinal(tr)
    st = np.asarray(tr.step)
    steps = tr.steps()
    assert len(steps) == 32  # each process's ranges are steps of their own
    kern = np.flatnonzero(np.asarray(tr.pid) < 100)  # the GPU events (device pids)
    assert len(kern) == 64 and (st[kern] >= 0).all()
    # each kernel sits in its launching process's step, which the ordinal names across processes
    assert {steps[st[e]].pid for e in kern if tr.pid[e] == 1} == {102}
    assert all(steps[st[e]].name == f"engine_step#{o[e]}" for e in kern)
    assert (o[kern] != st[kern]).any()  # (a merged trace numbers the processes' steps apart)


def test_collective_transfer_columns(tmp_path):
    """A slow link lengthens every rank's transfer (columns 14-16 move); one rank's host stall makes
    the other ranks wait (the raw all-reduce durations move, 9-10) but not the transfer."""
    from teller.data.summary import step_ordinal

    names = list(SUMMARY_FEATURE_NAMES)
    c = {n: names.index(n) for n in ("shift", "shift_z", "xfer_median", "xfer_shift", "xfer_shift_z")}
    xc = [c["xfer_median"], c["xfer_shift"], c["xfer_shift_z"]]
    _, base = _allreduce_trace(tmp_path)
    # the fastest rank's kernel is the transfer: 40, 80 us at 100 tokens, x sqrt(10) at 1 000
    want = np.median([_x(t * m) for t in (40, 80) for m in (1, 10**0.5)])
    assert base[c["xfer_median"]] == pytest.approx(want, rel=1e-5)
    assert abs(base[c["xfer_shift"]]) < 1e-3  # the load fit takes the 1 000-token steps
    _, link = _allreduce_trace(tmp_path, slow_link=range(8, 12))
    assert link[c["xfer_shift"]] > 0.4  # ln 2 = 0.69 inside, diluted by the window's edges
    assert link[c["xfer_shift_z"]] > 1.0
    _, stall = _allreduce_trace(tmp_path, stall=range(8, 12))
    assert stall[c["shift"]] > 0.2  # the waiting rank's all-reduce got much longer
    assert abs(stall[c["xfer_shift"]]) < 0.02  # the last rank's transfer did not
    # three ranks, one of which missed a step's all-reduces: that step's instances are left out
    _, three = _allreduce_trace(tmp_path, slow_link=range(8, 12), ranks=3, missing={(2, 3)})
    assert three[c["xfer_shift"]] > 0.4
    _, three_stall = _allreduce_trace(tmp_path, stall=range(8, 12), ranks=3, missing={(2, 3)})
    assert abs(three_stall[c["xfer_shift"]]) < 0.02
    # a duplicate on rank 0 shifts its later positions in that step; the instances stay matched
    _, dup = _allreduce_trace(tmp_path, dup=True)
    assert abs(dup[c["xfer_shift"]]) < 1e-3
    # rank 1's capture started a step later: matched by ordinal, no instance ends together
    _, late = _allreduce_trace(tmp_path, slow_link=range(8, 12), late=True)
    assert (late[xc] == 0).all()
    # one process: nothing to compare across ranks; under 3 steps: the level but no scan
    _, one = _allreduce_trace(tmp_path, slow_link=range(8, 12), ranks=1)
    assert (one[xc] == 0).all()
    tr2, two = _allreduce_trace(tmp_path, missing={(1, k) for k in range(2, 16)})
    assert two[c["xfer_median"]] > 0 and two[c["xfer_shift"]] == two[c["xfer_shift_z"]] == 0
    assert len(np.unique(step_ordinal(tr2)[np.asarray(tr2.pid) < 100])) >= 3  # (rank 0's steps)


def test_transfer_instance_needs_every_process():
    """An instance is complete when every process has it, not when it has as many events as there
    are processes: two events of process 0 at one key (positions restart where a process's events
    interleave two steps) do not stand in for process 1."""
    from teller.data.summary import N_SUMMARY_FEATURES, _transfer

    # 2 processes, 6 steps, one all-reduce per step: 10 us transfer (x = ln 1.01) ...
    pid = np.array([0] * 6 + [1] * 6)
    sord = np.array(list(range(6)) * 2)
    pos = np.zeros(12, np.int64)
    x = np.full(12, math.log1p(0.01))
    # ... except steps 3-5, where process 1 has none and process 0 has two long ones per step
    keep = ~((pid == 1) & (sord >= 3))
    pid, sord, pos, x = pid[keep], sord[keep], pos[keep], x[keep]
    pid = np.r_[pid, [0, 0, 0]]
    sord = np.r_[sord, [3, 4, 5]]
    pos = np.r_[pos, [0, 0, 0]]
    x = np.r_[x, [math.log1p(0.5)] * 3]
    x[(pid == 0) & (sord >= 3)] = math.log1p(0.5)
    w = np.zeros(len(x))
    b = (sord * 2).astype(np.int64)
    row = np.zeros(N_SUMMARY_FEATURES)
    _transfer(row, x, w, b, pid, sord, pos)
    assert row[14] == pytest.approx(math.log1p(0.01))  # only steps 0-2 are instances
    assert row[15] == 0.0  # (three steps: no scan either way, and no jump at step 3)


def test_reference_columns_hand_computed(tmp_path):
    # columns 17-19 from per-event residuals against a deployment's kernel reference: gemm has a
    # residual on 15 of its 20 events (rank 1: 0.5 x 10, rank 2: 0.1 x 5), norm on none (every
    # position new to the reference: a launch storm's extra kernels), and a host operator is no
    # kernel at all
    ev = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": pid, "tid": 7, "ts": 100 * k, "dur": 10}
        for pid in (1, 2)
        for k in range(10)
    ]
    ev += [
        {"ph": "X", "cat": "kernel", "name": "norm", "pid": 1, "tid": 7, "ts": 100 * k + 50, "dur": 5}
        for k in range(8)
    ]
    ev += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100 * k, "dur": 3}
        for k in range(4)
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    tok = tpe.train(tpe.corpus_from_symbols([["kernel:gemm", "kernel:norm"]]), vocab_size=0)
    names = np.asarray(tr.symbols)[np.asarray(tr.symbol)]
    pid = np.asarray(tr.pid)
    r = np.full(len(tr), np.nan)
    g1 = np.flatnonzero((names == "kernel:gemm") & (pid == 1))
    g2 = np.flatnonzero((names == "kernel:gemm") & (pid == 2))
    assert len(g1) == len(g2) == 10
    r[g1] = 0.5
    r[g2[:5]] = 0.1
    host = np.flatnonzero(tr.layer_mask("host_op"))
    assert len(host) == 4

    ids, f = symbol_summary(tr, tok, ref_resid=r)
    rows = {tok.token_str(int(i)): row for i, row in zip(ids, f, strict=True)}
    gemm, norm = rows["kernel:gemm"], rows["kernel:norm"]
    (hk,) = [k for k in rows if k not in ("kernel:gemm", "kernel:norm")]
    assert gemm[17] == pytest.approx(0.5)  # median of 0.5 x 10, 0.1 x 5
    assert gemm[18] == pytest.approx(0.5)  # rank 1's median
    assert gemm[19] == pytest.approx(0.75)  # 15 of 20 events with a residual
    assert not norm[17:].any()  # no residual at all: as an unknown deployment
    assert not rows[hk][17:].any()
    # no reference (an unknown deployment, a hidden training sample): all three 0
    _, f0 = symbol_summary(tr, tok)
    assert not f0[:, 17:].any()


def test_family_reference_columns_hand_computed(tmp_path):
    # columns 20-22 pool the residuals of a kernel family across its symbols. Two GEMM kernels (two
    # shapes: two names) every 100 us for 16 steps: gemm_a on rank 1 reads 0 for 8 events, then 0.2
    # (a slowdown in the second half), gemm_b on rank 2 reads 0.05 throughout. rms_norm is its own
    # family; "foo" has no known family (its own); a host operator has no residual.
    ev = []
    for k in range(16):
        ev.append(
            {"ph": "X", "cat": "kernel", "name": "gemm_a", "pid": 1, "tid": 7, "ts": 100 * k, "dur": 10}
        )
        ev.append(
            {"ph": "X", "cat": "kernel", "name": "gemm_b", "pid": 2, "tid": 7, "ts": 100 * k + 20, "dur": 10}
        )
    for k in range(4):
        ev.append(
            {"ph": "X", "cat": "kernel", "name": "rms_norm", "pid": 1, "tid": 7, "ts": 100 * k + 50, "dur": 5}
        )
        ev.append(
            {"ph": "X", "cat": "kernel", "name": "foo", "pid": 1, "tid": 7, "ts": 100 * k + 60, "dur": 5}
        )
        ev.append(
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100 * k, "dur": 3}
        )
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    syms = ["kernel:gemm_a", "kernel:gemm_b", "kernel:rms_norm", "kernel:foo"]
    tok = tpe.train(tpe.corpus_from_symbols([syms]), vocab_size=0)
    names = np.asarray(tr.symbols)[np.asarray(tr.symbol)]
    ts = np.asarray(tr.ts)
    r = np.full(len(tr), np.nan)
    a = np.flatnonzero(names == "kernel:gemm_a")
    r[a] = np.where(ts[a] >= 800_000, 0.2, 0.0)  # trace time is in ns
    r[names == "kernel:gemm_b"] = 0.05
    r[names == "kernel:rms_norm"] = 0.3
    r[names == "kernel:foo"] = -0.1

    ids, f = symbol_summary(tr, tok, ref_resid=r)
    rows = {tok.token_str(int(i)): row for i, row in zip(ids, f, strict=True)}
    for g in ("kernel:gemm_a", "kernel:gemm_b"):
        assert rows[g][20] == pytest.approx(0.05)  # median of 0 x 8, 0.05 x 16, 0.2 x 8
        assert rows[g][21] == pytest.approx(0.1)  # rank 1's median (0 and 0.2) over rank 2's 0.05
        # per time bin the mean of one gemm_a and one gemm_b: 0.025 in bins 0-7, 0.125 in 8-15
        assert rows[g][22] == pytest.approx(0.1)
    assert rows["kernel:gemm_a"][17] == pytest.approx(0.1)  # its own column 17 is per symbol
    assert rows["kernel:rms_norm"][20] == pytest.approx(0.3)
    assert rows["kernel:rms_norm"][21] == pytest.approx(0.3)
    assert rows["kernel:foo"][20] == pytest.approx(-0.1)  # no known family: its own
    (hk,) = [k for k in rows if k not in syms]
    assert not rows[hk][17:].any()
    assert N_SUMMARY_FEATURES == len(SUMMARY_FEATURE_NAMES) == 25


def test_family_shift_ignores_bins_without_the_family():
    # a family present in the first half of the capture only, with the same skewed residuals in every
    # bin it occupies (median 0, mean 0.1): it never changed, so column 22 reads 0; an unrelated
    # kernel keeps the capture running to the end
    from teller.data.summary import _family_reference

    tbin = np.repeat(np.arange(8), 3)
    r = np.tile([0.0, 0.0, 0.3], 8)
    fam = np.zeros(len(r), np.int64)
    pid = np.ones(len(r), np.int64)
    out = _family_reference(fam, r, pid, tbin)
    med, pmax, shift = out[0]
    assert med == pytest.approx(0.0) and pmax == pytest.approx(0.0)
    assert shift == pytest.approx(0.0)
    # a real change inside the occupied bins is still found: bins 4-7 read 0.2 more
    r2 = r + np.where(tbin >= 4, 0.2, 0.0)
    assert _family_reference(fam, r2, pid, tbin)[0][2] == pytest.approx(0.2)


def test_token_gpu_time_hand_computed():
    """Per token, ln(1 + us) of its kernels outside collectives and of its collective kernels, and
    the collectives' share; host events, copies and <close> positions add nothing."""
    from teller.data.summary import token_gpu_time
    from teller.trace import LAYER_NAMES

    k, h, m = (LAYER_NAMES.index(x) for x in ("kernel", "host_op", "memcpy"))
    symbols = [
        "host_op:aten::mm",
        "kernel:ampere_gemm",
        "kernel:ncclDevKernel_AllReduce_Sum_bf16",
        "memcpy:HtoD",
    ]
    tr = type(
        "T",
        (),
        {
            "layer": np.array([h, k, k, m, k]),
            "symbols": symbols,
            "symbol": np.array([0, 1, 2, 3, 1]),
            "dur": np.array([5_000, 40_000, 9_000, 7_000, 2_000]),  # ns
            "__len__": lambda self: 5,
        },
    )()
    # tokens: [host, gemm, allreduce], [<close>], [memcpy, gemm], [<close>]
    ev = np.array([0, 1, 2, -1, 3, 4, -1])
    offs = np.array([0, 3, 4, 6, 7])
    f = token_gpu_time(tr, ev, offs)
    expect = [[math.log1p(40), math.log1p(9), 9 / 49], [0, 0, 0], [math.log1p(2), 0, 0], [0, 0, 0]]
    np.testing.assert_allclose(f, np.array(expect, np.float32), rtol=1e-6)
    assert f.dtype == np.float32
    assert token_gpu_time(tr, ev[:0], offs[:1]).shape == (0, 3)


def test_token_gpu_time_tells_the_straggler_from_its_peers(tmp_path):
    """On simulated nccl_straggler samples, the straggler's tokens (the culprit ones) spend a smaller
    share of their GPU time in all-reduce than its peers' tokens, which wait for it there."""
    from teller.data import generate
    from teller.data.dataset import culprit_mask
    from teller.data.summary import token_gpu_time

    data = tmp_path / "ds"
    generate(data, num_samples=39, seed=3, preset="tiny")
    tok = tpe.train(data, vocab_size=0)
    seen = 0
    for sd in sorted(data.glob("s0*")):
        ann = json.loads((sd / "annotation.json").read_text())
        if ann["label"] != "nccl_straggler":
            continue
        tr = teller.trace.load(sd / "trace.json", warn=False)
        enc = tok.encode(tr)
        ev, offs = np.asarray(enc.events, np.int64), np.asarray(enc.offsets, np.int64)
        g = token_gpu_time(tr, ev, offs).astype(np.float64)
        f = np.expm1(g[:, :2])
        mask = culprit_mask(tr, ann)
        base = np.zeros(len(ev), bool)
        base[ev >= 0] = mask[ev[ev >= 0]]
        cs = np.r_[0, np.cumsum(base)]
        culprit = (cs[offs[1:]] - cs[offs[:-1]]) > 0
        peers = ~culprit & (f[:, 1] > 0)
        if not culprit.any() or not peers.any():
            continue
        share = g[:, 2]
        np.testing.assert_allclose(share, f[:, 1] / np.maximum(f.sum(1), 1e-300), rtol=1e-4, atol=1e-6)
        assert share[culprit].mean() < share[peers].mean(), sd.name
        seen += 1
    assert seen >= 1, seen


def _ranks_trace(tmp_path, slow_gpu=(), slow_host=(), ranks=2, gc_pause=False):
    """``ranks`` processes (pids 101, ...) with 16 ``engine_step#k`` ranges each (1 000 us apart, the
    same load on every rank), each step holding two host operators (``prep`` 50 us, then ``post``
    30 us) and launching two kernels (``gemm`` 100 us, then ``gemm`` again, 60 us: positions 0 and 1)
    on its GPU (device pid = rank) and an all-reduce that every rank's GPU finishes together.
    ``slow_gpu`` / ``slow_host``: steps where rank 1's kernels (all-reduce aside) / host operators take
    1.5x; ``gc_pause``: one 5 ms ``post`` on rank 0 in step 3 (one event, a benign pause)."""
    ev = []
    for k in range(16):
        for r in range(ranks):
            h = {"pid": 101 + r, "tid": 101 + r}
            g = {"pid": r, "tid": 7}
            t = 1000 * k + 3 * r
            sh = 1.5 if (r == 1 and k in slow_host) else 1.0
            sg = 1.5 if (r == 1 and k in slow_gpu) else 1.0
            post = 5000 if (gc_pause and r == 0 and k == 3) else 30 * sh
            ev += [
                {"ph": "X", "cat": "user_annotation", "name": f"engine_step#{k}", **h, "ts": t, "dur": 990,
                 "args": {"num_tokens": 64, "num_seqs": 8}},
                {"ph": "X", "cat": "cpu_op", "name": "prep", **h, "ts": t + 5, "dur": 50 * sh},
                {"ph": "X", "cat": "cpu_op", "name": "post", **h, "ts": t + 800, "dur": post},
                {"ph": "X", "cat": "kernel", "name": "gemm", **g, "ts": t + 100, "dur": 100 * sg},
                {"ph": "X", "cat": "kernel", "name": "gemm", **g, "ts": t + 300, "dur": 60 * sg},
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", **g,
                 "ts": t + 400, "dur": 200 - 3 * r},
            ]  # fmt: skip
    p = tmp_path / "ranks.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = teller.trace.load(p, warn=False)
    syms = ["host_op:prep", "host_op:post", "kernel:gemm", "kernel:ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    tok = tpe.train(tpe.corpus_from_symbols([syms]), vocab_size=0)
    ids, f = symbol_summary(tr, tok)
    names = [tok.token_str(int(i)) for i in ids]
    return tr, {n.split(":")[0] + ":" + n.split(":")[1][:4]: f[k] for k, n in enumerate(names)}


def test_cross_rank_residuals_hand_computed(tmp_path):
    """An event against its peers: the same symbol, step ordinal and position on the other ranks."""
    from teller.data.summary import cross_rank_residuals, step_ordinal

    tr, _ = _ranks_trace(tmp_path, slow_gpu=range(8, 16))
    x = np.log1p(np.maximum(np.asarray(tr.dur, np.float64), 0) / 1000.0)
    r = cross_rank_residuals(tr, x, step_ordinal(tr))
    name = np.array(tr.strings)[np.asarray(tr.name)]
    pid, ts = np.asarray(tr.pid), np.asarray(tr.ts)
    gemm1 = (name == "gemm") & (pid == 1)
    # two ranks: the median of a pair is its mean, so each reads half the difference
    late = gemm1 & (ts >= 8_000_000)  # (ns)
    d100, d60 = (_x(150) - _x(100)) / 2, (_x(90) - _x(60)) / 2
    np.testing.assert_allclose(np.sort(r[late]), np.sort([d100, d60] * 8), rtol=1e-6)
    assert np.allclose(r[gemm1 & (ts < 8_000_000)], 0.0)
    peer = (name == "gemm") & (pid == 0) & (ts >= 8_000_000)
    np.testing.assert_allclose(np.sort(-r[peer]), np.sort(r[late]), rtol=1e-6)
    # one rank: no peers, no residual
    tr1, f1 = _ranks_trace(tmp_path, slow_gpu=range(8, 16), ranks=1)
    x1 = np.log1p(np.maximum(np.asarray(tr1.dur, np.float64), 0) / 1000.0)
    assert np.isnan(cross_rank_residuals(tr1, x1, step_ordinal(tr1))).all()
    assert all(v[23] == 0 and v[24] == 0 for v in f1.values())


def test_cross_rank_columns_tell_a_straggler_from_a_gpu_neighbour(tmp_path):
    """Rank 1's kernels slow for the second half: its kernel rows and the GPU group move, the host
    rows do not (a noisy neighbour on its GPU); with its host slow too (a straggler) the host rows and
    the host group move as well. A single
    5 ms pause on one rank's host is one event of its bin: the median keeps the host group still."""
    _, f = _ranks_trace(tmp_path, slow_gpu=range(8, 16))
    gemm = (_x(150) - _x(100)) / 2  # (the bin median of positions 0 and 1 lies between the two)
    assert f["kernel:gemm"][23] == pytest.approx(np.median([gemm, (_x(90) - _x(60)) / 2]), rel=1e-6)
    assert f["kernel:gemm"][24] == pytest.approx(f["kernel:gemm"][23], rel=1e-6)
    assert f["host_op:prep"][23] == pytest.approx(0.0, abs=1e-9)
    assert f["host_op:prep"][24] == pytest.approx(0.0, abs=1e-9)
    assert f["kernel:nccl"][24] == f["kernel:gemm"][24]  # (the row's group: the GPU's, without it)
    _, s = _ranks_trace(tmp_path, slow_gpu=range(8, 16), slow_host=range(8, 16))
    assert s["host_op:prep"][23] == pytest.approx((_x(75) - _x(50)) / 2, rel=1e-6)
    assert s["host_op:post"][24] > 0.005 and s["host_op:post"][24] == s["host_op:prep"][24]
    assert s["kernel:gemm"][24] == pytest.approx(f["kernel:gemm"][24], rel=1e-6)
    _, p = _ranks_trace(tmp_path, gc_pause=True)
    assert p["host_op:post"][23] > 0.5  # (its own row sees it)
    assert p["host_op:prep"][24] == pytest.approx(0.0, abs=1e-9)


def test_cross_rank_columns_three_ranks(tmp_path):
    """With three ranks the peers' median is the healthy ranks' value: the slow rank reads its whole
    slowdown, the others 0 (a mean would spread it over all three)."""
    from teller.data.summary import cross_rank_residuals, step_ordinal

    tr, f = _ranks_trace(tmp_path, slow_host=range(8, 16), ranks=3)
    x = np.log1p(np.maximum(np.asarray(tr.dur, np.float64), 0) / 1000.0)
    r = cross_rank_residuals(tr, x, step_ordinal(tr))
    name = np.array(tr.strings)[np.asarray(tr.name)]
    pid, ts = np.asarray(tr.pid), np.asarray(tr.ts)
    prep = name == "prep"
    late = ts >= 8_000_000
    np.testing.assert_allclose(r[prep & late & (pid == 102)], _x(75) - _x(50), rtol=1e-6)
    assert np.allclose(r[prep & (pid != 102)], 0.0) and np.allclose(r[prep & ~late], 0.0)
    assert f["host_op:prep"][23] == pytest.approx(_x(75) - _x(50), rel=1e-6)


def _native_and_reference_agree(tr, tok, rng) -> int:
    """Asserts that the Rust loop and the numpy reference give identical rows, bit for bit in float64
    (before the cast to float32, which would hide a last-bit difference), with and without the
    per-position fit and reference residuals; returns the rows compared."""
    from teller.data.summary import symbol_summary_reference

    n = 0
    for by_position in (True, False):
        for with_ref in (False, True):
            r = None
            if with_ref:
                r = rng.normal(0.0, 0.1, len(tr))
                r[rng.random(len(tr)) < 0.4] = np.nan
            a_ids, a = symbol_summary(tr, tok, by_position=by_position, ref_resid=r, dtype=np.float64)
            b_ids, b = symbol_summary_reference(
                tr, tok, by_position=by_position, ref_resid=r, dtype=np.float64
            )
            assert a_ids.dtype == b_ids.dtype == np.uint32 and a.dtype == np.float64
            np.testing.assert_array_equal(a_ids, b_ids)
            bad = np.argwhere((a != b) & ~(np.isnan(a) & np.isnan(b)))
            assert not len(bad), [
                (SUMMARY_FEATURE_NAMES[j], float(a[i, j]), float(b[i, j])) for i, j in bad[:5]
            ]
            n += len(a)
        assert symbol_summary(tr, tok, by_position=by_position)[1].dtype == np.float32
    return n


def test_native_rows_equal_the_numpy_reference(tmp_path, traces_dir):
    # every class of the simulator (TP ranks, collectives, faults that start mid-capture), and two real
    # profiler traces; a tokenizer that lacks some of their symbols, so that [UNK] rows pool them
    from teller.data.dataset import generate

    generate(tmp_path / "d", num_samples=26, preset="tiny", seed=11)
    traces = [teller.trace.load(p, warn=False) for p in sorted((tmp_path / "d").glob("s*/trace.json"))]
    traces += [teller.trace.load(traces_dir / f, warn=False) for f in ("a100_nccl_2rank.kineto.json.gz",)]
    names = sorted({s for tr in traces for s in tr.symbols})
    tok = tpe.train(tpe.corpus_from_symbols([names[::2]]), vocab_size=0)
    rng = np.random.default_rng(0)
    rows = sum(_native_and_reference_agree(tr, tok, rng) for tr in traces)
    assert rows > 26 * 4 * 10


def test_native_rows_equal_the_reference_on_exact_fits(tmp_path):
    # durations an exact quadratic of the step's load per position (two GEMM shapes), with a slowdown
    # on one rank in some trials: the per-position residuals are ~0 and the window scans over them
    # tie, so the last bit of the fit (the 3 x 3 solve, the sums) decides the window; and integer-us
    # kernels of a two-rank collective (the transfer match's expm1 threshold)
    rng = np.random.default_rng(3)
    names: list[str] = []
    rows = 0
    for trial in range(12):
        ev = []
        for pid in (1, 2):
            for k in range(16):
                tokens = int(rng.choice([35, 100, 640, 1000, 2048, 6656]))
                step = {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"engine_step#{k}",
                    "pid": pid,
                    "tid": pid,
                }
                ev.append({**step, "ts": 5000 * k, "dur": 4999, "args": {"num_tokens": tokens}})
                w = math.log1p(tokens)
                for j, (a0, a1, a2) in enumerate(((1.0, 0.5, 0.25), (2.0, 0.125, 0.5))):
                    slow = 1.5 if (trial % 3 == 1 and pid == 2 and k >= 8) else 1.0
                    us = math.expm1(a0 + a1 * w + a2 * w * w / 16) * slow
                    ev.append(
                        {
                            "ph": "X",
                            "cat": "kernel",
                            "name": "gemm",
                            "pid": pid,
                            "tid": pid,
                            "ts": 5000 * k + 10 + 300 * j,
                            "dur": us,
                        }
                    )
                ev.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "ncclDevKernel_AllReduce",
                        "pid": pid,
                        "tid": pid,
                        "ts": 5000 * k + 1000 + (7 if pid == 1 else 0),
                        "dur": int(rng.integers(5, 40)),
                    }
                )
        p = tmp_path / f"q{trial}.json"
        p.write_text(json.dumps({"traceEvents": ev}))
        tr = teller.trace.load(p, warn=False)
        names = sorted(set(names) | set(tr.symbols))
        tok = tpe.train(tpe.corpus_from_symbols([names]), vocab_size=0)
        rows += _native_and_reference_agree(tr, tok, rng)
    assert rows >= 12 * 4 * 2


def test_native_rows_refuse_a_broken_call():
    from teller import _native

    i = np.zeros(3, np.int64)
    f = np.zeros(3)
    b = np.zeros(3, bool)
    # sid ts end pid x ex gap early w tbin step coll sord xrank host gpu host_shift gpu_shift ref_resid
    # fam fam_stats log1p_count baseline_frac by_position
    ok = (
        i,
        i,
        i,
        i,
        f,
        f,
        f,
        b,
        f,
        i,
        i,
        b,
        None,
        f,
        b,
        b,
        0.0,
        0.0,
        None,
        None,
        None,
        np.log1p(np.arange(4.0)),
        0.1,
        True,
    )
    assert _native.symbol_rows(*ok)[0].tolist() == [0]
    with pytest.raises(ValueError, match="ts has 2 values"):
        _native.symbol_rows(i, i[:2], *ok[2:])
    with pytest.raises(ValueError, match="gap has 2 values"):
        _native.symbol_rows(*ok[:6], f[:2], *ok[7:])
    with pytest.raises(ValueError, match="largest symbol has 3 events"):
        _native.symbol_rows(*ok[:21], np.zeros(3), 0.1, True)
    with pytest.raises(ValueError, match="tbin"):
        _native.symbol_rows(*ok[:9], np.full(3, 16, np.int64), *ok[10:])
