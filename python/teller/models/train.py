"""Training, prediction and evaluation of the RCA models (``teller train mot|single``, ``teller evaluate``).

A run directory holds ``config.json`` (model + training configuration, label names, data and
tokenizer references), ``model.safetensors`` (the best weights on val), ``last.safetensors`` +
``state.pt`` (optimizer, scheduler, epoch and RNG state: ``--resume`` continues from them) and
``history.json``. Deterministic given the seed (CPU; single-threaded reductions are not required,
but the same thread count is).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from teller._io import check_output_dir, dir_lock, make_output_dir, yaml_error_line
from teller.data.tokenize import LogTokenizer, read_shards_manifest
from teller.errors import (
    ConfigError,
    DatasetError,
    TellerError,
    TellerFileNotFoundError,
    TellerIOError,
    TellerWarning,
    TrainingDivergedError,
)
from teller.models.data import Sample, batches, check_extra_train, collate, load_model_split
from teller.models.metrics import (
    TEMPERATURE_RANGE,
    Prediction,
    compute_metrics,
    ece,
    fit_temperature,
    log_softmax,
    metrics_for,
    nll,
)
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
    """Path of a shipped configuration: ``mot``, ``single``, ``mot_minilm``, ``demo`` or
    ``demo_single``."""
    root = resources.files("teller.models") / "configs"
    p = Path(str(root / name / "train.yaml"))
    if not p.is_file():
        shipped = sorted(d.name for d in root.iterdir() if (d / "train.yaml").is_file())
        raise ConfigError(f"no shipped configuration {name!r} (shipped: {', '.join(shipped)})")
    return p


# the top-level sections of a training configuration
CONFIG_SECTIONS = ("model", "train")


def _config_sections(d: Any, where: str) -> None:
    """``d`` is a training configuration: a mapping of ``model:`` / ``train:`` mappings (or null)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: the configuration must be a mapping of {' and '.join(CONFIG_SECTIONS)}")
    bad = sorted(str(k) for k in d if k not in (*CONFIG_SECTIONS, "base"))
    if bad:
        raise ConfigError(
            f"{where}: unknown top-level key(s) {', '.join(bad)} "
            f"(allowed: base, {', '.join(CONFIG_SECTIONS)})"
        )
    if "base" in d and not isinstance(d["base"], str):
        raise ConfigError(
            f"{where}: base: must be a shipped configuration's name or a YAML file, got {d['base']!r}"
        )
    for k in CONFIG_SECTIONS:
        if d.get(k) is not None and not isinstance(d[k], dict):
            raise ConfigError(f"{where}: {k}: must be a mapping of settings, got {d[k]!r}")


def load_config(path: str | Path | None, default: str, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A training configuration: a YAML file, a shipped configuration's name, or (``None``) the
    shipped ``default``. Its ``model:`` and ``train:`` sections are type-checked here, so that a
    mistake names the file. ``base: NAME`` (a shipped configuration, or a YAML file, relative to this
    one) is read first, and this file's settings replace its, one by one; without ``base:`` a file
    is the whole configuration (every setting it leaves out takes its built-in default)."""
    p = Path(path) if path else builtin_config(default)
    if not p.is_file():
        # (a bare word is a shipped configuration's name; an existing path or one with a directory
        # part is a file that is said as such)
        if path and not Path(path).suffix and not p.exists() and os.sep not in str(path):
            p = builtin_config(str(path))
        elif p.is_dir():
            raise TellerIOError(
                f"{p}: a directory, not a configuration file", path=str(p), errno=errno.EISDIR
            )
        else:
            raise TellerFileNotFoundError(f"{p}: no such configuration file", path=str(p))
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise TellerIOError(
            f"{p}: cannot read the configuration ({e.strerror or e})", path=str(p), errno=e.errno
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{p}: not a YAML configuration (not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start})",
            path=str(p),
        ) from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {yaml_error_line(e)}", path=str(p)) from None
    if d is None:
        raise ConfigError(
            f"{p}: the configuration is empty (expected {' and/or '.join(CONFIG_SECTIONS)} sections)",
            path=str(p),
        )
    _config_sections(d, str(p))
    if "base" in d:
        if p.resolve() in _chain or len(_chain) > 8:
            raise ConfigError(f"{p}: base: {d['base']} leads back to itself", path=str(p))
        b = Path(d["base"]).expanduser()
        ref: str | Path = b if b.is_absolute() else (p.parent / b) if b.suffix else d["base"]
        try:
            base = load_config(ref, default, (*_chain, p.resolve()))
        except TellerError as e:
            raise type(e)(f"{p}: base: {e}", path=str(p)) from None
        d = {
            k: {**(base.get(k) or {}), **(d.get(k) or {})} if (base.get(k) or d.get(k)) else None
            for k in CONFIG_SECTIONS
        }
        d = {k: v for k, v in d.items() if v is not None}
    from teller.models.checks import typed_config

    for k, cls in (("model", ModelConfig), ("train", TrainConfig)):
        try:
            typed_config(cls, d.get(k) or {}, k)  # (values are checked in full by train())
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}", path=str(p)) from None
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
        probs = torch.softmax(out["logits"].float() / model.temperature, -1).cpu().numpy()
        loc = out["loc_logits"].float().cpu().numpy() if "loc_logits" in out else None
        by = out["loc_logits_by_class"].float().cpu().numpy() if "loc_logits_by_class" in out else None
        sym = out["summary_loc_logits"].float().cpu().numpy() if "summary_loc_logits" in out else None
        for i, s in enumerate(bs):
            n = len(s.trace_ids)
            n_rows = 0 if s.summary_ids is None else len(s.summary_ids)
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
                    symbol_scores=sym[i, :n_rows] if sym is not None else None,
                    symbol_culprit=s.summary_culprit[:n_rows]
                    if sym is not None and s.summary_culprit is not None
                    else None,
                )
            )
    dt = (time.perf_counter() - t0) / max(1, len(samples))
    return preds, dt


@torch.no_grad()
def predict_logits(
    model: RCAModel, samples: Sequence[Sample], batch_size: int = 32, device: torch.device | None = None
) -> np.ndarray:
    """The category head's raw logits [n, C] (float64), before any temperature."""
    model.eval()
    dev = device or next(model.parameters()).device
    out = [
        model({k: v.to(dev) for k, v in collate(bs).items()})["logits"].double().cpu().numpy()
        for bs in batches(samples, batch_size, shuffle=False)
    ]
    return np.concatenate(out) if out else np.zeros((0, model.cfg.n_classes))


def fit_calibration(
    model: RCAModel, samples: Sequence[Sample], split: str, device: torch.device | None = None
) -> dict[str, Any]:
    """Temperature scaling of the category head fitted on ``samples`` (held out from training: val):
    the ``calibration`` record of a checkpoint's config.json, with the split's NLL and ECE before and
    after. The argmax of every sample stays; only how sure the probabilities say the model is
    changes (metrics.fit_temperature)."""
    z = predict_logits(model, samples, device=device)
    y = np.asarray([s.label for s in samples], dtype=np.int64)
    note = None
    if len(y) and (z.argmax(1) == y).all():
        # every sample right: the NLL falls all the way as T -> 0 and the "fit" would only make every
        # confidence 1.000. Nothing here says how sure the model should be: left at 1
        t = 1.0
        note = f"every {split} sample is right: nothing to calibrate against, the temperature left at 1"
    else:
        t = fit_temperature(z, y)
        lo, hi = TEMPERATURE_RANGE
        if t <= lo * 1.01 or t >= hi * 0.99:
            note = (
                f"the temperature is at the end of its range ({lo:g} .. {hi:g}): {split} is too small "
                "or too easy to fit it on"
            )
    if note:
        warnings.warn(f"calibration: {note}", TellerWarning, stacklevel=2)
    before, after = np.exp(log_softmax(z)), np.exp(log_softmax(z, t))
    out: dict[str, Any] = {
        "method": "temperature",
        "temperature": t,
        "split": split,
        "n": len(y),
        "nll_before": round(nll(before, y), 6),
        "nll_after": round(nll(after, y), 6),
        "ece_before": round(ece(before, y), 6),
        "ece_after": round(ece(after, y), 6),
    }
    if note:
        out["note"] = note
    return out


def checkpoint_temperature(cfg: dict[str, Any]) -> float:
    """The temperature a checkpoint's config.json records (1.0 without a ``calibration``)."""
    cal = cfg.get("calibration")
    return float(cal["temperature"]) if isinstance(cal, dict) else 1.0


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask: read from /proc (setting it to read it back races with other threads
    creating files), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_tmp(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` into a temporary file beside ``path``, flushed to disk; :func:`_commit` moves it
    in place. An error removes it and is a :class:`TellerIOError` naming ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        # (safetensors creates its file 0600: the run's files get the mode the user's umask gives)
        os.chmod(tmp, 0o666 & ~_umask())
        _fsync(tmp)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            raise TellerIOError(
                f"{path}: cannot write it ({e.strerror or e})", path=str(path), errno=e.errno
            ) from None
        if isinstance(e, Exception):
            # (a full disk reaches torch.save as a RuntimeError, safetensors as its SafetensorError)
            raise TellerIOError(
                f"{path}: cannot write it ({type(e).__name__}: {_one_line(e)})", path=str(path)
            ) from None
        raise
    return tmp


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM (a scheduler, `timeout`) wait until the block is done: the files
    of one checkpoint are replaced together, so that an interrupted run leaves the earlier ones, or
    the new ones, never a mix. (SIGKILL cannot wait: :func:`recover_commit` finishes the renames.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[tuple[int, Any]] = []
    before: dict[int, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            before[sig] = signal.signal(sig, lambda *a: got.append(a))
    except (ValueError, OSError):  # (no signals here)
        for sig, h in before.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        yield
        return
    try:
        yield
    finally:
        # (None: a handler not installed from Python, which cannot be put back: the default)
        for sig, h in before.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        if got:
            sig = got[0][0]
            h = before.get(sig)
            if h is signal.SIG_IGN:
                pass
            elif callable(h):
                h(*got[0])  # (Python's own SIGINT handler raises KeyboardInterrupt)
            elif sig == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                signal.raise_signal(sig)  # (the default action, now that the files are in place)


COMMIT_JOURNAL = ".commit.json"  # the renames of a commit in progress (see _commit)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # (the renames themselves, on disk; not every system allows it)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(out: Path, files: dict[str, Path]) -> None:
    """Move the temporary files ``files`` (name -> temporary path in ``out``, in this order) into
    ``out``, as one step. Signals wait (:func:`_interrupts_deferred`). A process killed outright
    between two renames (SIGKILL, the OOM killer, a power cut) cannot wait, so with several files
    the list of renames is written first, atomically, to ``out/.commit.json``, after every
    temporary file is on disk: :func:`recover_commit` finishes a commit it finds there (a write-
    ahead journal, rolled forward), and the run holds one epoch's files, never a mix."""
    journal = out / COMMIT_JOURNAL if len(files) > 1 else None
    with _interrupts_deferred():
        if journal is not None:
            _fsync_dir(out)  # (the temporary files' names on disk before the journal that lists them)
            jtmp = _write_tmp(
                journal,
                lambda t: t.write_text(json.dumps({"renames": [[n, tmp.name] for n, tmp in files.items()]})),
            )
            try:
                os.replace(jtmp, journal)
            except OSError as e:
                with contextlib.suppress(OSError):
                    jtmp.unlink()
                raise TellerIOError(
                    f"{journal}: cannot write it ({e.strerror or e})", path=str(journal), errno=e.errno
                ) from None
            _fsync_dir(out)
        try:
            for name, tmp in files.items():
                try:
                    os.replace(tmp, out / name)
                except OSError as e:
                    raise TellerIOError(
                        f"{out / name}: cannot write it ({e.strerror or e})",
                        path=str(out / name),
                        errno=e.errno,
                    ) from None
        except BaseException:
            # (failed in this process: the caller removes the temporary files it names)
            if journal is not None:
                with contextlib.suppress(OSError):
                    journal.unlink()
            raise
        if journal is not None:
            try:  # (a journal left behind would name the next save's temporary files half written)
                journal.unlink()
            except OSError as e:
                raise TellerIOError(
                    f"{journal}: cannot remove it ({e.strerror or e})", path=str(journal), errno=e.errno
                ) from None
    _fsync_dir(out)


def recover_commit(out: Path) -> list[str]:
    """Finish a commit of :func:`_commit` that a killed process left in ``out`` (its
    ``.commit.json``): rename in the temporary files it names that are still there. Returns the
    names renamed. Every temporary file was on disk before the journal was, so the result is the
    commit's files. A journal that is not one (damaged, or not teller's) is a :class:`ConfigError`
    naming it, and nothing is renamed."""
    journal = out / COMMIT_JOURNAL
    if not journal.is_file():
        return []
    try:
        renames = json.loads(journal.read_text())["renames"]
        # (each entry exactly as _commit writes it: a file name and its _write_tmp temporary name)
        ok = isinstance(renames, list) and all(
            isinstance(r, list)
            and len(r) == 2
            and isinstance(r[0], str)
            and r[0]
            and Path(r[0]).name == r[0]
            and r[0] not in (".", "..")
            and r[1] == f".{r[0]}.tmp"
            for r in renames
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(
            f"{journal}: not a commit journal teller wrote (it lists the renames of an interrupted save); "
            "remove it if this run's files are whole, or train into another --output-dir",
            path=str(journal),
        )
    done = []
    for name, tmp in renames:
        if (out / tmp).is_file():
            try:
                os.replace(out / tmp, out / name)
            except OSError as e:
                raise TellerIOError(
                    f"{out / name}: cannot finish the interrupted save ({e.strerror or e})",
                    path=str(out / name),
                    errno=e.errno,
                ) from None
            done.append(name)
    try:
        journal.unlink()
    except OSError as e:
        raise TellerIOError(
            f"{journal}: cannot remove it ({e.strerror or e})", path=str(journal), errno=e.errno
        ) from None
    _fsync_dir(out)
    return done


def _weights_writer(model: nn.Module, metadata: dict[str, str] | None = None) -> Callable[[Path], None]:
    """A writer (for :func:`_write_tmp`) of the model's weights as they are now, as safetensors."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    return lambda t: save_file(state, str(t), metadata=metadata)


def _trained_as(cfg_json: dict[str, Any]) -> dict[str, str]:
    """The weights' metadata: the model section they were trained with (load_checkpoint compares it
    with config.json's: an edited n_heads or activation loaded silently as another network)."""
    return {"model": json.dumps(cfg_json["model"], sort_keys=True)}


def _model_changes(trained: str | None, now: dict[str, Any]) -> list[str]:
    """``field: trained -> now`` for each model setting that differs; a setting one side lacks counts
    as its default (a teller that added it reads older files alike); ``log_backbone`` (where the
    initial weights came from: the trained ones are in the file) is not compared. Empty where the
    weights record nothing (written before they did)."""
    if not trained:
        return []
    try:
        was = json.loads(trained)
    except ValueError:
        return ["its recorded model section is not JSON"]
    if not isinstance(was, dict):
        return []
    from teller.models.mot import ModelConfig
    from teller.models.report import _MODEL_SYNONYMS

    default = json.loads(json.dumps(ModelConfig().to_dict()))  # (as JSON reads it: lists, not tuples)

    def spelled(k: str, v: Any) -> Any:  # (one value's two spellings: `true` is "relative")
        alias, value = _MODEL_SYNONYMS.get(k, (object(), None))
        return value if v is alias else v

    out = []
    for k in sorted(set(was) | set(now)):
        if k == "log_backbone":
            continue
        a, b = spelled(k, was.get(k, default.get(k))), spelled(k, now.get(k, default.get(k)))
        if a != b:
            out.append(f"{k}: {json.dumps(a)} -> {json.dumps(b)}")
    return out


def save_checkpoint(model: RCAModel, path: Path, metadata: dict[str, str] | None = None) -> None:
    """The model's weights as safetensors, written atomically (a temporary file, then renamed)."""
    path = Path(path)
    tmp = _write_tmp(path, _weights_writer(model, metadata))
    _commit(path.parent, {path.name: tmp})


# fields of a checkpoint's config.json that diagnose / evaluate read, and the types they must have
_CKPT_FORMAT = "teller-rca-checkpoint"
_CKPT_VERSION = 1
_CKPT_FIELDS: dict[str, tuple[type, ...]] = {
    "data_dir": (str, type(None)),
    "extra_train": (list, type(None)),
    "tpe_dir": (str, type(None)),
    "log_tokenizer": (str, type(None)),
    "reference": (str, type(None)),
    "reference_sha256": (str, type(None)),
    "shards_version": (int, type(None)),
    "train": (dict, type(None)),
    "trained_on": (str, type(None)),
    "calibration": (dict, type(None)),
}


def _check_checkpoint_config(cfg: dict[str, Any], cfg_path: Path, calibration: bool = True) -> None:
    """A checkpoint's config.json, field by field: a :class:`ConfigError` naming the file."""
    fmt = cfg.get("format", _CKPT_FORMAT)
    if fmt != _CKPT_FORMAT:
        raise ConfigError(
            f"{cfg_path}: not an RCA model checkpoint (format {fmt!r}, expected {_CKPT_FORMAT!r})",
            path=str(cfg_path),
        )
    ver = cfg.get("version", _CKPT_VERSION)
    if type(ver) is not int or ver < 1:
        raise ConfigError(f"{cfg_path}: version: {ver!r} is not a checkpoint version (1)", path=str(cfg_path))
    if ver > _CKPT_VERSION:
        raise ConfigError(
            f"{cfg_path}: checkpoint version {ver}, this teller reads version {_CKPT_VERSION}: "
            "written by a newer teller",
            path=str(cfg_path),
        )
    for k, types in _CKPT_FIELDS.items():
        v = cfg.get(k)
        if not isinstance(v, types) or isinstance(v, bool):
            want = " or ".join(
                "null"
                if t is type(None)
                else {str: "a string", int: "an integer", list: "a list", dict: "a mapping"}[t]
                for t in types
            )
            raise ConfigError(f"{cfg_path}: {k}: {v!r} is not {want}", path=str(cfg_path))
    cal = cfg.get("calibration")
    if cal is not None and calibration:
        t = cal.get("temperature")
        if type(t) not in (int, float) or not math.isfinite(t) or t <= 0:
            raise ConfigError(
                f"{cfg_path}: calibration.temperature: {t!r} is not a positive number "
                "(refit it with `teller calibrate`, or remove it with `teller calibrate --reset`)",
                path=str(cfg_path),
            )
    names = cfg.get("label_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"{cfg_path}: label_names: {names!r} is not a list of strings", path=str(cfg_path)
            )
        n = cfg["model"].get("n_classes")
        if type(n) is int and len(names) != n:
            raise ConfigError(
                f"{cfg_path}: label_names has {len(names)} names, model.n_classes is {n}", path=str(cfg_path)
            )
        # training writes both; two orders would name every cause by the wrong logit
        inner = cfg["model"].get("label_names")
        if inner is not None and list(inner) != names:
            raise ConfigError(
                f"{cfg_path}: label_names and model.label_names differ (the file was edited?): "
                "the causes cannot be named",
                path=str(cfg_path),
            )


def _stopped_short(run: Path, cfg: dict[str, Any]) -> bool:
    """Whether a run without a calibration record stopped before its end: it has a saved state and
    fewer epochs in its history than train.epochs. (A run of an earlier teller trained without a val
    split, or reset by its calibrate --reset, has no record either, and its history is whole, unless
    it stopped early by train.patience, which needs a val split, so it was calibrated.)"""
    if not (run / "state.pt").is_file():
        return False
    try:
        epochs = int((cfg.get("train") or {}).get("epochs"))
        done = len(json.loads((run / "history.json").read_text()))
    except (OSError, ValueError, TypeError):
        return False
    return done < epochs


def refuse_a_file_as_checkpoint(p: Path) -> None:
    """A ConfigError naming ``p`` where it is a file outside any run directory (no config.json beside
    it) and not a weights file: the directory around it was named instead (``.``, ``DIR/config.json``)."""
    if not p.is_file() or p.suffix == ".safetensors" or (p.parent / "config.json").is_file():
        return  # (a file of a run: the run's own checks say what it is)
    raise ConfigError(
        f"{p}: a file, not a checkpoint: give a run directory of teller train (model.safetensors + "
        "config.json)",
        path=str(p),
    )


def load_checkpoint(
    checkpoint: str | Path, device: str = "cpu", *, calibrated: bool = True
) -> tuple[RCAModel, dict[str, Any]]:
    """A trained model from a run directory (or its ``model.safetensors``) and its ``config.json``.
    ``calibrated=False``: the recorded temperature is neither checked nor used (T = 1)."""
    from safetensors.torch import load_file

    p = Path(checkpoint)
    if not p.exists():
        raise TellerFileNotFoundError(
            f"{p}: no such checkpoint (a run directory with model.safetensors + config.json)", path=str(p)
        )
    run = p if p.is_dir() else p.parent
    weights = p / "model.safetensors" if p.is_dir() else p
    if p.is_file() and p.name.endswith(".json"):  # (read as weights it is "not safetensors")
        if (run / "model.safetensors").is_file():  # (its config.json, say: the run beside it)
            hint = f"give the run directory {run} (or its weights file, model.safetensors)"
        else:
            hint = "give a run directory of teller train (model.safetensors + config.json)"
        raise ConfigError(f"{p}: a JSON file, not a checkpoint: {hint}", path=str(p))
    refuse_a_file_as_checkpoint(p)
    if p.is_file() and p.name != "model.safetensors":
        # (its config.json's temperature, and the fingerprint evaluations are filed under, are those
        # of model.safetensors: last.safetensors, the state a --resume continues from, would be
        # scored, calibrated and recorded as the run's trained weights)
        raise ConfigError(
            f"{p}: not a run's trained weights (model.safetensors, its best epoch): give the run "
            f"directory {run}; last.safetensors is the training state `teller train --resume` continues from",
            path=str(p),
        )
    cfg_path = run / "config.json"
    if not weights.is_file() and cfg_path.is_file():
        fmt = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fmt = json.loads(cfg_path.read_text()).get("format")
        if fmt == "teller-baselines":
            raise ConfigError(
                f"{run}: a baselines run (teller train baselines), not a MoT or single-stream one: it has no "
                "network to load (teller evaluate reads it; teller train ensemble mixes it with a MoT run)",
                path=str(run),
            )
    if not weights.is_file() or not cfg_path.is_file():
        raise TellerFileNotFoundError(
            f"{run}: not a checkpoint (model.safetensors + config.json)", path=str(run)
        )
    if (run / COMMIT_JOURNAL).is_file():  # (read-only here: a trainer may be renaming right now)
        warnings.warn(
            f"{run}: a save of this run is in progress or was cut short ({COMMIT_JOURNAL}): its files may "
            "be of two epochs until `teller train --resume` into it finishes the save",
            TellerWarning,
            stacklevel=2,
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except OSError as e:
        raise TellerIOError(
            f"{cfg_path}: cannot read it ({e.strerror or e})", path=str(cfg_path), errno=e.errno
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{cfg_path}: not a readable checkpoint configuration ({e})", path=str(cfg_path)
        ) from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise ConfigError(
            f"{cfg_path}: not a checkpoint configuration (no 'model' section)", path=str(cfg_path)
        )
    _check_checkpoint_config(cfg, cfg_path, calibration=calibrated)
    mc = dict(cfg["model"])
    mc["log_backbone"] = None  # the weights already hold it
    try:
        model = build_model(mc)
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}", path=str(cfg_path)) from None
    except (TypeError, ValueError) as e:  # (a value the type checks let through, out of range)
        raise ConfigError(
            f"{cfg_path}: its model section does not build a model ({e})", path=str(cfg_path)
        ) from None
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt", device="cpu") as fh:
            meta = fh.metadata() or {}
        state = load_file(str(weights))
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        raise TellerIOError(
            f"{weights}: cannot read it ({e.strerror or e})", path=str(weights), errno=e.errno
        ) from None
    except Exception as e:  # (safetensors raises its own error type on a damaged header)
        raise ConfigError(f"{weights}: not readable safetensors ({e})", path=str(weights)) from None
    changed = _model_changes(meta.get("model"), cfg["model"])
    if changed:
        raise ConfigError(
            f"{cfg_path}: its model section is not the one {weights.name} was trained with "
            f"({'; '.join(changed)}): the weights would run as another network; restore it, or retrain",
            path=str(cfg_path),
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1:2] or [str(e)]
        raise ConfigError(
            f"{weights}: the weights do not fit the model {cfg_path} describes ({first[0].strip()})",
            path=str(weights),
        ) from None
    model.temperature = checkpoint_temperature(cfg) if calibrated else 1.0
    if calibrated and "calibration" not in cfg and _stopped_short(run, cfg):
        # (training calibrates on val as its last step: a run without it stopped before its end, or
        # had no val split; its confidences are the network's raw, over-confident probabilities)
        warnings.warn(
            f"{run}: not calibrated: its training stopped before its end (the same teller train command "
            "with --resume finishes it; teller calibrate fits the temperature alone); its confidences "
            "are the network's uncalibrated probabilities",
            TellerWarning,
            stacklevel=2,
        )
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


# the files of a trained run: a directory holding any of them is trained into only with resume
RUN_FILES = ("config.json", "model.safetensors", "last.safetensors", "state.pt")


def _one_line(e: BaseException) -> str:
    """An exception's message on one line, cut at its first sentence where long."""
    msg = " ".join(str(e).split()) or type(e).__name__
    if len(msg) > 160:
        end = msg.find(". ", 40)
        msg = msg[: end + 1] if 0 < end < 240 else msg[:240] + "..."
    return msg


def _check_output_dir(out: Path) -> None:
    """``out`` can be the run directory: a directory, or a path one can be created at, writable
    (check_output_dir checks the nearest existing directory's permissions too)."""
    check_output_dir(out, "--output-dir names the run directory")


# what any teller run directory holds (a trained model's, a baselines run's, an ensemble's config)
ANY_RUN_FILES = (*RUN_FILES, "baselines.pkl", "history.json")


def check_new_run_dir(out: Path) -> None:
    """``out`` can take a new run that cannot be resumed (baselines, an ensemble): a directory (or
    a path one can be created at), writable, holding no run yet (else a :class:`TellerError` naming
    it and what it holds, before any work). A save in progress or left half done by a killed
    process (its ``.commit.json``) counts as a run: it is not touched here, where another process
    may be writing it."""
    _check_output_dir(out)
    present = [f for f in (*ANY_RUN_FILES, COMMIT_JOURNAL) if (out / f).exists()]
    if present:
        raise ConfigError(
            f"{out}: already holds a run ({', '.join(present)}); "
            "pick another --output-dir (or remove this one)",
            path=str(out),
        )


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed over it (never half written)."""
    _commit(path.parent, {path.name: _write_tmp(path, lambda t: t.write_text(text))})


def distinct_extra_train(run_dir: Path, extra_dirs: Sequence[Path]) -> None:
    """Refuse ``--extra-train`` shards given twice (by resolved path): they would be trained on twice."""
    seen: dict[Path, Path] = {}
    for e in extra_dirs:
        r = e.resolve()
        if r in seen:
            raise ConfigError(
                f"{e}: given twice as --extra-train (also as {seen[r]}); "
                "its samples would be trained on twice",
                path=str(e),
            )
        seen[r] = e


def _sha(man: dict[str, Any], part: str) -> Any:
    d = man.get(part)
    return d.get("sha256") if isinstance(d, dict) else None


def check_eval_data(
    cfg: dict[str, Any],
    run_dir: Path,
    split: str,
    ckpt: str | Path,
    vocab: tuple[int | None, int | None] = (None, None),
) -> None:
    """The shards ``run_dir`` that a run (``cfg``, its config.json) is about to be evaluated on:
    encoded with the TPE and log tokenizers it was trained on (their SHA-256 against the run's
    training shards' manifest; where those are gone, the recorded TPE tokenizer file's, else the
    vocabulary sizes ``vocab`` = (trace, log) the model reads), and holding samples in ``split``.
    Else a :class:`ConfigError` naming the shards."""
    from teller.data.tokenize import _sha256, read_shards_manifest

    man = read_shards_manifest(run_dir)
    hint = (
        "evaluate a dataset directory instead (--data-dir DATASET or --split DATASET: it is encoded "
        "with the checkpoint's own tokenizers)"
    )
    trained = cfg.get("data_dir")
    tman: dict[str, Any] | None = None
    if isinstance(trained, str) and trained:
        with contextlib.suppress(TellerError, OSError, ValueError):
            tdir = shards_run_dir(trained)
            if tdir.resolve() == run_dir.resolve():
                tman = man
            else:
                tman = read_shards_manifest(tdir)
    checks: list[tuple[str, Any, Any]] = []
    if tman is not None:
        checks += [
            ("TPE tokenizer", _sha(tman, "tokenizer"), _sha(man, "tokenizer")),
            ("log tokenizer", _sha(tman, "log_tokenizer"), _sha(man, "log_tokenizer")),
        ]
    else:
        tpe_file = cfg.get("tpe_dir")
        if isinstance(tpe_file, str) and tpe_file:
            from teller import tpe

            f = Path(tpe_file)
            f = f / tpe.FILE_NAME if f.is_dir() else f
            if f.is_file():
                checks.append(("TPE tokenizer", _sha256(f), _sha(man, "tokenizer")))
        lt = man.get("log_tokenizer") if isinstance(man.get("log_tokenizer"), dict) else {}
        tk = man.get("tokenizer") if isinstance(man.get("tokenizer"), dict) else {}
        checks += [
            ("TPE vocabulary size", vocab[0], tk.get("vocab_size")),
            ("log vocabulary size", vocab[1], lt.get("vocab_size")),
        ]
    for what, want, have in checks:
        # (by size, the last resort: sizes that differ. A model given a larger model.trace_vocab than
        # its shards' whose shards and tokenizer are both gone is refused too; the size is all that
        # is left to tell another tokenizer's shards by)
        if want is not None and have is not None and want != have:
            why = (
                f"its {what} is {have}, {ckpt} was trained on {want}"
                if "size" in what
                else f"encoded with another {what} than {ckpt} was trained on"
            )
            raise ConfigError(f"{run_dir}: {why}; {hint}", path=str(run_dir))
    names = [split] if split != "all" else list(man["splits"])
    if split != "all" and split not in man["splits"]:
        raise ConfigError(
            f"{run_dir}: no {split!r} split (it has {', '.join(man['splits']) or 'none'})", path=str(run_dir)
        )
    if sum(len(man["splits"][n].get("samples") or []) for n in names) == 0:
        raise ConfigError(
            f"{run_dir}: its {split!r} split holds no samples: nothing to evaluate", path=str(run_dir)
        )


def _shards_identity(man: dict[str, Any]) -> str:
    """What tokenized shards hold, not where they or their inputs lie: the hash of their manifest
    without the input paths (the same shards moved elsewhere are the same)."""
    m = json.loads(json.dumps(man))
    for k in ("dataset", "tokenizer"):
        if isinstance(m.get(k), dict):
            m[k].pop("path", None)
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def _model_diff(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The model settings that differ between a run's recorded configuration and ``now`` (a setting
    missing from the record, written before it existed, counts as its default)."""
    from dataclasses import MISSING

    diff = []
    for f in fields(ModelConfig):
        if f.default is not MISSING:
            dflt = f.default
        elif f.default_factory is not MISSING:
            dflt = f.default_factory()
        else:
            dflt = None
        was, want = recorded.get(f.name, dflt), now.get(f.name, dflt)
        if was != want:
            diff.append(f"model.{f.name}: the run has {was!r}, now {want!r}")
    return diff


def _resume_state(
    out: Path,
    tc: TrainConfig,
    mc: ModelConfig,
    data: dict[str, Any],
    run_dir: Path,
    extra_dirs: Sequence[Path],
) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor] | None, dict[str, Any]]:
    """The saved state of the run in ``out`` (state.pt, last.safetensors and the recorded
    config.json), checked: readable, of one epoch, and of the same model and data as this resume
    (else a :class:`TellerError` naming the file). ``(None, None, {})`` where ``out`` holds no run
    yet (the run starts from scratch)."""
    present = [f for f in RUN_FILES if (out / f).exists()]
    if not present:
        # (a run stopped before its first epoch was saved leaves nothing to resume: said, not silent)
        warnings.warn(
            f"{out}: holds no saved run to resume (no state.pt): training from the start",
            TellerWarning,
            stacklevel=2,
        )
        return None, None, {}
    hint = f"train into another --output-dir, or remove {out} to start over"
    for f in ("state.pt", "last.safetensors"):
        if not (out / f).is_file():
            raise TellerFileNotFoundError(
                f"{out / f}: missing, so {out} cannot be resumed (it holds {', '.join(present)}); {hint}",
                path=str(out / f),
            )
    sp, lp = out / "state.pt", out / "last.safetensors"
    try:
        # (CPU first: a run saved on one device may resume on another; load_state_dict moves it)
        # (weights_only: tensors, numbers, strings and containers, what teller saves; a pickled object
        # of someone else's run directory is refused, not run)
        st = torch.load(sp, weights_only=True, map_location="cpu")
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        raise TellerIOError(
            f"{sp}: cannot read it ({e.strerror or e})", path=str(sp), errno=e.errno
        ) from None
    except Exception as e:  # noqa: BLE001 - torch / pickle raise many types on a damaged file
        raise ConfigError(
            f"{sp}: not a readable training state ({_one_line(e)}); the run cannot be resumed: {hint}",
            path=str(sp),
        ) from None
    want: dict[str, type | tuple[type, ...]] = {
        "opt": dict,
        "sched": dict,
        "epoch": int,
        "best": (int, float),
        "bad_epochs": int,
        "history": list,
        "torch_rng": torch.Tensor,
    }
    bad = [k for k, t in want.items() if not isinstance(st, dict) or not isinstance(st.get(k), t)]
    if bad:
        raise ConfigError(
            f"{sp}: not a training state teller wrote (missing or wrong: {', '.join(bad)}); {hint}",
            path=str(sp),
        )
    try:
        from safetensors import safe_open

        with safe_open(str(lp), framework="pt", device="cpu") as fh:
            meta = fh.metadata() or {}
            last = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - (not a dict)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        raise TellerIOError(
            f"{lp}: cannot read it ({e.strerror or e})", path=str(lp), errno=e.errno
        ) from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type on a damaged file
        raise ConfigError(
            f"{lp}: not readable safetensors ({_one_line(e)}); the run cannot be resumed: {hint}",
            path=str(lp),
        ) from None
    if "epoch" in meta and meta["epoch"] != str(st["epoch"]):
        raise ConfigError(
            f"{out}: last.safetensors (epoch {meta['epoch']}) and state.pt (epoch {st['epoch']}) are of "
            f"different epochs (an interrupted save?); {hint}",
            path=str(out),
        )
    try:
        prev = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        prev = None
    prev = prev if isinstance(prev, dict) else {}
    saved = st.get("ema")
    if (saved is None) != (not tc.ema) or (saved and float(saved.get("decay", tc.ema)) != tc.ema):
        was = f"with train.ema {saved.get('decay')}" if saved else "without train.ema"
        raise ConfigError(f"{sp}: the run was started {was}; resume it with the same setting", path=str(sp))
    rec = st.get("data")
    if isinstance(rec, dict):
        same_data, why = rec.get("shards") == data["shards"], " (their manifest.json differs)"
        # (in order: the samples are concatenated as given, and each epoch's shuffle picks by position)
        same_extra = list(rec.get("extra") or []) == list(data["extra"])
        rec_path, rec_extra = rec.get("path"), rec.get("extra_paths") or []
    else:  # (a run saved before the data was recorded in state.pt: its config.json's paths)
        rec_path, rec_extra, why = prev.get("data_dir"), prev.get("extra_train") or [], ""
        same_data = not isinstance(rec_path, str) or (
            Path(rec_path).name == run_dir.name or Path(rec_path).resolve() == run_dir.resolve()
        )
        same_extra = not isinstance(rec_extra, list) or [Path(str(e)).name for e in rec_extra] == [
            e.name for e in extra_dirs
        ]
    if not same_data:
        raise ConfigError(
            f"{out}: the run was trained on the shards {rec_path}, --data-dir {run_dir} holds other "
            f"ones{why}; resume it with the data it was trained on, or {hint}",
            path=str(out),
        )
    if not same_extra:
        names = lambda xs: ", ".join(str(x) for x in xs) or "none"  # noqa: E731
        raise ConfigError(
            f"{out}: the run was trained with --extra-train {names(rec_extra)}, this resume gives "
            f"{names(extra_dirs)}; resume it with the same, or {hint}",
            path=str(out),
        )
    recorded = st.get("model") if isinstance(st.get("model"), dict) else prev.get("model")
    if isinstance(recorded, dict):
        diff = _model_diff(recorded, mc.to_dict())
        if diff:
            more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
            raise ConfigError(
                f"{out}: the run was trained with another model configuration ({'; '.join(diff[:3])}{more}); "
                f"resume it with the same one, or {hint}",
                path=str(out),
            )
    # The settings of the optimization itself: a resume goes on where the run stopped, with the
    # optimizer state it saved (its learning rate, too), so other values would be recorded in
    # config.json without having been used. train.epochs may grow (train longer), the device,
    # patience and time budget may change.
    rec_train = prev.get("train")
    if isinstance(rec_train, dict):
        now = asdict(tc)
        diff = [
            f"train.{k} {rec_train[k]!r}, now {now[k]!r}"
            for k in RESUME_FIXED
            if k in rec_train and rec_train[k] != now[k]
        ]
        if diff:
            raise ConfigError(
                f"{out}: the run was trained with other settings ({'; '.join(diff[:3])}); resume it with "
                f"the ones in {out / 'config.json'}, or {hint}",
                path=str(out),
            )
    if st["epoch"] > tc.epochs:
        raise ConfigError(
            f"{out}: the run has trained {st['epoch']} epochs already, more than train.epochs "
            f"{tc.epochs}; resume with --epochs {st['epoch']} or more, or {hint}",
            path=str(out),
        )
    return st, last, prev


# the training settings a resume must keep (see _resume_state)
RESUME_FIXED = (
    "seed",
    "batch_size",
    "lr",
    "weight_decay",
    "warmup_frac",
    "loc_weight",
    "loc_listwise",
    "summary_loc_weight",
    "grad_clip",
    "max_train_samples",
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
    shards (same tokenizers) whose train split is added to the training samples.

    Everything is checked before training starts, and nothing is written until the first epoch
    ends: a directory that already holds a run is refused unless ``resume`` (which checks that
    the saved state is readable and of the same model and data), and each epoch's files
    (config.json with the weights it describes, last.safetensors + state.pt, history.json) are
    written to temporary files and renamed together, so that a run interrupted or failing at any
    point leaves the files of its last complete epoch (or of the run it resumed). Another teller
    process writing ``output_dir`` meanwhile (a second --resume, say) is refused at once (a
    ``DirectoryLockedError`` naming it)."""
    _config_sections(config, "the training configuration")
    mcfg_d = dict(config.get("model") or {})
    tcfg_d = dict(config.get("train") or {})
    arch = mcfg_d.get("arch")
    if "arch" in (overrides or {}) and arch is not None and arch not in ("mot", "single"):
        # (the subcommand sets the architecture; a value it would replace must still be one)
        raise ConfigError(f"model.arch: {arch!r} is not one of mot, single")
    for k, v in (overrides or {}).items():
        (mcfg_d if k in {f.name for f in fields(ModelConfig)} else tcfg_d)[k] = v
    tc = TrainConfig.from_dict(tcfg_d)
    dev = resolve_device(tc.device)
    out = Path(output_dir)
    _check_output_dir(out)
    # one writer of the run directory at a time (another teller process is refused, named), --resume
    # included; a directory created for the lock is removed again if the run ends before its first save
    with dir_lock(out, f"teller train {mcfg_d.get('arch') or 'mot'}", transient=True, what="run directory"):
        if out.is_dir() and recover_commit(out):  # (a save a killed run left half done: finished first)
            warnings.warn(
                f"{out}: finished the save of an epoch that an interrupted run left half done", stacklevel=2
            )
        if not resume:
            present = [f for f in RUN_FILES if (out / f).exists()]
            if present:
                raise ConfigError(
                    f"{out}: already holds a trained run ({', '.join(present)}); pass --resume to continue "
                    "it, or pick another --output-dir (or remove this one)",
                    path=str(out),
                )
        run_dir = shards_run_dir(data_dir)
        man = read_shards_manifest(run_dir)
        log_vocab = LogTokenizer.load(run_dir / "log_tokenizer.json").vocab
        try:
            label_names = [str(n) for n in man["label_names"]]
            mcfg_d.setdefault("trace_vocab", int(man["tokenizer"]["vocab_size"]))
            mcfg_d.setdefault("log_vocab", len(log_vocab))
            man["splits"]["train"]  # noqa: B018 - (present)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"{run_dir}: not tokenized shards teller wrote (manifest.json or log_tokenizer.json lacks "
                f"{_one_line(e)}); re-run `teller tokenize`",
                path=str(run_dir),
            ) from None
        mcfg_d["n_classes"] = len(label_names)
        mcfg_d["label_names"] = label_names
        mc = ModelConfig.from_dict(mcfg_d)
        if tpe_dir:  # recorded for diagnose, which encodes new traces with it: checked before training
            _check_tpe(tpe_dir, man, run_dir)

        ms = mc.max_summary_tokens if mc.summary_tokens and mc.modalities != "log" else 0
        if ms and int(man.get("version", 1)) < 2:
            raise ConfigError(
                f"{run_dir}: these shards (version {man.get('version', 1)}) have no per-symbol summaries, "
                "which model.summary_tokens needs; re-run `teller tokenize` (or set "
                "model.summary_tokens: false)"
            )
        if ms and mc.summary_loc and int(man.get("version", 1)) < 4 and tc.summary_loc_weight > 0:
            # older shards read summary_culprit as all False: the head would learn "no row is a culprit"
            raise ConfigError(
                f"{run_dir}: these shards (version {man.get('version', 1)}) have no summary_culprit labels, "
                "which model.summary_loc trains on (version 4); re-run `teller tokenize` (or set "
                "model.summary_loc: false)"
            )
        check_shards_version({"model": mc.to_dict(), "shards_version": int(man.get("version", 1))}, run_dir)
        extra_dirs = [shards_run_dir(e) for e in extra_train]
        distinct_extra_train(run_dir, extra_dirs)
        for e in extra_dirs:
            check_extra_train(run_dir, e)
        # what the run trains on, in state.pt: a resume must give the same
        data = {
            "shards": _shards_identity(man),
            "path": str(run_dir.resolve()),
            "run_id": man.get("run_id"),
            "extra": [_shards_identity(read_shards_manifest(e)) for e in extra_dirs],
            "extra_paths": [str(e.resolve()) for e in extra_dirs],
        }
        st, last, prev = _resume_state(out, tc, mc, data, run_dir, extra_dirs) if resume else (None, None, {})
        seed_everything(tc.seed)
        train_s, _ = load_model_split(run_dir, "train", mc.to_dict())
        for e in extra_dirs:
            train_s += load_model_split(e, "train", mc.to_dict())[0]
        if tc.max_train_samples:
            train_s = train_s[: tc.max_train_samples]
        if not train_s:  # (an evaluation-only dataset: random weights would be saved as a trained run)
            raise DatasetError(
                f"{run_dir}: its train split holds no samples (an evaluation-only dataset?): nothing to "
                "train on",
                path=str(run_dir),
            )
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
            "format": _CKPT_FORMAT,
            "version": _CKPT_VERSION,
            "model": mc.to_dict(),
            "train": asdict(tc),
            "label_names": label_names,
            "data_dir": str(run_dir.resolve()),
            "extra_train": [str(e.resolve()) for e in extra_dirs],
            "train_samples": len(train_s),
            "shards_version": int(man.get("version", 1)),  # how diagnose rebuilds the summaries
            "tpe_dir": str(Path(tpe_dir).resolve()) if tpe_dir else man["tokenizer"].get("path"),
            "log_tokenizer": str((run_dir / "log_tokenizer.json").resolve()),
            # (what diagnose checks the two files against: a tokenizer swapped at the same path
            # would read other ids)
            "tpe_sha256": _sha(man, "tokenizer"),
            "log_tokenizer_sha256": _sha(man, "log_tokenizer"),
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
        history: list[dict[str, float]] = []
        start_epoch = 0
        best = -math.inf  # (the first epoch is the best so far, whatever its score: -train_loss without val)
        bad_epochs = 0
        if st is not None and last is not None:
            before = prev.get("trained_on")
            if isinstance(before, str) and before:
                cfg_json["trained_on"] = "+".join(sorted({*before.split("+"), dev.type}))
            try:
                model.load_state_dict(last)
            except RuntimeError as e:
                first = str(e).strip().splitlines()[1:2] or [str(e)]
                raise ConfigError(
                    f"{out / 'last.safetensors'}: the weights do not fit the model being resumed "
                    f"({first[0].strip()})",
                    path=str(out / "last.safetensors"),
                ) from None
            try:
                opt.load_state_dict(st["opt"])
                sched.load_state_dict(st["sched"])
                torch.set_rng_state(st["torch_rng"])
                cuda_rng = st.get("cuda_rng")
                if dev.type == "cuda" and isinstance(cuda_rng, list) and cuda_rng:
                    if len(cuda_rng) == torch.cuda.device_count():
                        torch.cuda.set_rng_state_all(cuda_rng)
                    else:  # (another CUDA_VISIBLE_DEVICES: the state of the device trained on, if any)
                        i = dev.index if dev.index is not None else torch.cuda.current_device()
                        torch.cuda.set_rng_state(cuda_rng[min(i, len(cuda_rng) - 1)], dev)
                        warnings.warn(
                            f"{out / 'state.pt'}: saved with {len(cuda_rng)} GPU(s) visible, resumed "
                            f"with {torch.cuda.device_count()}: the random draws may differ from an "
                            "uninterrupted run",
                            TellerWarning,
                            stacklevel=2,
                        )
            except (KeyError, TypeError, ValueError, RuntimeError) as e:
                raise ConfigError(
                    f"{out / 'state.pt'}: its optimizer state does not fit the model being resumed "
                    f"({_one_line(e)})",
                    path=str(out / "state.pt"),
                ) from None
            start_epoch, best, bad_epochs, history = st["epoch"], st["best"], st["bad_epochs"], st["history"]
            if progress:
                progress("note", 0, 0, {"text": f"resuming {out} after epoch {start_epoch} of {tc.epochs}"})
        ema = WeightEMA(model, tc.ema) if tc.ema else None
        if ema is not None and st is not None:
            try:
                ema.load_state_dict(st["ema"])
            except (ConfigError, KeyError, TypeError, AttributeError, RuntimeError) as e:
                raise ConfigError(
                    f"{out / 'state.pt'}: its weight average (train.ema) does not fit ({_one_line(e)})",
                    path=str(out / "state.pt"),
                ) from None
        if st is not None and bad_epochs >= tc.patience:
            start_epoch = tc.epochs  # (it stopped early: a resume finishes it, without training on)
        use_amp = tc.amp and dev.type == "cuda"
        normal = label_names.index("normal") if "normal" in label_names else 0
        t_start = time.perf_counter()
        for epoch in range(start_epoch, tc.epochs):
            model.train()
            tot, n = 0.0, 0
            for k, bs in enumerate(
                batches(train_s, tc.batch_size, shuffle=True, seed=tc.seed * 1000 + epoch)
            ):
                b = {kk: v.to(dev) for kk, v in collate(bs).items()}
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                    o = model(b)
                loss, _ = loss_fn(o, b, tc.loc_weight, normal, tc.loc_listwise, tc.summary_loc_weight)
                lv = float(loss.detach())
                if not math.isfinite(lv):
                    # (a step on it would make every weight NaN, and the run would save them as trained)
                    raise TrainingDivergedError(
                        f"{out}: the training loss is {lv} at epoch {epoch + 1}, step {k + 1}: the run "
                        "diverged (lower train.lr, or set train.grad_clip); the last saved epoch is kept",
                        path=str(out),
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if tc.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                opt.step()
                sched.step()
                if ema is not None:
                    ema.update(model)
                tot += lv * len(bs)
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
            # this epoch's files: written beside the run's, then renamed in together
            make_output_dir(out, "run directory")
            files: dict[str, Path] = {}
            try:
                if score > best:
                    best, bad_epochs = score, 0
                    files["model.safetensors"] = _write_tmp(
                        out / "model.safetensors", _weights_writer(model, _trained_as(cfg_json))
                    )
                else:
                    bad_epochs += 1
                if raw is not None:
                    model.load_state_dict(raw)
                files["config.json"] = _write_tmp(
                    out / "config.json", lambda t: t.write_text(json.dumps(cfg_json, indent=1))
                )
                files["last.safetensors"] = _write_tmp(
                    out / "last.safetensors",
                    _weights_writer(model, {"epoch": str(epoch + 1), **_trained_as(cfg_json)}),
                )
                state = {
                    "opt": opt.state_dict(),
                    "sched": sched.state_dict(),
                    "epoch": epoch + 1,
                    "best": best,
                    "bad_epochs": bad_epochs,
                    "history": history,
                    "torch_rng": torch.get_rng_state(),
                    # (dropout and speed_aug draw on the batch's device: on CUDA its generators are
                    # what a resumed run must continue, not reseeded ones)
                    "cuda_rng": torch.cuda.get_rng_state_all() if dev.type == "cuda" else None,
                    "ema": ema.state_dict() if ema is not None else None,
                    "model": mc.to_dict(),  # (what a resume must give again)
                    "data": data,
                }
                files["state.pt"] = _write_tmp(out / "state.pt", lambda t, s=state: torch.save(s, t))
                files["history.json"] = _write_tmp(
                    out / "history.json", lambda t: t.write_text(json.dumps(history, indent=1))
                )
                _commit(out, files)
            finally:
                for tmp in files.values():  # (left only where the commit did not happen)
                    with contextlib.suppress(OSError):
                        tmp.unlink()
            if bad_epochs >= tc.patience:
                if progress and epoch + 1 < tc.epochs:
                    progress(
                        "note",
                        0,
                        0,
                        {
                            "text": f"stopped early after epoch {epoch + 1} of {tc.epochs}: the val "
                            f"metric did not improve for {tc.patience} epochs (train.patience)"
                        },
                    )
                break
            if (time.perf_counter() - t_start) / 60 > tc.max_minutes:
                if epoch + 1 < tc.epochs:  # (not silent: the schedule was cut short, a busy CPU can do it)
                    warnings.warn(
                        f"{out}: stopped after epoch {epoch + 1} of {tc.epochs}: train.max_minutes "
                        f"({tc.max_minutes:g}) reached, before the end of the learning-rate schedule "
                        "(another process on these cores slows training several fold; or lower "
                        "train.epochs, or raise train.max_minutes)",
                        TellerWarning,
                        stacklevel=2,
                    )
                break
        if not (out / "model.safetensors").exists():
            if ema is not None:
                ema.swap(model)
            save_checkpoint(model, out / "model.safetensors", _trained_as(cfg_json))
        if val_s:
            # temperature scaling of the kept weights on val (the split that chose them): a network
            # trained with cross-entropy to near-zero training loss is over-confident (the shipped MoT
            # fits T = 1.6-2.0: a wrong answer at p 1.000 reads 0.977), and diagnose prints these
            # probabilities as its confidence. Deterministic: a run interrupted before this point and
            # resumed (or `teller calibrate` on it) fits the same T
            from safetensors.torch import load_file

            model.load_state_dict(load_file(str(out / "model.safetensors")))
            cfg_json["calibration"] = fit_calibration(model, val_s, "val", device=dev)
            if progress:
                progress(
                    "calibrate", 1, 1, {k: v for k, v in cfg_json["calibration"].items() if k != "method"}
                )
            _commit_config(out, cfg_json)
        else:  # (no val split to fit on: recorded as done, null, so that loading it says nothing)
            cfg_json["calibration"] = None
            _commit_config(out, cfg_json)
        return out


def _commit_config(run: Path, cfg: dict[str, Any]) -> None:
    """Replace the run's config.json with ``cfg`` through the commit journal (a reader never sees a
    half-written file; a save cut short is finished by the next --resume)."""
    tmp = _write_tmp(run / "config.json", lambda t: t.write_text(json.dumps(cfg, indent=1)))
    try:
        _commit(run, {"config.json": tmp})
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def check_shards_version(cfg: dict[str, Any], run_dir: Path) -> None:
    """A checkpoint's configuration (a model's; a baselines run's, without ``model``, reads the
    summary rows; at training time, the configuration being trained) against the shards it is about
    to read: :class:`ConfigError` when the model reads
    ``token_proc_log`` and the shards (version < 5) have none (they would read as "no process logged
    an error"); a warning when the summary rows were computed differently from the training data's
    (version 5 changed what columns 9-11 mean, not their number), or the traces were linked
    differently (version 6: each rank's GPU work under its own process); :class:`ConfigError` when
    the checkpoint reads more summary columns than the shards have (versions 7, 8 and 11 added 3
    each, 13 added 2)."""
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
            f"{need} (trained on version {trained}; versions 7, 8 and 11 added 3 each, 13 added 2); "
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
    if mc and mc.get("log_process_features") and trace_side and (have >= 15) != (trained >= 15):
        warnings.warn(
            f"{run_dir}: shards version {have}, the checkpoint was trained on version {trained}; version 15 "
            "counts each process's error and warning log records, not lines (token_proc_log): re-tokenize "
            "the data with the teller that trained the checkpoint, or retrain",
            stacklevel=2,
        )
    if mc and mc.get("token_gpu_features") and trace_side and have < 12:
        raise ConfigError(
            f"{run_dir}: shards version {have} have no token_gpu, which model.token_gpu_features "
            "reads (version 12); re-run `teller tokenize` (or set model.token_gpu_features: false)",
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


def calibrate(
    checkpoint: str | Path,
    data_dir: str | Path | None = None,
    split: str = "val",
    *,
    reset: bool = False,
    device: str = "cpu",
) -> dict[str, Any] | None:
    """Refit the temperature of a trained run (see :func:`_calibrate`), holding the run directory's
    lock (:func:`teller._io.dir_lock`) from reading its configuration to rewriting it: a run being
    trained (`teller train --resume` holds the same lock) or calibrated by another process is
    refused, naming the holder, instead of one rewrite of config.json losing the other's."""
    p = Path(checkpoint)
    run = p if p.is_dir() else p.parent
    if not run.is_dir():  # (no run to lock, nor one to create: _calibrate names what is missing)
        return _calibrate(checkpoint, data_dir, split, reset=reset, device=device)
    # (transient: a run directory removed meanwhile, say by a refused `teller train`, is not left
    # behind re-created and empty)
    with dir_lock(run, "teller calibrate", transient=True, what="run directory"):
        return _calibrate(checkpoint, data_dir, split, reset=reset, device=device)


def _calibrate(
    checkpoint: str | Path,
    data_dir: str | Path | None = None,
    split: str = "val",
    *,
    reset: bool = False,
    device: str = "cpu",
) -> dict[str, Any] | None:
    """Refit the temperature of a trained run's category head on a split of tokenized shards
    (``data_dir`` defaults to the training shards, ``split`` to val: fit on data the run is not
    evaluated on), or with ``reset`` remove it (probabilities as the network gives them). Rewrites
    the run's config.json atomically; returns the new ``calibration`` record (None after a reset).
    A damaged ``calibration`` does not stop either: it is what they replace."""
    p = Path(checkpoint)
    run = p if p.is_dir() else p.parent
    refuse_a_file_as_checkpoint(p)
    if not p.is_dir() and p.exists() and p.name != "model.safetensors":
        raise ConfigError(
            f"{p}: a run's temperature describes its model.safetensors (the weights val chose): pass the "
            f"run directory {run}",
            path=str(p),
        )
    fmt = None
    with contextlib.suppress(OSError, ValueError, AttributeError):  # (else load_checkpoint names it)
        fmt = json.loads((run / "config.json").read_text()).get("format")
    if fmt == "teller-ensemble":
        raise ConfigError(
            f"{run}: an ensemble run, not a MoT or single-stream one: it keeps its MoT's temperature of "
            "the time it was fitted; calibrate the MoT run and fit the ensemble again",
            path=str(run),
        )
    if fmt == "teller-baselines":
        raise ConfigError(
            f"{run}: a baselines run, not a MoT or single-stream one: its models are not calibrated",
            path=str(run),
        )
    if (run / COMMIT_JOURNAL).is_file():
        raise ConfigError(
            f"{run}: a save of this run is in progress or was cut short ({COMMIT_JOURNAL}): finish it with "
            "`teller train --resume` into it first",
            path=str(run),
        )
    if reset:  # (read as JSON only: a configuration whose calibration is damaged is reset too)
        load_checkpoint(p, device, calibrated=False)  # (that it is a run, with its fields checked)
        cfg = json.loads((run / "config.json").read_text())
        cal: dict[str, Any] | None = None
    else:
        if split == "all":
            raise ConfigError("--split all: name one split to fit the temperature on (val, by default)")
        model, cfg = load_checkpoint(p, device, calibrated=False)
        if split == "train":
            warnings.warn(
                f"{run}: fitting the temperature on the train split the weights were fitted on: it "
                "will call the model surer than it is on new data (val is the split to fit on)",
                TellerWarning,
                stacklevel=2,
            )
        elif split in ("test", "test_ood"):
            warnings.warn(
                f"{run}: fitting the temperature on {split}, a split models are evaluated on: its "
                f"calibration (nll, ece, brier) on {split} will read better than on new data (val is "
                "the split to fit on)",
                TellerWarning,
                stacklevel=2,
            )
        run_dir = shards_run_dir(data_dir or cfg["data_dir"])
        mc = cfg["model"]
        check_eval_data(cfg, run_dir, split, checkpoint, (mc.get("trace_vocab"), mc.get("log_vocab")))
        check_shards_version(cfg, run_dir)
        samples, names = load_model_split(run_dir, split, mc)
        if list(names) != list(cfg["label_names"]):
            raise ConfigError(
                f"{run_dir}: its labels ({', '.join(names)}) are not the classes of {checkpoint} "
                f"({', '.join(cfg['label_names'])}): a temperature is fitted on samples of the model's "
                "classes",
                path=str(run_dir),
            )
        cal = fit_calibration(model, samples, split, device=torch.device(device))
        if data_dir is not None:
            cal["data_dir"] = str(run_dir.resolve())
    new = dict(cfg)
    # (null after a reset: removed on purpose, where an absent one means training stopped before it)
    new["calibration"] = cal
    _commit_config(run, new)
    return cal


def evaluate(
    checkpoint: str | Path, data_dir: str | Path | None = None, split: str = "test", device: str = "cpu"
) -> dict[str, Any]:
    """Metrics of a checkpoint on a split of tokenized shards (``data_dir`` defaults to the training one)."""
    model, cfg = load_checkpoint(checkpoint, device)
    run_dir = shards_run_dir(data_dir or cfg["data_dir"])
    mc = cfg["model"]
    check_eval_data(cfg, run_dir, split, checkpoint, (mc.get("trace_vocab"), mc.get("log_vocab")))
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
    m["temperature"] = model.temperature  # (the calibration its probabilities had; 1: none)
    m["model"] = f"{mc['arch']}" + ("" if mc["modalities"] == "both" else f"-{mc['modalities']}-only")
    return m
