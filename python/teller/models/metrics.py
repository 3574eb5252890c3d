"""Evaluation metrics for root-cause analysis.

Candidates are (category, location) pairs. A location is a *trace token type* (a TPE token id, i.e. a
recurring cross-layer call-chain fragment) in the sample; its score is the highest localization score
of its occurrences. For a normal sample the one correct candidate is ``(normal, -)``; for a faulty one
any ``(true fault, a location with at least one culprit token)``. Candidate scores are
``p(category) * q(location)`` with ``q`` the localization scores normalized to sum 1 over the
sample's locations (the ``normal`` candidate has no location: its score is ``p(normal)``).
AC@k = share of samples whose first correct candidate ranks within k; Avg@5 = mean of AC@1..AC@5.
Localization top-k (faulty samples with at least one culprit token): one of the k highest-scoring
trace tokens is a culprit. Symbol localization top-k (a model with a summary-row head; faulty samples
with a culprit row): one of the k summary rows (symbols) that head scores highest holds a culprit event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass
class Prediction:
    label: int
    probs: np.ndarray  # [C] category probabilities
    token_ids: np.ndarray  # [T] trace token ids
    # [T] localization scores (any monotone scale; higher = more likely culprit); None for a model
    # without localization (every location equally likely; no loc top-k)
    loc_scores: np.ndarray | None
    culprit: np.ndarray  # [T] bool ground truth
    # [T, C] per-cause localization scores (model.loc_per_class): candidate (c, l) scores
    # p(c) * q(l | c); ``loc_scores`` is then the predicted cause's column
    loc_by_class: np.ndarray | None = None
    severity: float = float("nan")  # the injected fault's severity, when known (per_severity)
    effect_events: int = -1  # what the fault did, when known (per_effect): annotation effect.events
    effect_share: float = float("nan")  # ... and effect.share
    sample_id: str = ""  # the sample's id in its dataset (the per-sample records of an evaluation)
    # [S] the summary-row head's score per summary row (one row per symbol; model.summary_loc), None
    # without that head; [S] bool: the row's symbol holds a culprit event. What `teller diagnose`
    # ranks its culprit operators by (symbol_top1 / symbol_top3)
    symbol_scores: np.ndarray | None = None
    symbol_culprit: np.ndarray | None = None


def _location_dist(ids: np.ndarray, inv: np.ndarray, n_locs: int, scores: np.ndarray) -> np.ndarray:
    """q over a sample's locations: softmax of each location's highest token score."""
    best = np.full(n_locs, -np.inf)
    np.maximum.at(best, inv, np.asarray(scores, dtype=np.float64))
    q = np.exp(best - best.max())
    return q / q.sum()


def candidate_rank(p: Prediction, normal_index: int = 0) -> int:
    """1-based rank of the best correct (category, location) candidate; a wrong candidate scoring
    the same counts ahead of it (ties are not the model's to win: a rule scorer's equal scores read
    as hits otherwise). A sample without trace tokens has one location-less candidate per fault."""
    probs = np.asarray(p.probs, dtype=np.float64)
    ids = np.asarray(p.token_ids)
    by = p.loc_by_class
    if len(ids):
        locs, inv = np.unique(ids, return_inverse=True)
        ls = np.zeros(len(ids)) if p.loc_scores is None else p.loc_scores
        q_shared = _location_dist(ids, inv, len(locs), ls) if by is None else None
        good = np.zeros(len(locs), bool)
        np.logical_or.at(good, inv, np.asarray(p.culprit, bool))
    else:  # (nothing to localize: the category alone, as (c, -))
        q_shared = np.ones(1)
        good = np.ones(1, bool)
    if p.label != normal_index and not good.any():
        good[:] = True  # no culprit token in the window: any location counts, only the category matters
    scores: list[float] = []
    correct: list[bool] = []
    for c, pc in enumerate(probs):
        if c == normal_index:
            scores.append(pc)
            correct.append(p.label == normal_index)
        else:
            if q_shared is not None:
                q = q_shared
            else:
                q = _location_dist(ids, inv, len(locs), by[:, c]) if len(ids) else np.zeros(0)
            scores.extend((pc * q).tolist())
            correct.extend((good & (c == p.label)).tolist())
    sc = np.asarray(scores)
    ok = np.asarray(correct, bool)
    if not ok.any():
        return len(sc) + 1  # (a label outside the classes)
    best_correct = sc[ok].max()
    return int((sc[~ok] >= best_correct).sum()) + 1


def ac_at_k(ranks: Sequence[int], k: int) -> float:
    r = np.asarray(ranks)
    return float((r <= k).mean()) if len(r) else 0.0


def avg_at_k(ranks: Sequence[int], k: int = 5) -> float:
    return float(np.mean([ac_at_k(ranks, j) for j in range(1, k + 1)])) if len(ranks) else 0.0


def confusion(y_true: Sequence[int], y_pred: Sequence[int], n: int) -> np.ndarray:
    m = np.zeros((n, n), dtype=np.int64)
    for t, p in zip(y_true, y_pred, strict=True):
        m[t, p] += 1
    return m


def per_class(y_true: Sequence[int], y_pred: Sequence[int], n: int) -> list[dict[str, Any]]:
    """Precision, recall, F1 and support per class; a class neither in ``y_true`` nor predicted has
    None for the three (nothing was asked of it: not an F1 of 0, as macro-F1 leaves it out too)."""
    m = confusion(y_true, y_pred, n)
    out: list[dict[str, Any]] = []
    for c in range(n):
        if not m[c].sum() and not m[:, c].sum():
            out.append({"precision": None, "recall": None, "f1": None, "support": 0})
            continue
        tp = m[c, c]
        prec = tp / m[:, c].sum() if m[:, c].sum() else 0.0
        rec = tp / m[c].sum() if m[c].sum() else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        out.append(
            {"precision": float(prec), "recall": float(rec), "f1": float(f1), "support": int(m[c].sum())}
        )
    return out


def macro_f1(y_true: Sequence[int], y_pred: Sequence[int], n: int) -> float:
    """Macro-F1 over the classes present in ``y_true`` or ``y_pred``."""
    pc = per_class(y_true, y_pred, n)
    present = set(y_true) | set(y_pred)
    vals = [pc[c]["f1"] for c in sorted(present)]
    return float(np.mean(vals)) if vals else 0.0


def loc_top_k(loc_scores: np.ndarray | None, culprit: np.ndarray, k: int) -> bool | None:
    """One of the k highest-scoring tokens is a culprit; None when the sample has no culprit token
    or the model no localization."""
    c = np.asarray(culprit, bool)
    if loc_scores is None or not c.any():
        return None
    top = np.argsort(-np.asarray(loc_scores, dtype=np.float64), kind="stable")[:k]
    return bool(c[top].any())


def detection(y_true: Sequence[int], y_pred: Sequence[int], normal_index: int = 0) -> dict[str, float | None]:
    """Precision/recall of "faulty" (positive) vs normal; None where undefined (no sample called
    faulty, no faulty sample), not 0.0, which reads as "every call was wrong"."""
    t = np.asarray(y_true) != normal_index
    p = np.asarray(y_pred) != normal_index
    tp = int((t & p).sum())
    prec = tp / int(p.sum()) if p.sum() else None
    rec = tp / int(t.sum()) if t.sum() else None
    return {"detection_precision": prec, "detection_recall": rec}


SEVERITY_BINS = ((0.0, 0.3), (0.3, 0.6), (0.6, 1.01))


def per_severity(
    preds: Sequence[Prediction], ranks: Sequence[int], normal_index: int = 0
) -> dict[str, dict[str, float]]:
    """Faulty samples of known severity by severity range: ``n``, category accuracy, AC@1 (a
    benchmark whose mild faults sit inside normal variance should be read range by range)."""
    out: dict[str, dict[str, float]] = {}
    for (lo, hi), key in zip(SEVERITY_BINS, severity_bin_names(), strict=True):
        sel = [
            i
            for i, p in enumerate(preds)
            if p.label != normal_index and np.isfinite(p.severity) and lo <= p.severity < hi
        ]
        if not sel:
            continue
        out[key] = {
            "n": len(sel),
            "category_accuracy": float(
                np.mean([int(np.argmax(preds[i].probs)) == preds[i].label for i in sel])
            ),
            "ac@1": float(np.mean([ranks[i] == 1 for i in sel])),
        }
    return out


# effect.share ranges (the time a fault added over the capture's fault-free work of its kind)
EFFECT_BINS = ((0.0, 0.01), (0.01, 0.05), (0.05, 0.2), (0.2, float("inf")))


def effect_bin_names() -> list[str]:
    """The rows of :func:`per_effect`, in order."""
    shares = [f"share {lo:g}-{hi:g}" if np.isfinite(hi) else f"share >= {lo:g}" for lo, hi in EFFECT_BINS]
    return ["none", *shares, "no share"]


def severity_bin_names() -> list[str]:
    """The rows of :func:`per_severity`, in order."""
    return [f"{lo:.1f}-{min(hi, 1.0):.1f}" for lo, hi in SEVERITY_BINS]


def per_effect(
    preds: Sequence[Prediction], ranks: Sequence[int], normal_index: int = 0
) -> dict[str, dict[str, float]]:
    """Faulty samples by what their fault actually did (simulated data records it): ``none`` (the
    fault touched no event: nothing in the trace or the log can show it), then by ``effect.share``
    range, and ``no share`` (faults counted in events, not time: a network delay, KV-cache
    exhaustion, eager mode, OOM). ``n``, category accuracy, AC@1 per row. A fault with no effect is
    a label no input can support; this table shows how much of the error is that."""
    names = effect_bin_names()[1:-1]
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(preds):
        if p.label == normal_index or p.effect_events < 0:
            continue
        if p.effect_events == 0:
            key = "none"
        elif not np.isfinite(p.effect_share):
            key = "no share"
        else:  # (a share below 0 cannot happen; it would count in the first range. The shards
            # hold float32: a share of exactly 0.01 reads 0.0099999998 and counts below the edge)
            key = next(
                (n for n, (_, hi) in zip(names, EFFECT_BINS, strict=True) if p.effect_share < hi), names[-1]
            )
        groups.setdefault(key, []).append(i)
    order = effect_bin_names()
    return {
        k: {
            "n": len(groups[k]),
            "category_accuracy": float(
                np.mean([int(np.argmax(preds[i].probs)) == preds[i].label for i in groups[k]])
            ),
            "ac@1": float(np.mean([ranks[i] == 1 for i in groups[k]])),
        }
        for k in order
        if k in groups
    }


def ac_with_effect(preds: Sequence[Prediction], ranks: Sequence[int], normal_index: int = 0) -> float | None:
    """AC@1 without the faulty samples whose fault did nothing (``effect.events`` 0; simulated data).
    ``None`` where no faulty sample's effect is known (a real run: its normal samples' "no fault"
    says nothing about the faults), or where no sample is left."""
    if not any(p.label != normal_index and p.effect_events >= 0 for p in preds):
        return None
    kept = [r for r, p in zip(ranks, preds, strict=True) if p.label == normal_index or p.effect_events != 0]
    return ac_at_k(kept, 1) if kept else None


# -- calibration: how far the category probabilities are from the frequencies they claim ----------
ECE_BINS = 15  # equal-width confidence bins (Guo et al. 2017 use 15)
_P_FLOOR = 1e-12  # (a probability of exactly 0 on the true class scores -ln 1e-12 = 27.6, not inf)


def _probs_labels(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise ValueError(f"need probabilities [n, C] and n labels, got {p.shape} and {y.shape}")
    if len(y) and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"a label outside 0..{p.shape[1] - 1}")
    return p, y


def nll(probs: Any, labels: Any) -> float:
    """Mean negative log-likelihood of the true class (natural log; 0 for no samples)."""
    p, y = _probs_labels(probs, labels)
    if not len(y):
        return 0.0
    return float(-np.log(np.maximum(p[np.arange(len(y)), y], _P_FLOOR)).mean())


def ece(probs: Any, labels: Any, bins: int = ECE_BINS) -> float:
    """Expected calibration error of the top class: samples binned by their top probability into
    ``bins`` equal-width bins over (0, 1]; the mean over bins, weighted by their share of samples, of
    |accuracy - mean confidence|. 0 for no samples."""
    p, y = _probs_labels(probs, labels)
    if not len(y):
        return 0.0
    conf = p.max(1)
    hit = p.argmax(1) == y
    # bin b holds confidences in (b/bins, (b+1)/bins]; a confidence of 0 (all-zero rows) joins bin 0
    b = np.clip(np.ceil(conf * bins).astype(np.int64) - 1, 0, bins - 1)
    gap = np.abs(np.bincount(b, hit, minlength=bins) - np.bincount(b, conf, minlength=bins))
    return float(gap.sum() / len(y))


def brier(probs: Any, labels: Any) -> float:
    """Mean over samples of the squared distance between the probabilities and the one-hot label
    (0 .. 2; 0 for no samples)."""
    p, y = _probs_labels(probs, labels)
    if not len(y):
        return 0.0
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    return float(((p - onehot) ** 2).sum(1).mean())


def log_softmax(logits: Any, temperature: float = 1.0) -> np.ndarray:
    """log softmax(logits / temperature) over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# the range a fitted temperature is searched in: below 1 sharpens, above 1 softens
TEMPERATURE_RANGE = (0.05, 20.0)


def fit_temperature(logits: Any, labels: Any) -> float:
    """The temperature T that minimizes the NLL of softmax(logits / T) on (held-out) samples: post-hoc
    temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", 2017). It leaves
    each sample's ranking of the categories as it is and makes the top probability mean what it
    says. The NLL is convex in 1/T, so a golden-section search over ln(1/T) finds the one minimum
    (deterministic; 1.0 for no samples). Where the NLL keeps falling toward an end of
    :data:`TEMPERATURE_RANGE` the result is at or near that end: every sample right gives a small T
    somewhere on the plateau where float rounding makes the loss 0, constant logits a flat loss
    and T = 20. :func:`teller.models.train.fit_calibration` does not use such a fit."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    _probs_labels(z, y)  # (shapes and labels checked)
    if not len(y):
        return 1.0
    rows = np.arange(len(y))

    def loss(u: float) -> float:  # u = ln(1/T)
        return float(-log_softmax(z, float(np.exp(-u)))[rows, y].mean())

    lo, hi = -np.log(TEMPERATURE_RANGE[1]), -np.log(TEMPERATURE_RANGE[0])
    g = (np.sqrt(5.0) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(80):  # the bracket shrinks by 0.618 a step: 80 steps reach float precision
        if fc <= fd:  # (ties keep the lower 1/T: the softer of two equal fits)
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    u = (a + b) / 2
    # the ends themselves, where the minimum lies beyond the range (golden section stops inside it)
    best = min(((loss(v), v) for v in (lo, u, hi)), key=lambda t: t[0])[1]
    return float(np.exp(-best))


# confidence levels of the selective table: the share of samples whose top category probability
# reaches each, and how often those answers are right
SELECTIVE_LEVELS = (0.5, 0.7, 0.9)


def selective(
    preds: Sequence[Prediction], ranks: Sequence[int], levels: Sequence[float] = SELECTIVE_LEVELS
) -> dict[str, dict[str, float | None]]:
    """Answers by confidence: for each level, the samples whose top category probability is at
    least that (``coverage``: their share, ``n``), their AC@1 and category accuracy (None where no
    sample reaches it). With calibrated probabilities (``teller train`` fits a temperature) this is
    what an operator reads a diagnosis's confidence by: how often an answer that sure is right,
    and how many answers are that sure."""
    conf = np.asarray([float(np.max(p.probs)) for p in preds])
    hit = np.asarray([int(np.argmax(p.probs)) == p.label for p in preds])
    r1 = np.asarray(ranks) == 1
    out: dict[str, dict[str, float | None]] = {}
    for lv in levels:
        m = conf >= lv
        k = int(m.sum())
        out[f"{lv:g}"] = {
            "n": k,
            "coverage": k / len(preds) if len(preds) else 0.0,
            "ac@1": float(r1[m].mean()) if k else None,
            "category_accuracy": float(hit[m].mean()) if k else None,
        }
    return out


def compute_metrics(preds: Sequence[Prediction], label_names: Sequence[str]) -> dict[str, object]:
    """Every metric of ``teller evaluate`` over a list of predictions."""
    n = len(label_names)
    normal = list(label_names).index("normal") if "normal" in label_names else 0
    y = [p.label for p in preds]
    yp = [int(np.argmax(p.probs)) for p in preds]
    ranks = [candidate_rank(p, normal) for p in preds]
    l1 = [loc_top_k(p.loc_scores, p.culprit, 1) for p in preds if p.label != normal]
    l3 = [loc_top_k(p.loc_scores, p.culprit, 3) for p in preds if p.label != normal]
    l1v = [v for v in l1 if v is not None]
    l3v = [v for v in l3 if v is not None]
    # the same over the summary rows (symbols), for a model with a summary-row head
    faulty_rows = [
        (p.symbol_scores, p.symbol_culprit)
        for p in preds
        if p.label != normal and p.symbol_scores is not None and p.symbol_culprit is not None
    ]
    s1v = [v for v in (loc_top_k(sc, c, 1) for sc, c in faulty_rows) if v is not None]
    s3v = [v for v in (loc_top_k(sc, c, 3) for sc, c in faulty_rows) if v is not None]
    pc = per_class(y, yp, n)
    P = np.stack([np.asarray(p.probs, dtype=np.float64) for p in preds]) if preds else np.zeros((0, n))
    out: dict[str, object] = {
        "n": len(preds),
        "category_accuracy": float(np.mean(np.asarray(y) == np.asarray(yp))) if preds else 0.0,
        "macro_f1": macro_f1(y, yp, n),
        "ac@1": ac_at_k(ranks, 1),
        "ac@3": ac_at_k(ranks, 3),
        "ac@5": ac_at_k(ranks, 5),
        "avg@5": avg_at_k(ranks, 5),
        "loc_top1": float(np.mean(l1v)) if l1v else None,
        "loc_top3": float(np.mean(l3v)) if l3v else None,
        "loc_n": len(l1v),
        "symbol_top1": float(np.mean(s1v)) if s1v else None,
        "symbol_top3": float(np.mean(s3v)) if s3v else None,
        "symbol_n": len(s1v),
        **detection(y, yp, normal),
        "per_class": {label_names[c]: pc[c] for c in range(n)},
        "per_severity": per_severity(preds, ranks, normal),
        "per_effect": per_effect(preds, ranks, normal),
        "ac@1_with_effect": ac_with_effect(preds, ranks, normal),
        # calibration of the category probabilities (`teller train` fits a temperature on val)
        "nll": nll(P, y) if preds else None,
        "ece": ece(P, y) if preds else None,
        "brier": brier(P, y) if preds else None,
        "selective": selective(preds, ranks),
        "confusion": confusion(y, yp, n).tolist(),
        "label_names": list(label_names),
        "samples": sample_records(preds, yp, ranks, label_names),
    }
    return out


def sample_records(
    preds: Sequence[Prediction], yp: Sequence[int], ranks: Sequence[int], label_names: Sequence[str]
) -> list[dict[str, Any]]:
    """One record per sample: ``id``, true ``label``, predicted ``pred`` (its probability ``p``) and
    the ``rank`` of the first correct candidate. Two evaluations on the same split are compared sample
    by sample from these (``teller results summarize``: paired differences)."""
    return [
        {
            "id": p.sample_id,
            "label": label_names[p.label],
            "pred": label_names[k],
            "p": round(float(p.probs[k]), 4),
            "rank": int(r),
        }
        for p, k, r in zip(preds, yp, ranks, strict=True)
    ]


def paired_difference(
    a: np.ndarray, b: np.ndarray, *, resamples: int = 2000, seed: int = 0
) -> dict[str, float | int]:
    """Paired comparison of two models' per-sample scores on the same samples (``a[i]`` and ``b[i]``
    in 0..1: a hit, or the share of a model's runs that got sample i right). ``diff`` = mean(a) -
    mean(b) with a 95 % percentile bootstrap interval over samples (``lo``, ``hi``; seeded), the
    samples where ``a`` is ahead (``better``) and behind (``worse``), and the exact two-sided sign-test
    p-value on those (McNemar's exact test when the scores are single runs' hits)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("paired_difference needs two score vectors of the same length")
    n = len(a)
    d = a - b
    out: dict[str, float | int] = {"n": n, "diff": float(d.mean()) if n else 0.0}
    if n:
        rng = np.random.default_rng(seed)
        step = max(1, 4_000_000 // n)  # resamples per chunk: the index array stays ~32 MB
        boots = np.concatenate(
            [
                d[rng.integers(0, n, size=(min(step, resamples - i), n))].mean(1)
                for i in range(0, resamples, step)
            ]
        )
        out["lo"], out["hi"] = (float(v) for v in np.percentile(boots, [2.5, 97.5]))
    else:
        out["lo"] = out["hi"] = 0.0
    better, worse = int((d > 0).sum()), int((d < 0).sum())
    out["better"], out["worse"] = better, worse
    out["p_sign"] = sign_test(better, worse)
    return out


def sign_test(k: int, m: int) -> float:
    """Exact two-sided binomial p-value of ``k`` successes against ``m`` failures at p = 1/2."""
    from fractions import Fraction

    n = k + m
    if n == 0:
        return 1.0
    tail, c = 0, 1  # exact integers (2**n overflows a float); C(n, i) built up term by term
    for i in range(min(k, m) + 1):
        tail += c
        c = c * (n - i) // (i + 1)
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def metrics_for(
    preds: Sequence[Prediction], data_names: Sequence[str], model_names: Sequence[str]
) -> dict[str, Any]:
    """``compute_metrics`` when the data's labels are the model's classes, else
    :func:`metrics_across_label_sets`."""
    if list(data_names) == list(model_names):
        return compute_metrics(preds, data_names)
    return metrics_across_label_sets(preds, data_names, model_names)


def metrics_across_label_sets(
    preds: Sequence[Prediction], data_names: Sequence[str], model_names: Sequence[str]
) -> dict[str, Any]:
    """``compute_metrics`` for data labelled with other names than the model's classes (the real CPU
    fault runs have ``io_stall`` and ``slow_operator``, which the simulator never produces).

    Samples whose label the model knows are scored as usual (their labels renamed to the model's
    indices). The others have a cause the model cannot name; for them only detection is scored:
    ``unknown_cause`` gives their count per label, the share flagged as faulty (not ``normal``) and
    what the model predicted instead."""
    model_names = list(model_names)
    normal = model_names.index("normal") if "normal" in model_names else 0
    known: list[Prediction] = []
    unknown: dict[str, dict[str, Any]] = {}
    for p in preds:
        name = data_names[p.label]
        if name in model_names:
            known.append(replace(p, label=model_names.index(name)))
            continue
        u = unknown.setdefault(name, {"n": 0, "flagged_faulty": 0, "predicted": {}})
        top = int(np.argmax(p.probs))
        u["n"] += 1
        u["flagged_faulty"] += int(top != normal)
        u["predicted"][model_names[top]] = u["predicted"].get(model_names[top], 0) + 1
    out: dict[str, Any] = (
        dict(compute_metrics(known, model_names)) if known else {"n": 0, "label_names": model_names}
    )
    out["unknown_cause"] = unknown
    out["n_total"] = len(preds)
    return out
