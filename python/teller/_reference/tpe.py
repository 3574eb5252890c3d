"""Reference TPE (Trace Pair Encoding): a BPE-style merge tokenizer over trace-event symbol ids.

This is the test oracle of the Rust core (``teller_core::tpe``), written in the style of tiktoken's
``_educational`` module: recount everything every time, no cleverness. It must not import ``teller``.

Conventions (identical in Rust):

* Base symbols are ``0 .. base_size - 1``; the token created by the merge of rank ``r`` has id
  ``base_size + r``.
* Training counts every adjacent pair of every segment (overlapping occurrences count: ``a a a``
  has two ``(a, a)``), picks the highest count, ties broken by the smallest pair ``(left, right)``,
  stops when the best count is below ``max(min_frequency, 1)``; pairs whose token would cover more
  than ``max_token_events`` base events are not candidates. A merge replaces occurrences left to
  right without overlap. Merges never cross segments.
* Encoding applies merges by rank: repeatedly merge the leftmost occurrence of the lowest-rank pair.
* ``offsets`` has ``len(tokens) + 1`` entries: token ``k`` covers events ``offsets[k]:offsets[k+1]``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

N_FEATURES = 5
STD_FLOOR = 0.1


def merge_pair(seg: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replaces every non-overlapping occurrence of ``pair`` (left to right) by ``new_id``."""
    out: list[int] = []
    i = 0
    while i < len(seg):
        if i + 1 < len(seg) and (seg[i], seg[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(seg[i])
            i += 1
    return out


def train_with_counts(
    segments: Sequence[Sequence[int]],
    base_size: int,
    num_merges: int,
    min_frequency: int = 2,
    max_token_events: int | None = None,
) -> tuple[list[tuple[int, int]], list[int]]:
    """Like :func:`train`, also returning the count of every merge when it was chosen."""
    segs = [list(s) for s in segments]
    for s in segs:
        for x in s:
            if not 0 <= x < base_size:
                raise ValueError(f"symbol id {x} out of range (base_size {base_size})")
    length = [1] * base_size  # base events covered by every token id
    merges: list[tuple[int, int]] = []
    counts_out: list[int] = []
    while len(merges) < num_merges:
        counts: Counter[tuple[int, int]] = Counter()
        for s in segs:
            for pair in zip(s, s[1:], strict=False):
                counts[pair] += 1
        candidates = [
            (c, p)
            for p, c in counts.items()
            if max_token_events is None or length[p[0]] + length[p[1]] <= max_token_events
        ]
        if not candidates:
            break
        count, pair = min(candidates, key=lambda cp: (-cp[0], cp[1]))
        if count < max(min_frequency, 1):
            break
        new_id = base_size + len(merges)
        merges.append(pair)
        counts_out.append(count)
        length.append(length[pair[0]] + length[pair[1]])
        segs = [merge_pair(s, pair, new_id) for s in segs]
    return merges, counts_out


def train(
    segments: Sequence[Sequence[int]],
    base_size: int,
    num_merges: int,
    min_frequency: int = 2,
    max_token_events: int | None = None,
) -> list[tuple[int, int]]:
    """Learns up to ``num_merges`` merges (see the module docstring for the exact rule)."""
    return train_with_counts(segments, base_size, num_merges, min_frequency, max_token_events)[0]


def encode(
    segment: Sequence[int], merges: Sequence[tuple[int, int]], base_size: int
) -> tuple[list[int], list[int]]:
    """Encodes one segment: ``(tokens, offsets)`` with ``len(offsets) == len(tokens) + 1``.

    ``base_size`` is needed to name merged tokens (``base_size + rank``).
    """
    ranks = {tuple(p): r for r, p in enumerate(merges)}
    toks = list(segment)
    lens = [1] * len(toks)
    while len(toks) >= 2:
        best = None  # (rank, position)
        for i in range(len(toks) - 1):
            r = ranks.get((toks[i], toks[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        r, i = best
        toks[i : i + 2] = [base_size + r]
        lens[i : i + 2] = [lens[i] + lens[i + 1]]
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    return toks, offsets


def decode(tokens: Sequence[int], merges: Sequence[tuple[int, int]], base_size: int) -> list[int]:
    """Expands tokens back to base symbol ids (recursively)."""

    def expand(t: int) -> list[int]:
        if t < base_size:
            return [t]
        a, b = merges[t - base_size]
        return expand(a) + expand(b)

    out: list[int] = []
    for t in tokens:
        if not 0 <= t < base_size + len(merges):
            raise ValueError(f"token id {t} out of range")
        out.extend(expand(t))
    return out


def log_dur(dur_ns: int) -> float:
    """``log1p`` of the duration in microseconds (negative durations count as 0)."""
    return math.log1p(max(dur_ns, 0) / 1000.0)


def symbol_stats(
    ids: Sequence[int], dur_ns: Sequence[int], base_size: int
) -> tuple[list[int], list[float], list[float]]:
    """Per-base-symbol ``(count, mean, std)`` of :func:`log_dur` (population std, two passes).

    The Rust core uses one pass of sums and sums of squares in fixed chunks; both agree to ~1e-12.
    """
    count = [0] * base_size
    total = [0.0] * base_size
    for s, d in zip(ids, dur_ns, strict=True):
        count[s] += 1
        total[s] += log_dur(d)
    mean = [total[s] / count[s] if count[s] else 0.0 for s in range(base_size)]
    sq = [0.0] * base_size
    for s, d in zip(ids, dur_ns, strict=True):
        sq[s] += (log_dur(d) - mean[s]) ** 2
    std = [math.sqrt(sq[s] / count[s]) if count[s] else 0.0 for s in range(base_size)]
    return count, mean, std


def features(
    segment: Sequence[int],
    dur_ns: Sequence[int],
    start_ns: Sequence[int],
    offsets: Sequence[int],
    stats: tuple[Sequence[int], Sequence[float], Sequence[float]],
) -> list[list[float]]:
    """Timing features of the tokens of one segment (``offsets`` relative to the segment).

    Per token covering events ``s:e``, with ``x = log_dur(dur)``:
    ``[count, sum x, max x, max z, log_gap]`` where ``z = (x - mean[sym]) / max(std[sym], STD_FLOOR)``
    (0 for a symbol with count 0) and ``log_gap = log1p(max(0, start[s] - anchor) / 1000)`` where
    ``anchor`` is the end of the previous event ``s - 1`` if it ended by ``start[s]``, else its start
    (it encloses the token); 0 for the first token.
    """
    count, mean, std = stats

    def z(sym: int, x: float) -> float:
        return 0.0 if count[sym] == 0 else (x - mean[sym]) / max(std[sym], STD_FLOOR)

    rows = []
    for k in range(len(offsets) - 1):
        s, e = offsets[k], offsets[k + 1]
        xs = [log_dur(dur_ns[j]) for j in range(s, e)]
        total = 0.0
        for x in xs:
            total += x
        if k == 0:
            gap = 0.0
        else:
            p = s - 1
            prev_end = start_ns[p] + max(dur_ns[p], 0)
            anchor = prev_end if prev_end <= start_ns[s] else start_ns[p]
            gap = math.log1p(max(0, start_ns[s] - anchor) / 1000.0)
        rows.append(
            [
                float(e - s),
                total,
                max(xs),
                max(z(segment[j], x) for j, x in zip(range(s, e), xs, strict=True)),
                gap,
            ]
        )
    return rows
