"""Evaluation output: metrics files, a confusion-matrix PNG (no plotting library needed), the
``teller results summarize`` tables and plots (matplotlib, optional)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from teller._io import write_atomic
from teller.data.dataset import read_json
from teller.errors import ConfigError, TellerError, TellerFileNotFoundError, TellerWarning

MAIN_KEYS = (
    "ac@1",
    "ac@3",
    "ac@5",
    "avg@5",
    "ac@1_with_effect",
    "category_accuracy",
    "macro_f1",
    "loc_top1",
    "loc_top3",
    "symbol_top1",
    "symbol_top3",
    "detection_precision",
    "detection_recall",
    "ece",
    "nll",
    "latency_ms_per_sample",
    "n",
)


def _tokenize_for(
    ck_dir: Path, cfg: dict[str, Any], dataset: Path, workers: int, cache: Path | None = None
) -> Path:
    """Shards of ``dataset`` encoded with the TPE and log tokenizers a checkpoint was trained with,
    cached under ``CHECKPOINT/eval-data/`` (a rerun reuses them), or under ``cache`` where given
    and the checkpoint's directory may not be written (a shared, read-only checkpoint)."""
    from teller.data.tokenize import read_shards_manifest, tokenize_dataset
    from teller.models.train import shards_run_dir

    if cfg.get("format") == "teller-baselines":
        run_dir = shards_run_dir(cfg["data_dir"])
        tpe_path = (read_shards_manifest(run_dir).get("tokenizer") or {}).get("path")
        log_tok = run_dir / "log_tokenizer.json"
    else:
        tpe_path, log_tok = cfg["tpe_dir"], cfg["log_tokenizer"]
    need = [("TPE tokenizer", tpe_path), ("log tokenizer", log_tok)]
    ref = cfg.get("reference")
    if int(cfg.get("shards_version") or 4) >= 8:  # (its summary columns 17-22 were computed against it)
        ref = ref or str(shards_run_dir(cfg["data_dir"]) / "reference.json")
        need.append(("kernel reference", ref))
    for what, q in need:
        if not q or not Path(q).exists():
            raise TellerFileNotFoundError(f"{ck_dir}: the checkpoint's {what} {q} is gone", path=str(q))
    # every sample is measured against the checkpoint's reference, none hidden (as diagnose does)
    where = ck_dir / "eval-data"
    if cache is not None and not os.access(ck_dir, os.W_OK):
        where = cache / "eval-data"
    d, w = Path(dataset).resolve(), where.resolve()
    if w == d or d in w.parents:  # (said here: tokenize_dataset's refusal would name its --output-dir)
        via = "--output" if where.parent == cache else "the checkpoint"
        raise ConfigError(
            f"{where}: the encoded dataset's cache would lie inside the dataset {dataset} (it would be read "
            f"as part of it); evaluate with {via} outside the dataset",
            path=str(where),
        )
    return tokenize_dataset(
        dataset,
        tpe_path,
        where,
        log_tokenizer=log_tok,
        reference=ref,
        hide_reference=False,
        workers=workers,
    )


def _is_dataset(path: Path) -> bool:
    """A dataset directory (``teller dataset generate`` / ``collect-cpu``), not shards."""
    try:
        return json.loads((path / "manifest.json").read_text()).get("format") == "teller-dataset"
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def evaluate_any(
    checkpoint: str | Path,
    data_dir: str | Path | None,
    split: str,
    *,
    workers: int = 1,
    cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Metrics of a MoT/single run, a baselines run (one entry per baseline) or an ensemble. ``split`` is a
    split name of the shards (``all``: every split), or a dataset directory (``teller dataset
    generate``), which is tokenized with the checkpoint's tokenizers and evaluated whole.
    ``data_dir`` is shards (``teller tokenize``) or a dataset directory, tokenized the same way, of
    which ``split`` is evaluated: models trained on other tokenizers are then compared on the same
    samples (their ``data`` is the dataset). The encoded dataset is cached in the checkpoint's
    directory, or in ``cache`` (the metrics' output directory) where that one may not be written."""
    p = Path(checkpoint)
    cache = Path(cache) if cache is not None else None
    if not p.exists():
        raise TellerFileNotFoundError(
            f"{p}: no such checkpoint (a run directory of teller train)", path=str(p)
        )
    from teller.models.train import refuse_a_file_as_checkpoint

    refuse_a_file_as_checkpoint(p)
    cfgp = (p if p.is_dir() else p.parent) / "config.json"
    if not cfgp.is_file():
        raise TellerFileNotFoundError(f"{cfgp}: no checkpoint configuration", path=str(cfgp))
    from teller._io import lock_holder

    who = lock_holder(cfgp.parent)
    if who is not None:
        # (trained or calibrated now: its weights are some epoch's, its temperature not yet fitted)
        from teller.errors import DirectoryLockedError

        raise DirectoryLockedError(
            f"{cfgp.parent}: being written ({who or 'by another teller process'}); evaluate it when that "
            "has finished",
            path=str(cfgp.parent),
        )
    try:
        cfg = json.loads(cfgp.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{cfgp}: not a readable checkpoint configuration ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{cfgp}: not a checkpoint configuration (a JSON object)")
    fmt = cfg.get("format")
    if fmt == "teller-ensemble":  # (its fields checked, naming config.json)
        from teller.models.ensemble import read_ensemble_config

        cfg = read_ensemble_config(cfgp.parent)
    sp = Path(split)
    named = split in ("train", "val", "test", "test_ood", "all")
    dataset = None
    if not named and (sp / "manifest.json").is_file():
        dataset, split = sp, "all"  # a dataset directory: all of it
    elif not named and sp.is_dir():
        raise ConfigError(
            f"{sp}: not a dataset directory (no manifest.json); --split takes a split name "
            "(train, val, test, test_ood, all) or a dataset directory",
            path=str(sp),
        )
    elif data_dir is not None and _is_dataset(Path(data_dir)):
        dataset = Path(data_dir)
        if split != "all":  # (checked before the dataset is encoded, which takes minutes)
            splits = json.loads((dataset / "manifest.json").read_text()).get("splits")
            have = sorted(k for k, v in splits.items() if v) if isinstance(splits, dict) else []
            if split not in have:
                raise ConfigError(
                    f"{dataset}: no samples in a split {split!r} (its splits: {', '.join(have) or 'none'}; "
                    "or all, or a dataset directory)",
                    path=str(dataset),
                )
    _warn_if_trained_on(cfg, cfgp, dataset, split, data_dir)
    if dataset is not None:
        # encode it with the checkpoint's own tokenizers, then evaluate the split
        if fmt == "teller-ensemble":  # (the MoT's tokenizers; the GBDT was trained on the same shards)
            mot = Path(cfg["mot"])
            data_dir = _tokenize_for(
                mot, read_json(mot / "config.json", "checkpoint configuration"), dataset, workers, cache
            )
        else:
            data_dir = _tokenize_for(cfgp.parent, cfg, dataset, workers, cache)
        res = evaluate_any(checkpoint, data_dir, split, workers=workers)
        for m in res:
            m["dataset"] = m["data"] = str(dataset.resolve())
            m["split"] = Path(m["dataset"]).name if split == "all" else split  # (resolved: "." has a name)
        return res
    if fmt == "teller-baselines":
        from teller.models.baselines import evaluate_baselines

        res = list(evaluate_baselines(p, data_dir, split).values())
    elif fmt == "teller-rca-checkpoint":
        from teller.models.train import evaluate

        res = [evaluate(p, data_dir, split)]
    elif fmt == "teller-ensemble":
        from teller.models.ensemble import evaluate_ensemble

        res = [evaluate_ensemble(p, data_dir, split)]
    else:
        raise ConfigError(f"{cfgp}: unknown checkpoint format {fmt!r}")
    from teller.models.train import shards_run_dir

    data = str(shards_run_dir(data_dir or cfg["data_dir"]).resolve())  # (evaluate read it: it exists)
    own = data if not data_dir else None
    if own is None and isinstance(cfg.get("data_dir"), str):
        with contextlib.suppress(TellerError, OSError):  # (moved: then the evaluated data is another)
            own = str(shards_run_dir(cfg["data_dir"]).resolve())
    cal = cfg.get("calibration") if fmt == "teller-rca-checkpoint" else None
    if isinstance(cal, dict) and cal.get("split") == split and (cal.get("data_dir") or own) == data:
        warnings.warn(
            f"{cfgp.parent}: its temperature was fitted on this split ({split} of {data}): its calibration "
            "(nll, ece, brier) reads better here than on new data (`teller calibrate` on val refits it)",
            TellerWarning,
            stacklevel=2,
        )
    weights = weights_id(cfgp.parent)
    for m in res:  # what summarize pools and pairs by: the recipe and the data evaluated
        m["recipe"] = recipe_id(cfg)
        m["data"] = data
        # (the run's own shards, where the data evaluated is others: its file must not be theirs)
        m["own_data"] = own
        # (summarize says when the run's weights changed since: a resumed or retrained run)
        m["weights"] = weights
        # (the run itself, wherever --output put this file: what summarize checks and pools by)
        m["run_dir"] = str(cfgp.parent.resolve())
        if cfg.get("trained_on"):
            m["trained_on"] = cfg["trained_on"]
    return res


def _warn_if_trained_on(
    cfg: dict[str, Any], cfgp: Path, dataset: Path | None, split: str, data_dir: Any = None
) -> None:
    """A TellerWarning where the samples evaluated include the run's training samples without their
    being asked for by name: ``all`` of its shards, or all of the very dataset its shards were encoded
    from (whose train samples the model has seen: its scores there say nothing about new data)."""
    # (--split train / val name those samples: the user knows; other shards' all are not the run's,
    # and neither is the cache a dataset directory was encoded into, evaluated by an inner call)
    seen = split == "all" and data_dir is None
    what = "--split all"
    if dataset is not None:
        seen = False
        try:
            from teller.models.train import shards_run_dir

            man = json.loads((shards_run_dir(cfg["data_dir"]) / "manifest.json").read_text())
            src = (man.get("dataset") or {}).get("manifest_sha256")
            mine = hashlib.sha256((dataset / "manifest.json").read_bytes()).hexdigest()
            seen = bool(src) and src == mine and split in ("all", "train", "val")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, TellerError):
            pass  # (the training shards are gone or unreadable: nothing to compare with)
        what = f"{dataset} (the dataset the run was trained on)"
    if seen and cfg.get("format") != "teller-ensemble":
        warnings.warn(
            f"{cfgp.parent}: {what} includes samples the model was trained or validated on: its "
            "scores there are higher than on new data (test and test_ood are held out)",
            TellerWarning,
            stacklevel=3,
        )


def weights_id(run: Path) -> str | None:
    """A fingerprint of a run's weights (``model.safetensors``: the first 16 hex digits of its
    SHA-256), or None for a run without that file (baselines, ensembles)."""
    f = run / "model.safetensors"
    h = hashlib.sha256()
    try:
        with open(f, "rb") as fh:  # (in chunks: hashlib.file_digest is Python 3.11+)
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()[:16]


# settings of `train:` added after runs were recorded, with their value when off: they count only
# when set, so that a run trained before a setting existed and one trained with it off are one
# recipe (expert_tie: an experiment added and taken out twice, docs/models.md, "Tying the experts")
_ADDED_LATER = {"ema": 0.0, "expert_tie": 0.0}
# which of them earlier definitions of the hash dropped (None: all of them, the current one)
_DROPPED_BEFORE: tuple[tuple[str, ...] | None, ...] = ((), ("expert_tie",), None)
# the same for settings of `model:` (a new model setting is written into every run's config.json
# with its default, which changed the hash of an unchanged configuration); definitions before
# 2026-12-05 (session of trace_mean_columns) dropped none of them
_MODEL_ADDED_LATER: dict[str, Any] = {
    "log_burst_features": False,
    "trace_mean_columns": [],
    "speed_aug": 0.0,
    "token_gpu_features": False,
}
# model settings with two spellings of one value, hashed as the second (definitions before
# session 28, 2026-12-05, hashed them as written: `token_gpu_features: true` and `relative` were two recipes)
_MODEL_SYNONYMS: dict[str, tuple[Any, Any]] = {"token_gpu_features": (True, "relative")}

# fields of a run's config.json that its fit produced or that only say where files lie (the shards'
# content-addressed names and the reference's hash pin the same things)
# (trained_on, where a run ran, is not hashed: a recipe's hash must not change under runs and
# evaluations made before it was recorded; train.device is, as given)
# (calibration / mot_temperature: fitted after training, on the weights; not how they were trained)
_NOT_RECIPE = (
    "info",
    "weight",
    "val_ac@1",
    "chosen_on",
    "tpe_dir",
    "log_tokenizer",
    "tpe_sha256",  # (implied by the shards, data_dir: their tok-<hash> name covers the tokenizers)
    "log_tokenizer_sha256",
    "reference",
    "trained_on",
    "calibration",
    "mot_temperature",
)


def _whole_numbers(x: Any) -> Any:
    """``x`` with every float that is a whole number as an int: ``max_minutes: 14`` in a YAML file and
    the ``14.0`` that the typed configuration records (since 2026-12-05) are one setting, and so one
    recipe."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, dict):
        return {k: _whole_numbers(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_whole_numbers(v) for v in x]
    return x


def run_recipe(run_dir: Path, stored: str | None) -> str | None:
    """The recipe of the run in ``run_dir`` by the current definition (:func:`recipe_id` of its
    config.json), so that evaluations written before a change to the definition pool with those
    written after it. The configuration counts only where it is the one the evaluation was made
    from: ``stored`` (what the evaluation file recorded) must be its hash by this definition or by
    an earlier one. Otherwise (the run retrained with other settings since, an evaluation file
    copied beside another run, an ensemble whose parts moved or changed) and where the
    configuration is missing or unreadable, ``stored`` is the recipe."""
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        if not isinstance(cfg, dict):
            return stored
        now = recipe_id(cfg)
        if stored is None or stored == now:
            return now
        earlier = {
            recipe_id(cfg, whole=w, dropped=d, model_dropped=m, synonyms=y)
            for w in (True, False)
            for d in _DROPPED_BEFORE
            for m in (True, False)
            for y in (True, False)
        }
        return now if stored in earlier else stored
    except Exception:  # noqa: BLE001 - a configuration of the wrong shape: what was recorded stands
        return stored


def recipe_id(
    cfg: dict[str, Any],
    *,
    whole: bool = True,
    dropped: tuple[str, ...] | None = None,
    model_dropped: bool = True,
    synonyms: bool = True,
) -> str:
    """What a run was trained as, without its seed and what its fit produced: the runs of one recipe
    with different seeds share it (``teller results summarize`` pools them). Shards count by their
    directory name (``tok-<hash of data, tokenizer and settings>``), not where they lie;
    ``train.device`` counts as given (``auto`` on CPU and on CUDA is one recipe: ``trained_on`` in
    the run's config says where it ran); an ensemble's recipe is made of its MoT's and its
    baselines' recipes. ``whole=False`` / ``dropped`` (the settings of ``_ADDED_LATER`` dropped at
    their default; None: all), ``model_dropped=False`` (``_MODEL_ADDED_LATER`` kept),
    ``synonyms=False`` (``_MODEL_SYNONYMS`` hashed as written): the definitions before whole numbers
    were normalized, before those settings were dropped and before one value's two spellings were
    one recipe (what evaluation files written then recorded; :func:`run_recipe`)."""
    import hashlib

    c = json.loads(json.dumps(cfg))
    if whole:
        c = _whole_numbers(c)
    if c.get("format") == "teller-ensemble":
        for key in ("mot", "baselines"):
            if c.get(key):
                run = Path(c.pop(key))
                try:
                    part = json.loads((run / "config.json").read_text())
                    c[f"{key}_recipe"] = recipe_id(
                        part, whole=whole, dropped=dropped, model_dropped=model_dropped, synonyms=synonyms
                    )
                except (OSError, ValueError, TypeError, AttributeError):
                    c[f"{key}_recipe"] = run.name
    for k in _NOT_RECIPE:
        c.pop(k, None)
    if isinstance(c.get("data_dir"), str):
        c["data_dir"] = Path(c["data_dir"]).name
    if isinstance(c.get("extra_train"), list):
        c["extra_train"] = [Path(str(e)).name for e in c["extra_train"]]
    if isinstance(c.get("train"), dict):
        c["train"].pop("seed", None)
        for k in _ADDED_LATER if dropped is None else dropped:
            if c["train"].get(k, _ADDED_LATER[k]) == _ADDED_LATER[k]:
                c["train"].pop(k, None)
    if model_dropped and isinstance(c.get("model"), dict):
        for k, off in _MODEL_ADDED_LATER.items():
            if c["model"].get(k, off) == off:
                c["model"].pop(k, None)
    if synonyms and isinstance(c.get("model"), dict):
        for k, (alias, value) in _MODEL_SYNONYMS.items():
            if k in c["model"] and c["model"][k] is alias:  # (`is`: 1 is not True here)
                c["model"][k] = value
    return hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()[:8]


def png_heatmap(m: np.ndarray, path: Path, cell: int = 24) -> None:
    """A row-normalized matrix as a grayscale-to-blue heat map PNG (written with zlib only)."""
    m = np.asarray(m, dtype=np.float64)
    norm = m / np.maximum(m.sum(1, keepdims=True), 1)
    h, w = m.shape
    img = np.full((h * cell, w * cell, 3), 255, np.uint8)
    for i in range(h):
        for j in range(w):
            v = norm[i, j]
            color = (int(255 * (1 - v)), int(255 * (1 - 0.7 * v)), 255)
            img[i * cell + 1 : (i + 1) * cell - 1, j * cell + 1 : (j + 1) * cell - 1] = color
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(img.shape[0]))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    hdr = struct.pack(">IIBBBBB", img.shape[1], img.shape[0], 8, 2, 0, 0, 0)
    write_atomic(
        path,
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", hdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b""),
    )


def write_metrics(m: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tag = Path(str(m["split"])).name
    ds = Path(str(m["dataset"])).name if m.get("dataset") else None
    if ds and (ds != tag or tag in ("train", "val", "test", "test_ood", "all")):
        tag = f"{ds}-{tag}"  # a split of a dataset directory: never the file of the shards' own split
    elif not ds and m.get("data") and m.get("data") != m.get("own_data"):
        tag = f"{Path(str(m['data'])).name}-{tag}"  # other shards' split: not the run's own file
    stem = f"eval-{tag}-{m['model']}"
    try:  # (another data set of the same name, evaluated before: both kept, this one marked)
        before = json.loads((out / f"{stem}.json").read_text())
    except (OSError, ValueError, AttributeError):
        before = None
    before = before if isinstance(before, dict) else {}
    if before.get("data") and m.get("data") and before["data"] != m["data"]:
        stem += "-" + hashlib.sha256(str(m["data"]).encode()).hexdigest()[:6]
    elif (
        before.get("run_dir")
        and m.get("run_dir")
        and before["run_dir"] != m["run_dir"]
        and not (before.get("weights") is not None and before.get("weights") == m.get("weights"))
        and Path(before["run_dir"]).is_dir()
    ):
        # another run's evaluation (other weights, a run that still exists; a shared --output): both
        # kept, this one named by its run. A copy of this run's own evaluation (`cp -r`: the same
        # weights), or one of a run deleted since, is replaced.
        stem += f"-{Path(m['run_dir']).name}-" + hashlib.sha256(m["run_dir"].encode()).hexdigest()[:6]
    write_atomic(out / f"{stem}.json", json.dumps(m, indent=1))
    if "confusion" not in m:  # no sample with a cause the model knows
        return out / f"{stem}.json"
    names = m["label_names"]
    conf = np.asarray(m["confusion"])
    lines = ["true\\pred," + ",".join(names)] + [
        f"{names[i]}," + ",".join(map(str, r)) for i, r in enumerate(conf)
    ]
    write_atomic(out / f"{stem}-confusion.csv", "\n".join(lines) + "\n")
    png_heatmap(conf, out / f"{stem}-confusion.png")
    return out / f"{stem}.json"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Any:
    """A rich table of plain text: cells are data (class names, a dataset's labels), never markup."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title))
    for c in columns:
        t.add_column(escape(c))
    for r in rows:
        t.add_row(*(escape(c) for c in r))
    return t


def print_metrics(m: dict[str, Any], console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    # (the split may be a dataset directory: a path is no markup)
    t = Table(title=escape(f"{m['model']} on {m['split']} (n={m['n']})"))
    t.add_column("metric")
    t.add_column("value", justify="right")
    # (and what --help lists beside them: the Brier score, and the temperature the probabilities had)
    for k in (*MAIN_KEYS, *(x for x in ("brier", "temperature") if x in m)):
        t.add_row(k, _fmt(m.get(k)))
    console.print(t)
    console.print(
        _table(
            "per fault type",
            ("class", "support", "precision", "recall", "f1"),
            [
                (name, str(r["support"]), _fmt(r["precision"]), _fmt(r["recall"]), _fmt(r["f1"]))
                for name, r in m.get("per_class", {}).items()
            ],
        )
    )
    for key, title, head in (
        ("per_severity", "faulty samples by injected severity", "severity"),
        (
            "per_effect",
            "faulty samples by what the fault did (effect.share: time added over the work of its kind)",
            "effect",
        ),
    ):
        if m.get(key):
            rows = [
                (rng, str(r["n"]), _fmt(r["category_accuracy"]), _fmt(r["ac@1"])) for rng, r in m[key].items()
            ]
            console.print(_table(title, (head, "n", "category accuracy", "AC@1"), rows))
    if m.get("selective"):
        rows = [
            (f">= {lv}", str(r["n"]), _fmt(r["coverage"]), _fmt(r["ac@1"]), _fmt(r["category_accuracy"]))
            for lv, r in m["selective"].items()
        ]
        console.print(
            _table(
                "answers by confidence (the top cause's probability)",
                ("confidence", "n", "coverage", "AC@1", "category accuracy"),
                rows,
            )
        )
    if m.get("unknown_cause"):
        rows = [
            (
                name,
                str(u["n"]),
                str(u["flagged_faulty"]),
                ", ".join(f"{k} {v}" for k, v in sorted(u["predicted"].items(), key=lambda kv: -kv[1])),
            )
            for name, u in m["unknown_cause"].items()
        ]
        console.print(
            _table(
                "causes outside the model's classes (detection only)",
                ("label", "n", "flagged faulty", "predicted as"),
                rows,
            )
        )


# the headline numbers of an evaluation file (teller evaluate --json), each a number or null
_EVAL_NUMBERS = (
    "n",
    "category_accuracy",
    "macro_f1",
    "ac@1",
    "ac@3",
    "ac@5",
    "avg@5",
    "loc_top1",
    "loc_top3",
    "loc_n",
    "symbol_top1",
    "symbol_top3",
    "symbol_n",
    "detection_precision",
    "detection_recall",
    "ac@1_with_effect",
    "nll",
    "ece",
    "brier",
    "latency_ms_per_sample",
    "temperature",
)


def _load_eval(f: Path) -> dict[str, Any]:
    try:
        m = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{f}: not a readable evaluation file ({e})") from None
    if not isinstance(m, dict) or "model" not in m or "split" not in m:
        raise ConfigError(
            f"{f}: not an evaluation file (no 'model' and 'split'; written by teller evaluate?)"
        )
    for k in ("model", "split"):
        if not isinstance(m[k], str) or not m[k]:
            raise ConfigError(f"{f}: {k!r} must be a non-empty string, got {json.dumps(m[k])[:40]}")
    for k in ("per_class", "per_severity", "per_effect"):  # (tables of {name: {metric: number}})
        v = m.get(k)
        if v is not None and not (isinstance(v, dict) and all(isinstance(r, dict) for r in v.values())):
            raise ConfigError(f"{f}: {k!r} must map names to records of metrics, got {json.dumps(v)[:40]}")
    for k in ("recipe", "data"):
        if not (m.get(k) is None or (isinstance(m[k], str) and m[k])):
            raise ConfigError(f"{f}: {k!r} must be a non-empty string")
    for k in _EVAL_NUMBERS:  # (the tables sort, average and pair them: a string there is a damaged file)
        v = m.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"{f}: {k!r} must be a number, got {type(v).__name__} {json.dumps(v)[:40]}")
    recs = m.get("samples")
    if recs is not None and not (
        isinstance(recs, list)
        and all(
            isinstance(r, dict)
            and isinstance(r.get("id"), str)
            and isinstance(r.get("rank"), int)
            and isinstance(r.get("label"), str)
            and isinstance(r.get("pred"), str)
            for r in recs
        )
    ):
        raise ConfigError(
            f"{f}: 'samples' must be a list of records with string 'id', 'label' and 'pred' and an "
            "integer 'rank'"
        )
    return m


def _stale(m: dict[str, Any], run: Path, ids: dict[Path, str | None]) -> bool:
    """Whether an evaluation file no longer describes its run: made with other weights (the
    fingerprint it records) or another temperature than the run's ``config.json`` now has.
    ``ids``: the runs' fingerprints, each computed once."""
    w = m.get("weights")
    if run not in ids:
        ids[run] = weights_id(run)
    if isinstance(w, str) and ids[run] is not None and ids[run] != w:
        return True
    try:
        cfg = json.loads((run / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict) or cfg.get("format") != "teller-rca-checkpoint":
        return False  # (an ensemble's temperature is its own, fixed when it was fitted)
    cal = cfg.get("calibration")
    t_now = float(cal["temperature"]) if isinstance(cal, dict) and "temperature" in cal else 1.0
    t = m.get("temperature")
    return isinstance(t, (int, float)) and abs(float(t) - t_now) > 1e-9


def _evaluated_run(m: dict[str, Any], home: Path, weight_ids: dict[Path, str | None]) -> Path:
    """The run an evaluation file in ``home`` evaluated: the run it records (``run_dir``) where
    that exists, except that a file in a run directory whose weights are that run's is that run's
    (a copied run's files record the run they were copied from); else ``home``."""
    rd = m.get("run_dir")
    if not (isinstance(rd, str) and Path(rd).is_dir()) or Path(rd) == home:
        return home
    if (home / "config.json").is_file():
        if home not in weight_ids:
            weight_ids[home] = weights_id(home)
        if m.get("weights") is None or m.get("weights") == weight_ids[home]:
            return home
    return Path(rd)


def summarize(runs: Sequence[str | Path], output: str | Path) -> str:
    """Collect every ``eval-*.json`` of the runs into one comparison: ``results.md`` (the main table,
    each model kind over its runs and paired per-sample differences (:func:`_model_groups`), F1 per
    fault type, AC@1 by severity and by effect per split), ``results.json``, ``results-paired.json``
    and, where matplotlib is installed, ``results-*.png`` plots."""
    rows: list[dict[str, Any]] = []
    seen: dict[Path, str] = {}
    empty: list[str] = []
    stale: list[str] = []  # (evaluation files of an earlier state of their run)
    weight_ids: dict[Path, str | None] = {}
    # (one evaluation of one run counts once: a run and an --output copy of its evaluation were two)
    evaluated: dict[tuple[Any, ...], str] = {}
    dup: list[str] = []
    for r in runs:
        p = Path(r)
        if not p.exists():
            raise TellerFileNotFoundError(f"{p}: no such run directory or evaluation file")
        key = p.resolve()
        if key in seen:  # (the same run twice would count as two runs of its kind)
            raise ConfigError(f"{p}: given twice (also as {seen[key]}); name each run once", path=str(p))
        seen[key] = str(r)
        files = sorted(p.glob("eval-*.json")) if p.is_dir() else [p]
        if not files:
            empty.append(str(p))
        for f in files:
            if f is not p and f.resolve() in seen:  # (a file given itself is recorded above)
                raise ConfigError(
                    f"{f}: given twice (also in {seen[f.resolve()]}); name each run once", path=str(f)
                )
            seen[f.resolve()] = str(r)
            m = _load_eval(f)
            # the run the file evaluated (its own directory, or the one it records: --output elsewhere)
            home = (p if p.is_dir() else p.parent).resolve()
            run_dir = _evaluated_run(m, home, weight_ids)
            # (one model's evaluation on one data set once: by its weights, where it has them, so a
            # copied run and the run it was copied from are one)
            ident = (m.get("weights") or str(run_dir), m.get("model"), m.get("split"), m.get("data"))
            if ident in evaluated:
                dup.append(f"{f} (the same evaluation as {evaluated[ident]})")
                continue
            evaluated[ident] = str(f)
            if _stale(m, run_dir, weight_ids):
                stale.append(str(f))
            rows.append(
                {
                    "_dir": run_dir,
                    "run": run_dir.name if run_dir != home else (p.name if p.is_dir() else p.parent.name),
                    **{k: m.get(k) for k in ("model", "split", *MAIN_KEYS)},
                    "per_class_f1": {c: v.get("f1") for c, v in (m.get("per_class") or {}).items()},
                    "per_severity_ac@1": {s: v.get("ac@1") for s, v in (m.get("per_severity") or {}).items()},
                    "per_effect_ac@1": {s: v.get("ac@1") for s, v in (m.get("per_effect") or {}).items()},
                    "_samples": m.get("samples"),
                    "recipe": run_recipe(run_dir, m.get("recipe")),
                    "data": m.get("data"),
                    "trained_on": m.get("trained_on") if isinstance(m.get("trained_on"), str) else None,
                }
            )
    if not rows:
        raise TellerFileNotFoundError(
            f"no eval-*.json in {', '.join(empty)} (run directories of teller train, after teller evaluate)",
            path=empty[0] if empty else None,
        )
    if empty:
        warnings.warn(
            f"{', '.join(empty)}: no eval-*.json (not a run directory, or not evaluated yet): left out",
            stacklevel=2,
        )
    if dup:
        warnings.warn(f"{'; '.join(dup)}: counted once", TellerWarning, stacklevel=2)
    if stale:
        warnings.warn(
            f"{', '.join(stale)}: evaluated before the run's weights or calibration changed (resumed, "
            "retrained, recalibrated): their numbers are the old model's; run teller evaluate again",
            TellerWarning,
            stacklevel=2,
        )
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    order = {"test": 0, "test_ood": 1}
    # (ties by model and run: the same tables whatever order the runs were given in)
    rows.sort(
        key=lambda x: (
            order.get(str(x["split"]), 2),
            str(x["split"]),
            -(x["ac@1"] or 0),
            str(x["model"]),
            str(x["_dir"]),
        )
    )
    _label_rows(rows)
    for x in rows:  # (the run column too: two seeds' `s0/mot` and `s1/mot` were both `mot`)
        x["run"] = x["_run"]
    _set_labels(rows)
    groups = _model_groups(rows)
    for x in rows:
        del x["_dir"], x["_samples"], x["_run"]
    write_atomic(out / "results.json", json.dumps(rows, indent=1))
    write_atomic(out / "results-paired.json", json.dumps(groups, indent=1))
    # the results table leaves the detection metrics to the per-run files; its split column names the
    # evaluated set (the split, and its data where one split name was evaluated on several)
    cols = ("run", "model", "set", *(k for k in MAIN_KEYS if not k.startswith("detection_")))
    md = ["# Results", "", "| " + " | ".join(("run", "model", "split", *cols[3:])) + " |"]
    md += ["|" + "---|" * len(cols)]
    md += ["| " + " | ".join(_fmt(x[c]) for c in cols) + " |" for x in rows]
    splits = list(dict.fromkeys(x["set"] for x in rows))
    md += _group_tables(groups)
    for split in splits:
        part = [x for x in rows if x["set"] == split]
        for key, title, head in (
            ("per_class_f1", "F1 per fault type", "class"),
            ("per_severity_ac@1", "AC@1 of faulty samples by injected severity", "severity"),
            ("per_effect_ac@1", "AC@1 of faulty samples by what the fault did (effect)", "effect"),
        ):
            names = _row_order(key, [n for x in part for n in x[key]])
            if not names:
                continue
            md += ["", f"## {title} ({split})", ""]
            md += [
                "| " + " | ".join([head, *(x["label"] for x in part)]) + " |",
                "|" + "---|" * (len(part) + 1),
            ]
            md += ["| " + " | ".join([n, *(_fmt(x[key].get(n)) for x in part)]) + " |" for n in names]
    plots = _plots(rows, splits, out)
    # (plots an earlier summary wrote here of sets this one does not have would sit beside
    # results.md and describe other models: only this summary's are kept)
    for old in [*out.glob("results-per-class-*.png"), out / "results-metrics.png"]:
        if old not in plots and old.is_file():
            old.unlink()
    if plots:
        md += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    else:
        md += ["", "(No plots: matplotlib is not installed; `pip install 'teller[plots]'`.)"]
    text = "\n".join(md) + "\n"
    write_atomic(out / "results.md", text)
    return text


def _model_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per evaluated set (split name and data: the shards or dataset an evaluation read), the runs of
    each *kind* pooled: a kind is a model trained by one recipe (``recipe_id``: same configuration
    and data, any seed), named by the model, plus the recipe where one model has several. Mean and
    spread of AC@1 and category accuracy per kind; then every kind compared sample by sample with the
    reference kind (the MoT; of several MoT recipes the best on mean AC@1; without a MoT the best kind
    with per-sample records), in AC@1 and in category accuracy: a sample's score is the share of the
    kind's runs that got it right (a correct candidate ranked first; the predicted cause), and
    :func:`teller.models.metrics.paired_difference` gives the difference with its bootstrap interval
    and sign test. Kinds that cannot be paired are listed with the reason. The interval and the test
    are over samples, for these trained runs: they do not cover what another set of seeds would do."""
    from teller.models.metrics import paired_difference

    out: list[dict[str, Any]] = []
    for label in dict.fromkeys(x["set"] for x in rows):
        part = [x for x in rows if x["set"] == label]
        data = part[0]["data"]
        by_kind: dict[tuple[str, Any], list[dict[str, Any]]] = {}
        for x in part:
            by_kind.setdefault((str(x["model"]), x["recipe"]), []).append(x)
        recipes_of: dict[str, int] = {}
        for model, _r in by_kind:
            recipes_of[model] = recipes_of.get(model, 0) + 1
        stats: dict[str, dict[str, Any]] = {}
        hits: dict[str, dict[str, dict[str, float]]] = {}  # kind -> metric -> sample id -> score
        unpaired: dict[str, str] = {}
        for (model, recipe), xs in by_kind.items():
            kind = model if recipes_of[model] == 1 else f"{model} [{recipe if recipe is not None else '?'}]"
            ac = np.array([x["ac@1"] for x in xs if isinstance(x["ac@1"], (int, float))], dtype=float)
            ca = [x["category_accuracy"] for x in xs if isinstance(x["category_accuracy"], (int, float))]
            # (evaluations written before calibration metrics existed have none)
            ec = [x.get("ece") for x in xs if isinstance(x.get("ece"), (int, float))]
            stats[kind] = {
                "model": kind,
                "arch": model,
                "recipe": recipe,
                "runs": len(xs),
                "run_names": [x["_run"] for x in xs],
                # (not part of the recipe: a kind whose runs ran on different devices says so)
                "trained_on": sorted({x["trained_on"] for x in xs if x["trained_on"]}),
                "ac@1_mean": float(ac.mean()) if len(ac) else None,
                "ac@1_sd": float(ac.std(ddof=1)) if len(ac) > 1 else None,
                "category_accuracy_mean": float(np.mean(ca)) if ca else None,
                "category_accuracy_sd": float(np.std(ca, ddof=1)) if len(ca) > 1 else None,
                "ece_mean": float(np.mean(ec)) if ec else None,
            }
            recs = [x["_samples"] for x in xs]
            if any(r is None for r in recs):
                unpaired[kind] = "no per-sample records (evaluated before they were written)"
                continue
            if not all(recs):
                unpaired[kind] = "an evaluation of it has an empty list of samples"
                continue
            ids = [[r["id"] for r in rec] for rec in recs]
            if any(len(set(i)) != len(i) or not all(i) for i in ids):
                unpaired[kind] = "a sample id is empty or repeated"
            elif any(set(i) != set(ids[0]) for i in ids):
                unpaired[kind] = "its runs were evaluated on different samples"
            else:
                hits[kind] = _mean_hits(recs)
        ranked = sorted(stats, key=lambda k: (-(stats[k]["ac@1_mean"] or 0.0), str(k)))
        mots = [k for k in ranked if stats[k]["arch"] == "mot" and k in hits]
        ref = mots[0] if mots else next((k for k in ranked if k in hits), None)
        paired = []
        for kind in ranked:
            if kind == ref or kind not in hits or ref is None:
                continue
            for metric in ("ac@1", "category_accuracy"):
                ha, hb = hits[ref][metric], hits[kind][metric]
                common = sorted(set(ha) & set(hb))
                if not common:
                    unpaired.setdefault(kind, "no sample in common with the reference")
                    continue
                a = np.array([ha[i] for i in common])
                b = np.array([hb[i] for i in common])
                paired.append({"metric": metric, "reference": ref, "model": kind, **paired_difference(a, b)})
        out.append(
            {
                "split": label,
                "data": data,
                "models": [stats[k] for k in ranked],
                "paired": paired,
                "not_paired": unpaired,
            }
        )
    return out


def _set_labels(rows: list[dict[str, Any]]) -> None:
    """``set``: the evaluated set a row belongs to, its split name, followed by the shortest tail of
    its data path that tells it apart where one split name was evaluated on several data (the same
    name on other data is another set: never pooled, paired or tabulated together)."""
    datas_of: dict[str, list[Any]] = {}
    for x in rows:
        d = datas_of.setdefault(str(x["split"]), [])
        if x["data"] not in d:
            d.append(x["data"])
    for x in rows:
        split, datas = str(x["split"]), datas_of[str(x["split"])]
        x["set"] = split if len(datas) == 1 else f"{split} ({_data_tail(x['data'], datas)})"


def _data_tail(data: str | None, others: list[str | None]) -> str:
    """The shortest tail of ``data``'s path that no other data directory of the split shares."""
    if data is None:
        return "data unknown"
    parts = Path(data).parts
    paths = [Path(o).parts for o in others if o is not None and o != data]
    for k in range(1, len(parts) + 1):
        if all(o[-k:] != parts[-k:] for o in paths):
            return "/".join(parts[-k:])
    return data


def _mean_hits(recs: list[list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per metric, each sample's share of runs that got it right."""
    acc: dict[str, dict[str, list[float]]] = {"ac@1": {}, "category_accuracy": {}}
    for rec in recs:
        for r in rec:
            acc["ac@1"].setdefault(r["id"], []).append(float(r["rank"] == 1))
            acc["category_accuracy"].setdefault(r["id"], []).append(float(r["pred"] == r["label"]))
    return {m: {i: float(np.mean(v)) for i, v in d.items()} for m, d in acc.items()}


def _group_tables(groups: list[dict[str, Any]]) -> list[str]:
    """``results.md`` sections of :func:`_model_groups`: the kinds over their runs, and the paired
    differences where more than one kind has per-sample records."""
    md: list[str] = []
    if any(g["models"] and max(m["runs"] for m in g["models"]) > 1 for g in groups):
        md += ["", "## Models over their runs (mean ± sd where a kind has several runs)", ""]
        md += ["| split | model | runs | ac@1 | category_accuracy | ece |", "|---|---|---|---|---|---|"]
        for g in groups:
            for m in g["models"]:  # (runs: their directory names)
                sd = f" ± {m['ac@1_sd']:.3f}" if m["ac@1_sd"] is not None else ""
                sdc = f" ± {m['category_accuracy_sd']:.3f}" if m["category_accuracy_sd"] is not None else ""
                dev = f" (trained on {', '.join(m['trained_on'])})" if len(m["trained_on"]) > 1 else ""
                md.append(
                    f"| {g['split']} | {m['model']} | {m['runs']}: {', '.join(m['run_names'])}{dev} | "
                    f"{_fmt(m['ac@1_mean'])}{sd} | "
                    f"{_fmt(m['category_accuracy_mean'])}{sdc} | {_fmt(m.get('ece_mean'))} |"
                )
    if any(g["paired"] for g in groups):
        md += [
            "",
            "## Paired differences (same samples)",
            "",
            "A sample's score is the share of a model's runs that got it right (ac@1: a correct "
            "candidate ranked first; category_accuracy: the predicted cause); diff = reference - model, "
            "a 95 % bootstrap interval over samples; better / worse: the samples where the reference "
            "scores higher / lower; p: exact two-sided sign test on them.",
            "",
            "| split | metric | reference | model | n | diff | 95 % interval | better | worse | p |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for g in groups:
            for c in g["paired"]:
                md.append(
                    f"| {g['split']} | {c['metric']} | {c['reference']} | {c['model']} | {c['n']} | "
                    f"{c['diff']:+.3f} | "
                    f"{c['lo']:+.3f} .. {c['hi']:+.3f} | {c['better']} | {c['worse']} | {c['p_sign']:.3g} |"
                )
    notes = [f"* {g['split']}: {k}: {why}" for g in groups for k, why in g["not_paired"].items()]
    if notes and any(len(g["models"]) > 1 for g in groups):
        md += ["", "Not paired:", "", *notes]
    return md


def _label_rows(rows: list[dict[str, Any]]) -> None:
    """``label``: the model kind where one run directory holds it, else the shortest tail of the
    run directories' paths that tells them apart (``seed0/mot/mot``, ``seed1/mot/mot``)."""
    dirs_of: dict[str, set[Path]] = {}
    for x in rows:
        dirs_of.setdefault(x["model"], set()).add(x["_dir"])
    for x in rows:
        dirs = sorted(dirs_of[x["model"]])
        if len(dirs) == 1:
            x["label"], x["_run"] = x["model"], x["run"]
            continue
        depth = 1
        while depth < max(len(d.parts) for d in dirs) and len({d.parts[-depth:] for d in dirs}) < len(dirs):
            depth += 1
        x["_run"] = "/".join(x["_dir"].parts[-depth:])  # (the runs column of the pooled table)
        x["label"] = f"{x['_run']}/{x['model']}"


def _row_order(key: str, names: list[str]) -> list[str]:
    """The rows of a per-split table in a fixed order (severity and effect bins as metrics defines
    them, classes as the first evaluation lists them), whatever order the models report them in."""
    from teller.models.metrics import effect_bin_names, severity_bin_names

    seen = list(dict.fromkeys(names))
    if key == "per_effect_ac@1":
        fixed = effect_bin_names()
    elif key == "per_severity_ac@1":
        fixed = severity_bin_names()
    else:
        return seen
    return [n for n in fixed if n in seen] + [n for n in seen if n not in fixed]


def _plots(rows: list[dict[str, Any]], splits: list[str], out: Path) -> list[Path]:
    """Grouped bars of the ranking metrics per split, and a heat map of F1 per fault type and model.
    Returns the files written; none where matplotlib is missing (it is an optional dependency)."""
    try:
        # Figure objects, not pyplot: no global state, no backend switch in a caller's process (a
        # notebook keeps its own), no display needed
        from matplotlib.figure import Figure
    except ImportError:
        return []
    written: list[Path] = []
    # one model order in every panel (the first split's ranking), so a model sits in one place
    rank = {lab: k for k, lab in enumerate(dict.fromkeys(x["label"] for x in rows))}
    rows = sorted(rows, key=lambda x: rank[x["label"]])
    metrics = ("ac@1", "ac@3", "avg@5", "category_accuracy", "loc_top1")
    fig = Figure(figsize=(max(6, 1.1 * len(rows)) + 2, 4))
    axes = fig.subplots(1, len(splits), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        part = [x for x in rows if x["set"] == split]
        width = 0.8 / len(metrics)
        xs = np.arange(len(part))
        for k, key in enumerate(metrics):
            vals = [x[key] if isinstance(x[key], (int, float)) else np.nan for x in part]
            ax.bar(xs + (k - (len(metrics) - 1) / 2) * width, vals, width, label=key)
        ax.set_xticks(xs, [x["label"] for x in part], rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.set_title(f"{split}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    written.append(out / "results-metrics.png")
    write_atomic(written[-1], lambda t: fig.savefig(t, dpi=110, format="png"))
    for split in splits:
        part = [x for x in rows if x["set"] == split and x["per_class_f1"]]
        names = list(dict.fromkeys(n for x in part for n in x["per_class_f1"]))
        if not names:
            continue
        m = np.array([[x["per_class_f1"].get(n, np.nan) for x in part] for n in names], dtype=float)
        fig = Figure(figsize=(2 + 1.1 * len(part), 1 + 0.35 * len(names)))
        ax = fig.subplots()
        im = ax.imshow(m, vmin=0, vmax=1, cmap="Blues", aspect="auto")
        ax.set_xticks(range(len(part)), [x["label"] for x in part], rotation=30, ha="right")
        ax.set_yticks(range(len(names)), names)
        for i in range(len(names)):
            for j in range(len(part)):
                if np.isfinite(m[i, j]):
                    ax.text(
                        j,
                        i,
                        f"{m[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if m[i, j] > 0.6 else "black",
                    )
        ax.set_title(f"F1 per fault type ({split})")
        fig.colorbar(im, ax=ax, fraction=0.04)
        fig.tight_layout()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", split).strip("_") or "split"
        while out / f"results-per-class-{slug}.png" in written:  # (two sets, one file name)
            slug += "_"
        written.append(out / f"results-per-class-{slug}.png")
        write_atomic(written[-1], lambda t, fig=fig: fig.savefig(t, dpi=110, format="png"))
    return written
