"""TPE, Trace Pair Encoding: BPE-style merges over trace-event symbols, with timing features per token.

>>> import teller
>>> tok = teller.tpe.train(["run1/", "run2/trace.json.gz"], vocab_size=4000)   # doctest: +SKIP
>>> enc = tok.encode(teller.trace.load("run3/"))                               # doctest: +SKIP
>>> enc.ids, enc.offsets, enc.features.shape                                   # doctest: +SKIP
>>> tok.decode(enc.ids)[:3]                                                    # doctest: +SKIP
['annotation:execute_model', 'annotation:attention', 'runtime:cudaLaunchKernel']

Base alphabet: the specials, one unknown symbol per layer (``kernel:[UNK]``...), the close symbol
``<close>``, and every normalized symbol (``layer:canonical-name``) seen at least ``min_symbol_count``
times, ordered by frequency then name. A trace becomes one sequence per step in call-chain order
(see ``teller_core::sequence``); merges never cross steps. The heavy lifting (training, encoding,
features) is Rust (``teller._native``) with the GIL released; ``teller._reference.tpe`` is the
pure-Python oracle the tests compare against.
"""

from __future__ import annotations

import errno
import json
import math
import operator
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from teller import __version__, _native
from teller._io import make_output_dir, write_atomic
from teller.errors import ConfigError, TellerFileNotFoundError, TellerIOError, TellerWarning, TokenizerError
from teller.trace import DEFAULT_STEP_PATTERNS, LAYER_NAMES, Trace, _int_arg, check_normalize, step_patterns
from teller.trace import load as load_trace

FORMAT = "teller-tpe"
FORMAT_VERSION = 1
FILE_NAME = "tokenizer.json"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(5)
CLOSE = "<close>"
LAYER_UNKS = tuple(f"{layer}:[UNK]" for layer in LAYER_NAMES)
FEATURE_NAMES = ("events", "sum_log_dur", "max_log_dur", "max_dur_z", "idle_gap_log")
# the conventions of the per-token duration features and the per-symbol statistics (teller-core,
# tpe/features.rs): a log-duration is ln(1 + duration in us), a z-score divides by the symbol's std
# floored at STD_FLOOR
STD_FLOOR = 0.1


def log_duration(dur_ns: Any) -> np.ndarray:
    """``ln(1 + max(dur_ns, 0) / 1000)``: the log-duration the statistics and features are in."""
    return np.log1p(np.maximum(np.asarray(dur_ns, dtype=np.float64), 0.0) / 1000.0)


DEFAULT_CLOSE_LAYERS = ("annotation", "python", "gpu_annotation")

ProgressFn = Callable[[int, int], Any]
_U32_MAX = 2**32 - 1


@dataclass
class Corpus:
    """Symbol sequences ready for training/encoding: ``names[ids[p]]`` is position p's symbol."""

    names: list[str]
    ids: np.ndarray  # uint32
    starts: np.ndarray  # int64, one per segment
    dur_ns: np.ndarray | None = None  # int64 per position
    start_ns: np.ndarray | None = None
    event: np.ndarray | None = None  # trace event index per position (-1 structural)
    steps: np.ndarray | None = None  # step index per segment

    @property
    def n_events(self) -> int:
        return len(self.ids)


class Encoding:
    """The encoding of one trace (or one list of symbol sequences).

    ``ids``: token ids; ``offsets``: ``len(ids) + 1`` base positions, token k covers
    ``offsets[k]:offsets[k+1]``; ``features``: ``len(ids) x 5`` float32 (FEATURE_NAMES);
    ``segment_starts``: index of the first token of every segment (step); ``events``: for each base
    position the trace event index (-1 for ``<close>``), or None for plain symbol input.
    """

    def __init__(
        self,
        tokenizer: TPETokenizer,
        ids: np.ndarray,
        offsets: np.ndarray,
        features: np.ndarray,
        segment_starts: np.ndarray,
        base_ids: np.ndarray,
        events: np.ndarray | None,
        steps: np.ndarray | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids = ids
        self.offsets = offsets
        self.features = features
        self.segment_starts = segment_starts
        self.base_ids = base_ids
        self.events = events
        self.steps = steps

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> list[str]:
        return [self.tokenizer.token_str(int(t)) for t in self.ids]

    def segments(self) -> list[tuple[int, int]]:
        """(first token, end token) of each segment."""
        s = self.segment_starts.tolist()
        if not s:
            return []  # (an encoding of no segments)
        return [(a, b) for a, b in zip(s, s[1:] + [len(self.ids)], strict=True)]

    def token_events(self, k: int) -> np.ndarray:
        """Trace event indices covered by token k (structural positions left out)."""
        if self.events is None:
            raise TokenizerError("this encoding was made from symbols, not from a trace")
        n = len(self.ids)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"token index must be an integer, got {type(k).__name__}")
        if not -n <= k < n:
            raise IndexError(f"token index {k} out of range ({n} tokens)")
        k = int(k) % n
        ev = self.events[self.offsets[k] : self.offsets[k + 1]]
        return ev[ev >= 0]

    def __repr__(self) -> str:
        return f"<teller.tpe.Encoding {len(self.ids)} tokens for {int(self.offsets[-1])} events>"


class TPETokenizer:
    """A trained TPE tokenizer: base vocabulary, merges, per-symbol duration statistics, settings."""

    def __init__(
        self,
        base_vocab: Sequence[str],
        merges: Sequence[tuple[int, int]],
        *,
        merge_counts: Sequence[int] | None = None,
        stats: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.base_vocab = list(base_vocab)
        if tuple(self.base_vocab[: len(SPECIALS)]) != SPECIALS:
            raise TokenizerError(f"the base vocabulary must start with the specials {SPECIALS}")
        self._index = {s: i for i, s in enumerate(self.base_vocab)}
        if len(self._index) != len(self.base_vocab):
            raise TokenizerError("the base vocabulary has duplicate symbols")
        self._native = _native.NativeTpe(len(self.base_vocab), [(int(a), int(b)) for a, b in merges])
        self.merge_counts = [int(c) for c in (merge_counts or [])]
        nb = len(self.base_vocab)
        stats = stats or {}
        self.stats = {
            "count": np.asarray(stats.get("count", np.zeros(nb)), dtype=np.uint64),
            "mean": np.asarray(stats.get("mean", np.zeros(nb)), dtype=np.float64),
            "std": np.asarray(stats.get("std", np.zeros(nb)), dtype=np.float64),
        }
        for k, v in self.stats.items():
            if len(v) != nb:
                raise TokenizerError(f"stats[{k!r}] has {len(v)} entries, the base vocabulary {nb}")
        self.settings = dict(settings or {})
        self._token_cache: dict[int, str] = {}
        self._has_dur: bool | None = None

    # -- sizes -----------------------------------------------------------------------------------
    @property
    def base_size(self) -> int:
        return len(self.base_vocab)

    @property
    def vocab_size(self) -> int:
        return int(self._native.vocab_size)

    @property
    def merges(self) -> list[tuple[int, int]]:
        return self._native.merges()

    @property
    def token_lens(self) -> np.ndarray:
        return self._native.token_lens()

    # -- symbols -----------------------------------------------------------------------------------
    def symbol_id(self, name: str) -> int:
        if not isinstance(name, str):
            raise TokenizerError(f"a symbol name must be a string, got {type(name).__name__}")
        i = self._index.get(name)
        if i is not None:
            return i
        layer = name.split(":", 1)[0]
        return self._index.get(f"{layer}:[UNK]", UNK)

    @property
    def has_duration_stats(self) -> bool:
        """Whether the training corpus had durations (without, every mean and std is 0)."""
        if self._has_dur is None:
            self._has_dur = bool(self.stats["mean"].any() or self.stats["std"].any())
        return self._has_dur

    def duration_z(self, symbol_id: int, dur_ns: Any) -> float:
        """How far events of a base symbol ran from the training corpus's events of that symbol: the
        mean of their log-durations (:func:`log_duration`) less the symbol's mean, over its std
        floored at :data:`STD_FLOOR` (a single event's value is its ``max_dur_z`` feature). 0 for a
        symbol the corpus never timed, a tokenizer trained without durations, or no events."""
        n = len(self.base_vocab)
        if isinstance(symbol_id, (bool, np.bool_)) or not 0 <= operator.index(symbol_id) < n:
            raise TokenizerError(
                f"symbol id {symbol_id!r} is not a base symbol of this tokenizer (0..{n - 1})"
            )
        d = log_duration(dur_ns)
        if not d.size or int(self.stats["count"][symbol_id]) == 0 or not self.has_duration_stats:
            return 0.0
        mu, sd = float(self.stats["mean"][symbol_id]), float(self.stats["std"][symbol_id])
        return float((d.mean() - mu) / max(sd, STD_FLOOR))

    def known(self, names: Iterable[str]) -> np.ndarray:
        """Per symbol name, whether it is in the base vocabulary (else it encodes as an ``[UNK]``)."""
        return np.fromiter((n in self._index for n in names), dtype=bool)

    def symbol_ids(self, names: Iterable[str]) -> np.ndarray:
        """Base ids of symbol names; unknown symbols map to their layer's ``[UNK]`` (else ``[UNK]``)."""
        return np.fromiter((self.symbol_id(n) for n in names), dtype=np.uint32)

    def token_str(self, token: int) -> str:
        """A token as a readable call-chain fragment: ``a ▸ b ▸ c``."""
        s = self._token_cache.get(token)
        if s is None:
            s = " ▸ ".join(self.decode([token]))
            self._token_cache[token] = s
        return s

    # -- encoding ----------------------------------------------------------------------------------
    def _corpus_of(self, x: Any) -> Corpus:
        if isinstance(x, Trace):
            return corpus_from_trace(x, self._close_layers())
        if isinstance(x, (str, os.PathLike)):
            if isinstance(x, str) and not x:
                raise ConfigError("encode: the path is empty")
            if isinstance(x, str) and ":" in x and not _looks_like_path(x) and not os.path.exists(x):
                # (a bare symbol: encode reads a string as a trace path)
                raise TellerFileNotFoundError(
                    f"{x}: no such file or directory: encode reads a string as a trace path; a symbol "
                    f"sequence must be given as a list, encode([{x!r}, ...])",
                    path=x,
                )
            _check_one_trace(x)
            return corpus_from_trace(
                load_trace(
                    x,
                    step_names=self.settings.get("step_names"),
                    normalize=self.settings.get("normalize"),
                    warn=False,
                ),
                self._close_layers(),
            )
        if isinstance(x, Corpus):
            return x
        if isinstance(x, (list, tuple)) and any(
            isinstance(e, os.PathLike) or (isinstance(e, str) and _names_a_trace(e)) for e in x
        ):
            # (a list of strings is one symbol sequence: paths in it would encode as one [UNK] each)
            raise ConfigError(
                "encode takes one trace (a Trace or a path) or symbol sequences; for several traces use "
                "encode_batch([...])"
            )
        return corpus_from_symbols(_symbol_sequences(x))

    def _close_layers(self) -> Sequence[str]:
        """The layers whose ranges end with ``<close>``: the settings' (``[]``: none), the default
        where the settings have none (``null`` too)."""
        v = self.settings.get("close_layers")
        return DEFAULT_CLOSE_LAYERS if v is None else v

    def encode(self, x: Any) -> Encoding:
        """Encode a Trace, a trace path/run directory, one symbol sequence, or a list of sequences.

        A directory must be one trace: a teller run directory (``raw/``, ``run.json``), raw files of
        one run, or a directory with a single trace file; a directory of several trace files is
        refused (:class:`teller.ConfigError`), as ``train`` takes each of them as a trace of its own."""
        c = self._corpus_of(x)
        base = np.asarray(self.symbol_ids(c.names), dtype=np.uint32)[c.ids] if len(c.names) else c.ids
        base = np.ascontiguousarray(base, dtype=np.uint32)
        starts = np.ascontiguousarray(c.starts, dtype=np.int64)
        tokens, offsets, seg = self._native.encode_ids(base, starts)
        n = len(base)
        dur = c.dur_ns if c.dur_ns is not None else np.zeros(n, dtype=np.int64)
        st = c.start_ns if c.start_ns is not None else np.zeros(n, dtype=np.int64)
        # (no durations on either side, no z-score: a tokenizer trained without durations has counts
        # but a mean and std of 0, and symbols without timing are not 0-ns events; `duration_z` says 0)
        timed = c.dur_ns is not None and self.has_duration_stats
        feats = self._native.features(
            base,
            np.ascontiguousarray(dur, dtype=np.int64),
            np.ascontiguousarray(st, dtype=np.int64),
            offsets,
            seg,
            self.stats["count"] if timed else np.zeros_like(self.stats["count"]),
            self.stats["mean"],
            self.stats["std"],
        )
        return Encoding(self, tokens, offsets, feats, seg, base, c.event, c.steps)

    def encode_batch(self, xs: Iterable[Any]) -> list[Encoding]:
        """Encode several inputs. Each encode is parallel over segments inside Rust."""
        return [self.encode(x) for x in xs]

    def encode_ids(self, ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fast path: base ids (uint32, from ``symbol_ids``) and segment start offsets (int64) ->
        (token ids, token offsets [n_tokens + 1]). Parallel over segments, GIL released."""
        a = _int_array(ids, "ids")
        o = _int_array(offsets, "offsets")
        if a.size and (a.min() < 0 or a.max() > np.iinfo(np.uint32).max):
            # (said as given: a -1 is not reported as the 4294967295 it would wrap to)
            bad = int(a.min()) if a.min() < 0 else int(a.max())
            raise TokenizerError(f"symbol id {bad} out of range (base vocabulary {self.base_size})")
        ids = np.ascontiguousarray(a, dtype=np.uint32)
        offsets = np.ascontiguousarray(o, dtype=np.int64)
        tokens, toffs, _seg = self._native.encode_ids(ids, offsets)
        return tokens, toffs

    def decode(self, ids: Iterable[int] | np.ndarray) -> list[str]:
        """Token ids back to the base symbol sequence (lossless)."""
        if isinstance(ids, (str, bytes, dict)) or not isinstance(ids, (Iterable, np.ndarray)):
            raise TokenizerError(f"decode takes a sequence of token ids, got {type(ids).__name__}")
        try:
            a = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        except (TypeError, ValueError) as e:
            raise TokenizerError(f"decode takes a sequence of token ids: {e}") from None
        if a.size == 0:
            a = a.astype(np.uint32)
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise TokenizerError(
                "decode takes a flat sequence of integer token ids, got "
                + (f"a {a.ndim}-d array" if a.ndim != 1 else f"values of type {a.dtype}")
            )
        if a.size and a.dtype.kind in "iu" and (a.min() < 0 or a.max() > np.iinfo(np.uint32).max):
            # (checked before the cast: -1 would wrap to 4294967295 and be reported as that)
            k = int(np.argmax((a < 0) | (a > np.iinfo(np.uint32).max)))
            raise TokenizerError(
                f"token id {int(a[k])} at index {k} is out of range (vocabulary size {self.vocab_size})"
            )
        base = self._native.decode(np.ascontiguousarray(a, dtype=np.uint32))
        vocab = self.base_vocab
        return [vocab[i] for i in base.tolist()]

    # -- persistence ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "teller_version": __version__,
            "specials": list(SPECIALS),
            "base_vocab": self.base_vocab,
            "merges": [list(m) for m in self.merges],
            "merge_counts": self.merge_counts,
            "stats": {
                "count": self.stats["count"].tolist(),
                # (full precision: a loaded tokenizer's features equal the trained one's; rounded to 6
                # decimals they differed by up to 5e-6)
                "mean": [float(x) for x in self.stats["mean"]],
                "std": [float(x) for x in self.stats["std"]],
            },
            "settings": self.settings,
        }

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``directory/tokenizer.json`` (atomically) and return its path."""
        if not isinstance(directory, (str, os.PathLike)):
            raise ConfigError(f"save takes a directory path, got {type(directory).__name__}")
        if not os.fspath(directory):
            raise ConfigError("save: the directory path is empty")
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise TellerIOError(
                f"{d}: exists and is not a directory (save takes the tokenizer directory)",
                path=str(d),
                errno=errno.ENOTDIR,
            )
        make_output_dir(d, "tokenizer directory")
        path = d / FILE_NAME
        # (atomic, through a link to the file, keeping an existing file's mode; a temporary name per
        # process and thread)
        write_atomic(path, json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n")
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, path: str = "<dict>") -> TPETokenizer:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TokenizerError(
                f"{path}: not a teller TPE tokenizer (format is {d.get('format')!r})"
                if isinstance(d, dict)
                else f"{path}: not a JSON object",
                path=path,
            )
        ver = d.get("version")
        if not isinstance(ver, int) or isinstance(ver, bool):
            raise TokenizerError(
                f"{path}: field 'version' must be an integer (this teller reads {FORMAT_VERSION}), "
                f"got {type(ver).__name__} {ver!r}",
                path=path,
            )
        if d.get("version") != FORMAT_VERSION:
            raise TokenizerError(
                f"{path}: unsupported tokenizer format version {d.get('version')!r} "
                f"(this teller reads {FORMAT_VERSION})",
                path=path,
            )
        for key, kind in (
            ("base_vocab", list),
            ("merges", list),
            ("merge_counts", list),
            ("stats", dict),
            ("settings", dict),
        ):
            v = d.get(key)
            if (v is not None or (key in ("base_vocab", "merges") and key in d)) and not isinstance(v, kind):
                raise TokenizerError(
                    f"{path}: field {key!r} must be a JSON {'object' if kind is dict else 'array'}, "
                    f"got {'null' if v is None else type(v).__name__}",
                    path=path,
                )
        sp = d.get("specials", list(SPECIALS))
        if not isinstance(sp, (list, tuple)) or list(sp) != list(SPECIALS):
            raise TokenizerError(
                f"{path}: field 'specials' is {repr(sp)[:80]}, this teller's are {list(SPECIALS)}",
                path=path,
            )
        bv = d.get("base_vocab")
        if isinstance(bv, list) and tuple(bv[: len(SPECIALS)]) != SPECIALS:
            raise TokenizerError(
                f"{path}: base_vocab must start with the specials {list(SPECIALS)}, "
                f"got {json.dumps(bv[: len(SPECIALS)])[:80]}",
                path=path,
            )
        bad = _check_saved_fields(d)
        if bad:
            raise TokenizerError(f"{path}: {bad}", path=path)
        try:
            return cls(
                d["base_vocab"],
                [tuple(m) for m in d["merges"]],
                merge_counts=d.get("merge_counts"),
                stats=d.get("stats"),
                settings=d.get("settings"),
            )
        except KeyError as e:
            raise TokenizerError(f"{path}: missing field {e.args[0]!r}", path=path) from None
        except (TypeError, ValueError) as e:
            if isinstance(e, TokenizerError):
                raise TokenizerError(f"{path}: {e}", path=path) from None
            raise TokenizerError(f"{path}: malformed tokenizer: {e}", path=path) from None

    def __repr__(self) -> str:
        return f"<teller.tpe.TPETokenizer base={self.base_size} vocab={self.vocab_size}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # (pickled as its saved form, so it crosses to worker processes and deep-copies; the native
        # merge tables are rebuilt from the merges on the other side)
        return (_from_saved, (self.to_dict(),))

    def __eq__(self, other: object) -> bool:
        """The same tokenizer: vocabulary, merges and their counts, statistics and settings (what
        ``save`` writes, the teller version aside)."""
        if not isinstance(other, TPETokenizer):
            return NotImplemented
        return (
            self.base_vocab == other.base_vocab
            and self.merges == other.merges
            and self.merge_counts == other.merge_counts
            and all(np.array_equal(self.stats[k], other.stats[k]) for k in ("count", "mean", "std"))
            and self.settings == other.settings
        )

    __hash__ = None  # type: ignore[assignment]  # (equality by content, and the object is mutable)


def _from_saved(d: dict[str, Any]) -> TPETokenizer:
    return TPETokenizer.from_dict(d, path="<pickle>")


def _check_saved_fields(d: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a saved tokenizer that the constructor would take and use
    only later (a wrong type would surface as a TypeError at the first encode), or None."""
    bv = d.get("base_vocab")
    if isinstance(bv, list):
        k = next((i for i, x in enumerate(bv) if not isinstance(x, str)), None)
        if k is not None:
            return f"base_vocab[{k}] must be a string, got {type(bv[k]).__name__}"
    ms = d.get("merges")
    if isinstance(bv, list) and isinstance(ms, list):
        # merge k joins two earlier tokens: ids below len(base_vocab) + k
        for k, m in enumerate(ms):
            if (
                not isinstance(m, list)
                or len(m) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in m)
            ):
                return f"merges[{k}] must be a pair of token ids, got {json.dumps(m)[:60]}"
            lim = len(bv) + k
            if lim == 0:
                return f"merges[{k}] = {m}: the base vocabulary is empty, so there is nothing to merge"
            if not all(0 <= x < lim for x in m):
                return f"merges[{k}] = {m}: token ids must be in 0..{lim - 1} (base symbols, earlier merges)"
    st = d.get("stats")
    if "stats" in d:
        # a saved tokenizer always carries them; absent, the per-symbol features would read as 0
        missing = [k for k in ("count", "mean", "std") if not isinstance(st, dict) or k not in st]
        if missing:
            return f"stats lacks {', '.join(repr(k) for k in missing)} (a saved tokenizer has all three)"
        for k in ("count", "mean", "std"):
            if not isinstance(st[k], list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in st[k]
            ):
                return f"stats[{k!r}] must be an array of numbers"
        if not len(st["count"]) == len(st["mean"]) == len(st["std"]):
            return "stats['count'], ['mean'] and ['std'] must be as long as each other (one entry per symbol)"
        # (a count is read as an unsigned integer, a std divides: said here, naming the file)
        bad = next(
            (
                i
                for i, x in enumerate(st["count"])
                if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < 2**63
            ),
            None,
        )
        if bad is not None:
            got = json.dumps(st["count"][bad])
            return f"stats['count'][{bad}] must be a non-negative integer below 2^63, got {got}"
        for k, least in (("mean", None), ("std", 0.0)):
            bad = next(
                (i for i, x in enumerate(st[k]) if not math.isfinite(x) or (least is not None and x < least)),
                None,
            )
            if bad is not None:
                what = "a finite number >= 0" if least is not None else "a finite number"
                return f"stats[{k!r}][{bad}] must be {what}, got {st[k][bad]}"
    mc = d.get("merge_counts")
    if isinstance(mc, list) and mc:
        # (a saved tokenizer has one count per merge; `tpe inspect` lists merges by them)
        if isinstance(ms, list) and len(mc) != len(ms):
            return f"merge_counts has {len(mc)} entries for {len(ms)} merges (one count per merge)"
        k = next(
            (i for i, x in enumerate(mc) if not isinstance(x, int) or isinstance(x, bool) or x < 0), None
        )
        if k is not None:
            return f"merge_counts[{k}] must be a non-negative integer, got {json.dumps(mc[k])}"
    se = d.get("settings") or {}
    for key in ("close_layers", "step_names"):
        v = se.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            return f"settings[{key!r}] must be an array of strings, got {json.dumps(v)}"
    if se.get("step_names") is not None:
        from teller.errors import ConfigError
        from teller.trace import step_patterns

        try:  # (used at every load of a trace to encode: an empty list or pattern said here)
            step_patterns(se["step_names"], "settings['step_names']")
        except ConfigError as e:
            return str(e)
    bad_layer = next((x for x in se.get("close_layers") or [] if x not in LAYER_NAMES), None)
    if bad_layer is not None:  # (used at every encode: said here, naming the tokenizer)
        return f"settings['close_layers']: unknown layer {bad_layer!r} (layers: {', '.join(LAYER_NAMES)})"
    for key, least, most, nullable in (
        ("min_frequency", 1, None, False),
        ("min_symbol_count", 1, None, False),
        ("max_token_events", 1, _U32_MAX, True),  # (train's bound: the native trainer's u32)
        ("training_events", 0, None, False),
        ("training_segments", 0, None, False),
    ):
        if key not in se or (nullable and se[key] is None):
            continue
        v = se[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < least or (most is not None and v > most):
            null = " or null" if nullable else ""
            bound = f">= {least}" if most is None else f"in {least}..{most}"
            return f"settings[{key!r}] must be an integer {bound}{null}, got {json.dumps(v)}"
    if se.get("normalize") is not None and not isinstance(se["normalize"], dict):
        return f"settings['normalize'] must be an object or null, got {json.dumps(se['normalize'])}"
    if se.get("normalize"):
        from teller.errors import ConfigError
        from teller.trace import check_normalize

        try:  # (used at every load of a trace to encode: said here, naming the tokenizer)
            check_normalize(se["normalize"])
        except ConfigError as e:
            return f"settings['normalize']: {e}"
    v = se.get("normalization_version")
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        return f"settings['normalization_version'] must be a positive integer, got {json.dumps(v)}"
    return None


def normalization_note(tok: TPETokenizer, path: str) -> str | None:
    """What a tokenizer trained under other symbol-normalization rules (``teller_core::normalize::
    VERSION``, recorded as ``settings['normalization_version']`` since version 2) means for the
    traces it encodes, where it means anything, else None: a newer one may name events differently;
    one from before version 2 that holds mangled kernel names (``kernel:_Z...``) which this teller
    now gives other symbols (it demangles them; some it keeps whole) no longer matches those kernels;
    one of a later older version may differ in ways docs/normalization.md lists."""
    have, cur = tok.settings.get("normalization_version"), _native.NORMALIZATION_VERSION
    if have == cur:
        return None
    if isinstance(have, int) and have > cur:
        return (
            f"{path}: trained with symbol normalization version {have}, newer than this teller's ({cur}): "
            "some events may read as other symbols; encode with the teller that trained it"
        )
    if isinstance(have, int) and have >= 2:
        return (
            f"{path}: trained with symbol normalization version {have}, older than this teller's ({cur}): "
            "some events may read as other symbols (docs/normalization.md); retrain it (teller tpe train)"
        )
    from teller.trace import symbol

    norm = tok.settings.get("normalize")
    moved = [
        x
        for x in tok.base_vocab
        if x.startswith("kernel:_Z") and symbol("kernel", x[7:], normalize=norm) != x
    ]
    if not moved:
        return None
    return (
        f"{path}: {len(moved)} kernel symbol(s) are mangled names (e.g. {moved[0][:48]}) that this teller "
        f"demangles (symbol normalization version {cur}; the tokenizer's: before 2): those kernels now "
        "read as unknown tokens; retrain it (teller tpe train) to give them symbols"
    )


# -- corpora ---------------------------------------------------------------------------------------


def _symbol_sequences(x: Any) -> list[Sequence[str]]:
    """``encode``'s symbol input as a list of sequences of strings: one sequence of symbol strings,
    or a list of them (not a mix, not a dict, bytes or numbers)."""
    what = "encode takes a Trace, a trace path, a sequence of symbol strings or a list of them"
    if isinstance(x, (bytes, bytearray, dict)) or not isinstance(x, Iterable):
        raise TokenizerError(f"{what}, got {type(x).__name__}")
    seqs = list(x)
    if all(isinstance(s, str) for s in seqs):
        return [seqs] if seqs else []
    for k, seq in enumerate(seqs):
        if isinstance(seq, (str, bytes, bytearray, dict)) or not isinstance(seq, Iterable):
            raise TokenizerError(
                f"{what}: item {k} is of type {type(seq).__name__}"
                + (" (a list mixes symbols and sequences)" if isinstance(seq, str) else "")
            )
        bad = next((s for s in seq if not isinstance(s, str)), None)
        if bad is not None:
            raise TokenizerError(f"{what}: sequence {k} holds a {type(bad).__name__}, not a symbol string")
    return seqs


def corpus_from_trace(tr: Trace, close_layers: Sequence[str] = DEFAULT_CLOSE_LAYERS) -> Corpus:
    names, ids, starts, steps, event, start_ns, dur_ns = tr._n.sequences(list(close_layers), False)
    return Corpus(
        names=names, ids=ids, starts=starts, dur_ns=dur_ns, start_ns=start_ns, event=event, steps=steps
    )


def corpus_from_symbols(seqs: Sequence[Sequence[str]]) -> Corpus:
    index: dict[str, int] = {}
    ids: list[int] = []
    starts: list[int] = []
    for seq in seqs:
        starts.append(len(ids))
        for s in seq:
            if not isinstance(s, str):
                raise ConfigError(f"symbol sequences must hold strings, got {type(s).__name__}")
            i = index.get(s)
            if i is None:
                i = index[s] = len(index)
            ids.append(i)
    return Corpus(
        names=list(index), ids=np.asarray(ids, dtype=np.uint32), starts=np.asarray(starts, dtype=np.int64)
    )


def concat(corpora: Sequence[Corpus]) -> Corpus:
    """One corpus over a shared name table."""
    index: dict[str, int] = {}
    ids, starts, durs, sts = [], [], [], []
    offset = 0
    has_time = all(c.dur_ns is not None for c in corpora)
    for c in corpora:
        remap = np.fromiter(
            (index.setdefault(n, len(index)) for n in c.names), dtype=np.uint32, count=len(c.names)
        )
        ids.append(remap[c.ids] if len(c.ids) else c.ids.astype(np.uint32))
        starts.append(np.asarray(c.starts, dtype=np.int64) + offset)
        if has_time:
            durs.append(c.dur_ns)
            sts.append(c.start_ns)
        offset += len(c.ids)
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    return Corpus(
        names=list(index),
        ids=cat(ids, np.uint32),
        starts=cat(starts, np.int64),
        dur_ns=cat(durs, np.int64) if has_time else None,
        start_ns=cat(sts, np.int64) if has_time else None,
    )


TRACE_SUFFIXES = (".json", ".json.gz", ".tmsgpack")


def discover_traces(path: str | os.PathLike[str]) -> list[Path]:
    """The traces under a dataset directory: sample directories holding ``trace.json`` (the dataset
    format), run directories (holding ``raw/``), or trace files. A file is itself."""
    p = Path(path)
    if not p.exists():
        raise TellerFileNotFoundError(f"{p}: no such file or directory", path=str(p))
    if p.is_file():
        return [p]
    if (p / "raw").is_dir():
        return [p]
    man = p / "manifest.json"
    if man.is_file():
        # a teller dataset (docs/dataset.md): train on its train split only (no test leakage)
        try:
            m = json.loads(man.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            m = None
        if isinstance(m, dict) and m.get("format") == "teller-dataset":
            train = [p / sid / "trace.json" for sid in m.get("splits", {}).get("train", [])]
            if not train:
                raise ConfigError(f"{p}: the dataset has no train samples to train a tokenizer on")
            return train
    found: list[Path] = []
    for child in sorted(p.iterdir()):
        if child.is_dir():
            for name in ("trace.json", "trace.json.gz"):
                if (child / name).is_file():
                    found.append(child / name)
                    break
            else:
                if (child / "raw").is_dir():
                    found.append(child)
        elif child.name.endswith(TRACE_SUFFIXES) and not child.name.startswith("."):
            found.append(child)
    if not found:
        raise ConfigError(
            f"{p}: no traces found (expected sample directories with trace.json, run directories, "
            f"or *.json/*.json.gz/*.tmsgpack files)",
            path=str(p),
        )
    return found


def _looks_like_path(s: str) -> bool:
    """Whether a string reads as a file path (a directory part, a trace suffix, ``.``, ``~``) rather
    than a symbol."""
    seps = (os.sep, os.altsep) if os.altsep else (os.sep,)
    return (
        any(c in s for c in seps)
        or s.endswith((*TRACE_SUFFIXES, ".gz"))
        or s in (".", "..")
        or s.startswith("~")
    )


# the JSON files teller writes beside traces, which the loader does not read as traces (load.rs)
_NOT_TRACES = ("run.json", "summary.json", "annotation.json", "manifest.json")


def _check_one_trace(path: str | os.PathLike[str]) -> None:
    """Refuse a directory that the loader would read as several traces merged onto one timeline: one
    with several trace files (``*.json``, ``*.json.gz``) and no raw files. A teller run directory
    (``raw/`` or ``run.json``), raw files of one run's processes (``*.tmsgpack``) or a directory of
    one trace file (a dataset sample) is one trace. (``train`` reads each such file as a trace of its
    own.) Anything else (a file, a missing path, an unreadable directory) is the loader's to say."""
    p = Path(path)
    try:
        if not p.is_dir() or (p / "raw").is_dir() or (p / "run.json").is_file():
            return
        names = sorted(os.listdir(p))
    except OSError:
        return
    if any(n.endswith(".tmsgpack") for n in names):
        return
    files = [n for n in names if n.endswith((".json", ".json.gz")) and n not in _NOT_TRACES]
    files = [n for n in files if (p / n).is_file()]
    if len(files) > 1:
        raise ConfigError(
            f"{p}: a directory of {len(files)} trace files, not a run directory: encode takes one trace; "
            f"give one file, e.g. {p / files[0]}, or, for one job's per-rank files, the trace they make "
            f"together: encode(teller.trace.load({str(p)!r})) (tpe train takes the whole directory, each "
            "file a trace of its own)",
            path=str(p),
        )


def _names_a_trace(s: str) -> bool:
    """Whether a string in a symbol sequence is rather the path of a trace or run directory."""
    return (s.endswith(TRACE_SUFFIXES) or os.sep in s) and os.path.exists(s)


def _trace_load_options(
    source: Any, step_names: list[str] | None, normalize: dict[str, Any] | None
) -> tuple[list[str] | None, dict[str, Any] | None]:
    """The step names and normalization a tokenizer trained on ``source`` records: a Trace given
    already has its steps and symbols (it was loaded with its own), and the settings must say how a
    path is to be loaded when it is encoded, so they are the Traces' own. Options given that differ
    from them, or Traces loaded differently from each other, are a ConfigError."""
    items = [source] if isinstance(source, Trace) else source if isinstance(source, (list, tuple)) else []
    traces = [t for t in items if isinstance(t, Trace)]
    if not traces:
        return step_names, normalize

    def canon(key: str, v: Any) -> Any:  # (the defaults spelled out mean the defaults)
        if key == "normalize":
            return v or None
        return None if v is not None and list(v) == list(DEFAULT_STEP_PATTERNS) else v

    given = {"step_names": step_names, "normalize": normalize}
    opts = traces[0].load_options
    for k, t in enumerate(traces[1:], 1):
        if any(canon(k, t.load_options[k]) != canon(k, opts[k]) for k in given):
            raise ConfigError(
                f"the Traces given were loaded with different options ({opts} and {t.load_options} for "
                f"trace {k}): a tokenizer records one way to load a trace; load them alike"
            )
    for key in ("step_names", "normalize"):
        if given[key] is not None and canon(key, given[key]) != canon(key, opts[key]):
            raise ConfigError(
                f"{key}={given[key]!r} differs from how the Trace given was loaded ({key}={opts[key]!r}): "
                f"it applies to paths; load the Trace with it (teller.trace.load(..., {key}=...)), or "
                "leave it out (the tokenizer records the Trace's own)"
            )
    # (paths beside the Traces are loaded as the Traces were)
    return opts["step_names"], opts["normalize"]


def _source_corpus(
    source: Any,
    names: Sequence[str] | None,
    close_layers: Sequence[str],
    step_names: Sequence[str] | None,
    normalize: dict[str, Any] | None,
) -> Corpus:
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], np.ndarray):
        ids, offsets = source
        if names is None:
            raise ConfigError("train((ids, offsets), names=...) needs the list of symbol names the ids index")
        return _fast_path_corpus(ids, offsets, list(names))
    if names is not None:
        # (the other sources carry their symbols' names: a names= given with them was dropped unsaid)
        raise ConfigError(
            "names= goes with the fast path train((ids, offsets), names=...); traces and symbol "
            "sequences carry their own symbol names"
        )
    if isinstance(source, Corpus):
        return source
    if isinstance(source, Trace):
        return corpus_from_trace(source, close_layers)
    given_one = isinstance(source, (str, os.PathLike))
    if given_one:
        source = [source]
    if isinstance(source, (bytes, bytearray, dict)) or not isinstance(source, Iterable):
        raise ConfigError(
            "train takes traces (Trace objects, paths, a dataset directory), symbol sequences or "
            f"(ids, offsets) arrays, got {type(source).__name__}"
        )
    items = list(source)
    if items and isinstance(items[0], (list, tuple)):
        for k, it in enumerate(items):
            if not isinstance(it, (list, tuple)):
                raise ConfigError(
                    f"train source item {k} is a {type(it).__name__}: symbol sequences (lists of "
                    "strings) and traces cannot be mixed"
                )
        return corpus_from_symbols(items)
    for k, it in enumerate(items):
        if not isinstance(it, (Trace, str, os.PathLike)):
            raise ConfigError(
                f"train source item {k} must be a Trace or a path (str or os.PathLike), "
                f"got {type(it).__name__}"
            )
    if not given_one:
        # (before any trace is loaded) a list of strings is read as paths: strings that name no file
        # and do not look like paths were meant as a symbol sequence, which is a list of lists
        for it in items:
            if isinstance(it, str) and not os.path.exists(it) and not _looks_like_path(it):
                shown = ", ".join(repr(x) for x in items[:3]) + (", ..." if len(items) > 3 else "")
                raise TellerFileNotFoundError(
                    f"{it}: no such file or directory: train reads a list of strings as trace paths; "
                    f"a symbol sequence must be given as a list of lists, train([[{shown}]])",
                    path=it,
                )
    corpora: list[Corpus] = []
    for it in items:
        if isinstance(it, Trace):
            corpora.append(corpus_from_trace(it, close_layers))
            continue
        for p in discover_traces(it):
            tr = load_trace(p, step_names=step_names, normalize=normalize, warn=False)
            corpora.append(corpus_from_trace(tr, close_layers))
    if not corpora:
        raise ConfigError("nothing to train on")
    return concat(corpora)


def _int_array(x: Any, what: str) -> np.ndarray:
    """``x`` as a 1-d numpy array of integers (an empty list too), else a TokenizerError saying what
    it is (not a silent truncation of floats, not numpy's bare ValueError)."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TokenizerError(f"{what} must be a 1-d array of integers: {e}") from None
    if a.ndim != 1:
        raise TokenizerError(
            f"{what} must be a 1-d array of integers, got a {a.ndim}-d array of shape {a.shape}"
        )
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise TokenizerError(f"{what} must be an array of integers, got dtype {a.dtype}")
    return a


def _fast_path_corpus(ids: Any, offsets: Any, names: list[str]) -> Corpus:
    """The corpus of ``train((ids, offsets), names=...)``, its arrays checked (values said as given:
    a -1 is not reported as the 4294967295 it would wrap to)."""
    a = _int_array(ids, "ids (the first array of (ids, offsets))")
    o = _int_array(offsets, "offsets (the second array of (ids, offsets))")
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0:
            k = int(np.argmax(a < 0))
            raise TokenizerError(f"ids: symbol id {int(a[k])} at index {k} is negative (ids index names)")
        if hi >= len(names):
            k = int(np.argmax(a >= len(names)))
            raise TokenizerError(
                f"ids: symbol id {int(a[k])} at index {k} is out of range for {len(names)} names "
                f"(0..{len(names) - 1})"
                if names
                else f"ids: symbol id {int(a[k])} at index {k}, but names is empty"
            )
    if o.size and int(o.min()) < 0:
        k = int(np.argmax(o < 0))
        raise TokenizerError(f"offsets: negative segment start {int(o[k])} at index {k}")
    seen: dict[str, int] = {}
    for k, n in enumerate(names):
        if n in seen:
            raise ConfigError(f"names has {n!r} twice (at {seen[n]} and {k}): each symbol must have one id")
        seen[n] = k
    return Corpus(
        names=names,
        ids=np.ascontiguousarray(a, dtype=np.uint32),
        starts=np.ascontiguousarray(o, dtype=np.int64),
    )


def train(
    source: Any,
    *,
    vocab_size: int | None = None,
    num_merges: int | None = None,
    min_frequency: int = 2,
    min_symbol_count: int = 1,
    max_token_events: int | None = None,
    names: Sequence[str] | None = None,
    close_layers: Sequence[str] = DEFAULT_CLOSE_LAYERS,
    step_names: Sequence[str] | None = None,
    normalize: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> TPETokenizer:
    """Train a TPE tokenizer.

    ``source``: traces (Trace objects, trace files, run directories, a dataset directory), plain
    sequences of symbol strings (each one segment; a list of them, ``[["a", "b"], ...]``: a list of
    strings is read as paths), or the fast path ``(ids, offsets)`` numpy arrays (integer symbol ids
    indexing ``names``, integer segment start offsets) with ``names`` (the symbols the ids index,
    each once).
    Give ``vocab_size`` (base + merges) or ``num_merges``. Deterministic: ties between equally
    frequent pairs go to the smallest pair. Training stops early when no pair of adjacent tokens
    occurs ``min_frequency`` times any more: a :class:`teller.TellerWarning` then says how many
    merges were made of those asked.
    """
    if (vocab_size is None) == (num_merges is None):
        raise ConfigError("give exactly one of vocab_size and num_merges")
    # Every argument's type and range up front (not a TypeError/OverflowError from the Rust core).
    for name, v in (("vocab_size", vocab_size), ("num_merges", num_merges)):
        if v is None:
            continue
        try:  # (any integer, numpy's too; 0 merges: the base symbols alone)
            ok = not isinstance(v, bool) and operator.index(v) >= 0
        except TypeError:
            ok = False
        if not ok:
            raise ConfigError(f"{name} must be an integer >= 0, got {v!r}")
        _int_arg(v, name, 0, _U32_MAX)  # (token ids are uint32)
    min_frequency = _int_arg(min_frequency, "min_frequency", 1, 2**64 - 1)
    min_symbol_count = _int_arg(min_symbol_count, "min_symbol_count", 1)
    if max_token_events is not None:
        max_token_events = _int_arg(max_token_events, "max_token_events", 1, _U32_MAX)
    if isinstance(close_layers, str):
        close_layers = [close_layers]
    if isinstance(close_layers, (bytes, bytearray, dict)) or not isinstance(close_layers, Iterable):
        raise ConfigError(f"close_layers must be a list of layer names, got {type(close_layers).__name__}")
    close_layers = list(close_layers)
    for x in close_layers:
        if x not in LAYER_NAMES:
            raise ConfigError(f"close_layers: unknown layer {x!r} (layers: {', '.join(LAYER_NAMES)})")
    if names is not None and (
        isinstance(names, (str, bytes, dict))
        or not isinstance(names, Iterable)
        or not all(isinstance(n, str) for n in names)
    ):
        raise ConfigError("names must be a list of symbol name strings")
    step_names = step_patterns(step_names)
    normalize = check_normalize(normalize)
    step_names, normalize = _trace_load_options(source, step_names, normalize)
    if progress is not None and not callable(progress):
        raise ConfigError(f"progress must be a callable(done, total) or None, got {type(progress).__name__}")
    c = _source_corpus(source, names, close_layers, step_names, normalize)
    if len(c.ids) == 0:
        # (as train([]) is: a tokenizer of the fixed symbols alone would encode everything as [UNK])
        raise ConfigError("nothing to train on: the corpus has no events")
    if len(c.names) and len(c.ids) and int(c.ids.max()) >= len(c.names):
        raise TokenizerError(f"symbol id {int(c.ids.max())} is out of range for {len(c.names)} names")
    counts = np.bincount(c.ids, minlength=len(c.names)) if len(c.ids) else np.zeros(len(c.names), np.int64)
    # Base vocabulary: specials, per-layer unknowns, <close>, then kept symbols by (-count, name).
    fixed = list(SPECIALS) + list(LAYER_UNKS) + [CLOSE]
    fixed_set = set(fixed)
    order = {n: int(k) for n, k in zip(c.names, counts.tolist(), strict=True)}
    kept = [n for n, k in order.items() if k >= min_symbol_count and n not in fixed_set]
    kept.sort(key=lambda n: (-order[n], n))
    base_vocab = fixed + kept
    tmp = TPETokenizer(base_vocab, [])
    remap = tmp.symbol_ids(c.names) if len(c.names) else np.zeros(0, np.uint32)
    base_ids = np.ascontiguousarray(remap[c.ids] if len(c.ids) else c.ids, dtype=np.uint32)
    nb = len(base_vocab)
    merges_wanted = num_merges if num_merges is not None else max(0, int(vocab_size) - nb)  # type: ignore[arg-type]
    if vocab_size and vocab_size <= nb:  # (0 asks for the base symbols alone: no warning)
        import warnings

        warnings.warn(
            f"vocab_size {vocab_size} is not above the corpus's {nb} base symbols: no merges are learned",
            TellerWarning,
            stacklevel=2,
        )
    merges, merge_counts = _native.tpe_train(
        base_ids,
        np.ascontiguousarray(c.starts, dtype=np.int64),
        nb,
        int(merges_wanted),
        int(min_frequency),
        max_token_events,
        progress,
    )
    if len(merges) < merges_wanted:
        import warnings

        asked = (
            f"vocab_size {vocab_size} over {nb} base symbols"
            if num_merges is None
            else f"num_merges {num_merges}"
        )
        cap = f" (within max_token_events {max_token_events})" if max_token_events is not None else ""
        warnings.warn(
            f"training made {len(merges)} of the {merges_wanted} merges asked ({asked}), vocabulary "
            f"{nb + len(merges)}: no pair of adjacent tokens was left with frequency >= min_frequency "
            f"({min_frequency}){cap}",
            TellerWarning,
            stacklevel=2,
        )
    if c.dur_ns is not None:
        cnt, mean, std = _native.tpe_symbol_stats(
            base_ids, np.ascontiguousarray(c.dur_ns, dtype=np.int64), nb
        )
        stats = {"count": cnt, "mean": mean, "std": std}
    else:
        stats = {"count": np.bincount(base_ids, minlength=nb).astype(np.uint64)}
    settings = {
        "min_frequency": int(min_frequency),
        "min_symbol_count": int(min_symbol_count),
        "max_token_events": max_token_events,
        "close_layers": list(close_layers),
        "step_names": list(step_names) if step_names is not None else None,
        "normalize": normalize,
        # (the symbol rules this vocabulary was made with: tpe.load says what a change means)
        "normalization_version": _native.NORMALIZATION_VERSION,
        "training_events": int(len(base_ids)),
        "training_segments": int(len(c.starts)),
    }
    return TPETokenizer(base_vocab, merges, merge_counts=merge_counts, stats=stats, settings=settings)


def load(directory: str | os.PathLike[str], *, warn: bool = True) -> TPETokenizer:
    """Load a tokenizer saved with :meth:`TPETokenizer.save` (a directory or the JSON file itself).
    ``warn``: say (:class:`teller.TellerWarning`) what other symbol-normalization rules than this
    teller's mean for it (:func:`normalization_note`; off in worker processes, whose parent said it)."""
    if not isinstance(directory, (str, os.PathLike)):
        raise ConfigError(f"tpe.load takes a directory or file path, got {type(directory).__name__}")
    if not os.fspath(directory):
        raise ConfigError("tpe.load: the path is empty")
    p = Path(directory)
    path = p / FILE_NAME if p.is_dir() else p
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TellerFileNotFoundError(
            f"{path}: no such file (expected a tokenizer directory)", path=str(path)
        ) from None
    except OSError as e:  # (a directory that may not be searched: PermissionError)
        raise TellerIOError(
            f"{path}: cannot read: {e.strerror or e}", path=str(path), errno=e.errno
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise TellerIOError(
            f"{path}: not a file (expected a tokenizer.json)",
            path=str(path),
            errno=errno.EISDIR if os.path.isdir(path) else None,
        )
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        # (JSONDecodeError and UnicodeDecodeError, and what json raises on hostile input: an integer
        # past Python's digit limit, nesting past the recursion limit)
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise TokenizerError(f"{path}: not valid JSON: {why}", path=str(path)) from None
    except OSError as e:
        raise TellerIOError(
            f"{path}: cannot read: {e.strerror or e}", path=str(path), errno=e.errno
        ) from None
    tok = TPETokenizer.from_dict(d, path=str(path))
    if warn:
        import warnings

        from teller.errors import TellerWarning

        for note in (_unknown_fields_note(d, str(path)), normalization_note(tok, str(path))):
            if note:
                warnings.warn(note, TellerWarning, stacklevel=2)
    return tok


# The fields this teller writes (``to_dict``; ``settings``: ``train``'s), the rest are read past.
_SAVED_FIELDS = frozenset(
    (
        "format",
        "version",
        "teller_version",
        "specials",
        "base_vocab",
        "merges",
        "merge_counts",
        "stats",
        "settings",
    )
)
_SAVED_SETTINGS = frozenset(
    (
        "min_frequency",
        "min_symbol_count",
        "max_token_events",
        "close_layers",
        "step_names",
        "normalize",
        "normalization_version",
        "training_events",
        "training_segments",
    )
)


def _unknown_fields_note(d: dict[str, Any], path: str) -> str | None:
    """Fields of a saved tokenizer this teller does not know (a newer teller's, or a typo in a
    hand-edited file: ``close_layer`` would silently mean the default), or None. Same format
    version, so they are ignored rather than refused; the note says which."""
    top = sorted(k for k in d if k not in _SAVED_FIELDS)
    se = d.get("settings") or {}
    sub = sorted(k for k in se if k not in _SAVED_SETTINGS)
    names = [repr(k) for k in top] + [f"settings[{k!r}]" for k in sub]
    if not names:
        return None
    wrote = d.get("teller_version")
    by = (
        f" (written by teller {wrote}, this is {__version__})"
        if isinstance(wrote, str) and wrote != __version__
        else ""
    )
    plural = "s" if len(names) > 1 else ""
    return f"{path}: ignored field{plural} this teller does not know: {', '.join(names)}{by}"


__all__ = [
    "CLOSE",
    "FEATURE_NAMES",
    "SPECIALS",
    "Corpus",
    "Encoding",
    "TPETokenizer",
    "discover_traces",
    "load",
    "train",
]
