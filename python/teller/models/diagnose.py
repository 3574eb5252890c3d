"""``teller diagnose``: one sample directory or collected run -> ranked root causes with evidence.

The input is encoded exactly as ``teller tokenize`` does (the checkpoint's TPE tokenizer and log
tokenizer), run through the model; the localization scores of the trace tokens are mapped back to
their events, which are aggregated by symbol (operator / kernel), kernel family and rank (device, or
process for CPU events). Evidence per culprit operator: the events, their duration against the
tokenizer's per-symbol statistics (z-score of log duration on normal-ish training data), and the log
lines that mention warnings or errors.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teller._io import check_output_file
from teller._term import table_or_list
from teller.data.summary import process_log_levels, token_gpu_time, token_process_log, token_work
from teller.errors import ConfigError, TellerError, TellerFileNotFoundError, TellerIOError, TellerWarning
from teller.models.data import Sample, _trace_features, collate, compact_log, word_mask

NOTABLE_LOG = (
    "WARNING",
    "ERROR",
    "Error",
    "error",
    "preempt",
    "Preemptions",
    "Traceback",
    "OutOfMemory",
    "timeout",
    "slow",
)


# a vLLM line's process prefix and record header; what follows is the message
_LOG_HEADER = re.compile(r"^(?:\([^)]*\)\s+)?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\]\s?)?")


def _notable(text: str) -> bool:
    """A log line worth showing as evidence: a warning, an error, an exception. Of a logged
    traceback (vLLM repeats the record's header on each of its lines) the record's message and the
    exception line are kept, not the ``Traceback`` line and the frames: a rank's out-of-memory error
    is 9 lines, and its ``OutOfMemoryError`` line came 9th, past the 8 shown."""
    msg = _LOG_HEADER.sub("", text, count=1)
    if msg.startswith(('  File "', "    ", "Traceback (most recent call last)")):
        return False
    return any(w in text for w in NOTABLE_LOG)


def _find_inputs(path: Path) -> tuple[Path | list[Path], Path | None]:
    """The trace input(s) and the log of ``path``: a sample directory (``trace.json``, ``log.txt``),
    a collected run directory, or a trace file (its log: ``log.txt`` beside it)."""
    if not path.exists():
        raise TellerFileNotFoundError(f"{path}: no such file or directory", path=str(path))
    if path.is_file():
        log = path.parent / "log.txt"
        return path, (log if log.is_file() else None)
    t = path / "trace.json"
    if t.exists() and not t.is_file():
        raise TellerIOError(f"{t}: a directory, not a trace file", path=str(t), errno=errno.EISDIR)
    if t.is_file():
        log = path / "log.txt"
        if log.exists() and not log.is_file():
            raise TellerIOError(f"{log}: a directory, not a log file", path=str(log), errno=errno.EISDIR)
        return t, (log if log.is_file() else None)
    if (path / "annotation.json").is_file():
        # a sample directory (docs/dataset.md) without its trace: not a directory of loose traces
        raise TellerFileNotFoundError(f"{path}: a sample directory without its trace.json", path=str(t))
    from teller import tpe
    from teller.errors import TraceFormatError
    from teller.trace import _dataset_sample, _teller_directory

    kind = _teller_directory(str(path))
    if kind is not None:  # (a run, shards, a tokenizer: their JSON files are not traces)
        raise TraceFormatError(f"{path}: {kind}", path=str(path))
    sample = _dataset_sample(str(path))
    if sample is not None:
        # (its samples' traces merged into one capture would be diagnosed as one: a wrong answer)
        raise TellerIOError(
            f"{path}: a directory of captures (sample or run directories holding trace.json), not one "
            f"capture: give one, e.g. {Path(sample).parent}, or several (teller diagnose {path}/*/)",
            path=str(path),
        )
    traces = tpe.discover_traces(path)
    if not traces:
        raise TellerFileNotFoundError(f"{path}: no trace (trace.json or raw files)", path=str(path))
    log = path / "log.txt"
    return (traces if len(traces) > 1 else traces[0]), (log if log.is_file() else None)


_REFERENCES: dict[str, Any] = {}
# the last checkpoint diagnose loaded (model, config, tokenizers) with the files' stamps: a caller
# diagnosing captures one after another (the Python API, a service) loads it once; building the
# model and reading its weights and tokenizers is some 30 ms of a 60 ms diagnosis. A file of the run
# replaced or rewritten since (teller calibrate, a retrained run) changes its stamp and reloads it.
# (An ensemble's GBDT is still read on every call.)
_MODEL_CACHE: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _stamp(path: str | Path) -> tuple[Any, ...] | None:
    """Identity and version of a file (a directory: its tokenizer.json), or None if not there."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    try:
        st = p.stat()
    except OSError:
        return None
    return (str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _load_model(checkpoint: str | Path) -> tuple[Any, dict[str, Any], Any, Any]:
    """``(model, config, TPE tokenizer, log tokenizer)`` of a run, reused while none of its files
    changed (:data:`_MODEL_CACHE`). A run with a save in progress is always read anew (and
    load_checkpoint warns)."""
    from teller import tpe
    from teller.data.tokenize import LogTokenizer
    from teller.models.train import COMMIT_JOURNAL, load_checkpoint

    ck = Path(checkpoint)
    run = ck if ck.is_dir() else ck.parent
    weights = ck / "model.safetensors" if ck.is_dir() else ck
    try:  # (config.json is small: keyed by its bytes, a rewrite within one mtime tick is seen)
        cfg_bytes: bytes | None = (run / "config.json").read_bytes()
    except OSError:
        cfg_bytes = None
    key = (_stamp(weights), _stamp(run / "config.json"), cfg_bytes)
    journal = (run / COMMIT_JOURNAL).exists()
    hit = _MODEL_CACHE.get(key)
    if (
        hit is not None
        and None not in key
        and not journal
        and hit[4] == (_stamp(hit[1]["tpe_dir"]), _stamp(hit[1]["log_tokenizer"]))
    ):
        return hit[:4]
    model, cfg = load_checkpoint(checkpoint)
    for k, what in (("tpe_dir", "TPE tokenizer"), ("log_tokenizer", "log tokenizer")):
        if not cfg.get(k) or not Path(cfg[k]).exists():
            raise TellerFileNotFoundError(
                f"{checkpoint}: its {what} {cfg.get(k)} (config.json's {k!r}) is not there: moved or "
                "deleted since training? Put it back, or edit the path in config.json",
                path=str(cfg.get(k)),
            )
    tok_stamps = (_stamp(cfg["tpe_dir"]), _stamp(cfg["log_tokenizer"]))  # (before they are read)
    tok = tpe.load(cfg["tpe_dir"])
    logtok = LogTokenizer.load(cfg["log_tokenizer"])
    _check_tokenizers(checkpoint, cfg, tok, logtok)
    _MODEL_CACHE.clear()
    if None not in key and not journal:
        _MODEL_CACHE[key] = (model, cfg, tok, logtok, tok_stamps)
    return model, cfg, tok, logtok


def _check_tokenizers(checkpoint: str | Path, cfg: dict[str, Any], tok: Any, logtok: Any) -> None:
    """The tokenizers config.json names must be the ones the model was trained with: another one
    reads other ids (a larger vocabulary's are clamped, a smaller one's shift), and the diagnosis
    names a cause with confidence, unflagged. By SHA-256: config.json's (runs since 2026-12-07),
    else the training shards' manifest's; where neither is there, by vocabulary size (more ids than
    the model reads: refused; fewer: a warning)."""
    import contextlib

    from teller import tpe
    from teller.data.tokenize import _sha256, read_shards_manifest
    from teller.models.train import shards_run_dir

    tp = Path(cfg["tpe_dir"])
    files = {
        "TPE tokenizer": tp / tpe.FILE_NAME if tp.is_dir() else tp,
        "log tokenizer": Path(cfg["log_tokenizer"]),
    }
    want = {"TPE tokenizer": cfg.get("tpe_sha256"), "log tokenizer": cfg.get("log_tokenizer_sha256")}
    if None in want.values():  # (a run from before config.json recorded them: its shards' manifest)
        with contextlib.suppress(TellerError, OSError, ValueError, TypeError, KeyError):
            man = read_shards_manifest(shards_run_dir(cfg["data_dir"]))
            for what, part in (("TPE tokenizer", "tokenizer"), ("log tokenizer", "log_tokenizer")):
                if want[what] is None and isinstance(man.get(part), dict):
                    want[what] = man[part].get("sha256")
    mc = cfg.get("model") or {}
    sizes = {
        "TPE tokenizer": (tok.vocab_size, mc.get("trace_vocab")),
        "log tokenizer": (len(logtok.vocab), mc.get("log_vocab")),
    }
    for what, f in files.items():
        have, model_size = sizes[what]
        if want[what]:  # (the SHA-256 decides: a model may be configured to read more ids than it has)
            if _sha256(f) == want[what]:
                continue
            why = "its SHA-256 is not the one the model was trained with"
        elif isinstance(model_size, int) and have > model_size:
            why = f"{have} ids, the model reads {model_size}"
        else:
            if isinstance(model_size, int) and have < model_size:
                warnings.warn(
                    f"{f}: {have} ids where the model reads {model_size}, and nothing records the {what} it "
                    "was trained with: if it is another, the diagnosis reads other ids",
                    TellerWarning,
                    stacklevel=3,
                )
            continue
        raise ConfigError(
            f"{f}: not the {what} {checkpoint} was trained with ({why}): it would read other ids; "
            "give the checkpoint its own (config.json's paths), or train one on this tokenizer",
            path=str(f),
        )


def reference_residuals(cfg: dict[str, Any], tr: Any, lines: list[tuple[int, str, str]]) -> np.ndarray | None:
    """Per event of ``tr``, its residual against the kernel reference of the shards a run
    (checkpoint or baselines configuration ``cfg``) was trained on, as ``teller tokenize`` computes
    it for summary columns 17-22; None for runs on shards older than version 8 or that read only
    columns 0-16, or when the reference is missing (a warning) or knows nothing of this
    deployment."""
    mc = cfg.get("model") or {}
    reads = mc.get("n_summary_features") if mc else cfg.get("summary_width")
    if int(cfg.get("shards_version") or 4) < 8 or (reads is not None and int(reads) <= 17):
        return None  # (shards before the reference, or a model that reads only columns 0-16)
    from teller.data.reference import KernelReference, deployment_key, event_residuals

    path = cfg.get("reference") or str(Path(cfg.get("data_dir", "")) / "reference.json")
    if path not in _REFERENCES:
        try:
            _REFERENCES[path] = KernelReference.load(path)
        except TellerError as e:
            warnings.warn(f"{e}: the reference columns read as unknown", stacklevel=2)
            _REFERENCES[path] = None
        else:
            # the checkpoint records the reference it was trained with; a file replaced since (a
            # re-run of `teller tokenize` into the same run id) computes other columns
            want = cfg.get("reference_sha256")
            if want and hashlib.sha256(Path(path).read_bytes()).hexdigest() != want:
                warnings.warn(
                    f"{path}: not the kernel reference the checkpoint was trained with (SHA-256 differs); "
                    "summary columns 17-22 are computed against it anyway",
                    stacklevel=2,
                )
    key = deployment_key(tr, "\n".join(t for _, _, t in lines))
    return event_residuals(tr, _REFERENCES[path], key)


def sample_inputs(
    tr: Any, lines: list[tuple[int, str, str]], tok: Any, logtok: Any, cfg: dict[str, Any], name: str
) -> tuple[Any, dict[str, Any]]:
    """The model inputs of one trace and its log lines (``parse_log``), built as ``teller tokenize``
    stores them and ``teller.models.data`` loads them for a checkpoint of configuration ``cfg``: the
    :class:`Sample` and the encoding (``ids``, ``feats``, ``offs``, ``ev``, ``lids``, ``lfeat``,
    ``n``) the localization maps back to events."""
    mc = cfg["model"]
    enc = tok.encode(tr)
    ids = np.asarray(enc.ids, dtype=np.int64)
    feats = np.asarray(enc.features, dtype=np.float32).reshape(-1, 5)
    offs = np.asarray(enc.offsets, dtype=np.int64)
    ev = np.asarray(enc.events if enc.events is not None else np.full(int(offs[-1]), -1), dtype=np.int64)
    start_ns = int(tr.ts.min()) if len(tr) else 0
    lids, lfeat = logtok.encode_lines(lines, start_ns)
    li, lf = compact_log(
        np.asarray(lids, np.int64),
        lfeat,
        int(mc["max_log_tokens"]),
        rich=bool(mc.get("rich_log_features")),
        gaps=bool(mc.get("log_gap_features")),
        lines=bool(mc.get("log_lines")),
        bursts=bool(mc.get("log_burst_features")),
    )
    n = min(len(ids), int(mc["max_trace_tokens"]))
    d = {
        "trace_ids": ids,
        "trace_features": feats,
        "segment_starts": np.asarray(enc.segment_starts, np.int64),
        "token_work": token_work(tr, ev, offs) if mc.get("work_features") else None,
        # (log records since shards version 15, lines before: as the checkpoint was trained)
        "token_proc_log": token_process_log(
            tr, ev, offs, process_log_levels(lines, records=int(cfg.get("shards_version") or 4) >= 15)
        )
        if mc.get("log_process_features")
        else None,
        "token_gpu": token_gpu_time(tr, ev, offs) if mc.get("token_gpu_features") else None,
    }
    tf = _trace_features(
        d,
        n,
        bool(mc.get("relative_features")),
        bool(mc.get("work_features")),
        bool(mc.get("log_process_features")),
        mc.get("token_gpu_features") or False,
    )
    s = Sample(name, 0, ids[:n], tf, np.zeros(n, bool), li, lf)
    if mc.get("log_summary_tokens"):
        from teller.models.data import log_word_summary, word_mask

        s.log_summary_ids, s.log_summary_features = log_word_summary(
            np.asarray(lids, np.int64), np.asarray(lfeat), word_mask(logtok.vocab)
        )
    if mc.get("summary_tokens"):
        from teller.data.summary import summary_options, symbol_summary

        k = int(mc.get("max_summary_tokens", 128))
        su_ids, su_f = symbol_summary(
            tr, tok, **summary_options(cfg), ref_resid=reference_residuals(cfg, tr, lines)
        )
        nsf = int(mc.get("n_summary_features", su_f.shape[1]))
        s.summary_ids, s.summary_features = su_ids[:k].astype(np.int64), su_f[:k, :nsf]
    return s, {"ids": ids, "feats": feats, "offs": offs, "ev": ev, "lids": lids, "lfeat": lfeat, "n": n}


def load_checkpoint_for_diagnosis(
    checkpoint: str | Path,
) -> tuple[dict[str, Any] | None, Any, dict[str, Any], Any, Any]:
    """``(ensemble config or None, model, config, TPE tokenizer, log tokenizer)`` of a MoT/single run
    or an ensemble run (its MoT's), through the cache :func:`diagnose` reads: a TellerError naming
    the checkpoint's file if it cannot be used (so a caller with many captures can check it once)."""
    ck = Path(checkpoint)
    ens = None  # an ensemble run (teller train ensemble): its MoT, plus the GBDT's category
    ens_cfg = (ck if ck.is_dir() else ck.parent) / "config.json"
    if ens_cfg.is_file():
        try:
            c = json.loads(ens_cfg.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            c = None  # (load_checkpoint names the file)
        if isinstance(c, dict) and c.get("format") == "teller-ensemble":
            from teller.models.ensemble import read_ensemble_config

            ens = read_ensemble_config(ens_cfg.parent)  # (its fields checked: a TellerError naming it)
            checkpoint = ens["mot"]
    model, cfg, tok, logtok = _load_model(checkpoint)
    return ens, model, cfg, tok, logtok


def load_baseline(path: str | Path, checkpoint: str | Path) -> Any:
    """A healthy capture for ``diagnose(baseline=...)``, loaded as ``diagnose`` loads the capture it
    explains (the checkpoint's step names and normalization), so that steps and symbols line up."""
    from teller import trace as _trace

    tok = load_checkpoint_for_diagnosis(checkpoint)[3]
    trace_in, _log = _find_inputs(Path(path))
    return _trace.load(
        trace_in,
        step_names=tok.settings.get("step_names"),
        normalize=tok.settings.get("normalize"),
        warn=False,
    )


def _time_at(tr: Any, ev: np.ndarray, offs: np.ndarray, n: int) -> str:
    """How far into the capture the first ``n`` tokens reach: "1.23 s of 4.56 s" (from the first
    event), or "" where the events are unknown."""
    evs = ev[: int(offs[n])] if n < len(offs) else ev
    evs = evs[evs >= 0]
    if not len(evs) or not len(tr):
        return "an unknown point"
    t0, t1 = int(tr.ts.min()), int((tr.ts + tr.dur).max())
    reach = int((tr.ts[evs] + tr.dur[evs]).max())
    return f"{(reach - t0) / 1e9:.3g} s of {(t1 - t0) / 1e9:.3g} s"


def diagnose(
    path: str | Path,
    checkpoint: str | Path,
    *,
    top: int = 3,
    perfetto: str | Path | None = None,
    baseline: Any = None,
) -> dict[str, Any]:
    """Diagnose one capture (a sample directory, a collected run or a trace file) with the model of
    ``checkpoint``. ``baseline``: a healthy capture of the same workload (a path, or a loaded
    :class:`teller.trace.Trace`): the report then also says what changed from it (``baseline``,
    :func:`teller.compare.compare`), evidence that needs no model."""
    from teller import trace as _trace
    from teller.data.dataset import kernel_family
    from teller.data.faults import FAULT_INFO
    from teller.data.tokenize import parse_log

    t_load = time.perf_counter()
    p = Path(path)
    ens, model, cfg, tok, logtok = load_checkpoint_for_diagnosis(checkpoint)
    if ens is not None:
        checkpoint = ens["mot"]
    temperature = float(model.temperature)
    if ens is not None:  # the MoT's temperature the ensemble's weight was chosen with
        temperature = float(ens.get("mot_temperature", 1.0))
    trace_in, log_path = _find_inputs(p)
    if perfetto:
        check_output_file(perfetto, [], "--perfetto")  # (a directory: refused before the work)
    tr = _trace.load(
        trace_in,
        step_names=tok.settings.get("step_names"),
        normalize=tok.settings.get("normalize"),
        warn=False,
    )
    apart = _trace._sources_apart(tr)
    if apart is not None:  # (unrelated captures diagnosed as one would get one, wrong, answer)
        raise TellerIOError(
            f"{p}: {apart.split(': they are read as')[0]}: not one capture; diagnose each on its own "
            "(teller diagnose FILE FILE ...)",
            path=str(p),
        )
    # (said once the capture is read: a path that is no trace is named for that, not for its log)
    modalities = cfg.get("model", {}).get("modalities", "both")
    if log_path is None and modalities != "trace":
        warnings.warn(
            f"{p}: no log.txt beside the trace: "
            + (
                "this log-only model reads nothing else (its causes are its priors; flagged unfamiliar)"
                if modalities == "log"
                else "the model's log side reads an empty log (its causes rest on the trace alone)"
            ),
            stacklevel=2,
        )
    # what the loader had to skip or repair (a raw file cut short, unknown categories): the diagnosis
    # rests on what was read, so say so (the collector's info notes stay out)
    if perfetto:
        check_output_file(
            perfetto, [*(src["path"] for src in tr.sources), *([log_path] if log_path else [])], "--perfetto"
        )
    input_warnings = _trace.split_collector_notes(tr.warnings)[1]
    for w in input_warnings:
        warnings.warn(w, TellerWarning, stacklevel=2)
    trace_side = cfg.get("model", {}).get("modalities", "both") != "log"
    multi = len(np.unique(tr.pid[tr.link[tr.link >= 0]])) > 1
    if trace_side and multi and int(cfg.get("shards_version") or 4) < 6:
        warnings.warn(
            f"{checkpoint}: trained on shards version {cfg.get('shards_version') or '< 5'}, which linked "
            "every process's GPU work to the first process's calls; this multi-process trace is linked per "
            "process now, so the model sees inputs it was not trained on: retrain it",
            stacklevel=2,
        )
    t0 = time.perf_counter()
    lines = parse_log(log_path) if log_path else []
    s, x = sample_inputs(tr, lines, tok, logtok, cfg, p.name)
    ids, feats, offs, ev, lids, lfeat, n = (
        x[k] for k in ("ids", "feats", "offs", "ev", "lids", "lfeat", "n")
    )
    unfamiliar = _unfamiliar(tr, lids, tok, logtok, cfg.get("model", {}).get("modalities", "both"))
    if trace_side and n < len(ids):
        # (the model reads the first max_trace_tokens, as in training: the rest of a long capture is
        # neither scored nor searched for culprits)
        cut = (
            f"{p}: the model reads the first {n} of the capture's {len(ids)} trace tokens "
            f"(max_trace_tokens of {checkpoint}; up to {_time_at(tr, ev, offs, n)}): causes and culprits "
            "rest on that part; capture a shorter window, or diagnose a cut of the trace"
        )
        warnings.warn(cut, TellerWarning, stacklevel=2)
        input_warnings = [*input_warnings, cut]
    with torch.no_grad():
        out = model(collate([s]))
    probs = torch.softmax(out["logits"][0].float() / temperature, -1).numpy()  # (calibrated)
    # (a model without a localization head, log-only: no culprit events, where 0 scored every one 0.5)
    loc = out["loc_logits"][0, :n].float().numpy() if "loc_logits" in out else np.full(n, -np.inf)
    names = cfg["label_names"]
    if ens is not None:
        probs, loc = _ensemble(ens, names, probs, out, n, tr, tok, ids, feats, lids, lfeat, lines)
    infer_ms = 1000 * (time.perf_counter() - t0)
    order = np.argsort(-probs, kind="stable")
    causes = [
        {
            "cause": names[c],
            "confidence": float(probs[c]),
            "layer": FAULT_INFO[names[c]][0] if names[c] in FAULT_INFO else None,
        }
        for c in order[: max(top, 1)]
    ]
    # localization: token scores -> events -> symbols / families / ranks. An event's score is the
    # highest of the tokens it is in (vectorized: a Python loop over tokens and events was ~5 ms of
    # a `default` diagnosis)
    sig = 1 / (1 + np.exp(-loc))
    o = np.asarray(offs[: n + 1], np.int64)
    pos_ev = np.asarray(ev[o[0] : o[-1]], np.int64) if n else np.zeros(0, np.int64)
    pos_tok = np.repeat(np.arange(n), np.diff(o))
    inside = pos_ev >= 0
    score = np.zeros(len(tr))
    np.maximum.at(score, pos_ev[inside], sig[pos_tok[inside]])
    seen = np.zeros(len(tr), bool)
    seen[pos_ev[inside]] = True
    culprit = np.flatnonzero(seen & (score >= 0.5))  # (ascending event index)
    syms = tr.symbols
    sym_col = np.asarray(tr.symbol, np.int64)
    dev = np.asarray(tr.device, np.int64)
    pid = np.asarray(tr.pid, np.int64)
    dur = tr.dur
    # "how far from normal": against the tokenizer's per-symbol statistics of the training corpus,
    # in their units (ln(1 + us); until session 30 this took ln(ns), which read every operator
    # ln(1000) / std, some 15, too slow)
    operators = []
    by_sym = culprit[np.argsort(sym_col[culprit], kind="stable")]
    for evs in np.split(by_sym, np.flatnonzero(np.diff(sym_col[by_sym])) + 1) if len(by_sym) else []:
        sym = syms[int(sym_col[evs[0]])]
        sid = tok.symbol_id(sym)
        # (None where there is no "normal" to be far from: a symbol the training corpus never had, or
        # never timed; the [UNK] id's statistics are of other symbols)
        timed = tok.has_duration_stats and bool(tok.known([sym])[0]) and int(tok.stats["count"][sid]) > 0
        z = tok.duration_z(sid, dur[evs]) if timed else None
        name = sym.split(":", 1)[-1]
        ranks = np.unique(np.where(dev[evs] >= 0, dev[evs], pid[evs]))
        sc = score[evs]
        operators.append(
            {
                "symbol": sym,
                "kernel_family": kernel_family(name) if sym.startswith("kernel:") else None,
                "score": float(sc.mean()),
                "events": len(evs),
                "example_events": [int(e) for e in evs[np.argsort(-sc, kind="stable")[:5]]],
                "mean_dur_us": float(dur[evs].mean() / 1000),
                "dur_z": z,
                "ranks_or_pids": [int(r) for r in ranks[:8]],
                # the summary-row head's score of its symbol (set below; None without that head)
                "symbol_score": None,
                "_events": evs,  # (the highlight's; dropped below)
                "_sid": sid,
            }
        )

    head = "summary_loc_logits" in out
    symbols = _culprit_symbols(out, s, tok) if head else []
    if head:
        # the summary-row head's score of each operator's symbol: a trace token spans many events of
        # many symbols, so the token head's scores of a capture's operators are nearly level, and it
        # cannot say which of them is the culprit (operator_rank_key). Looked up by the row's id: a
        # symbol the tokenizer does not know takes its layer's [UNK] row, as in the model's input;
        # one without a row (past max_summary_tokens) keeps None and ranks as 0
        row_sc = _row_scores(out)
        by_id = {int(i): float(row_sc[k]) for k, i in enumerate(np.asarray(s.summary_ids, np.int64))}
        for o in operators:
            v = by_id.get(int(o["_sid"]))
            o["symbol_score"] = v if v is not None and np.isfinite(v) else None  # (a NaN logit: no score)
    for o in operators:
        del o["_sid"]
    operators.sort(key=operator_rank_key)
    fam: dict[str, float] = defaultdict(float)
    for o in operators:
        if o["kernel_family"]:
            # (weighted by the symbol's score where the model has the summary-row head)
            w = (o["symbol_score"] or 0.0) if head else 1.0
            fam[o["kernel_family"]] += o["score"] * o["events"] * w
    evidence_lines = [f"{st} {txt}" for _, st, txt in lines if _notable(txt)][:8]
    culprit_events = [int(e) for e in culprit]
    # what --perfetto highlights: the events of the culprit operators the report lists, not every
    # event scored 0.5 or more. A trace token spans many events (a demo tokenizer's ten tokens cover
    # a whole capture), so the threshold alone marked 70-80 % of a capture and pointed at nothing;
    # the listed operators' events are the ones the report names (session 39)
    shown = operators[: max(top, 1) * 2]
    # with a summary-row head, of those the ones whose symbol it scores 0.5 or more (the rows below
    # them are listed as the token head's evidence, not marked as culprits); all where none is
    marked = [o for o in shown if symbol_marked(o)] if head else shown
    marked = marked or shown
    highlighted = sorted(e for o in marked for e in o["_events"])
    for o in operators:
        o.pop("_events")
    if causes and causes[0]["cause"] == "normal":
        # (the localization head is trained on faulty captures only: for a capture called normal its
        # scores point at nothing, so nothing is marked; the operators stay in --json, unranked
        # evidence, and the text view says why it lists none)
        highlighted = []
    # where the listed operators' events are (what --perfetto marks): the GPUs of their device events,
    # the processes of the rest
    ce = np.asarray(highlighted, np.int64)
    where = {
        "devices": [int(v) for v in np.unique(dev[ce][dev[ce] >= 0])[:16]],
        "pids": [int(v) for v in np.unique(pid[ce][dev[ce] < 0])[:16]],
    }
    if perfetto:
        tr.to_chrome(perfetto, highlight=highlighted)
    from teller.findings import findings

    facts = findings(tr)
    changes = None
    if baseline is not None:
        from teller.compare import compare

        base_tr = baseline if hasattr(baseline, "summary") else load_baseline(baseline, checkpoint)
        c = compare(base_tr, tr, top=max(top, 1) * 3, step_patterns=tok.settings.get("step_names"))
        changes = {"path": None if base_tr is baseline else str(baseline), **c}
    return {
        "path": str(p),
        "root_causes": causes,
        # the top cause below UNSURE_BELOW: the evidence does not settle it (a calibrated model's
        # answers that unsure were right six times in ten on the benchmark: docs/models.md)
        "uncertain": bool(causes and is_uncertain(causes[0]["confidence"])),
        # the temperature of the model's probabilities (the checkpoint's calibration, 1 without; for an
        # ensemble its MoT's at fit time, before the mix with the GBDT)
        "temperature": temperature,
        # how much of the capture the checkpoint's tokenizers never saw in training (_unfamiliar)
        "unfamiliar": unfamiliar,
        "operators": shown,
        "kernel_families": sorted(fam, key=lambda k: -fam[k])[:5],
        "culprit_symbols": symbols[: max(top, 1) * 2],
        "log_evidence": evidence_lines,
        # what the capture itself shows, without the model (teller.findings: GPU time breakdown rules)
        "findings": facts,
        # what changed from the healthy capture given as --baseline (teller.compare), or None
        "baseline": changes,
        "culprit_events": len(culprit_events),
        # the events --perfetto marks: those of the listed operators (a subset of the culprit events)
        "highlighted_events": len(highlighted),
        # the GPUs (device indices) and host processes (pids) of the highlighted events
        "culprit_where": where,
        "trace_tokens": int(len(ids)),
        # (the first trace_tokens_read of them are what the model read: its max_trace_tokens)
        "trace_tokens_read": int(n) if trace_side else 0,
        "log_tokens": int(len(s.log_ids)),
        "inference_ms": infer_ms,
        "total_ms": 1000 * (time.perf_counter() - t_load),
        "perfetto": str(perfetto) if perfetto else None,
        "input_warnings": input_warnings,
    }


def _ensemble(
    ens: dict[str, Any],
    names: list[str],
    probs: np.ndarray,
    out: dict[str, torch.Tensor],
    n: int,
    tr: Any,
    tok: Any,
    ids: np.ndarray,
    feats: np.ndarray,
    lids: Any,
    lfeat: Any,
    lines: list[tuple[int, str, str]],
) -> tuple[np.ndarray, np.ndarray]:
    """The ensemble's cause probabilities (the MoT's mixed with the GBDT's, on the features the GBDT
    was trained on, built as ``teller tokenize`` stores them) and the localization of its likeliest
    fault."""

    from teller.data.summary import summary_options, symbol_summary
    from teller.models.baselines import RawSample, gbdt_proba_one, load_baselines
    from teller.models.ensemble import mix

    b = load_baselines(Path(ens["baselines"]) / "baselines.pkl")
    bcfg = Path(ens["baselines"]) / "config.json"
    bc = json.loads(bcfg.read_text()) if bcfg.is_file() else {}
    su_ids, su_f = symbol_summary(
        tr, tok, **summary_options(bc), ref_resid=reference_residuals(bc, tr, lines)
    )
    lf = np.asarray(lfeat, np.float64).reshape(-1, 2)
    rs = RawSample(
        label=0,
        trace_ids=np.asarray(ids, np.int64),
        trace_features=np.asarray(feats, np.float64),
        culprit=np.zeros(len(ids), bool),
        log_ids=np.asarray(lids, np.int64),
        log_values=lf[:, 1],
        log_times=lf[:, 0],
        summary_ids=su_ids.astype(np.int64),
        summary_features=su_f.astype(np.float64),
    )
    pg = np.zeros(len(names))
    pg[[names.index(b.label_names[c]) for c in b.gbdt.classes_]] = gbdt_proba_one(b, rs)
    q = mix(probs[None], pg[None], float(ens["weight"]))[0]
    # (a model without a localization head, log-only: no culprit events, where 0 scored every one 0.5)
    loc = out["loc_logits"][0, :n].float().numpy() if "loc_logits" in out else np.full(n, -np.inf)
    if "loc_logits_by_class" in out:
        f = q.copy()
        if "normal" in names:
            f[names.index("normal")] = -1.0
        loc = out["loc_logits_by_class"][0, :n, int(np.argmax(f))].float().numpy()
    return q, loc


def _row_scores(out: dict[str, Any]) -> np.ndarray:
    """The summary-row head's score (a probability) of each of the first sample's summary rows."""
    return 1 / (1 + np.exp(-out["summary_loc_logits"][0].float().numpy()))


def _culprit_symbols(out: dict[str, Any], s: Any, tok: Any) -> list[dict[str, Any]]:
    """The summary rows ranked by the summary-row culprit head (``model.summary_loc``), with the
    row's own evidence: the load-normalized shift of the symbol inside the capture and its z-score
    (teller.data.summary)."""
    from teller.data.summary import SUMMARY_FEATURE_NAMES

    sc = _row_scores(out)
    rows = []
    f = s.summary_features
    col = {n: i for i, n in enumerate(SUMMARY_FEATURE_NAMES)}

    def get(r: np.ndarray, name: str) -> float | None:  # (a model may read only the first columns)
        return float(r[col[name]]) if len(r) > col[name] else None

    for k in np.argsort(-sc[: len(s.summary_ids)], kind="stable"):
        r = f[k]
        rows.append(
            {
                "symbol": tok.token_str(int(s.summary_ids[k])),
                "score": float(sc[k]),
                "events": int(r[0]) if len(r) else 0,
                "shift": get(r, "shift"),
                "shift_z": get(r, "shift_z"),
                # per process, the load-normalized change inside minus outside the window: one rank
                "rank_spread": get(r, "shift_pid_spread"),
                # a collective's transfer (its fastest rank's time), apart from waiting for peers
                "transfer_shift": get(r, "xfer_shift"),
                # against the deployment's kernel reference at the same load: the symbol, and its
                # whole family in the capture (e.g. +0.03: 3 % slower; None: no reference for it)
                "vs_reference": _ratio(get(r, "ref_dev"), get(r, "ref_cov")),
                "family_vs_reference": _ratio(get(r, "ref_fam_dev"), get(r, "ref_cov")),
            }
        )
    return rows


def _ratio(resid: float | None, cov: float | None) -> float | None:
    """A median residual x - reference(x), x = ln(1 + dur_us), as a relative change of the duration
    (exact for durations well above 1 us), or None where the row had no reference residual."""
    if resid is None or not cov:
        return None
    return float(np.expm1(resid))


# a top cause less likely than this is reported as uncertain (below it the calibrated recipe MoTs'
# answers were right 58 % / 61 % of the time on test / test_ood (AC@1), at or above it 97-98 %:
# docs/models.md, "Checkpoints")
UNSURE_BELOW = 0.7


# a capture with at least this share of its trace events, or of its log words, unknown to the
# checkpoint's tokenizers is flagged as unlike the training data. Measured (default preset): the
# simulator's val, test and test_ood captures (unseen GPUs and models included) have no unknown
# event and at most 1.7 % unknown log words; a CPU run of teller collect against a simulator-trained
# model 100 % of its events and 48 % of its log words; real profiler captures 66-97 % of events.
UNFAMILIAR_FROM = 0.5


def _unfamiliar(tr: Any, lids: np.ndarray, tok: Any, logtok: Any, modalities: str = "both") -> dict[str, Any]:
    """The share of the trace's events (those in its steps, which the model encodes) whose symbol
    the TPE tokenizer does not know and of the log's words the log tokenizer does not know (``[UNK]``
    among the word tokens: placeholders such as ``<num>`` and punctuation, known whatever the log,
    are left out; each 0 when there are none), and ``flagged``: either at least
    :data:`UNFAMILIAR_FROM`, of the sides the model reads (``modalities``: both, trace or log).
    Such a capture (another engine, workload or machine than the training data's) is encoded mostly
    as ``[UNK]``, and the model's confidence says nothing about it: the calibration was fitted on
    captures like the training data. ``lids``: the log's ``LogTokenizer.encode_lines`` ids."""
    ev = np.asarray(tr.symbol, dtype=np.int64)
    in_steps = np.asarray(tr.step, dtype=np.int64) >= 0
    if in_steps.any():  # (the events the model reads: those of the steps)
        ev = ev[in_steps]
    trace_share = float(1.0 - tok.known(tr.symbols)[ev].mean()) if len(ev) else 0.0
    is_word = getattr(logtok, "_word_mask", None)
    if is_word is None:  # (once per tokenizer: the model cache keeps it)
        is_word = logtok._word_mask = word_mask(logtok.vocab)
    lids = np.asarray(lids, dtype=np.int64)
    unk = lids == logtok.index["[UNK]"]
    n_words = int(unk.sum() + is_word[lids[~unk]].sum())
    log_share = float(unk.sum() / n_words) if n_words else 0.0
    flagged = (
        (modalities != "log" and trace_share >= UNFAMILIAR_FROM)
        or (modalities != "trace" and log_share >= UNFAMILIAR_FROM)
        # (a log-only model given no log word reads nothing at all: whatever it says is its prior)
        or (modalities == "log" and n_words == 0)
    )
    return {
        "trace_events": trace_share,
        "log_words": log_share,
        "flagged": bool(flagged),
        # (how many each share is of: a share of nothing is said as such, not as "0 %")
        "trace_events_n": int(len(ev)),
        "log_words_n": n_words,
    }


def symbol_marked(o: dict[str, Any]) -> bool:
    """Whether an operator's symbol score reads 0.5 or more, to the two decimals the report shows
    and ranks by (a 0.497 shown as "0.50" is marked as a 0.50 is)."""
    return _shown_symbol_score(o) >= 0.5


def _shown_symbol_score(o: dict[str, Any]) -> float:
    """An operator's symbol score to the two decimals the report shows (None: 0)."""
    return round(float(o.get("symbol_score") or 0.0), 2)


def operator_rank_key(o: dict[str, Any]) -> tuple[float, float, str]:
    """The order of the culprit operators. With a summary-row head (``symbol_score``: its score of the
    operator's symbol; None, ranked as 0, for a symbol without a row) that score first, to the two
    decimals the report shows, then the evidence below; without one (``symbol_score`` None or absent
    everywhere) the evidence alone: the token head's mean score x log1p(events) x (1 + max(0, dur_z)).

    The token head alone cannot order a capture's operators: a trace token spans many events of
    many symbols, so their scores are nearly level (0.90-0.91 for every row of a PCIe fault). On
    the recipe's seed-0 MoT (version 6; docs/models.md, "teller diagnose") a symbol holding a
    culprit event came first on 0.43 of the faulty test samples by the evidence key, 0.985 with
    the summary-row score first (val 0.46 / 0.985, test_ood 0.38 / 0.975). Without the dur_z factor the
    most frequent symbols came first whenever the scores were level (cudaLaunchKernel first in 12
    of 13 faults on the demo model); with it a culprit symbol was first on 0.45 of the demo dataset's
    faulty test and test_ood samples against 0.37."""
    slower = max(0.0, o["dur_z"] or 0.0)
    evidence = o["score"] * float(np.log1p(o["events"])) * (1.0 + slower)
    return (-_shown_symbol_score(o), -evidence, o["symbol"])


def is_uncertain(confidence: float) -> bool:
    """Whether a top cause this likely is reported as uncertain: below :data:`UNSURE_BELOW`, or not a
    number (the complement of ``metrics.selective``'s ``>=`` at that level)."""
    return not (float(confidence) >= UNSURE_BELOW)


def _score_cell(r: dict[str, Any], by_sym: bool) -> str:
    """An operator's score as the table shows it: its symbol's (``-`` for one without a summary row)
    where the model has a summary-row head, else the token head's."""
    if not by_sym:
        return f"{r['score']:.2f}"
    return "-" if r.get("symbol_score") is None else f"{r['symbol_score']:.2f}"


def render(d: dict[str, Any], console: Any) -> None:
    from rich.text import Text

    # the path on its own line: as the table's title it would wrap at the narrow table's width
    console.print(Text(str(d["path"]), style="bold"))
    causes = [(c["cause"], f"{c['confidence']:.3f}", str(c["layer"] or "-")) for c in d["root_causes"]]
    table_or_list(
        console,
        "root causes",
        ("cause", "confidence", "layer"),
        causes,
        min_name=max((len(c[0]) for c in causes), default=5),
        numbered=True,
    )
    if d.get("uncertain") and d["root_causes"]:
        # the two likeliest causes (one with --top 1)
        alts = " or ".join(f"{c['cause']} ({c['confidence']:.2f})" for c in d["root_causes"][:2])
        console.print(f"uncertain: {alts}; the capture does not settle it", highlight=False)
    u = d.get("unfamiliar") or {}
    if u.get("flagged"):
        kinds = (("trace_events", "trace events"), ("log_words", "log words"))
        # (a side with nothing in it is said as such, not as "0 %"; older results lack the counts)
        sides = [f"{100 * u[k]:.0f} % of its {what}" for k, what in kinds if u.get(f"{k}_n", 1)]
        none = [what for k, what in kinds if not u.get(f"{k}_n", 1)]
        console.print(
            f"unfamiliar capture: {' and '.join(sides)} are unknown to this model's tokenizers"
            + (f" (it has no {' and no '.join(none)})" if none else "")
            + "; it was trained on other captures, so these causes and confidences are guesses "
            "(train on captures like this one: docs/models.md)",
            highlight=False,
            markup=False,
        )
        console.print(
            f"  the full breakdown of the capture, without a model: "
            f"teller trace summary {shlex.quote(str(d['path']))}",
            highlight=False,
            markup=False,
        )
    # the score: where the model has a summary-row head, its score of the operator's symbol (what the
    # rows are ranked by: operator_rank_key; the token head's, nearly level across a capture's
    # operators, stays in --json as "score"); else the token head's mean score. (One column: the
    # table keeps its width before it folds to a list, about 86 columns with long kernel names)
    by_sym = any(r.get("symbol_score") is not None for r in d["operators"])
    cols = ("symbol", "family", "score", "events", "mean dur us", "dur z", "ranks/pids")
    rows = [
        (
            r["symbol"],
            str(r["kernel_family"] or "-"),
            _score_cell(r, by_sym),
            str(r["events"]),
            f"{r['mean_dur_us']:.1f}",
            "-" if r["dur_z"] is None else f"{r['dur_z']:+.1f}",
            ",".join(map(str, r["ranks_or_pids"])),
        )
        for r in d["operators"]
    ]
    if d["root_causes"] and d["root_causes"][0]["cause"] == "normal":
        console.print(
            "culprit operators: none, the likeliest cause is normal (the localization head is trained on "
            "faulty captures; --json keeps its scores)",
            highlight=False,
        )
    elif d["operators"]:
        title = (
            "culprit operators (score: the symbol's, summary-row head)"
            if by_sym
            else "culprit operators (localization head)"
        )
        table_or_list(console, title, cols, rows)
    else:  # (a table of headers alone reads as a rendering fault)
        console.print(
            "culprit operators: no event scored 0.5 or more by the localization head", highlight=False
        )
    if d.get("culprit_symbols") and d["root_causes"] and d["root_causes"][0]["cause"] != "normal":
        # (the head is trained on faulty samples only: for a run called normal its ranking means little)
        cols = ("symbol", "score", "events", "shift", "shift z", "rank spread", "transfer shift")

        def _f(v: float | None) -> str:
            return "-" if v is None else f"{v:+.2f}"

        def _pct(v: float | None) -> str:
            return "-" if v is None else f"{100 * v:+.1f}%"

        rows = [
            (
                r["symbol"],
                f"{r['score']:.2f}",
                str(r["events"]),
                _f(r["shift"]),
                _f(r["shift_z"]),
                _f(r["rank_spread"]),
                _f(r["transfer_shift"]) if r["transfer_shift"] else "-",
                _pct(r.get("vs_reference")),
                _pct(r.get("family_vs_reference")),
            )
            for r in d["culprit_symbols"]
        ]
        table_or_list(
            console,
            "culprit symbols (summary-row head; shift: load-normalized change in the capture)",
            (*cols, "vs ref", "family vs ref"),
            rows,
        )
    if d["log_evidence"]:
        console.print("log evidence:")
        for line in d["log_evidence"]:
            # one console line per log line, cut at the console's width (the whole line is in --json)
            console.print("  " + line, highlight=False, markup=False, no_wrap=True, overflow="ellipsis")
    if (d.get("baseline") or {}).get("statements"):
        console.print("what changed from the baseline (no model; largest first):")
        for line in d["baseline"]["statements"][:6]:
            console.print("  - " + line, highlight=False, markup=False, soft_wrap=True)
    if d.get("findings"):
        console.print("what the capture itself shows (no model; largest share of time first):")
        from teller.findings import group_findings

        for f in group_findings(d["findings"])[:4]:
            console.print("  - " + f["message"], highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"inference {d['inference_ms']:.1f} ms (total with loading {d['total_ms']:.0f} ms)"
        + (f"; Perfetto trace: {d['perfetto']}" if d["perfetto"] else ""),
        highlight=False,
    )


def render_summary(ds: list[dict[str, Any]], console: Any) -> None:
    """One row per diagnosed capture (``teller diagnose PATH...``): its likeliest cause and
    confidence, the second one, the top culprit (the first culprit operator where they are ranked
    by the summary-row head's symbol score and it scores 0.5 or more, so that it is among the events
    of the "where" column; else that head's first symbol; else the first operator, ranked by the
    token head, whose level scores favour frequent symbols such as ``cudaLaunchKernel``), the GPUs
    and processes of the listed culprit operators' events, and the flags; a capture that could not
    be read shows its error."""

    # paths under one directory are shown relative to it (named in the title), so that a batch of
    # sample directories reads s000010, s000011, ... rather than one long path folded over lines
    under = _common_dir([str(d["path"]) for d in ds])
    title = f"{len(ds)} capture{'s' * (len(ds) != 1)}" + (f" under {under}" if under else "")
    shown = [os.path.relpath(str(d["path"]), under) if under else str(d["path"]) for d in ds]
    rows: list[tuple[str, ...]] = []
    errors: list[tuple[str, str]] = []
    for d, path in zip(ds, shown, strict=True):
        if "error" in d:
            # (after the table, whole: a message in a cell would need a table as wide as it)
            errors.append((path, str(d["error"])))
            continue
        rc = d["root_causes"]
        top = rc[0] if rc else {"cause": "-", "confidence": float("nan")}
        nxt = f"{rc[1]['cause']} ({rc[1]['confidence']:.2f})" if len(rc) > 1 else "-"
        sym = None
        if top["cause"] != "normal":
            # (the first operator where the summary-row head ranked them and marks it; one it scores
            # below 0.5 is not its culprit: then its first row)
            ops = d["operators"]
            by_head = bool(ops) and ops[0].get("symbol_score") is not None and symbol_marked(ops[0])
            sym = ((ops if by_head else None) or d.get("culprit_symbols") or ops or [{}])[0].get("symbol")
        w = d.get("culprit_where") or {}
        parts = [
            f"{k} {','.join(map(str, w[f]))}" for k, f in (("gpu", "devices"), ("pid", "pids")) if w.get(f)
        ]
        where = "; ".join(parts)
        flags = ["uncertain"] * bool(d.get("uncertain")) + ["unfamiliar"] * bool(
            (d.get("unfamiliar") or {}).get("flagged")
        )
        rows.append(
            (
                path,
                top["cause"],
                f"{top['confidence']:.2f}",
                nxt,
                sym or "-",
                (where or "-") if sym else "-",
                ", ".join(flags) or "-",
            )
        )
    # the top culprit folds; everything else is whole, in the table or, too narrow for it, a list
    if rows:
        table_or_list(
            console,
            title,
            ("path", "cause", "conf", "next", "top culprit", "where", "flags"),
            rows,
            fold=4,
        )
    elif errors:
        console.print(f"{title}:", highlight=False, markup=False, emoji=False)
    for path, err in errors:
        console.print(f"  {path}: error: {err}", highlight=False, markup=False, emoji=False, soft_wrap=True)


def _common_dir(paths: list[str]) -> str | None:
    """The deepest directory holding every path, as the paths spell it; None for fewer than two
    paths, for paths with nothing in common but the root or the working directory, or a mix of
    absolute and relative ones."""
    if len(paths) < 2:
        return None
    try:
        common = os.path.commonpath([os.path.normpath(p) for p in paths])
    except ValueError:  # absolute and relative paths mixed
        return None
    if common in ("", ".", os.sep) or common in {os.path.normpath(p) for p in paths}:
        return None  # (nothing shared; or one path is the directory holding the others: keep them whole)
    return common
