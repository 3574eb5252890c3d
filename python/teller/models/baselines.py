"""Baselines, evaluated on the same splits as the deep models (``teller train baselines``).

* ``gbdt``: scikit-learn ``HistGradientBoostingClassifier`` on aggregated features: per-symbol timing
  (for the most frequent TPE tokens of train: count, mean/max duration z-score, mean log duration,
  events), global timing statistics, the log's word counts and, per word, the mean/max of the number
  that follows it (throughput, KV usage, ...). Hyper-parameters are chosen on val.
* ``zscore``: a per-symbol anomaly scorer fitted on the *normal* train samples (mean/std of each
  token's log-scaled timing features); a sample is faulty when its largest |z| passes a threshold
  chosen on val, and the cause comes from rules on the most anomalous token's symbols and the log.

Both localize with the per-token anomaly score (the GBDT has no per-token output).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from teller._io import dir_lock
from teller.data.dataset import read_json
from teller.data.summary import N_SUMMARY_FEATURES
from teller.data.tokenize import LogTokenizer, ShardedSplit, read_shards_manifest, split_names
from teller.errors import ConfigError, TellerFileNotFoundError
from teller.models.data import BOL_ID, NUM_ID
from teller.models.metrics import Prediction, metrics_for


def gbdt_min_leaf(n_train: int, n_classes: int) -> int:
    """The GBDT's smallest leaf: scikit-learn's 20 wherever a class has about 40 training samples
    (the simulated benchmarks: unchanged), smaller on a few dozen collected runs, where a leaf of 20
    cannot split at all and the trees would predict the most common class."""
    return int(np.clip(n_train // max(2 * n_classes, 1), 2, 20))


@dataclass
class RawSample:
    label: int
    trace_ids: np.ndarray
    trace_features: np.ndarray
    culprit: np.ndarray
    log_ids: np.ndarray
    log_values: np.ndarray
    log_times: np.ndarray | None = None  # ms, per log token (its line's time)
    summary_ids: np.ndarray | None = None
    summary_features: np.ndarray | None = None
    severity: float = float("nan")
    effect_events: int = -1
    effect_share: float = float("nan")
    sample_id: str = ""


def load_raw(run_dir: str | Path, split: str) -> tuple[list[RawSample], list[str]]:
    out = []
    names: list[str] = []
    for sp in split_names(run_dir, split):
        ss = ShardedSplit(run_dir, sp)
        names = ss.label_names
        out.extend(_raw(ss[i]) for i in range(len(ss)))
    return out, names


def _raw(d: dict[str, Any]) -> RawSample:
    return RawSample(
        label=int(d["label"]),
        trace_ids=np.asarray(d["trace_ids"], np.int64),
        trace_features=np.asarray(d["trace_features"], np.float64),
        culprit=np.asarray(d["trace_culprit"], bool),
        log_ids=np.asarray(d["log_ids"], np.int64),
        log_values=np.asarray(d["log_features"][:, 1], np.float64),
        log_times=np.asarray(d["log_features"][:, 0], np.float64),
        summary_ids=np.asarray(d["summary_ids"], np.int64),
        summary_features=np.asarray(d["summary_features"], np.float64),
        severity=float(d.get("severity", np.nan)),
        effect_events=int(d.get("effect_events", -1)),
        effect_share=float(d.get("effect_share", np.nan)),
        sample_id=str(d.get("sample_id", "")),
    )


def _slog(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


class ZScoreScorer:
    """Per-token-type anomaly scores against the normal samples of train."""

    def __init__(self, trace_vocab: int) -> None:
        self.v = trace_vocab
        self.mean = np.zeros((trace_vocab, 5))
        self.std = np.ones((trace_vocab, 5))
        self.gmean = np.zeros(5)
        self.gstd = np.ones(5)

    def fit(self, normals: Sequence[RawSample]) -> ZScoreScorer:
        ids = np.concatenate([s.trace_ids for s in normals])
        f = _slog(np.concatenate([s.trace_features for s in normals]))
        self.gmean, self.gstd = f.mean(0), f.std(0) + 1e-3
        cnt = np.bincount(ids, minlength=self.v).astype(float)
        s1 = np.zeros((self.v, 5))
        s2 = np.zeros((self.v, 5))
        np.add.at(s1, ids, f)
        np.add.at(s2, ids, f * f)
        seen = cnt >= 3
        self.mean[seen] = s1[seen] / cnt[seen, None]
        var = s2[seen] / cnt[seen, None] - self.mean[seen] ** 2
        self.std[seen] = np.sqrt(np.maximum(var, 0)) + 0.25 * self.gstd
        self.mean[~seen] = self.gmean
        self.std[~seen] = self.gstd
        self.seen = seen
        return self

    def token_scores(self, s: RawSample) -> np.ndarray:
        """|z| per token: the largest over the slow-down-oriented features (durations, idle gaps)."""
        f = _slog(s.trace_features)
        z = (f - self.mean[s.trace_ids]) / self.std[s.trace_ids]
        sc = np.max(np.abs(z[:, 1:]), axis=1)
        return sc + 2.0 * (~self.seen[s.trace_ids])


RULES: list[tuple[tuple[str, ...], str]] = [
    (("cross_device_reduce", "ncclDevKernel", "all_reduce"), "nvlink_degradation"),
    (("Memcpy", "cudaMemcpyAsync"), "pcie_degradation"),
    (("gemm", "FlashAttnFwd", "flash_fwd_kernel"), "gpu_throttle"),
    (("elementwise", "aten::add_"), "launch_storm"),
    (
        ("rms_norm", "rotary", "reshape_and_cache", "act_and_mul", "splitkv", "indexSelect", "SoftMax"),
        "hbm_contention",
    ),
    (("annotation:schedule",), "kv_cache_exhaustion"),
    (("cudaLaunchKernel",), "eager_mode_misconfig"),
    (("annotation:engine_step",), "network_delay"),
    (("host_op:", "runtime:", "annotation:"), "cpu_contention"),
]
LOG_RULES: list[tuple[tuple[str, ...], str]] = [
    (("outofmemoryerror", "oom"), "oom_error"),
    (("preempted", "preemption"), "kv_cache_exhaustion"),
]


def _summary_block(s: RawSample, top_sym: np.ndarray, width: int = N_SUMMARY_FEATURES) -> np.ndarray:
    """The per-symbol summary rows (teller.data.summary) of the ``top_sym`` base symbols, their first
    ``width`` columns, flattened; zeros for a symbol absent from the sample."""
    out = np.zeros((len(top_sym), width))
    if s.summary_ids is not None and s.summary_features is not None:
        pos = {int(t): k for k, t in enumerate(top_sym)}
        for t, row in zip(s.summary_ids.tolist(), s.summary_features, strict=True):
            k = pos.get(t)
            if k is not None:
                row = row[:width]
                out[k, : len(row)] = row  # (shards v2 have the first 8 columns only)
    return out.ravel()


def _features(s: RawSample, top: np.ndarray, log_vocab: int, lags: bool = True) -> np.ndarray:
    f = _slog(s.trace_features)
    pos = {int(t): k for k, t in enumerate(top)}
    per = np.zeros((len(top), 5))
    cnt = np.zeros(len(top))
    for t, row, raw in zip(s.trace_ids.tolist(), f, s.trace_features, strict=True):
        k = pos.get(t)
        if k is None:
            continue
        cnt[k] += 1
        per[k, 0] += raw[0]
        per[k, 1] = max(per[k, 1], row[3]) if cnt[k] > 1 else row[3]
        per[k, 2] += row[3]
        per[k, 3] += row[2]
        per[k, 4] += row[4]
    nz = np.maximum(cnt, 1)
    per[:, 2:] /= nz[:, None]
    glob = (
        np.concatenate([[len(s.trace_ids)], f.mean(0), f.max(0), f.std(0), f.sum(0)])
        if len(f)
        else np.zeros(21)
    )
    lc = np.log1p(np.bincount(s.log_ids, minlength=log_vocab)[:log_vocab])
    # numbers: value of each <num> attributed to the word before it
    vm = np.zeros(log_vocab)
    vx = np.zeros(log_vocab)
    vn = np.zeros(log_vocab)
    idx = np.flatnonzero(s.log_ids == NUM_ID)
    idx = idx[idx > 0]
    prev = s.log_ids[idx - 1]
    vals = s.log_values[idx]
    np.add.at(vm, prev, vals)
    np.add.at(vn, prev, 1)
    np.maximum.at(vx, prev, vals)
    vm /= np.maximum(vn, 1)
    if not lags:  # (baselines fitted before the lag features)
        return np.concatenate([glob, np.log1p(cnt), per.ravel(), lc, vm, vx])
    # per word, the longest lag between a line holding it and the line before (the MoT's gap features)
    lag = np.zeros(log_vocab)
    if s.log_times is not None and len(s.log_ids):
        line = np.cumsum(s.log_ids == BOL_ID)
        first = np.r_[0, np.flatnonzero(np.diff(line)) + 1]
        t_line = np.maximum.accumulate(s.log_times[first])  # (unstamped lines have time 0)
        lag_line = np.maximum(np.diff(t_line, prepend=t_line[0]), 0.0)
        np.maximum.at(lag, np.minimum(s.log_ids, log_vocab - 1), _slog(lag_line[line - line[0]]))
    return np.concatenate([glob, np.log1p(cnt), per.ravel(), lc, vm, vx, lag])


class Baselines:
    def __init__(
        self,
        label_names: list[str],
        trace_vocab: int,
        log_vocab: list[str],
        tpe_path: str | None,
        top_tokens: int = 96,
        seed: int = 0,
    ) -> None:
        self.label_names = label_names
        self.trace_vocab = trace_vocab
        self.log_vocab = log_vocab
        self.tpe_path = tpe_path
        self.top_tokens = top_tokens
        self.seed = seed
        self.top = np.zeros(0, np.int64)
        self.gbdt: Any = None
        self.zs = ZScoreScorer(trace_vocab)
        self.threshold = 0.0
        self.token_cause: dict[int, str] = {}
        self.info: dict[str, Any] = {}
        self.summary_width = N_SUMMARY_FEATURES
        self.log_lags = True

    # --- features --------------------------------------------------------------------------------
    def _layout(self, n_sym: int) -> tuple[int, bool]:
        """The feature layout this model was fitted with: summary columns per symbol, log lags.
        Pickles older than the attributes are told apart by the width the GBDT was fitted on."""
        if hasattr(self, "summary_width"):
            return int(self.summary_width), bool(self.log_lags)
        v = len(self.log_vocab)
        old = 21 + 6 * len(self.top) + 3 * v + 8 * n_sym
        fitted = getattr(self.gbdt, "n_features_in_", old)
        for width in (N_SUMMARY_FEATURES, 14):  # (14 columns: shards versions 3-6)
            if fitted == old + (width - 8) * n_sym + v:
                return width, True
        return 8, False

    def X(self, samples: Sequence[RawSample]) -> np.ndarray:
        top_sym = getattr(self, "top_sym", np.zeros(0, np.int64))
        width, lags = self._layout(len(top_sym))
        return np.stack(
            [
                np.concatenate(
                    [_features(s, self.top, len(self.log_vocab), lags), _summary_block(s, top_sym, width)]
                )
                for s in samples
            ]
        )

    def _cause_of_token(self, t: int) -> str:
        c = self.token_cause.get(t)
        if c is not None:
            return c
        c = "cpu_contention"
        if self.tpe_path:
            from teller import tpe

            if not hasattr(self, "_tok"):
                self._tok = tpe.load(self.tpe_path)
            s = self._tok.token_str(t)
            for keys, cause in RULES:
                if any(k in s for k in keys):
                    c = cause
                    break
        self.token_cause[t] = c
        return c

    # --- fitting ---------------------------------------------------------------------------------
    def fit(
        self,
        train: Sequence[RawSample],
        val: Sequence[RawSample],
        log: Any = print,
        grid: Sequence[tuple[float, int]] = ((0.05, 15), (0.05, 31), (0.1, 15), (0.1, 31)),
        max_iter: int = 300,
    ) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier

        ids = np.concatenate([s.trace_ids for s in train])
        cnt = np.bincount(ids, minlength=self.trace_vocab)
        self.top = np.argsort(-cnt, kind="stable")[: self.top_tokens]
        self.top = self.top[cnt[self.top] > 0]
        # the same per-symbol summaries the deep models get: the 64 symbols most often present in train
        sids = [s.summary_ids for s in train if s.summary_ids is not None and len(s.summary_ids)]
        if sids:
            sc = np.bincount(np.concatenate(sids), minlength=self.trace_vocab)
            self.top_sym = np.argsort(-sc, kind="stable")[:64]
            self.top_sym = self.top_sym[sc[self.top_sym] > 0]
        else:
            self.top_sym = np.zeros(0, np.int64)
        # the summary columns the shards have (14 before shards version 7), so that no column is
        # fitted as a constant 0 and the width is checked against the shards it later reads
        widths = [s.summary_features.shape[1] for s in train if s.summary_features is not None]
        self.summary_width = min(N_SUMMARY_FEATURES, *widths) if widths else N_SUMMARY_FEATURES
        Xt, yt = self.X(train), np.array([s.label for s in train])
        if not val:  # (tiny datasets) nothing to select on: the first setting
            log("no val samples: the GBDT uses its first setting, the z-score threshold is 0")
            grid = grid[:1]
        Xv, yv = (self.X(val), np.array([s.label for s in val])) if val else (Xt[:0], yt[:0])
        best = (-1.0, None, None)
        if len(train) < 300:  # no internal early stopping on small data: fewer rounds
            max_iter = min(max_iter, 100)
        min_leaf = gbdt_min_leaf(len(yt), len(np.unique(yt)))
        for lr, leaves in grid:
            t0 = time.perf_counter()
            m = HistGradientBoostingClassifier(
                learning_rate=lr,
                max_leaf_nodes=leaves,
                min_samples_leaf=min_leaf,
                max_iter=max_iter,
                l2_regularization=1.0,
                early_stopping=len(train) >= 300,
                validation_fraction=0.15,
                n_iter_no_change=20,
                random_state=self.seed,
            )
            m.fit(Xt, yt)
            acc = float((m.predict(Xv) == yv).mean()) if len(yv) else 0.0
            log(f"gbdt lr={lr} leaves={leaves}: val acc {acc:.3f} ({time.perf_counter() - t0:.0f} s)")
            if acc > best[0]:
                best = (acc, m, {"learning_rate": lr, "max_leaf_nodes": leaves, "min_samples_leaf": min_leaf})
        self.gbdt = best[1]
        self.info["gbdt"] = {"val_accuracy": best[0], "params": best[2]}
        normal = self.label_names.index("normal")
        self.zs.fit([s for s in train if s.label == normal])
        # threshold on val: maximize the balanced detection accuracy (normal vs faulty)
        mx = np.array([self.zs.token_scores(s).max() if len(s.trace_ids) else 0.0 for s in val])
        faulty = np.array([s.label != normal for s in val])
        cands = np.unique(mx)
        # balanced accuracy: ~92 % of the samples are faulty, plain accuracy would flag everything
        accs = [
            0.5 * (float((mx[faulty] > c).mean()) if faulty.any() else 0.0)
            + 0.5 * (float((mx[~faulty] <= c).mean()) if (~faulty).any() else 0.0)
            for c in cands
        ]
        self.threshold = float(cands[int(np.argmax(accs))]) if len(cands) else 0.0
        self.info["zscore"] = {
            "threshold": self.threshold,
            "val_balanced_detection_accuracy": float(max(accs, default=0)),
        }
        acc = self.info["zscore"]["val_balanced_detection_accuracy"]
        log(f"zscore threshold {self.threshold:.2f}: val balanced detection accuracy {acc:.3f}")

    # --- prediction ------------------------------------------------------------------------------
    def predict(self, samples: Sequence[RawSample], which: str) -> tuple[list[Prediction], float]:
        n = len(self.label_names)
        normal = self.label_names.index("normal")
        t0 = time.perf_counter()
        out = []
        for s in samples:
            sc = self.zs.token_scores(s) if len(s.trace_ids) else np.zeros(0)
            if which == "gbdt":
                # (one sample at a time, features included, as the MoT's latency is measured: a
                # batched predict_proba over the split read 0.58 ms a sample on version 5; this, 14.5)
                p = np.zeros(n)
                p[self.gbdt.classes_] = gbdt_proba_one(self, s)
            else:
                p = self._rule_probs(s, sc, normal)
            out.append(
                Prediction(
                    s.label,
                    p,
                    s.trace_ids,
                    sc,
                    s.culprit,
                    severity=s.severity,
                    effect_events=s.effect_events,
                    effect_share=s.effect_share,
                    sample_id=s.sample_id,
                )
            )
        return out, (time.perf_counter() - t0) / max(1, len(samples))

    def _rule_probs(self, s: RawSample, sc: np.ndarray, normal: int) -> np.ndarray:
        n = len(self.label_names)
        p = np.full(n, 0.01)
        words = {self.log_vocab[i] for i in np.unique(s.log_ids) if i < len(self.log_vocab)}
        for keys, cause in LOG_RULES:
            if any(k in words for k in keys) and cause in self.label_names:
                p[self.label_names.index(cause)] += 2.0
        if len(sc) == 0 or sc.max() <= self.threshold:
            p[normal] += 1.0
        else:
            order = np.argsort(-sc, kind="stable")[:3]
            for r, k in enumerate(order):
                c = self._cause_of_token(int(s.trace_ids[k]))
                if c in self.label_names:
                    p[self.label_names.index(c)] += 1.0 / (r + 1)
        return p / p.sum()

    def save(self, path: Path) -> None:
        path.write_bytes(pickle.dumps(self))


def train_baselines(
    data_dir: str | Path,
    output_dir: str | Path,
    log: Any = print,
    extra_train: Sequence[str | Path] = (),
    tpe_dir: str | Path | None = None,
    **fit_kw: Any,
) -> Path:
    """Fit the baselines on ``data_dir``'s train split (plus ``extra_train``'s) into a new run
    directory ``output_dir`` (one holding any run is refused before fitting). ``tpe_dir``: the TPE
    tokenizer the shards were encoded with (checked against their manifest; default: the path it
    names)."""
    from teller.models.data import check_extra_train
    from teller.models.train import (
        _check_tpe,
        _commit,
        _write_tmp,
        check_new_run_dir,
        distinct_extra_train,
        shards_run_dir,
    )

    out = Path(output_dir)
    check_new_run_dir(out)
    # one writer of the run directory at a time (another teller process is refused, named); a directory
    # created for the lock is removed again if nothing is written
    with dir_lock(out, "teller train baselines", transient=True, what="run directory"):
        run_dir = shards_run_dir(data_dir)
        man = read_shards_manifest(run_dir)
        if tpe_dir:
            _check_tpe(tpe_dir, man, run_dir)
        log_vocab = LogTokenizer.load(run_dir / "log_tokenizer.json").vocab
        extra_dirs = [shards_run_dir(e) for e in extra_train]
        distinct_extra_train(run_dir, extra_dirs)
        for e in extra_dirs:
            check_extra_train(run_dir, e)
        train, names = load_raw(run_dir, "train")
        for e in extra_dirs:
            train += load_raw(e, "train")[0]
        val, _ = load_raw(run_dir, "val")
        tpe_path = str(Path(tpe_dir).resolve()) if tpe_dir else man["tokenizer"].get("path")
        b = Baselines(names, int(man["tokenizer"]["vocab_size"]), log_vocab, tpe_path)
        t0 = time.perf_counter()
        b.fit(train, val, log, **fit_kw)
        b.info["fit_seconds"] = time.perf_counter() - t0
        check_new_run_dir(out)  # (again: another run may have been written there while this one fitted)
        out.mkdir(parents=True, exist_ok=True)
        cfg_text = json.dumps(
            {
                "format": "teller-baselines",
                "version": 1,
                "data_dir": str(run_dir.resolve()),
                "extra_train": [str(e.resolve()) for e in extra_dirs],
                "train_samples": len(train),
                "shards_version": int(man.get("version", 1)),
                "summary_width": int(b.summary_width),  # (summary columns the GBDT reads)
                # the kernel reference its summary columns 17-22 were computed with (shards >= 8)
                "reference": str((run_dir / "reference.json").resolve())
                if (run_dir / "reference.json").is_file()
                else None,
                "reference_sha256": (man.get("reference") or {}).get("sha256"),
                "label_names": names,
                "info": b.info,
            },
            indent=1,
        )
        # the model, then its configuration, each through a temporary file renamed into place
        # (the fitted model renamed last: a commit cut short leaves no baselines.pkl to be loaded with
        # another run's configuration; no temporary file is left behind on an error)
        tmps: dict[str, Path] = {}
        try:
            tmps["config.json"] = _write_tmp(out / "config.json", lambda t: t.write_text(cfg_text))
            tmps["baselines.pkl"] = _write_tmp(
                out / "baselines.pkl", lambda t: t.write_bytes(pickle.dumps(b))
            )
            _commit(out, tmps)
        finally:
            for t in tmps.values():
                with contextlib.suppress(OSError):
                    t.unlink(missing_ok=True)
        return out


def load_baselines(path: str | Path) -> Baselines:
    """The fitted baselines pickled by ``teller train baselines`` (trusted input: a pickle runs
    code; load only your own runs); a missing or damaged file is a TellerError naming it."""
    p = Path(path)
    if not p.is_file():
        what = "a directory, not" if p.exists() else "no"
        raise TellerFileNotFoundError(f"{p}: {what} fitted baselines (teller train baselines)", path=str(p))
    try:
        b = pickle.loads(p.read_bytes())
    except Exception as e:  # (unpickling raises anything: EOFError, UnpicklingError, ImportError, ...)
        raise ConfigError(
            f"{p}: not readable fitted baselines ({type(e).__name__}: {e})", path=str(p)
        ) from None
    if not isinstance(b, Baselines):
        raise ConfigError(f"{p}: holds a {type(b).__name__}, not fitted baselines", path=str(p))
    return b


def evaluate_baselines(
    checkpoint: str | Path, data_dir: str | Path | None, split: str
) -> dict[str, dict[str, Any]]:
    from teller.models.train import check_eval_data, check_shards_version, shards_run_dir

    p = Path(checkpoint)
    p = p / "baselines.pkl" if p.is_dir() else p
    b = load_baselines(p)
    cfg = read_json(p.parent / "config.json", "baselines configuration")
    if not isinstance(cfg, dict) or not cfg.get("data_dir") and data_dir is None:
        raise ConfigError(
            f"{p.parent / 'config.json'}: not a baselines configuration (no data_dir)",
            path=str(p.parent / "config.json"),
        )
    run_dir = shards_run_dir(data_dir or cfg["data_dir"])
    check_eval_data(cfg, run_dir, split, p.parent, (int(b.trace_vocab), len(b.log_vocab)))
    check_shards_version(cfg, run_dir)
    samples, names = load_raw(run_dir, split)
    res = {}
    for which in ("gbdt", "zscore"):
        preds, lat = b.predict(samples, which)
        m = metrics_for(preds, names, b.label_names)
        m["latency_ms_per_sample"] = 1000 * lat
        m["split"] = split
        m["model"] = which
        res[which] = m
    return res


def gbdt_proba_one(b: Any, s: RawSample) -> np.ndarray:
    """The GBDT's class probabilities of one sample, on one thread. Decision: sklearn's histogram
    GBDT opens an OpenMP region per tree, and one sample's work is too small to share; where the
    cores are busy its threads wait on each other. Demo GBDT, one test sample at a time on this
    2-core machine (2026-12-07): idle, 22 ms either way; beside two CPU-bound processes, 173-423 ms
    with its threads and 49-64 ms on one (a reviewer saw diagnoses of 0.6-10 s during a test run)."""
    global _THREADPOOLS
    if _THREADPOOLS is None:  # (found once: a threadpool_limits() scans the loaded libraries each
        # time, 0.6 ms with torch loaded; the controller's limit() 0.01 ms)
        try:
            from threadpoolctl import ThreadpoolController

            _THREADPOOLS = ThreadpoolController().limit
        except ImportError:  # (threadpoolctl < 3, which scikit-learn 1.4 accepts)
            from threadpoolctl import threadpool_limits

            _THREADPOOLS = threadpool_limits
    with _THREADPOOLS(limits=1, user_api="openmp"):
        return b.gbdt.predict_proba(b.X([s]))[0]


# the call that limits OpenMP's threads: a ThreadpoolController's limit, or threadpoolctl < 3's
# threadpool_limits (same keywords)
_THREADPOOLS: Callable[..., Any] | None = None
