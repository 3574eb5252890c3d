"""Tokenize a dataset into memory-mapped shards: TPE for the traces, a template tokenizer for the logs.

Output (``docs/dataset.md``, "Tokenized shards")::

    O/<run-id>/manifest.json
    O/<run-id>/log_tokenizer.json
    O/<run-id>/shards/<split>-<k>/<array>.npy

Shards are written to a temporary directory and renamed when complete, so a rerun with the same
run id skips them (resume), each checked first (a damaged one is encoded again). A run id that holds
the shards of another dataset (manifest or sample files' bytes), tokenizer or settings is refused,
never reused or overwritten; the dataset is checked (manifest, every sample's files and annotation) before
anything is written, and a damaged shard is named when read. One process at a time writes an output
directory (``O/.teller.lock``, :func:`teller._io.dir_lock`): another is refused, naming the first.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import re
import shutil
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from teller._io import check_output_dir, check_outside, dir_lock, terminal_text
from teller.data.dataset import (
    annotation_problem,
    file_problem,
    is_plain_name,
    log_text_problem,
    read_json,
    read_manifest,
)
from teller.data.summary import (
    N_GPU_TIME_FEATURES,
    N_PROC_LOG_FEATURES,
    N_SUMMARY_FEATURES,
    SUMMARY_FEATURE_NAMES,
)
from teller.errors import (
    ConfigError,
    DatasetError,
    TellerError,
    TellerFileNotFoundError,
    TellerIOError,
    TellerWarning,
    TokenizerError,
)

SHARDS_FORMAT = "teller-shards"
# 2: per-symbol summaries (teller.data.summary); 3: + 6 work-normalized columns, token_work;
# 4: + summary_culprit; 5: summary columns 9-11 on residuals fitted per position in the step
# (teller.data.summary), same width, new meaning; + token_proc_log; 6: the same arrays, encoded with
# the loader that links each GPU activity of a multi-process trace.json to its own process's launch
# (before, every rank's kernels hung under rank 0's calls: their chains, steps, token_proc_log and
# summary rows changed); 7: + summary columns 14-16, a collective's transfer apart from its waiting
# (teller.data.summary; columns 0-13 unchanged, so a version-6 model reads version-7 shards);
# 8: + summary columns 17-19, kernels against the deployment's reference (teller.data.reference,
# reference.json beside the shards; columns 0-16 unchanged); 10: columns 17-19 against a version-2
# reference (load in tokens and sequences, a table or a quadratic per row; same columns, smaller
# residuals; 9 was an inverted column 19, tried and never shipped, docs/models-history.md); 11: + summary
# columns 20-22, the reference residuals pooled over the kernel's family (columns 0-19 unchanged);
# 12: + token_gpu, each token's compute and collective kernel time (teller.data.summary.token_gpu_time;
# the other arrays unchanged, so a version-11 model reads version-12 shards); 13: + summary columns
# 23-24, each rank against its tensor-parallel peers (teller.data.summary.cross_rank_residuals;
# columns 0-22 and the other arrays unchanged, so a version-12 model reads version-13 shards)
# 15: token_proc_log counts log records, not lines (a logged traceback is one record)
SHARDS_VERSION = 15  # (14: unlinked GPU events in their own rank's steps; docs/dataset.md)
# the share of training samples whose reference columns are left 0 (chosen by a hash of the
# dataset seed and sample id), so that a model also learns to do without them (unseen deployments);
# with every training sample covered, a probe's trees sent unknown deployments down the wrong side
REF_HIDE_FRAC = 0.3
REFERENCE_FILE = "reference.json"
# what a run directory encodes (dataset manifest, tokenizer, settings), written before anything else
# and removed once manifest.json (which records the same) is written: a reused --run-id is checked
# against it, so that shards of one dataset are never reused for another
RUN_STAMP = ".tokenize.json"
LOG_TOKENIZER_FORMAT = "teller-log-tokenizer"
LOG_SPECIALS = ("[PAD]", "[UNK]", "[BOL]", "<stdout>", "<stderr>")
LOG_PLACEHOLDERS = ("<num>", "<hex>", "<ip>", "<path>", "<time>", "<id>")
LOG_FEATURE_NAMES = ("t_rel_ms", "signed_log1p_value")
ProgressFn = Callable[[int, int], Any]

# order matters: the first alternative that matches at a position wins
_TOKEN_RE = re.compile(
    r"(?P<time>\b\d\d-\d\d \d\d:\d\d:\d\d\b)"
    r"|(?P<ip>\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b)"
    r"|(?P<path>(?:/[\w.@+-]+){2,}/?|\b[\w-]+\.(?:py|json|cpp|cu|so|yaml)(?::\d+)?\b)"
    r"|(?P<id>\b(?:cmpl|chatcmpl|req)-[0-9a-f]+\b)"
    r"|(?P<hex>\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{12,}\b)"
    r"|(?P<num>[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?%?)"
    r"|(?P<word>[A-Za-z_][A-Za-z_']*)"
    r"|(?P<punct>[^\sA-Za-z0-9_])"
)


def _num(text: str) -> float:
    t = text.replace(",", "").rstrip("%")
    try:
        v = float(t)
    except ValueError:
        return 0.0
    return float(np.sign(v) * np.log1p(abs(v)))


def split_log_line(text: str) -> list[tuple[str, float]]:
    """A log line (without the tee prefix) -> (token string, numeric value) pairs. Numbers, ids,
    hex, addresses, paths and time stamps become placeholders; numbers keep their value."""
    out: list[tuple[str, float]] = []
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        s = m.group()
        if kind == "word":
            out.append((s.lower(), 0.0))
        elif kind == "punct":
            out.append((s, 0.0))
        elif kind == "num":
            out.append(("<num>", _num(s)))
        else:
            out.append((f"<{kind}>", 0.0))
    return out


def parse_log(path: Path) -> list[tuple[int, str, str]]:
    """``log.txt`` lines -> (realtime ns, stream, text). Lines without the tee prefix get ts 0.
    Undecodable bytes are replaced; a missing or unreadable file is a TellerError naming it.
    Lines end at ``\n`` only, and their text is what a terminal shows of it
    (:func:`teller._io.terminal_text`: no colour codes; a ``\r``-redrawn progress bar's last state):
    a program that saw a terminal (``teller collect`` gives it one) logs the same words as one that
    did not."""
    out = []
    try:
        # (newline="": a \r is kept where it is, not made a line end)
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise TellerFileNotFoundError(f"{path}: no such log file", path=str(path)) from None
    except OSError as e:
        what = "a directory, not a log file" if Path(path).is_dir() else f"cannot be read: {e.strerror or e}"
        raise TellerIOError(f"{path}: {what}", path=str(path)) from None
    # (not splitlines(): it also ends a line at \r, \f, \x1c-\x1e and U+2028, which made each part of
    # a progress bar a line of its own, without its time stamp)
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    for line in lines:
        ts_s, _, rest = line.partition(" ")
        stream, _, text = rest.partition(" ")
        if ts_s.isascii() and ts_s.isdigit() and stream in ("stdout", "stderr"):  # ("²" is a digit)
            out.append((int(ts_s), stream, terminal_text(text)))
        else:
            out.append((0, "stdout", terminal_text(line)))
    return out


@dataclass
class LogTokenizer:
    """Template tokenizer for logs: placeholders for variable fields, a word vocabulary built on the
    train split (most frequent first, ties by word), unknown words -> [UNK]. Every line starts with
    [BOL] and its stream token."""

    vocab: list[str]
    # the Rust encoder of this vocabulary, built on first use (None: it is encoded in Python)
    _native: Any = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.vocab)}
        # (every line is encoded with these: a vocabulary without them would fail at the first line)
        missing = [w for w in LOG_SPECIALS if w not in self.index]
        if missing:
            raise TokenizerError(f"a log tokenizer's vocabulary lacks the specials {missing}")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_native": False}  # (the native vocabulary is rebuilt, not pickled)

    @classmethod
    def train(cls, logs: Iterable[Path], vocab_size: int = 4096, min_count: int = 2) -> LogTokenizer:
        from teller import _native

        cnt: Counter[str] = Counter()
        for p in logs:
            texts = [text for _ts, _stream, text in parse_log(p)]
            pairs, deferred = _native.log_token_counts(texts)  # (the Rust splitter: encode_lines)
            cnt.update(dict(pairs))
            for i in deferred:  # (non-ASCII lines: split_log_line's classes)
                cnt.update(t for t, _v in split_log_line(texts[i]))
        fixed = list(LOG_SPECIALS) + list(LOG_PLACEHOLDERS)
        words = sorted(
            (w for w, c in cnt.items() if c >= min_count and w not in fixed), key=lambda w: (-cnt[w], w)
        )
        return cls(fixed + words[: max(0, vocab_size - len(fixed))])

    def encode_lines(self, lines: list[tuple[int, str, str]], t0: int) -> tuple[np.ndarray, np.ndarray]:
        """ids (uint32) and features (float32, n x 2: time relative to ``t0`` in ms, signed log1p of
        the number a <num> token stood for).

        Lines are split in the Rust core (``teller_core::logtok``: ~10x faster than ``re``, the
        same tokens); a line with non-ASCII text is split here by :func:`split_log_line`, whose
        classes the Rust pattern reproduces on ASCII only. :meth:`encode_lines_reference` is the
        pure-Python definition and the tests' oracle."""
        if self._native is False:
            from teller import _native

            try:
                self._native = _native.NativeLogVocab(self.vocab)
            except ValueError:  # (no [UNK], [BOL] or stream token: the Python path says which)
                self._native = None
        if self._native is None or not lines or any(st not in ("stdout", "stderr") for _, st, _ in lines):
            return self.encode_lines_reference(lines, t0)
        try:
            ids, line, num, deferred = self._native.encode(
                [t for _, _, t in lines], [st == "stderr" for _, st, _ in lines]
            )
            ts = np.fromiter((ts for ts, _, _ in lines), np.int64, len(lines))
            t_line = np.where(ts != 0, (ts - t0) / 1e6, 0.0)
        except (OverflowError, UnicodeError):  # (a time stamp past int64, a lone surrogate: Python's)
            return self.encode_lines_reference(lines, t0)
        is_num = ~np.isnan(num)
        v = np.zeros(len(num))
        v[is_num] = np.sign(num[is_num]) * np.log1p(np.abs(num[is_num]))
        feats = np.stack([t_line[line], v], 1).astype(np.float32)
        if deferred:
            unk = self.index["[UNK]"]
            pi: list[np.ndarray] = []
            pf: list[np.ndarray] = []
            prev = 0
            for li, at in deferred:
                toks = split_log_line(lines[li][2])
                pi += [ids[prev:at], np.asarray([self.index.get(t, unk) for t, _ in toks], np.uint32)]
                pf += [
                    feats[prev:at],
                    np.asarray([(t_line[li], v) for _, v in toks], np.float32).reshape(-1, 2),
                ]
                prev = at
            ids = np.concatenate([*pi, ids[prev:]])
            feats = np.concatenate([*pf, feats[prev:]])
        return ids.astype(np.uint32, copy=False), feats

    def encode_lines_reference(
        self, lines: list[tuple[int, str, str]], t0: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode_lines` in pure Python (``re`` and :func:`split_log_line`): the definition."""
        ids: list[int] = []
        feats: list[tuple[float, float]] = []
        unk = self.index["[UNK]"]
        for ts, stream, text in lines:
            t = (ts - t0) / 1e6 if ts else 0.0
            ids.append(self.index["[BOL]"])
            feats.append((t, 0.0))
            ids.append(self.index[f"<{stream}>"])
            feats.append((t, 0.0))
            for tok, v in split_log_line(text):
                ids.append(self.index.get(tok, unk))
                feats.append((t, v))
        return np.asarray(ids, dtype=np.uint32), np.asarray(feats, dtype=np.float32).reshape(-1, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": LOG_TOKENIZER_FORMAT,
            "version": 1,
            "vocab": self.vocab,
            "specials": list(LOG_SPECIALS),
            "placeholders": list(LOG_PLACEHOLDERS),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogTokenizer:
        if not isinstance(d, dict) or d.get("format") != LOG_TOKENIZER_FORMAT:
            raise TokenizerError("not a teller log tokenizer")
        vocab = d.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
            raise TokenizerError("a log tokenizer's 'vocab' must be a list of words")
        return cls(list(vocab))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LogTokenizer:
        """A ``log_tokenizer.json``; a missing, unreadable or malformed file is named."""
        p = Path(path)
        if not p.is_file():
            raise TellerFileNotFoundError(f"{p}: no log tokenizer", path=str(p))
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (ValueError, UnicodeDecodeError) as e:  # (TokenizerError and JSON errors are ValueErrors)
            raise TokenizerError(f"{p}: not a teller log tokenizer ({e})", path=str(p)) from None


def culprit_rules(manifest: dict[str, Any]) -> int:
    """The version of :func:`teller.data.dataset.culprit_mask`'s rules for a dataset: 2 for real CPU
    runs (``collect-cpu``), whose culprit events it marks since then (before: none), 1 for every
    other dataset (unchanged). Part of the shards' key: shards encoded under other rules are not
    reused."""
    gen = manifest.get("generator") if isinstance(manifest, dict) else None
    return 2 if isinstance(gen, dict) and gen.get("name") == "teller-cpu-runs" else 1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


ARRAYS = {
    "labels": "int64 [samples]: index into label_names",
    "severity": "float32 [samples]: the labelled fault's severity (0 for normal; NaN if unknown)",
    "effect_events": "int64 [samples]: events the labelled fault stretched, added, held back or delayed "
    "(its annotation's effect.events; 0 for normal; -1 if unknown, e.g. a real run)",
    "effect_share": "float32 [samples]: the labelled fault's effect.share (the time it added over the "
    "capture's fault-free work of its kind; 0 for normal; NaN if unknown)",
    "trace_ids": "uint32 [tokens]: TPE token ids, samples concatenated",
    "trace_features": "float32 [tokens, 5]: TPE timing features (feature_names)",
    "trace_offsets": "int64 [samples + 1]: sample i's tokens are trace_ids[o[i]:o[i+1]]",
    "trace_culprit": "bool [tokens]: the token covers a culprit event (teller.data.culprit_mask)",
    "token_event_pos": "int64 [tokens]: first base position of each token within its sample",
    "token_work": "float32 [tokens]: ln(1 + num_tokens) of the step of each token's first event "
    "(teller.data.summary.token_work)",
    "token_proc_log": "float32 [tokens, 2]: log1p of the ERROR and WARNING log lines of the process "
    "of each token's first event (teller.data.summary.token_process_log)",
    "token_gpu": "float32 [tokens, 3]: ln(1 + us) of each token's kernel time outside collectives and "
    "of its collective kernels' time, and the collectives' share (teller.data.summary.token_gpu_time)",
    "base_events": "int64 [base positions]: trace event index of each base position (-1: <close>)",
    "base_offsets": "int64 [samples + 1]: sample i's base positions are base_events[b[i]:b[i+1]]",
    "segment_starts": "int64 [segments]: first token (within its sample) of each step",
    "segment_offsets": "int64 [samples + 1]: sample i's steps are segment_starts[s[i]:s[i+1]]",
    "log_ids": "uint32 [log tokens]: log tokenizer ids, samples concatenated",
    "log_features": "float32 [log tokens, 2]: log feature_names",
    "log_offsets": "int64 [samples + 1]: sample i's log tokens are log_ids[l[i]:l[i+1]]",
    "summary_ids": "uint32 [rows]: TPE base id of each per-symbol summary row (teller.data.summary)",
    "summary_features": "float32 [rows, features]: summary feature_names (the manifest's summary section)",
    "summary_offsets": "int64 [samples + 1]: sample i's summary rows are summary_ids[u[i]:u[i+1]]",
    "summary_culprit": "bool [rows]: the row's symbol has a culprit event in the sample",
}
# Arrays a version-1 run lacks (token_work: before version 3, summary_culprit: before 4,
# token_proc_log: before 5; token_gpu: before 12; effect_events / effect_share: shards encoded
# before they existed, which are still version 7 since no model reads them); readers get them empty
# (token_work, token_proc_log, token_gpu: zeros, "no information"; summary_culprit: all False;
# effect: -1 / NaN, unknown).
# the shards version that added each optional array: a shard of that version or later that lacks
# it is incomplete (not an older shard), and is named rather than read as zeros
_ARRAY_SINCE = {
    "summary_ids": 2,
    "summary_features": 2,
    "summary_offsets": 2,
    "token_work": 3,
    "summary_culprit": 4,
    "token_proc_log": 5,
    "token_gpu": 12,
}
# the per-sample evaluation arrays a shard whose done.json says "effect": true was written with
_EFFECT_ARRAYS = ("severity", "effect_events", "effect_share")
OPTIONAL_ARRAYS = (
    "summary_ids",
    "summary_features",
    "summary_offsets",
    "token_work",
    "token_proc_log",
    "token_gpu",
    "severity",
    "summary_culprit",
    "effect_events",
    "effect_share",
)


def _labelled_effect(ann: dict[str, Any]) -> tuple[int, float]:
    """(effect.events, effect.share) of a sample's labelled fault, for evaluation by what the fault
    did: (0, 0.0) for a normal sample; -1 / NaN where unknown (no ``effect``: a real run). With
    several faults of the labelled type, their events add up and the share is the largest."""
    if not ann.get("faults"):
        return 0, 0.0
    effs = [f.get("effect") for f in ann["faults"] if f.get("type") == ann.get("label")]
    effs = [e for e in effs if isinstance(e, dict)]
    if not effs:
        return -1, float("nan")
    if not all(isinstance(e.get("events"), (int, float)) for e in effs):
        return -1, float("nan")  # (not what the simulator writes: unknown rather than "did nothing")
    n = sum(int(e["events"]) for e in effs)
    shares = [float(e["share"]) for e in effs if isinstance(e.get("share"), (int, float))]
    return n, (max(shares) if shares else float("nan"))


def _done_record(final: Path, job: dict[str, Any]) -> dict[str, Any] | None:
    """The ``done.json`` of shard directory ``final`` if it is what ``job`` would encode (its
    samples, this version, the culprit rules), else None: the shard is encoded (again)."""
    if not (final / "done.json").is_file():
        return None
    try:
        done = json.loads((final / "done.json").read_text())
    except (OSError, ValueError):  # (a damaged marker of our own: the shard is encoded again)
        return None
    # a shard of an older version is encoded again, as is one from before the effect arrays
    # (same version: no model reads them, but evaluation by effect would silently cover part of
    # a split)
    if (
        isinstance(done, dict)
        and done.get("samples") == len(job["samples"])
        and done.get("version") == SHARDS_VERSION
        and done.get("effect")
        and done.get("culprit_rules", 1) == job.get("culprit_rules", 1)
    ):
        return done
    return None


def _drop_damaged_shards(
    out: Path, jobs: list[dict[str, Any]], num_labels: int, vocab_sizes: dict[str, int] | None = None
) -> None:
    """Before a resumed run encodes: every shard its ``done.json`` marks complete is checked as a
    reader checks it (:func:`load_shard`: each array's npy header, memory-mapped, so a truncated or
    missing one is found without reading the data; shapes, offsets and labels against done.json);
    a damaged one is warned about (naming the file) and its done.json removed, so it is encoded again."""
    for j in jobs:
        final = out / "shards" / j["name"]
        if _done_record(final, j) is None:
            continue
        try:
            load_shard(out, j["name"], num_labels=num_labels, vocab_sizes=vocab_sizes)
        except TellerError as e:
            why = str(e).replace(f" (an incomplete shard: {_RETOKENIZE})", "").replace(f"; {_RETOKENIZE}", "")
            _warn(f"{why}; a damaged shard of a resumed run, encoded again")
            (final / "done.json").unlink()


def _encode_shard(job: dict[str, Any]) -> dict[str, Any]:
    from teller import tpe
    from teller.data.dataset import culprit_mask
    from teller.data.reference import KernelReference, deployment_key, event_residuals
    from teller.data.summary import (  # noqa: PLC0415
        process_log_levels,
        symbol_summary,
        token_gpu_time,
        token_process_log,
        token_work,
    )

    out = Path(job["out"])
    final = out / "shards" / job["name"]
    done = _done_record(final, job)
    if done is not None and job.get(CONTENT_KEY) and done.get(CONTENT_KEY) not in (None, job[CONTENT_KEY]):
        done = None  # (its record says other bytes than this call hashed: encoded again)
    if done is not None and not isinstance(done.get(CONTENT_KEY), str) and job.get("backfill", True):
        # done before the content digest existed, in a run whose fingerprint is this call's (so these are
        # the bytes it encoded): its samples' digest is added to its record, nothing else rewritten.
        # Never in a run whose record has no fingerprint ("backfill" False): nothing says the bytes
        # now are the ones its shards encode
        done = {
            **done,
            CONTENT_KEY: job.get(CONTENT_KEY) or shard_samples_digest(job["data"], job["samples"]),
        }
        tmp = final / ".done.json.tmp"
        tmp.write_text(json.dumps(done, sort_keys=True))
        os.replace(tmp, final / "done.json")
    if done is not None:
        return done
    # the bytes of its samples, hashed (streamed) before they are encoded: the run's record of them
    digest = job.get(CONTENT_KEY) or shard_samples_digest(job["data"], job["samples"])
    tmp = out / "shards" / f".tmp-{job['name']}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tok = tpe.load(job["tokenizer"], warn=False)  # (the parent said what there is to say)
    logtok = LogTokenizer.load(job["log_tokenizer"])
    ref = KernelReference.load(job["reference"]) if job.get("reference") else None
    folds = [KernelReference.load(p) for p in job["reference_folds"]] if job.get("reference_folds") else None
    labels = job["labels"]
    per_sample = ("labels", "severity", "effect_events", "effect_share")
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ARRAYS if not k.endswith("offsets") and k not in per_sample
    }
    offs = {
        "trace_offsets": [0],
        "base_offsets": [0],
        "segment_offsets": [0],
        "log_offsets": [0],
        "summary_offsets": [0],
    }
    lab = []
    sev = []
    eff_events: list[int] = []
    eff_share: list[float] = []
    for sid in job["samples"]:
        sd = Path(job["data"]) / sid
        ann = read_json(sd / "annotation.json", "sample annotation")
        problem = annotation_problem(ann, labels)
        if problem is not None:  # (checked before encoding too: the dataset changed since)
            ap = sd / "annotation.json"
            raise DatasetError(f"{ap}: {problem[0]}: {problem[1]}", path=str(ap), detail=problem[1])
        tr = load_sample_trace(sd, tok)
        enc = tok.encode(tr)
        ev = np.asarray(
            enc.events if enc.events is not None else np.full(int(enc.offsets[-1]), -1), dtype=np.int64
        )
        mask = culprit_mask(tr, ann)
        base_c = np.zeros(len(ev), dtype=np.int64)
        ok = ev >= 0
        base_c[ok] = mask[ev[ok]]
        o = np.asarray(enc.offsets, dtype=np.int64)
        csum = np.concatenate([[0], np.cumsum(base_c)])
        tok_c = (csum[o[1:]] - csum[o[:-1]]) > 0
        cols["trace_ids"].append(np.asarray(enc.ids, dtype=np.uint32))
        cols["trace_features"].append(np.asarray(enc.features, dtype=np.float32).reshape(-1, 5))
        cols["trace_culprit"].append(tok_c)
        cols["token_event_pos"].append(o[:-1])
        cols["token_work"].append(token_work(tr, ev, o))
        cols["token_gpu"].append(token_gpu_time(tr, ev, o))
        cols["base_events"].append(ev)
        cols["segment_starts"].append(np.asarray(enc.segment_starts, dtype=np.int64))
        resid = None
        if ref is not None and not (job.get("hide") and reference_hidden(job.get("seed"), sid)):
            log_text = (sd / "log.txt").read_text(errors="replace") if (sd / "log.txt").is_file() else None
            r = folds[reference_fold(job.get("seed"), sid)] if folds else ref
            resid = event_residuals(tr, r, deployment_key(tr, log_text))
        sids, sfeat = symbol_summary(tr, tok, ref_resid=resid)
        cols["summary_ids"].append(sids)
        cols["summary_features"].append(sfeat)
        # a row is a culprit when its base symbol (the same mapping symbol_summary uses) has a culprit event
        base = tok.symbol_ids(tr.symbols).astype(np.int64)
        cul_ids = np.unique(base[np.asarray(tr.symbol, dtype=np.int64)[mask]]) if mask.any() else []
        cols["summary_culprit"].append(np.isin(sids.astype(np.int64), cul_ids))
        offs["summary_offsets"].append(offs["summary_offsets"][-1] + len(sids))
        t0 = int(ann["trace"]["start_ns"])
        lines = parse_log(sd / "log.txt")
        cols["token_proc_log"].append(token_process_log(tr, ev, o, process_log_levels(lines)))
        lids, lfeat = logtok.encode_lines(lines, t0)
        cols["log_ids"].append(lids)
        cols["log_features"].append(lfeat)
        offs["trace_offsets"].append(offs["trace_offsets"][-1] + len(enc.ids))
        offs["base_offsets"].append(offs["base_offsets"][-1] + len(ev))
        offs["segment_offsets"].append(offs["segment_offsets"][-1] + len(enc.segment_starts))
        offs["log_offsets"].append(offs["log_offsets"][-1] + len(lids))
        lab.append(labels.index(ann["label"]))
        # the labelled (primary) fault's severity, not a milder secondary one's
        fs = [f.get("severity") for f in ann.get("faults") or [] if f.get("type") == ann["label"]]
        fs = [float(x) for x in fs if isinstance(x, (int, float))]
        sev.append(fs[0] if fs else (0.0 if not ann.get("faults") else float("nan")))
        ev_n, ev_share = _labelled_effect(ann)
        eff_events.append(ev_n)
        eff_share.append(ev_share)
    dtypes = {
        "trace_ids": np.uint32,
        "trace_features": np.float32,
        "trace_culprit": np.bool_,
        "token_event_pos": np.int64,
        "token_work": np.float32,
        "token_proc_log": np.float32,
        "token_gpu": np.float32,
        "base_events": np.int64,
        "segment_starts": np.int64,
        "log_ids": np.uint32,
        "log_features": np.float32,
        "summary_ids": np.uint32,
        "summary_features": np.float32,
        "summary_culprit": np.bool_,
    }
    for k, parts in cols.items():
        width = {
            "trace_features": 5,
            "log_features": 2,
            "summary_features": N_SUMMARY_FEATURES,
            "token_proc_log": N_PROC_LOG_FEATURES,
            "token_gpu": N_GPU_TIME_FEATURES,
        }.get(k, 0)
        empty = np.zeros((0, width) if width else 0, dtype=dtypes[k])
        arr = np.concatenate(parts).astype(dtypes[k], copy=False) if parts else empty
        np.save(tmp / f"{k}.npy", arr)
    for k, v in offs.items():
        np.save(tmp / f"{k}.npy", np.asarray(v, dtype=np.int64))
    np.save(tmp / "labels.npy", np.asarray(lab, dtype=np.int64))
    np.save(tmp / "severity.npy", np.asarray(sev, dtype=np.float32))
    np.save(tmp / "effect_events.npy", np.asarray(eff_events, dtype=np.int64))
    np.save(tmp / "effect_share.npy", np.asarray(eff_share, dtype=np.float32))
    info = {
        "name": job["name"],
        "samples": len(job["samples"]),
        "tokens": int(offs["trace_offsets"][-1]),
        "log_tokens": int(offs["log_offsets"][-1]),
        "culprit_tokens": int(sum(int(c.sum()) for c in cols["trace_culprit"])),
        "version": SHARDS_VERSION,
        "effect": True,  # carries effect_events / effect_share
        "culprit_rules": job.get("culprit_rules", 1),
        CONTENT_KEY: digest,
    }
    (tmp / "done.json").write_text(json.dumps(info, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return info


def load_sample_trace(sample_dir: Path, tok: Any) -> Any:
    """A sample's trace.json, loaded with the step names and normalization ``tok`` was trained with."""
    from teller import trace as _trace

    return _trace.load(
        sample_dir / "trace.json",
        step_names=tok.settings.get("step_names"),
        normalize=tok.settings.get("normalize"),
        warn=False,
    )


def _unit(seed: Any, sample_id: str, salt: str) -> float:
    h = hashlib.sha256(f"{salt}:{seed}:{sample_id}".encode()).digest()
    return int.from_bytes(h[:4], "big") / 2**32


def reference_hidden(seed: Any, sample_id: str) -> bool:
    """Whether a training sample's reference columns are left 0 (``REF_HIDE_FRAC`` of them, fixed
    by the dataset seed and the sample id)."""
    return _unit(seed, sample_id, "hide") < REF_HIDE_FRAC


def reference_fold(seed: Any, sample_id: str) -> int:
    """The half (0 or 1) of the train split a training sample belongs to for its out-of-fold
    reference residuals."""
    return int(_unit(seed, sample_id, "fold") >= 0.5)


def _reference_points(job: tuple[str, str, Any, str], tok: Any = None) -> tuple[int, Any] | None:
    """One training sample's kernel points outside its labelled fault windows, with its fold
    (:func:`fit_reference`); None for a capture without a deployment key. ``job``: (sample
    directory, sample id, dataset seed, TPE tokenizer file, read once per process unless ``tok``)."""
    from teller import tpe
    from teller.data.reference import deployment_key, kernel_points, outside_faults

    sdir, sid, seed, tok_file = job
    sd = Path(sdir)
    if tok is None:
        tok = _WORKER_TOK.get(tok_file) or _WORKER_TOK.setdefault(tok_file, tpe.load(tok_file, warn=False))
    try:
        ann = json.loads((sd / "annotation.json").read_text())
        tr = load_sample_trace(sd, tok)
        log_text = (sd / "log.txt").read_text(errors="replace")
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{sd}: cannot read the sample to fit the kernel reference ({e})") from None
    key = deployment_key(tr, log_text)
    if key is None:
        return None
    idx, pk, w, s, x = kernel_points(tr)
    keep = outside_faults(tr, idx, ann)
    return reference_fold(seed, sid), (
        key,
        [k for k, ok in zip(pk, keep, strict=True) if ok],
        w[keep],
        s[keep],
        x[keep],
    )


_WORKER_TOK: dict[str, Any] = {}  # (a worker process's TPE tokenizer, loaded once per file)


def _fit_reference_part(pts_fold: tuple[list[Any], int | None]) -> Any:
    """The reference fitted on ``pts`` (``(fold, points)`` pairs) without fold ``skip`` (None: all)."""
    from teller.data.reference import KernelReference

    pts, skip = pts_fold
    return KernelReference.fit(p for f, p in pts if f != skip)


def fit_reference(
    data: Path,
    man: dict[str, Any],
    tok: Any,
    *,
    tok_file: str | os.PathLike[str] | None = None,
    workers: int = 1,
) -> tuple[Any, list[Any]]:
    """The deployments' kernel reference (:mod:`teller.data.reference`) from a dataset's train
    split (every kernel event outside the sample's labelled fault windows), and the two out-of-fold
    references: ``folds[f]`` is fitted without the training samples of half ``f``
    (:func:`reference_fold`). A training sample's residuals come from the reference that did not
    see it, as a val or test sample's do from the full one; in-sample residuals are smaller (a
    deployment with a handful of training captures fits them closely) and would teach a model that
    any residual is a fault.

    With ``workers`` > 1 (and ``tok_file``, the file ``tok`` was loaded from), the samples are read
    and the three references fitted in that many processes: the same points in the same order,
    so the same references (it was half of a 2-worker ``teller tokenize`` of ``default``, serial)."""
    seed = man.get("seed")
    train = man["splits"].get("train", [])
    if workers > 1 and tok_file is not None and len(train) > 1:
        jobs = [(str(data / sid), sid, seed, str(tok_file)) for sid in train]
        with mp.get_context("spawn").Pool(min(workers, len(train))) as pool:
            got = pool.map(_reference_points, jobs, chunksize=max(1, len(jobs) // (8 * workers)))
            pts = [p for p in got if p is not None]
            full, *folds = pool.map(_fit_reference_part, [(pts, None), (pts, 0), (pts, 1)], chunksize=1)
        return full, folds
    pts = [p for sid in train if (p := _reference_points((str(data / sid), sid, seed, ""), tok)) is not None]
    return _fit_reference_part((pts, None)), [_fit_reference_part((pts, g)) for g in (0, 1)]


def tokenize_dataset(
    data_dir: str | os.PathLike[str],
    tokenizer_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    shard_size: int = 256,
    workers: int = 1,
    log_vocab_size: int = 4096,
    log_tokenizer: str | os.PathLike[str] | None = None,
    reference: str | os.PathLike[str] | None = None,
    hide_reference: bool = True,
    progress: ProgressFn | None = None,
) -> Path:
    """Tokenize every sample of a dataset; returns ``output_dir/<run-id>``. The default run id is a
    hash of the dataset manifest, the tokenizer and the settings, so a rerun resumes (as does the same
    command on a regenerated or copied dataset); a dataset whose sample files hold other bytes under
    the same manifest is never served the run's shards: it is encoded into a run id of its own (an
    explicit ``run_id`` holding the other bytes is refused). See the note at :data:`SAMPLE_FILES`.

    The log tokenizer is built from the dataset's train split, or taken from ``log_tokenizer`` (a
    ``log_tokenizer.json``): how new data is encoded for a model trained on other shards. The
    kernel reference likewise: fitted on the train split, or taken from ``reference`` (a
    ``reference.json``), or, when only ``log_tokenizer`` is given, from the ``reference.json``
    beside it (the run it came from). ``hide_reference``: leave the reference columns 0 for a fixed
    share of the train split (``REF_HIDE_FRAC``; training data), or for none (data to evaluate)."""
    from teller import tpe

    data = Path(data_dir)
    man_path = data / "manifest.json"
    man = read_manifest(data)  # (a missing, unreadable or malformed manifest is named)
    tpath = Path(tokenizer_dir)
    tfile = tpath / tpe.FILE_NAME if tpath.is_dir() else tpath
    if not tfile.is_file():
        raise TellerFileNotFoundError(f"{tfile}: no tokenizer", path=str(tfile))
    if shard_size < 1 or workers < 1:
        raise ConfigError("--shard-size and --workers must be >= 1")
    n_fixed = len(LOG_SPECIALS) + len(LOG_PLACEHOLDERS)
    if log_vocab_size < n_fixed:
        raise ConfigError(
            f"--log-vocab-size must be at least {n_fixed} (the log specials and placeholders), "
            f"got {log_vocab_size}"
        )
    if run_id is not None and not is_plain_name(run_id):
        raise ConfigError(
            f"--run-id {run_id!r}: not a plain name (letters, digits, '_', '-' and '.', not first): "
            "the run directory goes inside --output-dir"
        )
    out_root = Path(output_dir)
    check_output_dir(out_root, "--output-dir names a directory")
    check_outside(out_root, data, "--output-dir", "the dataset")
    tok = tpe.load(tfile)  # fail early on a bad tokenizer
    labels: list[str] = list(man["labels"])
    t_hash = _sha256(tfile)
    d_hash = _sha256(man_path)
    settings: dict[str, Any] = {"shard_size": shard_size, "log_vocab_size": log_vocab_size}
    if log_tokenizer is not None:
        lt_src = Path(log_tokenizer)
        LogTokenizer.load(lt_src)  # fail early on a bad one
        settings["log_tokenizer_sha256"] = _sha256(lt_src)
        if reference is None and (lt_src.parent / REFERENCE_FILE).is_file():
            reference = lt_src.parent / REFERENCE_FILE
    if reference is not None:
        from teller.data.reference import KernelReference

        ref_src = Path(reference)
        KernelReference.load(ref_src)  # fail early on a missing or bad one
        settings["reference_sha256"] = _sha256(ref_src)
    if not hide_reference:
        settings["hide_reference"] = False
    rules = culprit_rules(man)
    if rules != 1:  # (the key of every dataset whose culprit events never changed stays as it was)
        settings["culprit_rules"] = rules
    _check_samples(data, man)  # (before anything is written)
    s_hash = samples_fingerprint(data, man)  # (before encoding: a file changed meanwhile differs next time)
    plan = shard_plan(man, shard_size)
    digests: list[str] | None = None  # each shard's content digest: hashed here only for a record to check

    def content() -> str:
        nonlocal digests
        if digests is None:
            digests = _shard_digests(data, plan, workers)
        return samples_digest(digests)

    # the key of the default run id: the dataset manifest, tokenizer and settings, not the sample files
    # (the same command on a regenerated or copied dataset gives the same id; the note at SAMPLE_FILES)
    key = [d_hash, t_hash, settings, SHARDS_VERSION]
    explicit = run_id is not None
    run_id = run_id if run_id is not None else _key_id(key)
    out = out_root / run_id
    stamp = {
        "dataset": {"path": str(data.resolve()), "manifest_sha256": d_hash, SAMPLES_KEY: s_hash},
        "tokenizer": {"sha256": t_hash},
        "settings": settings,
    }
    # one writer of the output root at a time (another teller process is refused, named): choosing the run
    # id (the default one may give way to a content-addressed one) and writing it are one step
    with dir_lock(out_root, "teller tokenize", transient=True):
        # where the default run id's record holds another fingerprint, a run of its own that records this
        # one (the dataset lives there) is taken without hashing a file
        found = None
        if not explicit and _recorded_fingerprint(out) != s_hash:
            found = _content_run(out_root, key, s_hash)
        if found is not None:
            run_id, out = found, out_root / found
        changed, known, unverified = _check_run_dir(
            out, run_id, stamp, content, refuse_changed=explicit or found is not None
        )
        if changed:
            # the default run id holds other sample files, or ones its record cannot vouch for: this content
            # gets a run of its own
            run_id = _key_id([*key, content()])
            out = out_root / run_id
            changed, known, unverified = _check_run_dir(out, run_id, stamp, content, refuse_changed=True)
        if known is None and digests is not None and not unverified:
            known = samples_digest(digests)
        if known is not None:  # (an interrupted run is then checked by content too)
            stamp["dataset"][CONTENT_KEY] = known
        if unverified:  # (it stays a record without a fingerprint: nothing vouches for its done shards)
            stamp["dataset"][SAMPLES_KEY] = None
        try:
            (out / "shards").mkdir(parents=True, exist_ok=True)
            tmp = out / f"{RUN_STAMP}.tmp"
            tmp.write_text(json.dumps(stamp, sort_keys=True) + "\n")
            os.replace(tmp, out / RUN_STAMP)
        except OSError as e:
            raise TellerIOError(
                f"{out}: cannot write the run directory: {e.strerror or e}", path=str(out), errno=e.errno
            ) from None
        # A resumed run's log tokenizer and kernel reference are what its shards were encoded with: one
        # that is damaged (unreadable, malformed, or another file than its record says) is copied again
        # from this call's --log-tokenizer / --reference (the run's settings hold their hashes, so they are
        # the files it was made with), or, fitted here, fitted again and every shard encoded again (as a
        # reference of an older version is); one copied in that this call cannot restore is refused.
        lt_path = out / "log_tokenizer.json"
        redo = False  # every shard encoded again (done ones included)
        lt_bad = None
        if lt_path.is_file():
            lt_src_sha = settings.get("log_tokenizer_sha256")
            lt_bad = _resumed_file_problem(
                lt_path, LogTokenizer.load, lt_src_sha or _recorded_sha(out, "log_tokenizer")
            )
            if lt_src_sha is not None and lt_bad == _CHANGED:
                raise ConfigError(
                    f"{lt_path}: run id {run_id!r} already holds another log tokenizer than {log_tokenizer}; "
                    "its shards were encoded with that one: use a new --run-id",
                    path=str(lt_path),
                )
            if lt_bad is not None:
                lt_path.unlink()
        if not lt_path.is_file() and log_tokenizer is not None:
            tmp = out / ".log_tokenizer.json.tmp"
            shutil.copyfile(log_tokenizer, tmp)
            os.replace(tmp, lt_path)
            if lt_bad is not None:
                _warn(f"{lt_path}: {lt_bad}; copied again from {log_tokenizer}")
        elif not lt_path.is_file():
            train_logs = [data / sid / "log.txt" for sid in man["splits"].get("train", [])]
            lt = LogTokenizer.train(train_logs, vocab_size=log_vocab_size)
            tmp = out / ".log_tokenizer.json.tmp"
            tmp.write_text(json.dumps(lt.to_dict(), ensure_ascii=False) + "\n")
            os.replace(tmp, lt_path)
            if lt_bad is not None:
                _warn(f"{lt_path}: {lt_bad}; fitted again, and every shard of the run is encoded again")
                redo = True
        ref_path = out / REFERENCE_FILE
        fold_paths = [out / f"reference.fold{g}.json" for g in (0, 1)]
        if ref_path.is_file() and reference is None:
            from teller.data.reference import REF_VERSION, KernelReference

            own = all(p.is_file() for p in fold_paths)
            bad = _resumed_file_problem(ref_path, KernelReference.load, None)
            stale = bad is None and KernelReference.load(ref_path).version != REF_VERSION
            if bad is None and not stale:  # (one of an older version is fitted again anyway)
                bad = _resumed_file_problem(ref_path, KernelReference.load, _recorded_sha(out, "reference"))
            bad_path = ref_path
            for p in fold_paths if own and bad is None and not stale else ():
                bad, bad_path = _resumed_file_problem(p, KernelReference.load, None), p
                if bad is not None:
                    break
            if (bad is not None or stale) and not own:
                # copied in by an earlier run of this run id (--reference / --log-tokenizer): its shards
                # were encoded against it, and it is not ours to replace
                what = (
                    "a kernel reference of another version," if bad is None else f"{bad}; a kernel reference"
                )
                raise ConfigError(
                    f"{ref_path}: {what} copied in by an earlier run of run id {run_id!r}; pass the same "
                    "--reference (or --log-tokenizer) again, or use a new --run-id",
                    path=str(ref_path),
                )
            if bad is not None or stale:
                # fitted here, by an older teller (a reused --run-id) or damaged since: fitted again, and
                # every shard encoded against the old one is encoded again
                if bad is not None:
                    _warn(
                        f"{bad_path}: {bad}; the kernel reference is fitted again, every shard encoded again"
                    )
                for p in [ref_path, *fold_paths]:
                    p.unlink(missing_ok=True)
                redo = True
        elif ref_path.is_file() and _sha256(ref_path) != settings["reference_sha256"]:
            from teller.data.reference import KernelReference

            bad = _resumed_file_problem(ref_path, KernelReference.load, None)
            if bad is None:  # (readable: another reference than the one its shards were encoded against)
                raise ConfigError(
                    f"{ref_path}: run id {run_id!r} already holds another kernel reference than {reference}; "
                    "its shards were encoded against that one: use a new --run-id",
                    path=str(ref_path),
                )
            # damaged: the run's copy of this call's --reference (whose hash its settings hold), copied again
            _warn(f"{ref_path}: {bad}; copied again from {reference}")
            ref_path.unlink()
        if redo:
            for p in (out / "shards").glob("*/done.json"):
                p.unlink()
        if not ref_path.is_file():
            if reference is not None:
                tmp = out / f".{REFERENCE_FILE}.tmp"
                shutil.copyfile(reference, tmp)
                os.replace(tmp, ref_path)
            else:
                full, folds = fit_reference(data, man, tok, tok_file=tfile, workers=workers)
                if man["splits"].get("train") and not len(full):
                    import warnings

                    from teller.errors import TellerWarning

                    warnings.warn(
                        f"{data}: no training capture names its GPU (deviceProperties) and its model "
                        "(vLLM's args line), so the kernel reference is empty and summary columns 17-22 "
                        "stay 0 (a dataset of simulator version 1 predates deviceProperties: regenerate it)",
                        TellerWarning,
                        stacklevel=2,
                    )
                for g, r in enumerate(folds):
                    r.save(out / f"reference.fold{g}.json")
                full.save(ref_path)  # (last: its presence marks the three as complete)
        own_reference = all(p.is_file() for p in fold_paths)
        jobs = []
        splits: dict[str, Any] = {
            split: {"samples": list(ids), "shards": []} for split, ids in man["splits"].items()
        }
        for i, (split, name, ids, rows) in enumerate(plan):
            jobs.append(
                {
                    "name": name,
                    "samples": ids,
                    "data": str(data),
                    "out": str(out),
                    "tokenizer": str(tfile),
                    "log_tokenizer": str(lt_path),
                    "reference": str(ref_path),
                    # a training sample of the dataset the reference was fitted on: out of fold
                    "reference_folds": [str(p) for p in fold_paths]
                    if own_reference and split == "train"
                    else None,
                    "split": split,
                    "hide": hide_reference and split == "train",
                    "seed": man.get("seed"),
                    "labels": labels,
                    "culprit_rules": rules,
                    # (its samples' content digest, where hashed above: not hashed again)
                    CONTENT_KEY: digests[i] if digests is not None else None,
                    "backfill": not unverified,
                }
            )
            splits[split]["shards"].append({"name": name, "rows": rows})
        # (ids checked against the tokenizers too, as a reader checks them: an id past the end was
        # resumed as complete and failed only when a model read it)
        lt_size = len(LogTokenizer.load(lt_path).vocab)
        sizes = {"trace_ids": tok.vocab_size, "summary_ids": tok.vocab_size, "log_ids": lt_size}
        _drop_damaged_shards(out, jobs, len(labels), sizes)
        infos: dict[str, dict[str, Any]] = {}
        done = 0
        if progress:
            progress(0, len(jobs))
        if workers == 1 or len(jobs) <= 1:
            for j in jobs:
                infos[j["name"]] = _encode_shard(j)
                done += 1
                if progress:
                    progress(done, len(jobs))
        else:
            with mp.get_context("spawn").Pool(workers) as pool:
                for info in pool.imap_unordered(_encode_shard, jobs):
                    infos[info["name"]] = info
                    done += 1
                    if progress:
                        progress(done, len(jobs))
        for sp in splits.values():
            for s in sp["shards"]:
                s.update({k: v for k, v in infos[s["name"]].items() if k != "name"})
        lt_vocab = len(LogTokenizer.load(lt_path).vocab)  # (checked above: a damaged one is named)
        from teller.data.reference import KernelReference

        ref_table = KernelReference.load(ref_path).table
        shard_digests = [infos[j["name"]].get(CONTENT_KEY) for j in jobs]
        # a shard of a record without a fingerprint, reused as it was (an explicit run id), has no digest: the
        # run's record then holds neither (it still vouches for nothing), as it was
        verified = all(isinstance(d, str) for d in shard_digests)
        manifest = {
            "format": SHARDS_FORMAT,
            "version": SHARDS_VERSION,
            "run_id": run_id,
            "dataset": {
                "path": str(data.resolve()),
                "manifest_sha256": d_hash,
                SAMPLES_KEY: s_hash if verified else None,
                CONTENT_KEY: samples_digest(shard_digests) if verified else None,
                "num_samples": man["num_samples"],
            },
            "tokenizer": {
                "path": str(tfile.resolve()),
                "sha256": t_hash,
                "vocab_size": tok.vocab_size,
                "feature_names": list(tpe.FEATURE_NAMES),
            },
            "log_tokenizer": {
                "path": "log_tokenizer.json",
                "sha256": _sha256(lt_path),
                "vocab_size": lt_vocab,
                "feature_names": list(LOG_FEATURE_NAMES),
            },
            "summary": {"feature_names": list(SUMMARY_FEATURE_NAMES), "baseline_frac": 0.1},
            "reference": {
                "path": REFERENCE_FILE,
                "sha256": _sha256(ref_path),
                "deployments": len(ref_table),
                "entries": sum(len(v) for v in ref_table.values()),
                "hidden_train_frac": REF_HIDE_FRAC if hide_reference else 0.0,
                # training samples' residuals from the half of the train split they are not in
                "out_of_fold": own_reference,
            },
            "label_names": labels,
            "settings": settings,
            "arrays": ARRAYS,
            "splits": splits,
        }
        tmp = out / ".manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, out / "manifest.json")
        (out / RUN_STAMP).unlink(missing_ok=True)  # (manifest.json records the same)
        return out


def _need_file(p: Path, what: str) -> None:
    problem = file_problem(p)
    if problem == "missing":
        raise TellerFileNotFoundError(f"{p}: missing ({what})", path=str(p))
    if problem is not None:
        raise TellerIOError(f"{p}: {problem} ({what})", path=str(p))


# What a run records of the sample files it encoded (manifest.json names the samples but says nothing
# of their bytes, so a sample truncated, replaced or edited in place, or a copy of the dataset with
# other samples under the same manifest, would otherwise be served the shards of other bytes). The
# run id stays a hash of the dataset manifest, tokenizer and settings alone (the same command on a
# regenerated, copied or cloned dataset gives the same `tok-...` id, which `teller results summarize`
# groups recipes by); the run's record (its manifest.json, or the stamp of an interrupted run) holds
# two things about the samples:
# - their fingerprint (SAMPLES_KEY): the path in the dataset, size and mtime_ns of each file the
#   shards encode, one stat per file (as make and git's index do; ~30 ms for 2 600 samples);
# - their content digest (CONTENT_KEY): the SHA-256 of each shard's digest in order, a shard's being
#   the SHA-256 over (path in the dataset, SHA-256 of the bytes) of each file of its samples,
#   computed by the worker that encodes the shard (so in parallel, and only on files it reads anyway).
# A call whose fingerprint is the record's reuses the run without reading a byte; one whose
# fingerprint differs (files rewritten, `cp -r`, a clone, a regeneration) hashes its files: the same
# content reuses the run (its record takes the new fingerprint), other content is refused for an
# explicit --run-id, and for the default one goes into a run of its own, `tok-` + a hash of the same
# key plus its digest, the other run left as it is (a later call finds that run by the fingerprint its
# manifest.json records, without hashing). A record without a fingerprint (written before it existed)
# vouches for no bytes: the default run id leaves it as it is and goes to the run of the content's own;
# an explicit --run-id, named by the user, reuses it by its manifest, and no digest is written into its
# shards' done.json (nothing says they encode the bytes now). One with a fingerprint but no digest (as
# an interrupted first run's stamp) is reused while its fingerprint matches; otherwise it cannot be
# checked, so is taken as other content (a touched or copied dataset is encoded again).
SAMPLE_FILES = ("trace.json", "log.txt", "annotation.json")
SAMPLES_KEY = "samples_fingerprint"
CONTENT_KEY = "samples_sha256"


def samples_fingerprint(data: Path, man: dict[str, Any]) -> str:
    """SHA-256 over (path in the dataset, size, mtime_ns) of each of ``SAMPLE_FILES`` of every sample
    the manifest's splits list, in their order (see the note above)."""
    h = hashlib.sha256()
    root = os.fspath(data)
    for ids in man["splits"].values():
        for sid in ids:
            for name in SAMPLE_FILES:
                rel = f"{sid}/{name}"
                try:
                    st = os.stat(os.path.join(root, rel))
                except OSError as e:  # (checked just before: it went meanwhile)
                    p = data / rel
                    raise TellerIOError(
                        f"{p}: cannot be read: {e.strerror or e}", path=str(p), errno=e.errno
                    ) from None
                h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def shard_samples_digest(data: str | os.PathLike[str], ids: Iterable[str]) -> str:
    """The content digest of one shard's samples: SHA-256 over (path in the dataset, SHA-256 of the
    bytes, read in 1 MiB chunks) of each of ``SAMPLE_FILES`` of each sample of ``ids``, in order."""
    h = hashlib.sha256()
    for sid in ids:
        for name in SAMPLE_FILES:
            rel = f"{sid}/{name}"
            p = Path(data) / rel
            try:
                fh = _sha256(p)
            except OSError as e:  # (checked before encoding: it went meanwhile)
                raise TellerIOError(
                    f"{p}: cannot be read: {e.strerror or e}", path=str(p), errno=e.errno
                ) from None
            h.update(f"{rel}\0{fh}\n".encode())
    return h.hexdigest()


def samples_digest(shard_digests: Iterable[str]) -> str:
    """A dataset's content digest (``CONTENT_KEY``): SHA-256 of its shards' digests, in order."""
    return hashlib.sha256("".join(f"{d}\n" for d in shard_digests).encode()).hexdigest()


def shard_plan(man: dict[str, Any], shard_size: int) -> list[tuple[str, str, list[str], list[int]]]:
    """The shards a dataset is encoded into: (split, shard name, sample ids, [first row, end]) each, the
    splits in the manifest's order, up to ``shard_size`` samples a shard."""
    return [
        (
            split,
            f"{split}-{k // shard_size:05d}",
            list(ids[k : k + shard_size]),
            [k, min(k + shard_size, len(ids))],
        )
        for split, ids in man["splits"].items()
        for k in range(0, len(ids), shard_size)
    ]


def _shard_digests(data: Path, plan: list[tuple[str, str, list[str], list[int]]], workers: int) -> list[str]:
    """Every shard's :func:`shard_samples_digest`, in ``workers`` threads (hashlib and file reads
    release the GIL)."""
    if workers <= 1 or len(plan) <= 1:
        return [shard_samples_digest(data, ids) for _, _, ids, _ in plan]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(workers, len(plan))) as ex:
        return list(ex.map(lambda p: shard_samples_digest(data, p[2]), plan))


def _key_id(key: list[Any]) -> str:
    return "tok-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _recorded_fingerprint(out: Path) -> Any:
    """The sample files' fingerprint a run's ``manifest.json`` records (None: none, or no manifest)."""
    try:
        return json.loads((out / "manifest.json").read_text())["dataset"].get(SAMPLES_KEY)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _content_run(out_root: Path, key: list[Any], s_hash: str) -> str | None:
    """The run of its own (``tok-`` + a hash of ``key`` and a content digest) under ``out_root`` whose
    ``manifest.json`` records the fingerprint ``s_hash`` and is named by the digest it records: found
    without hashing a sample file (then checked as any run is); else None."""
    for p in sorted(out_root.glob("tok-*/manifest.json")):
        try:
            d = json.loads(p.read_text())["dataset"]
            if d.get(SAMPLES_KEY) == s_hash and p.parent.name == _key_id([*key, d[CONTENT_KEY]]):
                return p.parent.name
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def _warn(msg: str) -> None:
    warnings.warn(msg, TellerWarning, stacklevel=3)


def _recorded_sha(out: Path, part: str) -> str | None:
    """The sha256 that a run's ``manifest.json`` records for its ``part`` (``log_tokenizer``,
    ``reference``), or None (no manifest yet: an interrupted run; checked by :func:`_check_run_dir`)."""
    try:
        sha = json.loads((out / "manifest.json").read_text())[part]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sha if isinstance(sha, str) else None


_CHANGED = "not the file the run's shards were encoded with (it changed since)"


def _resumed_file_problem(path: Path, load: Callable[[Path], Any], sha: str | None) -> str | None:
    """What makes a file of a resumed run (its log tokenizer, kernel reference) unfit to be what its
    shards were encoded with: unreadable or malformed (``load`` fails), or not the file of hash
    ``sha`` its record names; None if it is fit."""
    try:
        if path.stat().st_size == 0:
            return "empty file"
        load(path)
    except TellerError as e:
        return str(e).removeprefix(f"{path}: ")
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if sha is not None and _sha256(path) != sha:
        return _CHANGED
    return None


def _check_samples(data: Path, man: dict[str, Any]) -> None:
    """Every sample the manifest's splits list, before anything is encoded: its directory,
    ``annotation.json``, ``trace.json`` and ``log.txt`` present, the annotation usable
    (:func:`teller.data.dataset.annotation_problem`); else a TellerError naming the file. A
    ``log.txt`` that is not text is warned about (:class:`TellerWarning`, the first one named)."""
    labels = man["labels"]
    binary: list[tuple[Path, str]] = []
    for split, ids in man["splits"].items():
        for sid in ids:
            sd = data / sid
            if not sd.is_dir():
                what = "no such sample directory" if not sd.exists() else "not a directory"
                raise TellerFileNotFoundError(
                    f"{sd}: {what} (sample {sid!r} of manifest.json's splits.{split})", path=str(sd)
                )
            for name in ("annotation.json", "trace.json", "log.txt"):
                _need_file(sd / name, "every sample needs annotation.json, trace.json and log.txt")
            ap = sd / "annotation.json"
            problem = annotation_problem(read_json(ap, "sample annotation"), labels)
            if problem is not None:
                raise DatasetError(f"{ap}: {problem[0]}: {problem[1]}", path=str(ap), detail=problem[1])
            lp = log_text_problem(sd / "log.txt")
            if lp is not None:
                binary.append((sd / "log.txt", lp))
    if binary:
        more = f" (and {len(binary) - 1} more log.txt files)" if len(binary) > 1 else ""
        warnings.warn(
            f"{binary[0][0]}: {binary[0][1]}; its log tokens will be noise{more}", TellerWarning, stacklevel=3
        )


# the settings of a run that its dataset manifest decides (compared through the manifest's hash)
_DERIVED_SETTINGS = ("culprit_rules",)


def _check_run_dir(
    out: Path, run_id: str, stamp: dict[str, Any], content: Callable[[], str], *, refuse_changed: bool
) -> tuple[bool, str | None]:
    """An existing run directory may be resumed only by a call with the same dataset manifest, sample
    files, TPE tokenizer and settings as the run that wrote it (its ``manifest.json``, or the stamp of
    an interrupted run): else a :class:`ConfigError` naming the directory and what differs, and
    nothing in it is touched (its shards would be reused for other samples, or overwritten).

    The sample files are compared by their fingerprint (``SAMPLES_KEY``), and where it differs by
    their content (``content()``, this call's :func:`samples_digest`, against the record's
    ``CONTENT_KEY``; see the note at :data:`SAMPLE_FILES`). Other content is refused when
    ``refuse_changed``; else only it differing returns ``(True, None, False)`` (the caller picks another
    run id), as does a record without a fingerprint (written before it existed: nothing vouches for the
    files its shards encode). Returns ``(False, digest, unverified)``: the run may be resumed, the
    content digest its record vouches for this call's files (None: unknown, or no record), and whether
    it is one without a fingerprint that ``refuse_changed`` (an explicit run id) reuses as named."""
    if not out.exists():
        return False, None, False
    if not out.is_dir():
        raise TellerIOError(f"{out}: not a directory (run id {run_id!r} names a file)", path=str(out))
    fix = f"use another --run-id, or remove {out}"
    changed, known, unverified = False, None, False
    for rec in (out / "manifest.json", out / RUN_STAMP):
        if not rec.exists():
            continue
        try:
            m = read_json(rec, "record of what the run holds")
            if rec.name == "manifest.json" and m.get("format") != SHARDS_FORMAT:
                raise ValueError(f"its format is {m.get('format')!r}, not {SHARDS_FORMAT!r}")
            old = {
                "dataset": m["dataset"]["manifest_sha256"],
                "samples": m["dataset"].get(SAMPLES_KEY),
                "content": m["dataset"].get(CONTENT_KEY),
                "path": m["dataset"].get("path"),
                "tokenizer": m["tokenizer"]["sha256"],
                "settings": dict(m["settings"]),
            }
        except (TellerError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise DatasetError(
                f"{rec}: not a readable record of what run id {run_id!r} holds ({e}); {fix}", path=str(rec)
            ) from None
        diffs = []
        if old["dataset"] != stamp["dataset"]["manifest_sha256"]:
            diffs.append(f"the shards of another dataset ({old['path'] or 'its manifest.json differs'})")
        if old["tokenizer"] != stamp["tokenizer"]["sha256"]:
            diffs.append("the shards of another TPE tokenizer")
        a = {k: v for k, v in old["settings"].items() if k not in _DERIVED_SETTINGS}
        b = {k: v for k, v in stamp["settings"].items() if k not in _DERIVED_SETTINGS}
        for k in sorted(set(a) | set(b), key=lambda k: (k != "reference_sha256", k)):
            if a.get(k) == b.get(k):
                continue
            if k == "reference_sha256":
                diffs.append("another kernel reference than this call's (--reference / --log-tokenizer)")
            elif k == "log_tokenizer_sha256":
                diffs.append("another log tokenizer than this call's (--log-tokenizer)")
            else:
                diffs.append(f"shards made with {k} {a.get(k)!r} (this call: {b.get(k)!r})")
        # the sample files, where all else agrees
        why = None
        if not diffs and old["samples"] is None:
            # a record from before the fingerprint: nothing says its shards encode these bytes. The
            # default run id leaves it (the data goes to a run of its own); an explicit one, named by
            # the user, is reused by its manifest, its shards' records left without a digest
            if refuse_changed:
                unverified = True
            else:
                why = "the record holds no fingerprint of them"
        elif not diffs and old["samples"] != stamp["dataset"][SAMPLES_KEY]:
            if not isinstance(old["content"], str):
                why = (
                    "their sizes or modification times differ, and the record holds no digest of their "
                    "contents to check them by"
                )
            elif old["content"] != content():
                why = "their contents differ"
            else:  # (the same bytes: a copy, a regeneration, a clone)
                known = old["content"]
        elif not diffs and old["samples"] is not None and isinstance(old["content"], str):
            known = old["content"]
        if why is not None and refuse_changed:
            diffs.append(
                f"the shards of another dataset ({old['path'] or 'the same manifest.json'}: the same "
                f"manifest.json, other sample files: {why})"
            )
        if diffs:
            raise ConfigError(
                f"{out}: run id {run_id!r} already holds {'; '.join(diffs)}; its shards are not reused "
                f"for this call: {fix}",
                path=str(out),
            )
        changed = changed or why is not None
    return (True, None, False) if changed else (False, known, unverified)


# what each array of a shard holds: dtype kinds ("i"/"u" integers, "f" floats, "b" bool), the
# width of a 2-D one (None: any), and the offsets that index it ("labels": one row per sample)
_ARRAY_SHAPES: dict[str, tuple[str, int | None, str]] = {
    "labels": ("iu", 0, "labels"),
    "severity": ("f", 0, "labels"),
    "effect_events": ("iu", 0, "labels"),
    "effect_share": ("f", 0, "labels"),
    "trace_ids": ("iu", 0, "trace_offsets"),
    "trace_features": ("f", 5, "trace_offsets"),
    "trace_culprit": ("b", 0, "trace_offsets"),
    "token_event_pos": ("iu", 0, "trace_offsets"),
    "token_work": ("f", 0, "trace_offsets"),
    "token_proc_log": ("f", N_PROC_LOG_FEATURES, "trace_offsets"),
    "token_gpu": ("f", N_GPU_TIME_FEATURES, "trace_offsets"),
    "base_events": ("iu", 0, "base_offsets"),
    "segment_starts": ("iu", 0, "segment_offsets"),
    "log_ids": ("iu", 0, "log_offsets"),
    "log_features": ("f", 2, "log_offsets"),
    "summary_ids": ("iu", 0, "summary_offsets"),
    "summary_features": ("f", None, "summary_offsets"),
    "summary_culprit": ("b", 0, "summary_offsets"),
}
_RETOKENIZE = "remove that shard directory and run the same `teller tokenize` again"


def _load_array(f: Path, mmap: bool) -> np.ndarray:
    """One ``.npy`` array of a shard; a missing, unreadable or damaged file is a TellerError naming it."""
    problem = file_problem(f)
    if problem == "missing":
        raise TellerFileNotFoundError(f"{f}: missing (an incomplete shard: {_RETOKENIZE})", path=str(f))
    if problem is not None:
        raise TellerIOError(f"{f}: {problem}", path=str(f))
    try:
        with open(f, "rb") as fh:
            magic = fh.read(6)
        what = None if magic == b"\x93NUMPY" else ("empty" if not magic else "no NumPy header")
        if what is None:
            return np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
    except PermissionError as e:
        raise TellerIOError(f"{f}: cannot be read: {e.strerror or e}", path=str(f), errno=e.errno) from None
    except (ValueError, EOFError, OSError, TypeError) as e:
        what = "truncated" if isinstance(e, EOFError) else str(e) or type(e).__name__
        if "mmap length is greater" in what:
            what = "truncated: shorter than its header says"
    raise DatasetError(f"{f}: not a readable .npy array ({what}); {_RETOKENIZE}", path=str(f), detail=what)


def _check_shard(
    d: Path,
    a: dict[str, np.ndarray],
    loaded: set[str],
    done: dict[str, Any],
    num_labels: int | None,
    vocab_sizes: dict[str, int] | None = None,
) -> None:
    """The arrays of a shard agree with each other and with its ``done.json``: dtypes and widths,
    one row per sample, offsets that start at 0, never decrease and end at the length of what they
    index, label values within the label names, token ids within the vocabularies
    (``vocab_sizes``: array name -> size; an id past the end would otherwise surface as an
    IndexError deep inside an embedding)."""

    def bad(what: str, k: str | None = None) -> DatasetError:
        where = d / f"{k}.npy" if k else d
        return DatasetError(f"{where}: {what}; {_RETOKENIZE}", path=str(where), detail=what)

    for k in (k for k in ARRAYS if k in loaded):
        kinds, width, _ = _ARRAY_SHAPES.get(k, ("iu", 0, ""))  # (offsets: integers)
        arr = a[k]
        if arr.dtype.kind not in kinds:
            want = {"iu": "an integer", "f": "a float", "b": "a bool"}[kinds]
            raise bad(f"dtype {arr.dtype}, expected {want} array", k)
        if width == 0 and arr.ndim != 1:
            raise bad(f"shape {arr.shape}, expected one dimension", k)
        if width != 0 and (arr.ndim != 2 or (width is not None and arr.shape[1] != width)):
            raise bad(f"shape {arr.shape}, expected [rows, {width or 'columns'}]", k)
    n = done.get("samples")
    if not isinstance(n, int) or isinstance(n, bool):
        n = len(a["labels"])
    for k, (_, _, by) in _ARRAY_SHAPES.items():
        if by == "labels" and len(a[k]) != n:
            raise bad(f"{len(a[k])} rows, the shard holds {n} samples (done.json)", k)
    for offs in ("trace_offsets", "base_offsets", "segment_offsets", "log_offsets", "summary_offsets"):
        o = a[offs]
        if o.dtype.kind not in "iu" or o.shape != (n + 1,):
            raise bad(
                f"dtype {o.dtype}, shape {o.shape}: expected {n + 1} integer offsets ({n} samples)", offs
            )
        if int(o[0]) != 0 or bool((np.diff(o) < 0).any()):
            raise bad("offsets must start at 0 and never decrease", offs)
        for k, (_, _, by) in _ARRAY_SHAPES.items():
            if by == offs and len(a[k]) != int(o[-1]):
                raise bad(f"{len(a[k])} rows, {offs}.npy ends at {int(o[-1])}", k)
    for k, key in (("trace_ids", "tokens"), ("log_ids", "log_tokens")):
        want = done.get(key)
        if isinstance(want, int) and len(a[k]) != want:
            raise bad(f"{len(a[k])} rows, done.json says {want} {key.replace('_', ' ')}", k)
    lab = a["labels"]
    if n:
        lo, hi = int(lab.min()), int(lab.max())
        if lo < 0 or (num_labels is not None and hi >= num_labels):
            raise bad(
                f"label value {lo if lo < 0 else hi} out of range"
                + (f" (manifest.json has {num_labels} label names)" if num_labels is not None else ""),
                "labels",
            )
    # (one vectorized pass per array, a few MB per shard at most: measured level with the loads)
    for k, size in (vocab_sizes or {}).items():
        ids = a[k]
        if len(ids):
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= size:
                raise bad(
                    f"token id {lo if lo < 0 else hi} out of range (manifest.json: a vocabulary of {size})", k
                )


def load_shard(
    run_dir: str | os.PathLike[str],
    name: str,
    mmap: bool = True,
    *,
    num_labels: int | None = None,
    vocab_sizes: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """All arrays of one shard (memory-mapped by default), checked against each other and the
    shard's ``done.json`` (label values against ``num_labels`` and token ids against
    ``vocab_sizes``, when given): a missing, damaged or inconsistent array is a TellerError naming
    the file."""
    d = Path(run_dir) / "shards" / name
    if not (d / "done.json").is_file():
        raise TellerFileNotFoundError(f"{d}: no such complete shard", path=str(d))
    done = read_json(d / "done.json", "shard's completion record")
    if not isinstance(done, dict):
        raise DatasetError(f"{d / 'done.json'}: not a shard's completion record (a JSON object)", path=str(d))
    ver = done.get("version")
    ver = ver if isinstance(ver, int) and not isinstance(ver, bool) else None
    got: dict[str, np.ndarray] = {}
    for k in ARRAYS:
        f = d / f"{k}.npy"
        since = _ARRAY_SINCE.get(k)
        # (severity and effect: no version added them, a shard's done.json says it carries them)
        required = k in _EFFECT_ARRAYS and bool(done.get("effect"))
        if (
            k in OPTIONAL_ARRAYS
            and not f.exists()
            and not required
            and (ver is None or since is None or ver < since)
        ):
            continue  # an older shard: no summaries / token work / ...
        got[k] = _load_array(f, mmap)
    n = len(got["labels"])
    t = len(got["trace_ids"])
    m = len(got["summary_ids"]) if "summary_ids" in got else 0
    out: dict[str, np.ndarray] = {}
    for k in ARRAYS:
        if k in got:
            out[k] = got[k]
        elif k == "token_work":
            out[k] = np.zeros(t, np.float32)
        elif k == "token_proc_log":
            out[k] = np.zeros((t, N_PROC_LOG_FEATURES), np.float32)
        elif k == "token_gpu":
            out[k] = np.zeros((t, N_GPU_TIME_FEATURES), np.float32)
        elif k in ("severity", "effect_share"):
            out[k] = np.full(n, np.nan, np.float32)
        elif k == "effect_events":
            out[k] = np.full(n, -1, np.int64)
        elif k == "summary_culprit":
            out[k] = np.zeros(m, bool)
        elif k.endswith("offsets"):
            out[k] = np.zeros(n + 1, np.int64)
        else:
            out[k] = np.zeros((0, N_SUMMARY_FEATURES) if k == "summary_features" else 0, np.float32)
    _check_shard(d, out, set(got), done, num_labels, vocab_sizes)
    return out


def _shards_manifest_problem(man: Any) -> str | None:
    """What makes a parsed shards ``manifest.json`` unreadable (JSON path: what), or None."""
    if not isinstance(man, dict):
        return f"$: not a shards manifest (a JSON object), got {type(man).__name__}"
    fmt = man.get("format", SHARDS_FORMAT)
    if fmt != SHARDS_FORMAT:
        hint = " (a dataset: run `teller tokenize` on it)" if fmt == "teller-dataset" else ""
        return f"$.format: {fmt!r}, not {SHARDS_FORMAT!r}{hint}"
    names = man.get("label_names")
    if not (isinstance(names, list) and names and all(isinstance(x, str) for x in names)):
        return "$.label_names: must be a non-empty list of label names"
    splits = man.get("splits")
    if not isinstance(splits, dict):
        return "$.splits: must map split names to their samples and shards"
    for name, sp in splits.items():
        at = f"$.splits.{name}"
        if not isinstance(sp, dict):
            return f"{at}: must be an object"
        ids, shards = sp.get("samples"), sp.get("shards")
        if not (isinstance(ids, list) and all(isinstance(x, str) for x in ids)):
            return f"{at}.samples: must be a list of sample ids"
        if not isinstance(shards, list):
            return f"{at}.shards: must be a list of shards"
        row = 0
        for k, sh in enumerate(shards):
            if not (isinstance(sh, dict) and is_plain_name(sh.get("name"))):
                return f"{at}.shards[{k}]: must be an object with a plain 'name'"
            r = sh.get("rows")
            if not (
                isinstance(r, list)
                and len(r) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                and r[0] == row < r[1]
            ):
                return (
                    f"{at}.shards[{k}].rows: {r!r}, expected [{row}, end] (shards cover the samples in order)"
                )
            row = r[1]
        if row != len(ids):
            return f"{at}: its shards hold {row} samples, it lists {len(ids)}"
    return None


def read_shards_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``RUN/manifest.json`` of tokenized shards, checked for what reading them needs (format, label
    names, each split's samples and the shards that cover them): a missing, unreadable or malformed
    one is a TellerError naming it."""
    mp_ = Path(run_dir) / "manifest.json"
    if not mp_.exists():
        raise TellerFileNotFoundError(f"{mp_}: no shards manifest", path=str(mp_))
    man = read_json(mp_, "shards manifest")
    problem = _shards_manifest_problem(man)
    if problem is not None:
        # (a dataset's manifest carries its own hint; a damaged shards manifest this one)
        again = (
            "" if "teller tokenize" in problem else " (tokenize the dataset again, into a new run directory)"
        )
        raise DatasetError(
            f"{mp_}: {problem}{again}",
            path=str(mp_),
            detail=problem,
        )
    return man


def shard_vocab_sizes(man: dict[str, Any]) -> dict[str, int]:
    """The id arrays of a shard and the vocabulary sizes the manifest records for them (trace and
    summary ids: the TPE tokenizer's; log ids: the log tokenizer's). A size the manifest lacks or
    garbles is not checked."""
    out: dict[str, int] = {}
    for part, keys in (("tokenizer", ("trace_ids", "summary_ids")), ("log_tokenizer", ("log_ids",))):
        v = man.get(part, {}).get("vocab_size") if isinstance(man.get(part), dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out.update(dict.fromkeys(keys, v))
    return out


def split_names(run_dir: str | os.PathLike[str], split: str) -> list[str]:
    """``[split]``, or every split of the run for ``"all"`` (how a whole unseen dataset is evaluated)."""
    if split != "all":
        return [split]
    return list(read_shards_manifest(run_dir)["splits"])


class ShardedSplit:
    """Random access to the samples of one split of a tokenized run (memory-mapped, no copies until
    indexed): ``ShardedSplit(run_dir, "train")[i]`` is a dict of that sample's arrays plus its
    ``label`` (int) and ``sample_id``. Usable directly as a map-style PyTorch dataset. A damaged
    manifest or shard is a TellerError naming the file (a shard's when it is first read)."""

    def __init__(self, run_dir: str | os.PathLike[str], split: str) -> None:
        self.run_dir = Path(run_dir)
        self.split = split
        self.manifest = read_shards_manifest(self.run_dir)
        if split not in self.manifest["splits"]:
            raise ConfigError(f"unknown split {split!r}; known: {', '.join(self.manifest['splits'])}")
        sp = self.manifest["splits"][split]
        self.sample_ids: list[str] = list(sp["samples"])
        self.label_names: list[str] = list(self.manifest["label_names"])
        self._shards = sp["shards"]
        self._starts = np.array([s["rows"][0] for s in self._shards], dtype=np.int64)
        self._cache: dict[str, dict[str, np.ndarray]] = {}
        self._vocab_sizes = shard_vocab_sizes(self.manifest)

    def __len__(self) -> int:
        return len(self.sample_ids)

    def _shard(self, name: str) -> dict[str, np.ndarray]:
        a = self._cache.get(name)
        if a is None:
            a = load_shard(
                self.run_dir, name, num_labels=len(self.label_names), vocab_sizes=self._vocab_sizes
            )
            sh = next(s for s in self._shards if s["name"] == name)
            want = sh["rows"][1] - sh["rows"][0]
            if len(a["labels"]) != want:
                d = self.run_dir / "shards" / name
                raise DatasetError(
                    f"{d}: holds {len(a['labels'])} samples, {self.run_dir / 'manifest.json'} says {want}; "
                    f"{_RETOKENIZE}",
                    path=str(d),
                )
            self._cache[name] = a
        return a

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        sh = self._shards[k]
        a = self._shard(sh["name"])
        r = i - sh["rows"][0]
        o0, o1 = int(a["trace_offsets"][r]), int(a["trace_offsets"][r + 1])
        b0, b1 = int(a["base_offsets"][r]), int(a["base_offsets"][r + 1])
        s0, s1 = int(a["segment_offsets"][r]), int(a["segment_offsets"][r + 1])
        l0, l1 = int(a["log_offsets"][r]), int(a["log_offsets"][r + 1])
        u0, u1 = int(a["summary_offsets"][r]), int(a["summary_offsets"][r + 1])
        return {
            "sample_id": self.sample_ids[i],
            "label": int(a["labels"][r]),
            "severity": float(a["severity"][r]),
            "effect_events": int(a["effect_events"][r]),
            "effect_share": float(a["effect_share"][r]),
            "trace_ids": a["trace_ids"][o0:o1],
            "trace_features": a["trace_features"][o0:o1],
            "trace_culprit": a["trace_culprit"][o0:o1],
            "token_event_pos": a["token_event_pos"][o0:o1],
            "token_work": a["token_work"][o0:o1],
            "token_proc_log": a["token_proc_log"][o0:o1],
            "token_gpu": a["token_gpu"][o0:o1],
            "base_events": a["base_events"][b0:b1],
            "segment_starts": a["segment_starts"][s0:s1],
            "log_ids": a["log_ids"][l0:l1],
            "log_features": a["log_features"][l0:l1],
            "summary_ids": a["summary_ids"][u0:u1],
            "summary_features": a["summary_features"][u0:u1],
            "summary_culprit": a["summary_culprit"][u0:u1],
        }
