"""Metric functions against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
from teller.models.metrics import (
    Prediction,
    ac_at_k,
    avg_at_k,
    candidate_rank,
    compute_metrics,
    detection,
    loc_top_k,
    macro_f1,
    per_class,
)


def test_ac_and_avg_at_k() -> None:
    ranks = [1, 2, 3, 6]
    assert ac_at_k(ranks, 1) == 0.25
    assert ac_at_k(ranks, 3) == 0.75
    assert ac_at_k(ranks, 5) == 0.75
    assert avg_at_k(ranks, 5) == pytest.approx((0.25 + 0.5 + 0.75 + 0.75 + 0.75) / 5)


def test_macro_f1_hand_computed() -> None:
    # class 0: tp 1, fp 1, fn 1 -> p 0.5 r 0.5 f1 0.5; class 1: tp 1, fp 1, fn 1 -> 0.5; class 2: 1.0
    y = [0, 0, 1, 1, 2]
    p = [0, 1, 1, 0, 2]
    assert macro_f1(y, p, 3) == pytest.approx((0.5 + 0.5 + 1.0) / 3)


def test_a_class_absent_from_a_split_has_no_f1_rather_than_zero() -> None:
    """Neither in the labels nor predicted: None (the per-fault table said 0.000, a failure, while
    macro-F1 rightly left it out); predicted but absent, or present but never predicted: 0."""
    pc = per_class([0, 1, 1], [0, 1, 1], 4)
    assert pc[2] == {"precision": None, "recall": None, "f1": None, "support": 0}
    assert macro_f1([0, 1, 1], [0, 1, 1], 4) == 1.0
    pc = per_class([0, 1], [3, 1], 4)
    assert pc[3]["f1"] == 0.0 and pc[0]["f1"] == 0.0 and pc[0]["support"] == 1


def test_detection() -> None:
    d = detection([0, 1, 2, 0], [1, 1, 0, 0])
    assert d["detection_precision"] == 0.5  # predicted faulty: samples 0 (wrong) and 1 (right)
    assert d["detection_recall"] == 0.5  # faulty: samples 1 (found) and 2 (missed)
    # nothing called faulty / nothing faulty: undefined, not 0.0 ("every call was wrong")
    assert detection([1, 2], [0, 0]) == {"detection_precision": None, "detection_recall": 0.0}
    assert detection([0, 0], [1, 0]) == {"detection_precision": 0.0, "detection_recall": None}


def test_loc_top_k() -> None:
    assert loc_top_k(np.array([0.1, 0.9, 0.3]), np.array([0, 1, 0], bool), 1) is True
    assert loc_top_k(np.array([0.9, 0.1, 0.3]), np.array([0, 1, 0], bool), 1) is False
    assert loc_top_k(np.array([0.9, 0.1, 0.3]), np.array([0, 1, 0], bool), 3) is True
    assert loc_top_k(np.array([0.9]), np.array([False]), 1) is None


def test_candidate_rank_hand_computed() -> None:
    # classes: normal, A, B. Locations: token types 7 (culprit) and 9.
    ids = np.array([7, 9, 9])
    culprit = np.array([True, False, False])
    loc = np.log(np.array([1.0, 3.0, 2.0]))  # q(7) = 1/4, q(9) = 3/4 after max-pooling + softmax
    probs = np.array([0.1, 0.6, 0.3])
    p = Prediction(label=1, probs=probs, token_ids=ids, loc_scores=loc, culprit=culprit)
    # candidates: normal 0.1, (A,7) 0.15, (A,9) 0.45, (B,7) 0.075, (B,9) 0.225 -> correct (A,7) ranks 3rd
    assert candidate_rank(p) == 3
    pn = Prediction(label=0, probs=probs, token_ids=ids, loc_scores=loc, culprit=np.zeros(3, bool))
    assert candidate_rank(pn) == 4  # normal 0.1 is below 0.45, 0.225 and 0.15
    # a faulty sample without any culprit token: any location of the right category counts
    pf = Prediction(label=2, probs=probs, token_ids=ids, loc_scores=loc, culprit=np.zeros(3, bool))
    assert candidate_rank(pf) == 2  # (B,9) 0.225 is below (A,9) 0.45 only


def test_candidate_rank_counts_ties_against_the_correct_candidate() -> None:
    """Equal scores are not the model's to win (a rule scorer's flat probabilities read as AC@1 hits
    where argmax picked another class); a sample without trace tokens still has its category."""
    none = np.zeros(0, np.int64)
    tie = Prediction(
        label=2,
        probs=np.array([0.1, 0.45, 0.45]),
        token_ids=np.array([5]),
        loc_scores=np.zeros(1),
        culprit=np.array([True]),
    )
    assert candidate_rank(tie) == 2
    flat = Prediction(
        label=5,
        probs=np.array([0.5] + [0.1] * 5),
        token_ids=np.array([5]),
        loc_scores=np.zeros(1),
        culprit=np.array([True]),
    )
    assert candidate_rank(flat) == 6  # (the normal candidate and four equal wrong ones ahead)
    # no trace tokens: one (c, -) candidate per fault, ranked by the category alone
    says_normal = Prediction(
        label=1,
        probs=np.array([0.99, 0.005, 0.005]),
        token_ids=none,
        loc_scores=np.zeros(0),
        culprit=np.zeros(0, bool),
    )
    assert candidate_rank(says_normal) == 3
    right = Prediction(
        label=1,
        probs=np.array([0.005, 0.99, 0.005]),
        token_ids=none,
        loc_scores=None,
        culprit=np.zeros(0, bool),
    )
    assert candidate_rank(right) == 1
    assert (
        candidate_rank(
            Prediction(
                label=0,
                probs=np.array([0.9, 0.1]),
                token_ids=none,
                loc_scores=None,
                culprit=np.zeros(0, bool),
            )
        )
        == 1
    )


def test_compute_metrics_keys() -> None:
    preds = [
        Prediction(0, np.array([0.9, 0.1]), np.array([1]), np.array([0.0]), np.array([False])),
        Prediction(1, np.array([0.2, 0.8]), np.array([1, 2]), np.array([0.0, 1.0]), np.array([False, True])),
    ]
    m = compute_metrics(preds, ["normal", "a"])
    for k in ("ac@1", "ac@3", "ac@5", "avg@5", "category_accuracy", "macro_f1", "loc_top1", "loc_top3", "n"):
        assert k in m
    assert m["ac@1"] == 1.0 and m["category_accuracy"] == 1.0 and m["loc_top1"] == 1.0 and m["n"] == 2
    # no summary-row head: no symbol-level localization (None, not 0.0)
    assert m["symbol_top1"] is None and m["symbol_top3"] is None and m["symbol_n"] == 0


def test_symbol_top_k_hand_computed() -> None:
    """symbol_top1 / symbol_top3: over faulty samples with a culprit row, whether the summary-row
    head's first (first three) rows hold one; normal samples and samples without a culprit row are
    left out (symbol_n); carried through metrics_across_label_sets."""
    from teller.models.metrics import metrics_across_label_sets

    def pred(label: int, scores: list[float], culprit: list[bool]) -> Prediction:
        return Prediction(
            label,
            np.array([0.1, 0.9]) if label else np.array([0.9, 0.1]),
            np.array([1]),
            np.array([0.0]),
            np.array([False]),
            symbol_scores=np.array(scores),
            symbol_culprit=np.array(culprit),
        )

    preds = [
        pred(1, [0.9, 0.2, 0.1, 0.05], [True, False, False, False]),  # first: top-1 and top-3
        pred(1, [0.9, 0.8, 0.7, 0.6], [False, False, True, False]),  # third: top-3 only
        pred(1, [0.9, 0.8, 0.7, 0.6], [False, False, False, True]),  # fourth: neither
        pred(1, [0.9, 0.8], [False, False]),  # no culprit row: left out
        pred(0, [0.9, 0.1], [True, False]),  # normal: left out
    ]
    m = compute_metrics(preds, ["normal", "a"])
    assert m["symbol_n"] == 3 and m["symbol_top1"] == 1 / 3 and m["symbol_top3"] == 2 / 3
    across = metrics_across_label_sets(preds, ["normal", "a"], ["a", "normal"])  # (the model's order)
    assert across["symbol_n"] == 3 and across["symbol_top3"] == 2 / 3


def test_metrics_across_label_sets() -> None:
    from teller.models.metrics import metrics_across_label_sets

    model = ["normal", "cpu_contention", "gpu_throttle"]
    data = ["normal", "cpu_contention", "io_stall", "slow_operator"]

    def pred(label: int, top: int) -> Prediction:
        probs = np.full(3, 0.1)
        probs[top] = 0.8
        return Prediction(label, probs, np.array([1, 2]), np.array([0.0, 1.0]), np.array([False, True]))

    preds = [pred(0, 0), pred(1, 1), pred(1, 0), pred(2, 1), pred(2, 0), pred(3, 2)]
    m = metrics_across_label_sets(preds, data, model)
    assert m["n"] == 3 and m["n_total"] == 6
    assert m["category_accuracy"] == pytest.approx(2 / 3)
    assert m["unknown_cause"] == {
        "io_stall": {"n": 2, "flagged_faulty": 1, "predicted": {"cpu_contention": 1, "normal": 1}},
        "slow_operator": {"n": 1, "flagged_faulty": 1, "predicted": {"gpu_throttle": 1}},
    }


def test_candidate_rank_per_class_localization():
    # locations: token types 5 and 6 (the culprit); classes normal, A, B; label A
    probs = np.array([0.1, 0.5, 0.4])
    ids = np.array([5, 6])
    culprit = np.array([False, True])
    by = np.array([[0.0, 0.0, 3.0], [0.0, 2.0, 0.0]])  # [T, C]: A points at 6, B at 5
    p = Prediction(label=1, probs=probs, token_ids=ids, loc_scores=by[:, 1], culprit=culprit, loc_by_class=by)
    # (A, 6) = 0.5 * e^2 / (1 + e^2) = 0.440 beats (B, 5) = 0.4 * e^3 / (1 + e^3) = 0.381 and normal 0.1
    assert candidate_rank(p) == 1
    # one shared score (B's column) for every cause: (A, 6) = 0.5 * 1 / (1 + e^3) = 0.024 comes after
    # (A, 5) = 0.476, (B, 5) = 0.381 and normal 0.1
    shared = Prediction(label=1, probs=probs, token_ids=ids, loc_scores=by[:, 2], culprit=culprit)
    assert candidate_rank(shared) == 4


def test_per_effect_hand_computed():
    from teller.models.metrics import per_effect

    def pred(label, guess, events, share):
        probs = np.full(3, 0.1)
        probs[guess] = 0.8
        return Prediction(
            label,
            probs,
            np.array([4]),
            np.zeros(1),
            np.array([True]),
            effect_events=events,
            effect_share=share,
        )

    preds = [
        pred(1, 0, 0, 0.0),  # the fault did nothing, called normal
        pred(1, 1, 5, 0.003),  # tiny effect, right
        pred(1, 0, 5, 0.008),  # tiny effect, called normal
        pred(2, 2, 9, 0.3),  # large, right
        pred(2, 2, 9, float("nan")),  # events but no share
        pred(0, 0, 0, 0.0),  # normal: not in the table, but in ac@1_with_effect
        pred(2, 1, -1, float("nan")),  # unknown (a real run): neither
    ]
    ranks = [candidate_rank(p) for p in preds]
    out = per_effect(preds, ranks)
    assert out == {
        "none": {"n": 1, "category_accuracy": 0.0, "ac@1": 0.0},
        "share 0-0.01": {"n": 2, "category_accuracy": 0.5, "ac@1": 0.5},
        "share >= 0.2": {"n": 1, "category_accuracy": 1.0, "ac@1": 1.0},
        "no share": {"n": 1, "category_accuracy": 1.0, "ac@1": 1.0},
    }
    m = compute_metrics(preds, ["normal", "a", "b"])
    assert m["per_effect"] == out
    # all but the no-effect sample: 4 right of 6
    assert m["ac@1_with_effect"] == pytest.approx(4 / 6)
    assert m["ac@1"] == pytest.approx(4 / 7)
    unknown = [pred(1, 1, -1, float("nan"))]
    assert compute_metrics(unknown, ["normal", "a", "b"])["ac@1_with_effect"] is None
    # a real run: its normal samples have no fault (effect "known", 0 events) but no fault's effect
    # is known: no number, rather than AC@1 again
    real = [pred(0, 0, 0, 0.0), pred(1, 1, -1, float("nan"))]
    assert compute_metrics(real, ["normal", "a", "b"])["ac@1_with_effect"] is None
    nothing = [pred(1, 0, 0, 0.0)]  # every faulty sample did nothing: no sample left
    assert compute_metrics(nothing, ["normal", "a", "b"])["ac@1_with_effect"] is None


def test_per_severity_hand_computed():
    from teller.models.metrics import per_severity

    def pred(label, guess, sev):
        probs = np.full(3, 0.1)
        probs[guess] = 0.8
        return Prediction(label, probs, np.array([4]), np.zeros(1), np.array([True]), severity=sev)

    preds = [
        pred(1, 1, 0.1),  # mild, right
        pred(1, 2, 0.2),  # mild, wrong
        pred(2, 2, 0.7),  # severe, right
        pred(0, 0, 0.0),  # normal: not counted
        pred(2, 2, float("nan")),  # unknown severity: not counted
    ]
    ranks = [candidate_rank(p) for p in preds]
    out = per_severity(preds, ranks)
    assert out == {
        "0.0-0.3": {"n": 2, "category_accuracy": 0.5, "ac@1": 0.5},
        "0.6-1.0": {"n": 1, "category_accuracy": 1.0, "ac@1": 1.0},
    }
    assert compute_metrics(preds, ["normal", "a", "b"])["per_severity"] == out


def test_sample_records_and_paired_difference() -> None:
    from teller.models.metrics import paired_difference, sign_test

    one, zero = np.array([1]), np.array([0.0])
    preds = [
        Prediction(0, np.array([0.9, 0.1]), one, zero, np.array([False]), sample_id="s1"),
        Prediction(1, np.array([0.7, 0.3]), one, zero, np.array([True]), sample_id="s2"),
    ]
    m = compute_metrics(preds, ["normal", "a"])
    assert m["samples"] == [
        {"id": "s1", "label": "normal", "pred": "normal", "p": 0.9, "rank": 1},
        {"id": "s2", "label": "a", "pred": "normal", "p": 0.7, "rank": 2},
    ]
    # sign test: 1 vs 4 discordant -> P(X <= 1) = (1 + 5) / 32, two-sided 12 / 32
    assert sign_test(1, 4) == pytest.approx(12 / 32)
    assert sign_test(4, 1) == pytest.approx(12 / 32)
    assert sign_test(0, 0) == 1.0 and sign_test(3, 3) == 1.0
    assert sign_test(0, 10) == pytest.approx(2 / 1024)
    # large counts stay exact (2 ** n overflows a float past n = 1023): normal approximation as a check
    assert sign_test(600, 500) == pytest.approx(0.0029, abs=0.0005)
    assert sign_test(1500, 1500) == 1.0
    a = np.array([1, 1, 1, 1, 0, 1, 0, 1.0])
    b = np.array([1, 0, 0, 0, 0, 1, 1, 0.5])
    d = paired_difference(a, b)
    assert d["n"] == 8 and d["diff"] == pytest.approx((6 - 3.5) / 8)
    assert (d["better"], d["worse"]) == (4, 1) and d["p_sign"] == pytest.approx(12 / 32)
    assert -1.0 <= d["lo"] < d["diff"] < d["hi"] <= 1.0
    assert paired_difference(a, b) == d  # seeded
    same = paired_difference(a, a)
    assert same["diff"] == same["lo"] == same["hi"] == 0.0 and same["p_sign"] == 1.0
    with pytest.raises(ValueError, match="two score vectors of the same length"):
        paired_difference(a, b[:3])


def test_calibration_metrics_hand_computed() -> None:
    from teller.models.metrics import brier, ece, nll

    p = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.5, 0.5]])
    y = np.array([0, 1, 1, 0])
    # NLL: -(ln .9 + ln .4 + ln .8 + ln .5) / 4
    assert nll(p, y) == pytest.approx(-(np.log(0.9) + np.log(0.4) + np.log(0.8) + np.log(0.5)) / 4)
    # ECE, 15 bins of width 1/15: 0.9 -> bin 13 (hit), 0.6 -> bin 8 (miss), 0.8 -> bin 11 (hit),
    # 0.5 -> bin 7 (argmax 0 on a tie: hit). Each bin one sample: mean |hit - conf| =
    # (0.1 + 0.6 + 0.2 + 0.5) / 4
    assert ece(p, y) == pytest.approx((0.1 + 0.6 + 0.2 + 0.5) / 4)
    # two bins: (0, .5] holds 0.5 (hit), (.5, 1] holds .9 hit, .6 miss, .8 hit: |2 - 2.3| -> 0.3
    assert ece(p, y, bins=2) == pytest.approx((0.5 + 0.3) / 4)
    # Brier: squared distance to the one-hot label, summed over classes, mean over samples
    assert brier(p, y) == pytest.approx((2 * 0.01 + 2 * 0.36 + 2 * 0.04 + 2 * 0.25) / 4)
    # a probability of exactly 0 on the true class: large, not inf
    assert np.isfinite(nll(np.array([[1.0, 0.0]]), np.array([1])))
    assert nll(np.zeros((0, 3)), np.zeros(0, int)) == ece(np.zeros((0, 3)), np.zeros(0, int)) == 0.0
    with pytest.raises(ValueError, match="label outside"):
        nll(p, np.array([0, 1, 2, 0]))
    # compute_metrics reports them
    preds = [
        Prediction(int(t), q, np.array([1]), np.array([0.0]), np.array([t != 0]))
        for q, t in zip(p, y, strict=True)
    ]
    m = compute_metrics(preds, ["normal", "a"])
    assert m["nll"] == pytest.approx(nll(p, y)) and m["ece"] == pytest.approx(ece(p, y))
    assert m["brier"] == pytest.approx(brier(p, y))


def test_fit_temperature_recovers_an_over_confident_model() -> None:
    from teller.models.metrics import TEMPERATURE_RANGE, fit_temperature, log_softmax, nll

    rng = np.random.default_rng(0)
    z = rng.normal(0, 2.0, (4000, 5))
    # labels drawn from softmax(z): z is calibrated; a network that says 3 z is over-confident
    p = np.exp(log_softmax(z))
    y = np.array([rng.choice(5, p=row) for row in p])
    t = fit_temperature(3.0 * z, y)
    assert t == pytest.approx(3.0, rel=0.08)
    # the fitted T is the NLL minimum: either side is worse
    for other in (t * 0.9, t * 1.1):
        assert nll(np.exp(log_softmax(3.0 * z, other)), y) > nll(np.exp(log_softmax(3.0 * z, t)), y)
    # an under-confident one is sharpened (T < 1)
    assert fit_temperature(0.5 * z, y) == pytest.approx(0.5, rel=0.08)
    # every sample right by a wide margin: the NLL falls all the way, T stops at the range's bound
    sure = np.array([[10.0, 0.0], [0.0, 10.0]])
    assert fit_temperature(sure, np.array([0, 1])) == pytest.approx(TEMPERATURE_RANGE[0])
    assert fit_temperature(np.zeros((0, 3)), np.zeros(0, int)) == 1.0
    # constant logits: T does not matter, the loss is flat; the search ends at the soft end
    assert fit_temperature(np.zeros((3, 2)), np.array([0, 1, 0])) == pytest.approx(TEMPERATURE_RANGE[1])


def test_selective_answers_hand_computed() -> None:
    from teller.models.metrics import selective

    # confidences 0.95 (right), 0.8 (wrong), 0.6 (right), 0.4 (wrong category)
    probs = [
        np.array([0.95, 0.03, 0.02]),
        np.array([0.1, 0.8, 0.1]),
        np.array([0.6, 0.3, 0.1]),
        np.array([0.3, 0.4, 0.3]),
    ]
    labels = [0, 0, 0, 0]
    preds = [
        Prediction(t, q, np.array([1]), np.array([0.0]), np.array([False]))
        for q, t in zip(probs, labels, strict=True)
    ]
    ranks = [1, 3, 1, 2]
    s = selective(preds, ranks, levels=(0.5, 0.7, 0.9, 0.99))
    assert s["0.5"] == {
        "n": 3,
        "coverage": 0.75,
        "ac@1": pytest.approx(2 / 3),
        "category_accuracy": pytest.approx(2 / 3),
    }
    assert s["0.7"] == {"n": 2, "coverage": 0.5, "ac@1": 0.5, "category_accuracy": 0.5}
    assert s["0.9"] == {"n": 1, "coverage": 0.25, "ac@1": 1.0, "category_accuracy": 1.0}
    assert s["0.99"] == {"n": 0, "coverage": 0.0, "ac@1": None, "category_accuracy": None}
    assert set(compute_metrics(preds, ["normal", "a", "b"])["selective"]) == {"0.5", "0.7", "0.9"}
    # a confidence exactly at a level is counted at it (>=), the uncertain rule's complement
    at = [Prediction(0, np.array([0.7, 0.2, 0.1]), np.array([1]), np.array([0.0]), np.array([False]))]
    assert selective(at, [1], levels=(0.7,))["0.7"]["n"] == 1


def test_gbdt_proba_one_limits_openmp_with_either_threadpoolctl(monkeypatch):
    """One sample's GBDT probabilities are computed under a one-thread OpenMP limit, with
    threadpoolctl 3's controller or, where it is older, its threadpool_limits."""
    import contextlib
    import sys
    import types
    from types import SimpleNamespace

    import numpy as np
    from teller.models import baselines

    calls = []

    @contextlib.contextmanager
    def limits(limits=None, user_api=None):
        calls.append((limits, user_api))
        yield

    b = SimpleNamespace(gbdt=SimpleNamespace(predict_proba=lambda x: np.array([[0.25, 0.75]])), X=lambda s: s)
    old = types.ModuleType("threadpoolctl")
    old.threadpool_limits = limits  # (no ThreadpoolController: threadpoolctl < 3)
    new = types.ModuleType("threadpoolctl")
    new.ThreadpoolController = lambda: SimpleNamespace(limit=limits)
    for mod in (old, new):
        monkeypatch.setitem(sys.modules, "threadpoolctl", mod)
        monkeypatch.setattr(baselines, "_THREADPOOLS", None)
        assert baselines.gbdt_proba_one(b, object()).tolist() == [0.25, 0.75]
    assert calls == [(1, "openmp"), (1, "openmp")]


def test_diagnose_log_evidence_keeps_a_logged_tracebacks_message_and_exception():
    """vLLM repeats a record's header on each line of a logged traceback; diagnose shows 8 lines of
    evidence, and a rank's OOM record is 9 lines with the OutOfMemoryError last: the frames and the
    ``Traceback`` line are left out, the record's message and its exception line kept."""
    from teller.models.diagnose import _notable

    h = "(EngineCore_DP0 pid=7) ERROR 04-03 01:52:29 [core.py:526] "
    record = [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        '  File "/v/core.py", line 521, in run_engine_core',
        "    engine_core.run_busy_loop()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.",
    ]
    assert [_notable(h + m) for m in record] == [True, False, False, False, True]
    assert _notable("(APIServer pid=3) WARNING 04-03 01:52:29 [x.py:1] slow client")
    assert not _notable("(APIServer pid=3) INFO 04-03 01:52:29 [loggers.py:116] Engine 000: Running: 3 reqs")
