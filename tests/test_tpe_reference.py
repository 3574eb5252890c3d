"""Tests of the pure-Python TPE reference (the oracle of the Rust core).

Runnable without the compiled package: the module is loaded by path, ``teller`` is not imported.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[1] / "python" / "teller" / "_reference" / "tpe.py"
_spec = importlib.util.spec_from_file_location("_teller_reference_tpe", _PATH)
ref = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ref
_spec.loader.exec_module(ref)


@st.composite
def corpora(draw):
    base = draw(st.integers(1, 5))
    segs = draw(st.lists(st.lists(st.integers(0, base - 1), max_size=20), max_size=6))
    return base, segs


def encode_sequential(segment, merges, base_size):
    """Alternative encoder: apply each merge, in rank order, over the whole segment."""
    toks = list(segment)
    for r, pair in enumerate(merges):
        toks = ref.merge_pair(toks, tuple(pair), base_size + r)
    return toks


def test_overlapping_runs():
    merges, counts = ref.train_with_counts([[0, 0, 0, 0]], 1, 10, min_frequency=1)
    assert merges == [(0, 0), (1, 1)]
    assert counts == [3, 1]
    assert ref.encode([0] * 5, merges, 1) == ([2, 0], [0, 4, 5])
    assert ref.merge_pair([0, 0, 0], (0, 0), 1) == [1, 0]


def test_tie_break_smallest_pair_and_min_frequency():
    segs = [[2, 3, 0, 1], [2, 3, 0, 1]]
    assert ref.train(segs, 4, 2, min_frequency=2) == [(0, 1), (2, 3)]
    assert ref.train(segs, 4, 2, min_frequency=3) == []


def test_no_merge_across_segments():
    assert ref.train([[0, 0], [1, 1]], 2, 10, min_frequency=1) == [(0, 0), (1, 1)]


def test_out_of_range():
    with pytest.raises(ValueError):
        ref.train([[0, 3]], 2, 1)
    with pytest.raises(ValueError):
        ref.decode([5], [(0, 1)], 2)


@settings(max_examples=200, deadline=None)
@given(corpora(), st.integers(0, 12), st.integers(0, 3), st.one_of(st.none(), st.integers(0, 5)))
def test_train_encode_properties(corpus, num_merges, min_frequency, max_tok):
    base, segs = corpus
    merges, counts = ref.train_with_counts(segs, base, num_merges, min_frequency, max_tok)
    assert len(merges) <= num_merges
    assert len(set(merges)) == len(merges)
    assert all(c >= max(min_frequency, 1) for c in counts)
    lens = [1] * base
    for a, b in merges:
        assert a < len(lens) and b < len(lens)
        lens.append(lens[a] + lens[b])
    if max_tok is not None:
        assert all(n <= max(max_tok, 1) for n in lens)
    for s in segs:
        toks, offs = ref.encode(s, merges, base)
        assert toks == encode_sequential(s, merges, base)
        assert ref.decode(toks, merges, base) == s
        assert len(offs) == len(toks) + 1 and offs[0] == 0 and offs[-1] == len(s)
        assert [offs[k + 1] - offs[k] for k in range(len(toks))] == [lens[t] for t in toks]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(-10, 10**7), st.integers(0, 10**6)), min_size=1, max_size=30
    ),
    st.data(),
)
def test_features_invariants(events, data):
    ids = [e[0] for e in events]
    dur = [e[1] for e in events]
    start = [e[2] for e in events]
    n = len(ids)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=n)) if n > 1 else []))
    offsets = [0, *cuts, n]
    stats = ref.symbol_stats(ids, dur, 4)
    rows = ref.features(ids, dur, start, offsets, stats)
    assert len(rows) == len(offsets) - 1
    assert rows[0][4] == 0.0
    for k, (cnt, total, mx, mz, gap) in enumerate(rows):
        s, e = offsets[k], offsets[k + 1]
        assert cnt == e - s
        assert mx <= total + 1e-9 and mx >= 0
        assert gap >= 0
        assert math.isfinite(mz)


def test_features_hand_computed():
    ids = [0, 1, 0, 1]
    dur = [1000, 3000, 1000, -5]
    start = [0, 1000, 10_000, 11_000]
    stats = ref.symbol_stats(ids, dur, 3)
    assert stats[0] == [2, 2, 0]
    rows = ref.features(ids, dur, start, [0, 2, 4], stats)
    l2, l4 = math.log(2), math.log(4)
    assert rows[0][:3] == pytest.approx([2, l2 + l4, l4])
    assert rows[0][3] == pytest.approx(1.0)  # symbol 1: x in {ln4, 0}: mean ln2, std ln2
    assert rows[1][4] == pytest.approx(math.log(7))  # 10000 - max(1000, 4000) ns = 6 us
