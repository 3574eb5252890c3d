"""The GBDT's category with the MoT's localization: an evaluation-time ensemble.

The two are strong at different halves of a root cause: the gradient-boosted trees threshold a few
load-normalized numbers and get the category right more often, while the MoT's per-cause
localization head points at the culprit tokens (the GBDT only has a per-token anomaly score). A
candidate (cause c, location l) scores ``p(c) * q(l | c)`` as for the MoT alone, with

    p(c)  proportional to  p_mot(c) ** (1 - w) * p_gbdt(c) ** w

(a geometric mix; ``w`` is chosen on val among ``WEIGHTS`` for the best AC@1, ties going to the
smaller weight, i.e. to the MoT) and ``q`` the MoT's localization. ``teller train ensemble`` writes
a run directory (``config.json``, format ``teller-ensemble``) that ``teller evaluate`` and
``teller results summarize`` take like any other.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from teller._io import dir_lock
from teller.data.dataset import read_json
from teller.data.tokenize import read_shards_manifest
from teller.errors import ConfigError, TellerFileNotFoundError
from teller.models.metrics import Prediction, candidate_rank, metrics_for

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _bad(p: Path, key: str, v: Any, want: str) -> ConfigError:
    return ConfigError(f"{p}: {key}: {v!r} is not {want}", path=str(p))


def _read_cfg(run: Path, fmt: str) -> dict[str, Any]:
    """``run``'s config.json, of format ``fmt``, with the fields the ensemble reads checked (else a
    :class:`TellerError` naming the file and the field)."""
    p = run / "config.json"
    if not p.is_file():
        raise TellerFileNotFoundError(f"{p}: no run configuration", path=str(p))
    cfg = read_json(p, "run configuration")
    if not isinstance(cfg, dict) or cfg.get("format") != fmt:
        got = cfg.get("format") if isinstance(cfg, dict) else type(cfg).__name__
        raise ConfigError(f"{run}: a {got!r} run, expected {fmt!r}", path=str(run))
    names = cfg.get("label_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _bad(p, "label_names", names, "a list of label names")
    if fmt == "teller-ensemble":
        for key in ("mot", "baselines"):
            if not isinstance(cfg.get(key), str) or not cfg[key]:
                raise _bad(p, key, cfg.get(key), f"the path of the ensemble's {key} run")
        w = cfg.get("weight")
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0.0 <= w <= 1.0:
            raise _bad(p, "weight", w, "a number in [0, 1]")
        if not isinstance(cfg.get("model"), str):
            raise _bad(p, "model", cfg.get("model"), "a model name")
        t = cfg.get("mot_temperature", 1.0)
        if type(t) not in (int, float) or not np.isfinite(t) or t <= 0:
            raise _bad(p, "mot_temperature", t, "a positive number (the MoT's temperature at fit time)")
    if not isinstance(cfg.get("data_dir"), str) or not cfg["data_dir"]:
        raise _bad(p, "data_dir", cfg.get("data_dir"), "the path of the shards it was trained on")
    if fmt == "teller-rca-checkpoint" and not (
        isinstance(cfg.get("model"), dict) and isinstance(cfg["model"].get("arch"), str)
    ):
        raise _bad(p, "model", cfg.get("model"), "a model configuration (with its arch)")
    return cfg


def read_ensemble_config(run: str | Path) -> dict[str, Any]:
    """An ensemble run's config.json (``teller train ensemble``), its fields checked: what
    ``teller evaluate`` and ``teller diagnose`` read."""
    return _read_cfg(Path(run), "teller-ensemble")


def mix(p_mot: np.ndarray, p_gbdt: np.ndarray, w: float) -> np.ndarray:
    """``p_mot ** (1 - w) * p_gbdt ** w``, normalized (rows are samples)."""
    lg = (1.0 - w) * np.log(np.asarray(p_mot) + 1e-9) + w * np.log(np.asarray(p_gbdt) + 1e-9)
    q = np.exp(lg - lg.max(-1, keepdims=True))
    return q / q.sum(-1, keepdims=True)


def _predictions(
    mot_run: Path,
    baselines_run: Path,
    data_dir: str | Path | None,
    split: str,
    mot_temperature: float | None = None,
) -> tuple[list[Prediction], np.ndarray, list[str], float]:
    """The MoT's predictions, the GBDT's probabilities (aligned, in the MoT's label order), the
    split's label names and the latency per sample of both models (seconds). ``mot_temperature``:
    the MoT's probabilities at this temperature instead of its checkpoint's (an ensemble uses the
    one its weight was chosen with)."""
    from teller.models.baselines import gbdt_proba_one, load_baselines, load_raw
    from teller.models.data import load_model_split
    from teller.models.train import (
        check_eval_data,
        check_shards_version,
        load_checkpoint,
        predict,
        shards_run_dir,
    )

    model, cfg = load_checkpoint(mot_run)
    if mot_temperature is not None:
        model.temperature = float(mot_temperature)
    b = load_baselines(baselines_run / "baselines.pkl")
    run_dir = shards_run_dir(data_dir or cfg["data_dir"])
    mc = cfg["model"]
    check_eval_data(cfg, run_dir, split, mot_run, (mc.get("trace_vocab"), mc.get("log_vocab")))
    check_shards_version(cfg, run_dir)
    bcfg = baselines_run / "config.json"
    if bcfg.is_file():
        bc = read_json(bcfg, "baselines configuration")
        if isinstance(bc, dict):
            check_eval_data(bc, run_dir, split, baselines_run, (int(b.trace_vocab), len(b.log_vocab)))
        check_shards_version(bc, run_dir)
    samples, names = load_model_split(run_dir, split, cfg["model"])
    raw, _ = load_raw(run_dir, split)
    preds, _ = predict(model, samples)
    g = b.gbdt.predict_proba(b.X(raw)) if raw else np.zeros((0, len(b.gbdt.classes_)))
    pg = np.zeros((len(raw), len(cfg["label_names"])))
    pg[:, [cfg["label_names"].index(b.label_names[c]) for c in b.gbdt.classes_]] = g
    # latency: one sample at a time, both models, features included (as the MoT's and the
    # baselines' are measured; batched, it read faster than either model alone)
    k = min(32, len(samples), len(raw))
    t0 = time.perf_counter()
    for s, r in zip(samples[:k], raw[:k], strict=True):
        predict(model, [s], batch_size=1)
        gbdt_proba_one(b, r)
    return preds, pg, names, (time.perf_counter() - t0) / max(1, k)


def fit_ensemble(
    mot_run: str | Path,
    baselines_run: str | Path,
    output_dir: str | Path,
    log: Any = print,
    split: str = "val",
) -> Path:
    """Choose the mixing weight on ``split`` (val) and write the ensemble's run directory."""
    from teller.models.train import (
        check_new_run_dir,
        checkpoint_temperature,
        shards_run_dir,
        write_text_atomic,
    )

    mot, base, out = Path(mot_run), Path(baselines_run), Path(output_dir)
    check_new_run_dir(out)  # (before any work: never over another run, the MoT's or the GBDT's)
    # one writer of the run directory at a time (another teller process is refused, named); a directory
    # created for the lock is removed again if nothing is written
    with dir_lock(out, "teller train ensemble", transient=True, what="run directory"):
        mc = _read_cfg(mot, "teller-rca-checkpoint")
        bc = _read_cfg(base, "teller-baselines")
        if list(mc["label_names"]) != list(bc["label_names"]):
            raise ConfigError(f"{mot} and {base} have different label names")

        shas = []
        for c in (mc, bc):
            man = read_shards_manifest(shards_run_dir(c["data_dir"]))
            shas.append(
                ((man.get("tokenizer") or {}).get("sha256"), (man.get("log_tokenizer") or {}).get("sha256"))
            )
        if shas[0] != shas[1]:
            raise ConfigError(f"{mot} and {base} were trained on shards of different tokenizers")
        preds, pg, _, _ = _predictions(mot, base, None, split)
        if not preds:
            raise ConfigError(f"{mc['data_dir']}: no {split} samples to choose the mixing weight on")
        scores = {}
        for w in WEIGHTS:
            q = mix(np.stack([p.probs for p in preds]), pg, w)
            scores[w] = float(
                np.mean([candidate_rank(replace(p, probs=qi)) == 1 for p, qi in zip(preds, q, strict=True)])
            )
            log(f"weight {w}: val AC@1 {scores[w]:.3f}")
        best = max(WEIGHTS, key=lambda w: (scores[w], -w))
        check_new_run_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        cfg = {
            "format": "teller-ensemble",
            "version": 1,
            "mot": str(mot.resolve()),
            "baselines": str(base.resolve()),
            "weight": best,
            "chosen_on": split,
            "val_ac@1": {str(w): s for w, s in scores.items()},
            "data_dir": mc["data_dir"],
            "label_names": mc["label_names"],
            "model": f"{mc['model']['arch']}+gbdt",
            # the MoT's temperature the weight was chosen with (its calibration then): evaluate and
            # diagnose use this one, so a later `teller calibrate` of the MoT does not change the ensemble
            "mot_temperature": checkpoint_temperature(mc),
        }
        write_text_atomic(out / "config.json", json.dumps(cfg, indent=1))
        return out


def evaluate_ensemble(run: str | Path, data_dir: str | Path | None, split: str) -> dict[str, Any]:
    """``teller evaluate`` of an ensemble run directory."""
    r = Path(run)
    cfg = read_ensemble_config(r)
    # (an ensemble fitted before calibration existed recorded no temperature: its MoT's raw
    # probabilities, T = 1, are what its weight was chosen on)
    t = float(cfg.get("mot_temperature", 1.0))
    preds, pg, names, lat = _predictions(Path(cfg["mot"]), Path(cfg["baselines"]), data_dir, split, t)
    q = mix(np.stack([p.probs for p in preds]), pg, float(cfg["weight"])) if preds else pg
    normal = list(cfg["label_names"]).index("normal") if "normal" in cfg["label_names"] else -1
    out = []
    for p, qi in zip(preds, q, strict=True):
        loc = p.loc_scores
        if p.loc_by_class is not None:  # the localization of the ensemble's likeliest fault
            f = qi.copy()
            if normal >= 0:
                f[normal] = -1.0
            loc = p.loc_by_class[:, int(np.argmax(f))]
        out.append(replace(p, probs=qi, loc_scores=loc))
    preds = out
    m = metrics_for(preds, names, cfg["label_names"])
    m["latency_ms_per_sample"] = 1000 * lat
    m["split"] = split
    m["checkpoint"] = str(run)
    m["model"] = cfg["model"]
    m["weight"] = cfg["weight"]
    m["temperature"] = t  # (the MoT's)
    return m
