"""Model inputs from tokenized shards (``teller tokenize``): per-sample tensors, log compaction, batching.

Logs are long (median ~2 400 template tokens per sample on ``default``) and mostly repeated request
lines, so before truncation each sample's log is *compacted*: identical line templates (the same
token ids, placeholders included) are kept once, in order of first occurrence, with three features
per token: ``t_rel`` of the first occurrence (signed log1p of ms), the mean over occurrences of the
numeric value the token stood for, and ``log1p(count)`` of the line. This brings the median to ~510
tokens with every distinct message kept; what remains over ``max_log_tokens`` is cut keeping the
head (start-up configuration) and the tail (the latest messages) halves.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teller.data.summary import N_GPU_TIME_FEATURES, N_PROC_LOG_FEATURES, N_SUMMARY_FEATURES, load_slope
from teller.data.tokenize import LogTokenizer, ShardedSplit, read_shards_manifest, split_names
from teller.errors import ConfigError, TellerWarning

BOL_ID = 2  # LOG_SPECIALS index of [BOL]
N_LOG_FEATURES = 3
N_RICH_LOG_FEATURES = 8
N_GAP_LOG_FEATURES = 2  # compact_log(gaps=True): mean and max lag after the previous log line
N_BURST_LOG_FEATURES = 2  # compact_log(bursts=True): the template's densest burst and its surprise
# The burst window. Requests a client-side network held back reach the server together when it
# heals (the simulator releases them within 2 ms; a proxy flushing its queue is as fast), while
# independent arrivals at the same mean rate rarely stack up within it.
BURST_WINDOW_MS = 2.0


@dataclass
class Sample:
    sample_id: str
    label: int
    trace_ids: np.ndarray  # int64 [T]
    trace_features: np.ndarray  # float32 [T, 5]
    culprit: np.ndarray  # bool [T]
    log_ids: np.ndarray  # int64 [L]
    log_features: np.ndarray  # float32 [L, 3]
    token_event_pos: np.ndarray | None = None
    base_events: np.ndarray | None = None
    log_summary_ids: np.ndarray | None = None  # int64 [K]: words that precede numbers (log_word_summary)
    log_summary_features: np.ndarray | None = None  # float32 [K, 8]
    summary_ids: np.ndarray | None = None  # int64 [S]: per-symbol summary rows (teller.data.summary)
    summary_features: np.ndarray | None = None  # float32 [S, n_summary_features]
    severity: float = float("nan")  # the fault's severity (evaluation by severity; NaN if unknown)
    effect_events: int = -1  # the fault's effect.events (evaluation by effect; -1 if unknown)
    effect_share: float = float("nan")  # its effect.share (NaN if unknown)
    summary_culprit: np.ndarray | None = None  # bool [S]: the row's symbol has a culprit event (shards v4)


def _slog(x: np.ndarray) -> np.ndarray:
    return (np.sign(x) * np.log1p(np.abs(x))).astype(np.float32)


N_RELATIVE_FEATURES = 4
N_WORK_FEATURES = 2  # model.work_features: work_token_features


def relative_token_features(
    ids: np.ndarray, feats: np.ndarray, segment_starts: np.ndarray, baseline_frac: float = 0.1
) -> np.ndarray:
    """Per-token timing relative to the same token type in the sample's opening steps (the first
    ``baseline_frac`` of its segments; all of them for a type absent there): mean log duration per
    event, max log duration and idle gap minus that baseline, and the token's position in time
    (segment index / segments). ``float32 [T, 4]``: appended to the 5 TPE features when
    ``model.relative_features`` is on (what the localization head needs to point at the tokens
    that changed, not the ones that are long for this workload)."""
    t = len(ids)
    out = np.zeros((t, N_RELATIVE_FEATURES), np.float32)
    if t == 0:
        return out
    f = np.asarray(feats, np.float64)
    frac = _segment_frac(t, segment_starts)
    cols = np.stack([f[:, 1] / np.maximum(f[:, 0], 1), f[:, 2], f[:, 4]], 1)
    out[:, :3] = _minus_opening(ids, cols, frac < baseline_frac)
    out[:, 3] = frac
    return out


def _segment_frac(t: int, segment_starts: np.ndarray) -> np.ndarray:
    """Per token, its segment's index over the number of segments (its position in time)."""
    seg = np.searchsorted(np.asarray(segment_starts), np.arange(t), side="right") - 1
    return np.clip(seg, 0, None) / max(len(segment_starts), 1)


def _minus_opening(ids: np.ndarray, cols: np.ndarray, early: np.ndarray) -> np.ndarray:
    """``cols`` minus, per token type, their median over its ``early`` tokens (over all of its
    tokens for a type absent there)."""
    out = np.zeros_like(cols)
    order = np.argsort(ids, kind="stable")
    bounds = np.flatnonzero(np.diff(np.asarray(ids)[order])) + 1
    for grp in np.split(order, bounds):
        e = grp[early[grp]]
        base = np.median(cols[e if len(e) else grp], axis=0)
        out[grp] = cols[grp] - base
    return out


def gpu_time_token_features(
    ids: np.ndarray, gpu: np.ndarray, segment_starts: np.ndarray, baseline_frac: float = 0.1
) -> np.ndarray:
    """The shards' ``token_gpu`` (compute and collective kernel time, ln(1 + us), and the
    collectives' share) minus the same token type's in the sample's opening steps, as
    :func:`relative_token_features` does for the TPE features. Relative, because the level is the
    deployment's: measured as they are, the columns made models call captures of unseen
    deployments (test_ood) `nvlink_degradation`; against the capture's own opening, a straggler's
    steps read compute up and all-reduce share down, its peers' the reverse, and a slow link every
    rank's all-reduce up. ``float32 [T, 3]``."""
    t = len(ids)
    g = np.asarray(gpu, np.float64).reshape(-1, N_GPU_TIME_FEATURES)
    if t == 0:
        return np.zeros((0, N_GPU_TIME_FEATURES), np.float32)
    early = _segment_frac(t, segment_starts) < baseline_frac
    return _minus_opening(ids, g, early).astype(np.float32)


def work_token_features(
    ids: np.ndarray,
    feats: np.ndarray,
    work: np.ndarray,
    segment_starts: np.ndarray,
    baseline_frac: float = 0.1,
) -> np.ndarray:
    """Per-token timing normalized by the load of the token's step (``work``: ln(1 + num_tokens),
    the shards' ``token_work``): per token type, the slope b of the mean log duration per event on
    the work over the sample (clipped to [0, 1.2]), and the residual ``x - b w`` minus the type's
    median residual in the opening steps (all steps for a type absent there); and the token's work
    minus the sample's median work. ``float32 [T, 2]``. The opening-window features of
    :func:`relative_token_features` call a 6 656-token prefill GEMM slow next to a 35-token decode
    GEMM; these do not."""
    t = len(ids)
    out = np.zeros((t, N_WORK_FEATURES), np.float32)
    if t == 0:
        return out
    f = np.asarray(feats, np.float64)
    w = np.asarray(work, np.float64)
    x = f[:, 1] / np.maximum(f[:, 0], 1)
    seg = np.searchsorted(np.asarray(segment_starts), np.arange(t), side="right") - 1
    early = np.clip(seg, 0, None) / max(len(segment_starts), 1) < baseline_frac
    order = np.argsort(ids, kind="stable")
    for grp in np.split(order, np.flatnonzero(np.diff(np.asarray(ids)[order])) + 1):
        xs, ws = x[grp], w[grp]
        r = xs - load_slope(xs, ws) * ws
        e = early[grp]
        out[grp, 0] = r - np.median(r[e] if e.any() else r)
    out[:, 1] = w - np.median(w)
    return out


NUM_ID = 5  # "<num>": LOG_SPECIALS (5 entries), then the placeholders, <num> first
N_LOG_SUMMARY_FEATURES = 8


def word_mask(vocab: Sequence[str]) -> np.ndarray:
    """True for the log-vocabulary entries that are words (not specials, placeholders, punctuation)."""
    return np.array(
        [not (w.startswith("[") or w.startswith("<")) and any(c.isalnum() for c in w) for w in vocab], bool
    )


def num_context(ids: np.ndarray, words: np.ndarray) -> np.ndarray:
    """For each ``<num>`` token, the id of the last word before it on its line (0 if none; 0 for
    every other token): ``usage`` for the 97.3 of ``GPU KV cache usage: 97.3%``."""
    ids = np.asarray(ids, np.int64)
    n = len(ids)
    if n == 0:
        return np.zeros(0, np.int64)
    is_word = (ids < len(words)) & words[np.minimum(ids, len(words) - 1)]
    last = np.maximum.accumulate(np.where(is_word | (ids == BOL_ID), np.arange(n), -1))
    prev = ids[np.maximum(last, 0)]
    ctx = np.where((last >= 0) & (prev != BOL_ID), prev, 0)
    return np.where(ids == NUM_ID, ctx, 0).astype(np.int64)


def log_word_summary(ids: np.ndarray, feats: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the log's numbers say, keyed by the word before each number, over the *whole* log (before
    compaction): per word (sorted by id) the count, mean, max, min and last value (the values are
    already sign(v) log1p|v|), and the time of its first and last occurrence and the longest interval
    between two (signed log1p of ms). ``GPU KV cache usage: <num>`` becomes one row for ``usage``:
    the GBDT's word -> value features, as tokens the model does not have to find among 256."""
    ctx = num_context(ids, words)
    sel = np.flatnonzero(ctx > 0)
    if len(sel) == 0:
        return np.zeros(0, np.int64), np.zeros((0, N_LOG_SUMMARY_FEATURES), np.float32)
    f = np.asarray(feats, np.float64)
    keys, v, t = ctx[sel], f[sel, 1], f[sel, 0]
    order = np.argsort(keys, kind="stable")  # by word, then position (time)
    keys, v, t = keys[order], v[order], t[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    out = np.zeros((len(starts), N_LOG_SUMMARY_FEATURES), np.float64)
    for g, (a, b) in enumerate(zip(starts, ends, strict=True)):
        vv, tt = v[a:b], t[a:b]
        gap = float(np.max(np.diff(tt))) if b - a > 1 else 0.0
        out[g] = [b - a, vv.mean(), vv.max(), vv.min(), vv[-1], tt[0], tt[-1], gap]
    out[:, 5:] = _slog(out[:, 5:])
    return keys[starts], out.astype(np.float32)


def poisson_surprise(k: int, mu: float) -> float:
    """``-ln P(X >= k)`` for ``X ~ Poisson(mu)`` (0 for ``k <= 0``; capped at 700, the tail of a
    float64): how unlikely ``k`` events in a window are where ``mu`` are expected. Exact to ~1e-12
    for the counts one window holds; past a few thousand with ``k`` within a few of ``mu`` the
    series below is cut short."""
    if k <= 0:
        return 0.0
    if mu <= 0.0:
        return 700.0
    if k <= mu:  # the tail holds at least about half the mass: 1 - CDF(k - 1) is accurate
        i = np.arange(k, dtype=np.float64)
        log_pmf = -mu + i * np.log(mu) - np.array([math.lgamma(x + 1.0) for x in i])
        return float(min(-math.log(max(1.0 - float(np.exp(log_pmf).sum()), 1e-300)), 700.0))
    # ln pmf(k) + ln(1 + mu/(k+1) + mu^2/((k+1)(k+2)) + ...): the ratios stay under mu/k < 1
    log_pmf_k = -mu + k * math.log(mu) - math.lgamma(k + 1.0)
    j = np.arange(1, 4096, dtype=np.float64)
    series = 1.0 + float(np.cumprod(mu / (k + j)).sum())
    return float(min(-(log_pmf_k + math.log(series)), 700.0))


def burst_features(times_ms: np.ndarray, window_ms: float = BURST_WINDOW_MS) -> tuple[float, float]:
    """The densest burst of one template's occurrences (``times_ms``, any order; 0 = a line without
    a timestamp, left out): ``ln`` of the most occurrences within any ``window_ms`` that starts at
    one, and how surprising the *others* in that window would be for independent (Poisson) arrivals
    at the template's mean rate over its span: ``ln(1 + max(0, s - ln n))`` with ``s`` the
    :func:`poisson_surprise` of ``most - 1`` (``- ln n``: n windows had the chance). ``(0, 0)``
    for fewer than two stamped occurrences; the surprise is 0 when the span is under one window
    (no rate to compare a burst after total silence with)."""
    t = np.asarray(times_ms, np.float64)
    t = np.sort(t[t != 0.0])
    n = len(t)
    if n < 2:
        return 0.0, 0.0
    most = int((np.searchsorted(t, t + window_ms, side="right") - np.arange(n)).max())
    span = float(t[-1] - t[0])
    if span < window_ms:
        return math.log(most), 0.0
    s = poisson_surprise(most - 1, (n - 1) / span * window_ms) - math.log(n)
    return math.log(most), math.log1p(max(s, 0.0))


def compact_log(
    ids: np.ndarray,
    feats: np.ndarray,
    max_tokens: int,
    rich: bool = False,
    gaps: bool = False,
    lines: bool = False,
    bursts: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Deduplicate identical line templates (see the module docstring), then cut to ``max_tokens``.

    Features per kept token (``N_LOG_FEATURES``): time of the template's first occurrence (signed
    log1p of ms), the mean of the number at that position over the occurrences, log1p(count). With
    ``rich`` (``N_RICH_LOG_FEATURES``) also: the max, min and last value at that position, the time of
    the last occurrence and the longest interval between two occurrences (signed log1p of ms): a
    KV-cache usage that peaks at 99 % or request lines that stop for a second are invisible in a
    mean. With ``gaps`` (``N_GAP_LOG_FEATURES`` more, after those): the mean and the max over the
    occurrences of the lag between the previous log line and this one (signed log1p of ms): an HTTP
    ``200 OK`` that normally follows its ``Finished request`` line within microseconds and now comes
    hundreds of milliseconds later is a slow network or client, visible in no count or number.
    With ``bursts`` (``N_BURST_LOG_FEATURES`` more, last): the template's :func:`burst_features`,
    e.g. 35 ``Received request`` lines within 2 ms after a lull, which a network that held requests
    back and released them leaves and independent arrivals at that rate do not.
    With ``lines`` (the model reads one token per line, ``model.log_lines``) the kept tail starts at
    its first ``[BOL]`` (and is empty without one): the words of a line cut in two would otherwise
    continue the head's last (cut) line as one line."""
    ids = np.asarray(ids, dtype=np.int64)
    feats = np.asarray(feats, dtype=np.float32)
    nf = (
        (N_RICH_LOG_FEATURES if rich else N_LOG_FEATURES)
        + (N_GAP_LOG_FEATURES if gaps else 0)
        + (N_BURST_LOG_FEATURES if bursts else 0)
    )
    if len(ids) == 0:
        return ids, np.zeros((0, nf), np.float32)
    starts = np.flatnonzero(ids == BOL_ID)
    if len(starts) == 0 or starts[0] != 0:
        starts = np.concatenate([[0], starts])
    ends = np.append(starts[1:], len(ids))
    order: list[tuple[int, ...]] = []
    agg: dict[tuple[int, ...], list[Any]] = {}
    occ: dict[tuple[int, ...], list[float]] = {}  # bursts: each template's occurrence times
    # ms since the previous line (a running max: lines without a timestamp prefix have time 0)
    line_t = np.maximum.accumulate(feats[starts, 0].astype(np.float64))
    lag = np.diff(line_t, prepend=line_t[0])
    for li, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        key = tuple(ids[s:e].tolist())
        v = feats[s:e, 1].astype(np.float64)
        t = float(feats[s, 0])
        if bursts:
            occ.setdefault(key, []).append(t)
        a = agg.get(key)
        if a is None:
            # t_first, value sum, count, value max, value min, last value, t_last, max interval,
            # lag sum, lag max
            mx, mn = (v.copy(), v.copy()) if rich else (v, v)  # updated in place only when rich
            agg[key] = [t, v, 1, mx, mn, v, t, 0.0, lag[li], lag[li]]
            order.append(key)
        else:
            a[8] += lag[li]
            a[9] = max(a[9], lag[li])
            a[1] = a[1] + v
            a[2] += 1
            if rich:
                np.maximum(a[3], v, out=a[3])
                np.minimum(a[4], v, out=a[4])
                a[5] = v
                a[7] = max(a[7], t - a[6])
                a[6] = t
    out_ids: list[int] = []
    out_f: list[np.ndarray] = []
    for key in order:
        t0, vsum, n, vmax, vmin, vlast, t1, gap, lag_sum, lag_max = agg[key]
        f = np.empty((len(key), nf), np.float32)
        f[:, 0] = _slog(np.array([t0]))[0]
        f[:, 1] = vsum / n
        f[:, 2] = np.log1p(n)
        if rich:
            f[:, 3] = vmax
            f[:, 4] = vmin
            f[:, 5] = vlast
            f[:, 6] = _slog(np.array([t1]))[0]
            f[:, 7] = _slog(np.array([gap]))[0]
        if gaps:
            g0 = nf - N_GAP_LOG_FEATURES - (N_BURST_LOG_FEATURES if bursts else 0)
            f[:, g0 : g0 + N_GAP_LOG_FEATURES] = _slog(np.array([lag_sum / n, lag_max]))
        if bursts:
            f[:, nf - N_BURST_LOG_FEATURES :] = burst_features(np.array(occ[key]))
        out_ids.extend(key)
        out_f.append(f)
    oi = np.asarray(out_ids, dtype=np.int64)
    of = np.concatenate(out_f)
    if len(oi) > max_tokens:
        h = max_tokens // 2
        a = len(oi) - (max_tokens - h)
        if lines:
            bol = np.flatnonzero(oi[a:] == BOL_ID)
            a += int(bol[0]) if len(bol) else len(oi) - a  # no line starts in the tail: none of it
        oi = np.concatenate([oi[:h], oi[a:]])
        of = np.concatenate([of[:h], of[a:]])
    return oi, of


def load_split(
    run_dir: str | Path,
    split: str,
    max_trace_tokens: int,
    max_log_tokens: int,
    keep_positions: bool = False,
    max_summary_tokens: int = 0,
    relative_features: bool = False,
    rich_log_features: bool = False,
    log_summary: bool = False,
    n_summary_features: int = N_SUMMARY_FEATURES,
    log_gaps: bool = False,
    work_features: bool = False,
    proc_log_features: bool = False,
    log_lines: bool = False,
    log_bursts: bool = False,
    gpu_time: bool | str = False,
) -> tuple[list[Sample], list[str]]:
    """All samples of a split as compact in-memory arrays (traces cut to ``max_trace_tokens``; the
    first ``max_summary_tokens`` summary rows, i.e. the most frequent base symbols of the TPE
    vocabulary, which is ordered by frequency, with their first ``n_summary_features`` columns)."""
    out: list[Sample] = []
    label_names: list[str] = []
    words = None
    if log_summary:
        words = word_mask(LogTokenizer.load(Path(run_dir) / "log_tokenizer.json").vocab)
    for ss in (ShardedSplit(run_dir, sp) for sp in split_names(run_dir, split)):
        label_names = ss.label_names
        _load_into(
            out,
            ss,
            max_trace_tokens,
            max_log_tokens,
            keep_positions,
            max_summary_tokens,
            relative_features,
            rich_log_features,
            words,
            n_summary_features,
            log_gaps,
            work_features,
            proc_log_features,
            log_lines,
            log_bursts,
            gpu_time,
        )
    return out, label_names


def check_extra_train(run_dir: str | Path, extra: str | Path) -> None:
    """``extra``'s train split can be trained on with ``run_dir``'s: the same TPE tokenizer, log
    tokenizer, labels and shards version (else a :class:`ConfigError` naming what differs)."""
    a = read_shards_manifest(run_dir)
    mp = Path(extra) / "manifest.json"
    if not mp.is_file():
        raise ConfigError(f"{extra}: not tokenized shards (no manifest.json)", path=str(extra))
    b = read_shards_manifest(extra)

    def sha(m: dict[str, Any], part: str) -> Any:
        d = m.get(part)
        return d.get("sha256") if isinstance(d, dict) else None

    checks = {
        "TPE tokenizer": (sha(a, "tokenizer"), sha(b, "tokenizer")),
        "log tokenizer": (sha(a, "log_tokenizer"), sha(b, "log_tokenizer")),
        "kernel reference": (sha(a, "reference"), sha(b, "reference")),
        "label names": (a["label_names"], b["label_names"]),
        "shards version": (a.get("version"), b.get("version")),
    }
    for what, (x, y) in checks.items():
        if x != y and what == "shards version":
            raise ConfigError(
                f"{extra}: shards version {y}, {run_dir}'s are version {x}; tokenize it again with "
                "this teller (`teller tokenize --log-tokenizer RUN/log_tokenizer.json`, as before)",
                path=str(extra),
            )
        if x != y:
            raise ConfigError(
                f"{extra}: its {what} differs from {run_dir}'s; tokenize it with the same TPE tokenizer "
                "and `teller tokenize --log-tokenizer RUN/log_tokenizer.json` (which also takes RUN's "
                "reference.json)",
                path=str(extra),
            )
    if "train" not in b["splits"]:
        raise ConfigError(f"{extra}: no train split", path=str(extra))
    # the same samples twice, or a dataset regenerated with the benchmark's seed (sample i is a
    # function of (seed, i) alone: it would hold the benchmark's val and test samples)
    da = a.get("dataset") if isinstance(a.get("dataset"), dict) else {}
    db = b.get("dataset") if isinstance(b.get("dataset"), dict) else {}
    if da.get("manifest_sha256") is not None and da.get("manifest_sha256") == db.get("manifest_sha256"):
        raise ConfigError(f"{extra}: encodes the same dataset as {run_dir}", path=str(extra))
    seeds = []
    for dd in (da, db):
        dm = Path(str(dd.get("path", ""))) / "manifest.json"
        try:
            seeds.append(json.loads(dm.read_text()).get("seed") if dm.is_file() else None)
        except (OSError, ValueError, AttributeError):  # (only a hint: an unreadable one tells nothing)
            seeds.append(None)
    if seeds[0] is not None and seeds[0] == seeds[1]:
        raise ConfigError(
            f"{extra}: its dataset was generated with the benchmark's seed ({seeds[0]}), so its samples "
            "repeat the benchmark's (val and test included); generate it with another --seed",
            path=str(extra),
        )


def load_model_split(
    run_dir: str | Path, split: str, model_cfg: dict[str, Any]
) -> tuple[list[Sample], list[str]]:
    """``load_split`` with the inputs a model configuration (``ModelConfig.to_dict()``) asks for."""
    summary = bool(model_cfg.get("summary_tokens")) and model_cfg.get("modalities", "both") != "log"
    return load_split(
        run_dir,
        split,
        int(model_cfg["max_trace_tokens"]),
        int(model_cfg["max_log_tokens"]),
        max_summary_tokens=int(model_cfg.get("max_summary_tokens", 0)) if summary else 0,
        relative_features=bool(model_cfg.get("relative_features")),
        rich_log_features=bool(model_cfg.get("rich_log_features")),
        log_summary=bool(model_cfg.get("log_summary_tokens"))
        and model_cfg.get("modalities", "both") != "trace",
        n_summary_features=int(model_cfg.get("n_summary_features", N_SUMMARY_FEATURES)),
        log_gaps=bool(model_cfg.get("log_gap_features")),
        work_features=bool(model_cfg.get("work_features")),
        proc_log_features=bool(model_cfg.get("log_process_features")),
        log_lines=bool(model_cfg.get("log_lines")),
        log_bursts=bool(model_cfg.get("log_burst_features")),
        gpu_time=model_cfg.get("token_gpu_features") or False,
    )


def _load_into(
    out: list[Sample],
    ss: ShardedSplit,
    max_trace_tokens: int,
    max_log_tokens: int,
    keep_positions: bool,
    max_summary_tokens: int,
    relative_features: bool,
    rich_log_features: bool,
    words: np.ndarray | None,
    n_summary_features: int = N_SUMMARY_FEATURES,
    log_gaps: bool = False,
    work_features: bool = False,
    proc_log_features: bool = False,
    log_lines: bool = False,
    log_bursts: bool = False,
    gpu_time: bool | str = False,
) -> None:
    if max_summary_tokens and len(ss):
        width = ss[0]["summary_features"].shape[1]
        if width < n_summary_features:
            raise ConfigError(
                f"{ss.run_dir}: its per-symbol summaries have {width} columns, the model needs "
                f"{n_summary_features} (shards version {ss.manifest.get('version', 1)}); "
                "re-run `teller tokenize`"
            )
    cut = lost = 0
    for i in range(len(ss)):
        d = ss[i]
        n = min(len(d["trace_ids"]), max_trace_tokens)
        if n < len(d["trace_ids"]):
            cut += 1
            tc = np.asarray(d["trace_culprit"], dtype=bool)
            lost += int(tc.any() and not tc[:n].any())
        li, lf = compact_log(
            d["log_ids"],
            d["log_features"],
            max_log_tokens,
            rich=rich_log_features,
            gaps=log_gaps,
            lines=log_lines,
            bursts=log_bursts,
        )
        out.append(
            Sample(
                sample_id=d["sample_id"],
                label=int(d["label"]),
                severity=float(d.get("severity", np.nan)),
                effect_events=int(d.get("effect_events", -1)),
                effect_share=float(d.get("effect_share", np.nan)),
                trace_ids=np.asarray(d["trace_ids"][:n], dtype=np.int64),
                trace_features=_trace_features(
                    d, n, relative_features, work_features, proc_log_features, gpu_time
                ),
                culprit=np.asarray(d["trace_culprit"][:n], dtype=bool),
                log_ids=li,
                log_features=lf,
                token_event_pos=np.asarray(d["token_event_pos"]) if keep_positions else None,
                base_events=np.asarray(d["base_events"]) if keep_positions else None,
                summary_ids=np.asarray(d["summary_ids"][:max_summary_tokens], dtype=np.int64),
                summary_features=np.array(
                    d["summary_features"][:max_summary_tokens, :n_summary_features], dtype=np.float32
                ),
                summary_culprit=np.asarray(
                    d.get("summary_culprit", np.zeros(len(d["summary_ids"]), bool))[:max_summary_tokens],
                    dtype=bool,
                ),
            )
        )
        if words is not None:
            out[-1].log_summary_ids, out[-1].log_summary_features = log_word_summary(
                np.asarray(d["log_ids"]), np.asarray(d["log_features"]), words
            )
    if cut:
        # a model reads a capture's first max_trace_tokens tokens; a long real capture (25k tokens)
        # loses its end, and where every culprit was there, its localization is neither trained nor
        # scored (loc_n counts what is left): say so rather than drop them quietly
        warnings.warn(
            f"{ss.run_dir} ({ss.split}): {cut} of {len(ss)} samples have more than max_trace_tokens "
            f"({max_trace_tokens}) trace tokens and are read up to it; {lost} of them lose every culprit "
            "token, so their localization is neither trained nor scored",
            TellerWarning,
            stacklevel=3,
        )


def _trace_features(
    d: dict[str, Any],
    n: int,
    relative: bool,
    work: bool = False,
    proc_log: bool = False,
    gpu_time: bool | str = False,
) -> np.ndarray:
    f = np.array(d["trace_features"][:n], dtype=np.float32)
    parts = [f]
    ids = np.asarray(d["trace_ids"], np.int64)
    if relative:  # whole sample, then cut
        parts.append(relative_token_features(ids, d["trace_features"], d["segment_starts"])[:n])
    if work:
        tw = d.get("token_work")
        tw = np.zeros(len(ids), np.float32) if tw is None else np.asarray(tw)
        parts.append(work_token_features(ids, d["trace_features"], tw, d["segment_starts"])[:n])
    if proc_log:
        pl = d.get("token_proc_log")
        parts.append(
            np.zeros((n, N_PROC_LOG_FEATURES), np.float32)
            if pl is None
            else np.asarray(pl[:n], np.float32).reshape(-1, N_PROC_LOG_FEATURES)
        )
    if gpu_time:  # whole sample, then cut
        g = d.get("token_gpu")
        g = np.zeros((len(ids), N_GPU_TIME_FEATURES), np.float32) if g is None else np.asarray(g)
        if gpu_time == "absolute":
            parts.append(np.asarray(g, np.float32).reshape(-1, N_GPU_TIME_FEATURES)[:n])
        else:  # (True: "relative", the first reading)
            parts.append(gpu_time_token_features(ids, g, d["segment_starts"])[:n])
    return np.concatenate(parts, 1) if len(parts) > 1 else f


def collate(samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
    """Pad a list of samples to the longest trace/log in the batch (pad id 0, masks True = real)."""
    b = len(samples)
    lt = max(1, max(len(s.trace_ids) for s in samples))
    ll = max(1, max(len(s.log_ids) for s in samples))
    nf = samples[0].trace_features.shape[1] if samples[0].trace_features.ndim == 2 else 5
    out = {
        "trace_ids": torch.zeros(b, lt, dtype=torch.long),
        "trace_features": torch.zeros(b, lt, nf),
        "trace_mask": torch.zeros(b, lt, dtype=torch.bool),
        "culprit": torch.zeros(b, lt),
        "log_ids": torch.zeros(b, ll, dtype=torch.long),
        "log_features": torch.zeros(b, ll, samples[0].log_features.shape[1]),
        "log_mask": torch.zeros(b, ll, dtype=torch.bool),
        "labels": torch.tensor([s.label for s in samples], dtype=torch.long),
    }
    _pad_rows(
        out,
        "log_summary",
        [(s.log_summary_ids, s.log_summary_features) for s in samples],
        N_LOG_SUMMARY_FEATURES,
    )
    nsf = next(
        (s.summary_features.shape[1] for s in samples if s.summary_features is not None),
        N_SUMMARY_FEATURES,
    )
    _pad_rows(out, "summary", [(s.summary_ids, s.summary_features) for s in samples], nsf)
    out["summary_culprit"] = torch.zeros(out["summary_mask"].shape)
    for i, s in enumerate(samples):
        if s.summary_culprit is not None and len(s.summary_culprit):
            out["summary_culprit"][i, : len(s.summary_culprit)] = torch.from_numpy(
                s.summary_culprit.astype(np.float32)
            )
    for i, s in enumerate(samples):
        n, m = len(s.trace_ids), len(s.log_ids)
        out["trace_ids"][i, :n] = torch.from_numpy(s.trace_ids)
        out["trace_features"][i, :n] = torch.from_numpy(s.trace_features)
        out["trace_mask"][i, :n] = True
        out["culprit"][i, :n] = torch.from_numpy(s.culprit.astype(np.float32))
        out["log_ids"][i, :m] = torch.from_numpy(s.log_ids)
        out["log_features"][i, :m] = torch.from_numpy(s.log_features)
        out["log_mask"][i, :m] = True
    return out


def _pad_rows(out: dict[str, torch.Tensor], key: str, rows: list[tuple[Any, Any]], nf: int) -> None:
    """``KEY_ids``, ``KEY_features``, ``KEY_mask``: per-sample summary rows padded to the longest (at
    least one all-masked row, so that the model's pools always have an input)."""
    b = len(rows)
    k = max(1, max((len(i) for i, _ in rows if i is not None), default=0))
    out[f"{key}_ids"] = torch.zeros(b, k, dtype=torch.long)
    out[f"{key}_features"] = torch.zeros(b, k, nf)
    out[f"{key}_mask"] = torch.zeros(b, k, dtype=torch.bool)
    for r, (i, f) in enumerate(rows):
        if i is not None and len(i):
            out[f"{key}_ids"][r, : len(i)] = torch.from_numpy(np.asarray(i, np.int64))
            out[f"{key}_features"][r, : len(i)] = torch.from_numpy(np.asarray(f, np.float32))
            out[f"{key}_mask"][r, : len(i)] = True


def batches(
    samples: Sequence[Sample], batch_size: int, *, shuffle: bool, seed: int = 0, bucket: int = 32
) -> Iterator[list[Sample]]:
    """Length-bucketed batches: shuffle (seeded), sort chunks of ``bucket`` batches by length, shuffle
    the batches. Without ``shuffle``: the split order, in plain consecutive batches."""
    idx = np.arange(len(samples))
    if not shuffle:
        for k in range(0, len(idx), batch_size):
            yield [samples[j] for j in idx[k : k + batch_size]]
        return
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(samples))
    chunk = batch_size * bucket
    groups: list[np.ndarray] = []
    for k in range(0, len(idx), chunk):
        c = idx[k : k + chunk]
        c = c[np.argsort([len(samples[j].trace_ids) + len(samples[j].log_ids) for j in c], kind="stable")]
        groups.extend(c[m : m + batch_size] for m in range(0, len(c), batch_size))
    for g in rng.permutation(len(groups)):
        yield [samples[j] for j in groups[g]]
