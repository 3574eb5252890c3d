"""Training, prediction and evaluation of the RCA models (``teller train mot|single``, ``teller evaluate``).

A run directory holds ``config.json`` (model + training configuration, label names, data and
tokenizer references), ``model.safetensors`` (the best weights on val), ``last.safetensors`` +
``state.pt`` (optimizer, scheduler, epoch and RNG state: ``--resume`` continues from them) and
``history.json``. Deterministic given the seed (CPU; single-threaded reductions are not required,
but the same thread count is).
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from teller.errors import ConfigError, TellerFileNotFoundError
from teller.models.data import Sample, batches, check_extra_train, collate, load_model_split
from teller.models.metrics import Prediction, compute_metrics, metrics_for
from teller.models.mot import ModelConfig, RCAModel, build_model, init_log_side_from_bert

ProgressFn = Callable[[str, int, int, dict[str, float]], Any]


@dataclass
class TrainConfig:
    seed: int = 0
    batch_size: int = 16
    epochs: int = 12
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    loc_weight: float = 1.0
    loc_listwise: float = 0.0  # weight of the listwise localization term (loss_fn)
    summary_loc_weight: float = 1.0  # weight of the summary-row culprit loss (model.summary_loc)
    patience: int = 4
    max_minutes: float = 14.0
    grad_clip: float = 1.0
    device: str = "auto"  # auto | cpu | cuda
    amp: bool = True  # mixed precision (bf16) on CUDA
    max_train_samples: int | None = None
    # decay of an exponential moving average of the weights (0: off). When on, validation, early
    # stopping and model.safetensors use the averaged weights; last.safetensors keeps the raw ones
    ema: float = 0.0

    def __post_init__(self) -> None:
        rules = (
            ("seed", self.seed >= 0, ">= 0"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("epochs", self.epochs >= 1, ">= 1"),
            ("lr", self.lr > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("warmup_frac", 0 <= self.warmup_frac < 1, "in [0, 1)"),
            ("loc_weight", self.loc_weight >= 0, ">= 0"),
            ("loc_listwise", self.loc_listwise >= 0, ">= 0"),
            ("summary_loc_weight", self.summary_loc_weight >= 0, ">= 0"),
            ("patience", self.patience >= 1, ">= 1 (epochs without a better val before stopping)"),
            ("max_minutes", self.max_minutes >= 0, ">= 0 (checked after each epoch)"),
            ("grad_clip", self.grad_clip >= 0, ">= 0 (0: off)"),
            ("ema", 0 <= self.ema < 1, "in [0, 1) (0: off)"),
            (
                "max_train_samples",
                self.max_train_samples is None or self.max_train_samples >= 1,
                ">= 1 or null",
            ),
        )
        bad = [f"train.{k} must be {want}, got {getattr(self, k)!r}" for k, ok, want in rules if not ok]
        if bad:
            raise ConfigError("; ".join(bad))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        from teller.models.checks import typed_config

        return cls(**typed_config(cls, d, "train"))


def builtin_config(name: str) -> Path:
    """Path of a shipped configuration: ``mot``, ``single``, ``mot_minilm`` or ``demo``."""
    p = Path(str(resources.files("teller.models") / "configs" / name / "train.yaml"))
    if not p.is_file():
        raise ConfigError(f"no shipped configuration {name!r} (shipped: mot, single, mot_minilm, demo)")
    return p


def load_config(path: str | Path | None, default: str) -> dict[str, Any]:
    p = Path(path) if path else builtin_config(default)
    if not p.is_file():
        if path and not Path(path).suffix:
            p = builtin_config(str(path))
        else:
            raise TellerFileNotFoundError(f"{p}: no such configuration file", path=str(p))
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: the configuration must be a mapping")
    return d


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"train.device: {name!r} is not auto, cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda requested but no CUDA device is available")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"train.device: {name!r} is not auto, cpu or cuda[:N]")
    return dev


def shards_run_dir(data_dir: str | Path) -> Path:
    """A tokenized run: the directory itself (manifest.json) or its only ``tok-*`` subdirectory."""
    p = Path(data_dir)
    if (p / "manifest.json").is_file():
        return p
    subs = sorted(q for q in p.glob("*/manifest.json"))
    if len(subs) == 1:
        return subs[0].parent
    if not subs:
        raise TellerFileNotFoundError(f"{p}: no tokenized shards (manifest.json)", path=str(p))
    raise ConfigError(f"{p}: several tokenized runs; pass one of {', '.join(str(s.parent) for s in subs)}")


def loss_fn(
    out: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    loc_weight: float,
    normal_index: int = 0,
    listwise: float = 0.0,
    summary_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CE(category) + loc_weight * BCE(localization over real trace tokens of faulty samples)
    + listwise * -log(softmax mass of the culprit tokens) + summary_weight * (BCE + listwise term)
    over the summary rows of faulty samples (model.summary_loc)."""
    dev = out["logits"].device
    y = batch["labels"].to(dev)
    ce = F.cross_entropy(out["logits"].float(), y)
    loss = ce
    parts = {"ce": float(ce.detach())}
    if "summary_loc_logits" in out and summary_weight > 0 and "summary_culprit" in batch:
        sl = out["summary_loc_logits"].float()
        sm = batch["summary_mask"].to(dev) & (y != normal_index)[:, None]
        sc = batch["summary_culprit"].to(dev)
        if sm.any():
            sb = F.binary_cross_entropy_with_logits(sl[sm], sc[sm])
            has = ((sc > 0) & sm).any(1)
            if has.any():
                lg = sl.masked_fill(~batch["summary_mask"].to(dev), float("-inf"))[has]
                sb = (
                    sb
                    + (
                        torch.logsumexp(lg, 1)
                        - torch.logsumexp(lg.masked_fill(sc[has] <= 0, float("-inf")), 1)
                    ).mean()
                )
            loss = loss + summary_weight * sb
            parts["summary"] = float(sb.detach())
    if "loc_logits_by_class" in out:
        # per-cause localization: train the true cause's column
        by = out["loc_logits_by_class"]
        out = {**out, "loc_logits": by.gather(2, y[:, None, None].expand(-1, by.shape[1], 1)).squeeze(-1)}
    if "loc_logits" in out and (loc_weight > 0 or listwise > 0):
        m = batch["trace_mask"].to(dev) & (y != normal_index)[:, None]
        if m.any() and loc_weight > 0:
            bce = F.binary_cross_entropy_with_logits(
                out["loc_logits"].float()[m], batch["culprit"].to(dev)[m]
            )
            loss = loss + loc_weight * bce
            parts["bce"] = float(bce.detach())
        if listwise > 0:
            # -log of the softmax mass on the culprit tokens, per faulty sample with culprits: what
            # localization top-k measures (the BCE alone spreads its effort over every token)
            cul = batch["culprit"].to(dev) > 0
            has = (cul & m).any(1)
            if has.any():
                lg = out["loc_logits"].float().masked_fill(~batch["trace_mask"].to(dev), float("-inf"))
                lse_all = torch.logsumexp(lg[has], 1)
                lse_cul = torch.logsumexp(lg[has].masked_fill(~cul[has], float("-inf")), 1)
                lw = (lse_all - lse_cul).mean()
                loss = loss + listwise * lw
                parts["listwise"] = float(lw.detach())
    return loss, parts


def _lr_lambda(total: int, warmup: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f


@torch.no_grad()
def predict(
    model: RCAModel, samples: Sequence[Sample], batch_size: int = 32, device: torch.device | None = None
) -> tuple[list[Prediction], float]:
    """Predictions for samples, and the mean inference latency per sample (seconds, batched)."""
    model.eval()
    dev = device or next(model.parameters()).device
    preds: list[Prediction] = []
    t0 = time.perf_counter()
    for bs in batches(samples, batch_size, shuffle=False):
        b = collate(bs)
        out = model({k: v.to(dev) for k, v in b.items()})
        probs = torch.softmax(out["logits"].float(), -1).cpu().numpy()
        loc = out["loc_logits"].float().cpu().numpy() if "loc_logits" in out else None
        by = out["loc_logits_by_class"].float().cpu().numpy() if "loc_logits_by_class" in out else None
        for i, s in enumerate(bs):
            n = len(s.trace_ids)
            preds.append(
                Prediction(
                    label=s.label,
                    probs=probs[i],
                    token_ids=s.trace_ids,
                    loc_scores=loc[i, :n] if loc is not None else None,  # (no localization head)
                    loc_by_class=by[i, :n] if by is not None else None,
                    severity=s.severity,
                    effect_events=s.effect_events,
                    effect_share=s.effect_share,
                    culprit=s.culprit,
                    sample_id=s.sample_id,
                )
            )
    dt = (time.perf_counter() - t0) / max(1, len(samples))
    return preds, dt


def save_checkpoint(model: RCAModel, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(path))


def load_checkpoint(checkpoint: str | Path, device: str = "cpu") -> tuple[RCAModel, dict[str, Any]]:
    """A trained model from a run directory (or its ``model.safetensors``) and its ``config.json``."""
    from safetensors.torch import load_file

    p = Path(checkpoint)
    if not p.exists():
        raise TellerFileNotFoundError(
            f"{p}: no such checkpoint (a run directory with model.safetensors + config.json)", path=str(p)
        )
    run = p if p.is_dir() else p.parent
    weights = p / "model.safetensors" if p.is_dir() else p
    cfg_path = run / "config.json"
    if not weights.is_file() or not cfg_path.is_file():
        raise TellerFileNotFoundError(
            f"{run}: not a checkpoint (model.safetensors + config.json)", path=str(run)
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{cfg_path}: not a readable checkpoint configuration ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise ConfigError(f"{cfg_path}: not a checkpoint configuration (no 'model' section)")
    mc = dict(cfg["model"])
    mc["log_backbone"] = None  # the weights already hold it
    model = build_model(mc)
    try:
        state = load_file(str(weights))
    except Exception as e:  # (safetensors raises its own error type on a damaged header)
        raise ConfigError(f"{weights}: not readable safetensors ({e})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1:2] or [str(e)]
        raise ConfigError(
            f"{weights}: the weights do not fit the model {cfg_path} describes ({first[0].strip()})"
        ) from None
    model.to(device)
    model.eval()
    return model, cfg


class WeightEMA:
    """Exponential moving average of a model's parameters; buffers (the fitted feature norms and bin
    edges, fixed during training) are copied, not averaged. The decay ramps up as
    ``min(decay, (1 + n) / (10 + n))`` over the first updates, so that the average is not dominated
    by the initial weights."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"train.ema must be in (0, 1) (0 turns it off), got {decay}")
        self.decay = decay
        self.n = 0
        self.params = {k for k, _ in model.named_parameters()}
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.n += 1
        d = min(self.decay, (1.0 + self.n) / (10.0 + self.n))
        for k, v in model.state_dict().items():
            sh = self.shadow[k]
            if k in self.params and sh.dtype.is_floating_point:
                sh.mul_(d).add_(v.detach(), alpha=1.0 - d)
            else:
                sh.copy_(v)

    def swap(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Load the averaged weights into ``model``; returns its own weights (load them back after)."""
        raw = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.shadow)
        return raw

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if set(st["shadow"]) != set(self.shadow):
            raise ConfigError("the saved weight average does not match this model's weights")
        self.n = int(st["n"])
        # (onto the model's device: a run saved on one device may resume on another)
        self.shadow = {k: v.to(self.shadow[k].device).clone() for k, v in st["shadow"].items()}


def _check_tpe(tpe_dir: str | Path, man: dict[str, Any], run_dir: Path) -> None:
    """``--tpe-dir`` must be the TPE tokenizer the shards were encoded with: a model trained on
    one vocabulary and diagnosing with another would read other ids."""
    from teller import tpe
    from teller.data.tokenize import _sha256

    p = Path(tpe_dir)
    tfile = p / tpe.FILE_NAME if p.is_dir() else p
    if not tfile.is_file():
        raise TellerFileNotFoundError(
            f"{tfile}: no TPE tokenizer (--tpe-dir: the directory of {tpe.FILE_NAME})", path=str(tfile)
        )
    want = (man.get("tokenizer") or {}).get("sha256")
    if want and _sha256(tfile) != want:
        raise ConfigError(
            f"{tfile}: not the TPE tokenizer {run_dir} was encoded with (SHA-256 differs from its "
            "manifest.json's); pass that one, or leave --tpe-dir out to use the path the manifest names"
        )


def train(
    config: dict[str, Any],
    data_dir: str | Path,
    output_dir: str | Path,
    *,
    tpe_dir: str | Path | None = None,
    resume: bool = False,
    progress: ProgressFn | None = None,
    overrides: dict[str, Any] | None = None,
    extra_train: Sequence[str | Path] = (),
) -> Path:
    """Train a model; returns the run directory (``output_dir``). ``extra_train``: more tokenized
    shards (same tokenizers) whose train split is added to the training samples."""
    mcfg_d = dict(config.get("model") or {})
    tcfg_d = dict(config.get("train") or {})
    for k, v in (overrides or {}).items():
        (mcfg_d if k in {f.name for f in fields(ModelConfig)} else tcfg_d)[k] = v
    tc = TrainConfig.from_dict(tcfg_d)
    run_dir = shards_run_dir(data_dir)
    man = json.loads((run_dir / "manifest.json").read_text())
    label_names = list(man["label_names"])
    log_vocab = json.loads((run_dir / "log_tokenizer.json").read_text())["vocab"]
    mcfg_d.setdefault("trace_vocab", int(man["tokenizer"]["vocab_size"]))
    mcfg_d.setdefault("log_vocab", len(log_vocab))
    mcfg_d["n_classes"] = len(label_names)
    mcfg_d["label_names"] = label_names
    mc = ModelConfig.from_dict(mcfg_d)
    if tpe_dir:  # recorded for diagnose, which encodes new traces with it: checked before training
        _check_tpe(tpe_dir, man, run_dir)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(tc.device)

    ms = mc.max_summary_tokens if mc.summary_tokens and mc.modalities != "log" else 0
    if ms and int(man.get("version", 1)) < 2:
        raise ConfigError(
            f"{run_dir}: these shards (version {man.get('version', 1)}) have no per-symbol summaries, which "
            "model.summary_tokens needs; re-run `teller tokenize` (or set model.summary_tokens: false)"
        )
    if ms and mc.summary_loc and int(man.get("version", 1)) < 4 and tc.summary_loc_weight > 0:
        # older shards read summary_culprit as all False: the head would learn "no row is a culprit"
        raise ConfigError(
            f"{run_dir}: these shards (version {man.get('version', 1)}) have no summary_culprit labels, "
            "which model.summary_loc trains on (version 4); re-run `teller tokenize` (or set "
            "model.summary_loc: false)"
        )
    check_shards_version({"model": mc.to_dict(), "shards_version": int(man.get("version", 1))}, run_dir)
    seed_everything(tc.seed)
    train_s, _ = load_model_split(run_dir, "train", mc.to_dict())
    extra_dirs = [shards_run_dir(e) for e in extra_train]
    for e in extra_dirs:
        check_extra_train(run_dir, e)
        train_s += load_model_split(e, "train", mc.to_dict())[0]
    if tc.max_train_samples:
        train_s = train_s[: tc.max_train_samples]
    val_s, _ = load_model_split(run_dir, "val", mc.to_dict()) if "val" in man["splits"] else ([], [])

    seed_everything(tc.seed)
    model = build_model({**mc.to_dict(), "log_backbone": None})
    model.fit_feature_norm(train_s)
    model.fit_log_summary_norm(train_s)
    if mc.speed_aug and model.use_trace:
        from teller import tpe

        tk_path = tpe_dir or man["tokenizer"].get("path")
        if not tk_path:
            raise ConfigError(f"{run_dir}: model.speed_aug needs the TPE tokenizer: pass --tpe-dir")
        tk = tpe.load(tk_path)
        model.fit_speed_aug([tk.decode([i]) for i in range(tk.vocab_size)])
    if ms:
        model.fit_summary_norm(
            np.concatenate([s.summary_ids for s in train_s if s.summary_ids is not None]),
            np.concatenate([s.summary_features for s in train_s if s.summary_features is not None]),
        )
    if mc.log_backbone:
        init_log_side_from_bert(model, mc.log_backbone, log_vocab)
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    steps_per_epoch = max(1, math.ceil(len(train_s) / tc.batch_size))
    total = steps_per_epoch * tc.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total, int(tc.warmup_frac * total)))
    cfg_json = {
        "format": "teller-rca-checkpoint",
        "version": 1,
        "model": mc.to_dict(),
        "train": asdict(tc),
        "label_names": label_names,
        "data_dir": str(run_dir.resolve()),
        "extra_train": [str(e.resolve()) for e in extra_dirs],
        "train_samples": len(train_s),
        "shards_version": int(man.get("version", 1)),  # how diagnose rebuilds the summaries
        "tpe_dir": str(Path(tpe_dir).resolve()) if tpe_dir else man["tokenizer"].get("path"),
        "log_tokenizer": str((run_dir / "log_tokenizer.json").resolve()),
        # the kernel reference of summary columns 17-22 (shards >= 8), for diagnose
        "reference": str((run_dir / "reference.json").resolve())
        if (run_dir / "reference.json").is_file()
        else None,
        "reference_sha256": (man.get("reference") or {}).get("sha256"),
        # the device it ran on (train.device may say auto; CUDA trains with mixed precision): not
        # hashed into the recipe, shown by summarize where a kind's runs differ; a run resumed on
        # another device names both ("cpu+cuda")
        "trained_on": dev.type,
    }
    st: dict[str, Any] | None = None
    if resume and (out / "state.pt").is_file():
        # (CPU first: a run saved on one device may resume on another; load_state_dict moves it)
        st = torch.load(out / "state.pt", weights_only=False, map_location="cpu")
        saved = st.get("ema")
        if (saved is None) != (not tc.ema) or (saved and float(saved.get("decay", tc.ema)) != tc.ema):
            was = f"with train.ema {saved.get('decay')}" if saved else "without train.ema"
            raise ConfigError(
                f"{out / 'state.pt'}: the run was started {was}; resume it with the same setting"
            )
        try:
            before = json.loads((out / "config.json").read_text()).get("trained_on")
        except (OSError, ValueError, AttributeError):
            before = None
        if isinstance(before, str) and before:
            cfg_json["trained_on"] = "+".join(sorted({*before.split("+"), dev.type}))
    (out / "config.json").write_text(json.dumps(cfg_json, indent=1))
    history: list[dict[str, float]] = []
    start_epoch = 0
    best = -1.0
    bad_epochs = 0
    if st is not None:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(out / "last.safetensors")))
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        start_epoch, best, bad_epochs, history = st["epoch"], st["best"], st["bad_epochs"], st["history"]
        torch.set_rng_state(st["torch_rng"])
    ema = WeightEMA(model, tc.ema) if tc.ema else None
    if ema is not None and st is not None:
        ema.load_state_dict(st["ema"])
    use_amp = tc.amp and dev.type == "cuda"
    normal = label_names.index("normal") if "normal" in label_names else 0
    t_start = time.perf_counter()
    for epoch in range(start_epoch, tc.epochs):
        model.train()
        tot, n = 0.0, 0
        for k, bs in enumerate(batches(train_s, tc.batch_size, shuffle=True, seed=tc.seed * 1000 + epoch)):
            b = {kk: v.to(dev) for kk, v in collate(bs).items()}
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                o = model(b)
            loss, _ = loss_fn(o, b, tc.loc_weight, normal, tc.loc_listwise, tc.summary_loc_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if tc.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            sched.step()
            if ema is not None:
                ema.update(model)
            tot += float(loss.detach()) * len(bs)
            n += len(bs)
            if progress:
                progress("train", epoch * steps_per_epoch + k + 1, total, {"loss": tot / n})
        rec: dict[str, float] = {
            "epoch": epoch + 1,
            "train_loss": tot / max(1, n),
            "elapsed_s": time.perf_counter() - t_start,
        }
        raw = ema.swap(model) if ema is not None else None  # validate (and keep) the averaged weights
        if val_s:
            preds, _ = predict(model, val_s, device=dev)
            m = compute_metrics(preds, label_names)
            rec.update({f"val_{k}": float(m[k]) for k in ("ac@1", "category_accuracy", "macro_f1")})
            rec["val_loc_top1"] = float(m["loc_top1"] or 0.0)
            score = float(m["ac@1"]) + 0.01 * float(m["category_accuracy"])
        else:
            score = -rec["train_loss"]
        history.append(rec)
        if progress:
            progress("epoch", epoch + 1, tc.epochs, rec)
        if score > best:
            best, bad_epochs = score, 0
            save_checkpoint(model, out / "model.safetensors")
        else:
            bad_epochs += 1
        if raw is not None:
            model.load_state_dict(raw)
        save_checkpoint(model, out / "last.safetensors")
        torch.save(
            {
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "epoch": epoch + 1,
                "best": best,
                "bad_epochs": bad_epochs,
                "history": history,
                "torch_rng": torch.get_rng_state(),
                "ema": ema.state_dict() if ema is not None else None,
            },
            out / "state.pt",
        )
        (out / "history.json").write_text(json.dumps(history, indent=1))
        if bad_epochs >= tc.patience:
            break
        if (time.perf_counter() - t_start) / 60 > tc.max_minutes:
            break
    if not (out / "model.safetensors").exists():
        if ema is not None:
            ema.swap(model)
        save_checkpoint(model, out / "model.safetensors")
    return out


def check_shards_version(cfg: dict[str, Any], run_dir: Path) -> None:
    """A checkpoint's configuration (a model's; a baselines run's, without ``model``, reads the
    summary rows; at training time, the configuration being trained) against the shards it is about
    to read: :class:`ConfigError` when the model reads
    ``token_proc_log`` and the shards (version < 5) have none (they would read as "no process logged
    an error"); a warning when the summary rows were computed differently from the training data's
    (version 5 changed what columns 9-11 mean, not their number), or the traces were linked
    differently (version 6: each rank's GPU work under its own process); :class:`ConfigError` when
    the checkpoint reads more summary columns than the shards have (versions 7, 8 and 11 added 3 each)."""
    mc = cfg.get("model")
    man = json.loads((run_dir / "manifest.json").read_text())
    have = int(man.get("version", 1))
    trace_side = mc is None or mc.get("modalities", "both") != "log"
    trained = int(cfg.get("shards_version") or 4)
    if trace_side and (have >= 6) != (trained >= 6):
        warnings.warn(
            f"{run_dir}: shards version {have}, the checkpoint was trained on version {trained}; version 6 "
            "links the GPU work of a multi-process trace to its own process (before, to rank 0's calls): "
            "re-tokenize the data with the teller that trained the checkpoint, or retrain",
            stacklevel=2,
        )
    need = (
        (mc.get("n_summary_features") if mc.get("summary_tokens") else None)
        if mc
        else cfg.get("summary_width")
    )
    width = len(man.get("summary", {}).get("feature_names", []))
    if trace_side and need and width < int(need):
        raise ConfigError(
            f"{run_dir}: shards version {have} have {width} summary columns, the checkpoint reads "
            f"{need} (trained on version {trained}; versions 7, 8 and 11 added 3 each); "
            "re-run `teller tokenize`",
            path=str(run_dir),
        )
    ref_have = (man.get("reference") or {}).get("sha256")
    ref_trained = cfg.get("reference_sha256")
    reads_ref = int(need or 0) > 17
    if trace_side and reads_ref and ref_have and ref_trained and ref_have != ref_trained:
        warnings.warn(
            f"{run_dir}: its kernel reference (summary columns 17-22) is not the one the checkpoint "
            "was trained with; encode the data with `teller tokenize --log-tokenizer "
            "TRAINING_RUN/log_tokenizer.json` (which takes that run's reference.json)",
            stacklevel=2,
        )
    if mc and mc.get("log_process_features") and trace_side and have < 5:
        raise ConfigError(
            f"{run_dir}: shards version {have} have no token_proc_log, which model.log_process_features "
            "reads (version 5); re-run `teller tokenize` (or set model.log_process_features: false)",
            path=str(run_dir),
        )
    if not trace_side or (mc is not None and not mc.get("summary_tokens")):
        return
    if (have >= 5) != (trained >= 5):
        warnings.warn(
            f"{run_dir}: shards version {have}, the checkpoint was trained on version {trained}; their "
            "per-symbol summaries differ (columns 9-11): re-tokenize the data with the teller that "
            "trained the checkpoint, or retrain",
            stacklevel=2,
        )


def evaluate(
    checkpoint: str | Path, data_dir: str | Path | None = None, split: str = "test", device: str = "cpu"
) -> dict[str, Any]:
    """Metrics of a checkpoint on a split of tokenized shards (``data_dir`` defaults to the training one)."""
    model, cfg = load_checkpoint(checkpoint, device)
    run_dir = shards_run_dir(data_dir or cfg["data_dir"])
    mc = cfg["model"]
    check_shards_version(cfg, run_dir)
    samples, names = load_model_split(run_dir, split, mc)
    preds, _ = predict(model, samples)
    # latency: one sample at a time (what a diagnosis costs)
    t0 = time.perf_counter()
    for s in samples[: min(32, len(samples))]:
        predict(model, [s], batch_size=1)
    lat = (time.perf_counter() - t0) / max(1, min(32, len(samples)))
    m = metrics_for(preds, names, cfg["label_names"])
    m["latency_ms_per_sample"] = 1000 * lat
    m["split"] = split
    m["checkpoint"] = str(checkpoint)
    m["model"] = f"{mc['arch']}" + ("" if mc["modalities"] == "both" else f"-{mc['modalities']}-only")
    return m
