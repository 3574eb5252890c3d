"""Datasets: configuration and presets, the sample plan (labels, stratified splits, OOD workloads),
the generate driver (parallel, deterministic, resumable), reading (the manifest and annotation checks
a reader needs), validation, and the culprit mask.

Layout (``docs/dataset.md``)::

    D/manifest.json
    D/s000000/{trace.json, log.txt, annotation.json[, raw/*.tmsgpack]}
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from teller import __version__
from teller._io import check_output_dir, dir_lock, yaml_error_line
from teller.data import kernels as K
from teller.data.faults import FAULT_INFO, LABELS, NORMAL, Fault, draw_fault
from teller.data.simulator import Workload, simulate
from teller.errors import ConfigError, DatasetError, TellerFileNotFoundError, TellerIOError, TellerWarning

GENERATOR = "teller-sim"
# 2: traces carry the workload's GPUs (Kineto's deviceProperties); events and logs as in 1
# 3: hbm_contention may be a time-sliced neighbour process
# 4: the start-up log lines end at least a second before serving
# 5: an hbm_contention neighbour's visible kernels run one after another on their stream
# 6: annotation.json only: culprit windows without clock error; a secondary fault's events not culprits
# 7: closer to a real vLLM V1 engine (docs/faults.md, "Generator version 7"): the process prefix
#    starts every log line, tracebacks and access lines included; no "Host memory is low" line (vLLM
#    prints none); no per-preemption warning (V1 logs none); a degraded PCIe link's latency factor
#    on the copy's fixed latency only; capture clocks drawn, not from the sample index; NVTX ranges
#    carry their range id as External id
# 8: trace.json's teller.sources lists each input's pids and rank (a merged file read back pairs
#    and names its GPUs by input); at TP > 1 rank 0 runs in a worker process of its own
#    (Worker_TP0), the engine core's lines under its own pid; the crash's log records on stdout
#    (vLLM's handler), the worker traceback with its worker_busy_loop source line; the eager-mode
#    warning from the API server (where the config is checked)
GENERATOR_VERSION = 8
DATASET_FORMAT = "teller-dataset"
DATASET_VERSION = 1
SAMPLE_FORMAT = "teller-sample"
SPLITS = ("train", "val", "test", "test_ood")
REAL_BASE0 = 1_764_000_000_000_000_000  # 2025-11-24T16:00:00Z: sample clocks start from here
CLOCK_SPAN_NS = 365 * 86_400 * 1_000_000_000  # ... within a year of it (generator version 7)

ProgressFn = Callable[[int, int], Any]


# -- configuration -------------------------------------------------------------------------------


def preset_names() -> list[str]:
    d = resources.files("teller.data") / "presets"
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))


def _read_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {yaml_error_line(e)}", path=where) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: the configuration must be a mapping", path=where)
    return cfg


def load_config(preset: str | None = None, config: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A preset (default ``default``), optionally overlaid by a YAML file (whose ``base`` key may name
    the preset to start from). Returns the validated, complete configuration."""
    if config is not None:
        p = Path(config)
        if p.is_dir():
            raise TellerIOError(
                f"{p}: a directory, not a configuration file", path=str(p), errno=errno.EISDIR
            )
        if not p.is_file():
            raise TellerFileNotFoundError(f"{p}: no such configuration file", path=str(p))
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{p}: not a YAML configuration: not UTF-8 text (byte {e.start})", path=str(p)
            ) from None
        except OSError as e:
            raise TellerIOError(
                f"{p}: cannot read the configuration: {e.strerror or e}", path=str(p), errno=e.errno
            ) from None
        user = _read_yaml(text, str(p))
        named = user.pop("base", None)  # (popped even when --preset overrides it: not a setting)
        base = preset or named or "default"
    else:
        user = {}
        base = preset or "default"
    if base not in preset_names():
        raise ConfigError(f"unknown preset {base!r}; known: {', '.join(preset_names())}")
    text = (resources.files("teller.data") / "presets" / f"{base}.yaml").read_text()
    cfg = _read_yaml(text, f"preset {base}")
    _check_keys(user, str(config))
    cfg = _merge(cfg, user)
    cfg["preset"] = base
    _check_config(cfg, str(config) if config is not None else f"preset {base}")
    return cfg


# The workload settings drawn from a [min, max] range (each checked as one).
_WORKLOAD_RANGES = (
    "rate",
    "prompt_mean",
    "output_mean",
    "init_running",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_util",
)

# The keys a configuration may set (every preset's, and the optional ones the simulator reads with
# a default): a misspelt key is an error, not a setting silently left at the preset's value.
_KEYS: dict[str, Any] = {
    "classes": None,
    "jitter": None,
    "keep_raw": None,
    "log_every_steps": None,
    "num_samples": None,
    "ood_fraction": None,
    "secondary_fault_fraction": None,
    "severity": None,
    "splits": {"train": None, "val": None, "test": None},
    "steps": None,
    "traced_layers": None,
    "workloads": {
        **dict.fromkeys((*_WORKLOAD_RANGES, "tp")),
        "in_dist": {"models": None, "gpus": None, "arrivals": None},
        "ood": {"models": None, "gpus": None, "arrivals": None},
    },
}


def _check_keys(user: dict[str, Any], where: str, known: dict[str, Any] = _KEYS, at: str = "") -> None:
    bad = sorted(f"{at}{k}" for k in user if k not in known)
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(bad)}", path=where)
    for k, v in user.items():
        if isinstance(known[k], dict) and isinstance(v, dict):
            _check_keys(v, where, known[k], f"{at}{k}.")


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _range(
    cfg: dict[str, Any],
    key: str,
    lo: float | None = None,
    hi: float | None = None,
    where: str = "config",
    at: str = "",
) -> None:
    v = cfg.get(key)
    key = at + key
    if not (isinstance(v, list) and len(v) == 2 and all(_finite(x) for x in v) and v[0] <= v[1]):
        raise ConfigError(
            f"{where}: {key} must be a [min, max] pair of finite numbers, got {v!r}", path=where
        )
    if (lo is not None and v[0] < lo) or (hi is not None and v[1] > hi):
        raise ConfigError(f"{where}: {key} must lie within [{lo}, {hi}], got {v!r}", path=where)


def _finite(v: Any) -> bool:
    """A finite int or float (not a bool, not NaN or infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Upper bounds of the settings that size a run (docs/dataset.md): at most MAX_SAMPLES samples (the
# bound generator version 6's clocks needed: each capture started 2 h after the one before it, and
# past index 310 555 a clock left the 4e18 ns the trace readers hold; kept with drawn clocks); the
# seed is a 32-bit unsigned integer.
MAX_SAMPLES = 300_000
MAX_SEED = 2**32 - 1
MAX_JITTER = 1.0  # sigma of the lognormal duration noise: exp(N(0, 1)) already spans ~0.05x-20x


def _check_config(cfg: dict[str, Any], where: str = "config") -> None:
    def fail(msg: str) -> ConfigError:
        return ConfigError(f"{where}: {msg}", path=where)

    for key, hi in (("num_samples", MAX_SAMPLES), ("traced_layers", None)):
        v = cfg.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1 or (hi is not None and v > hi):
            bound = f" <= {hi}" if hi is not None else ""
            raise fail(f"{key} must be a positive integer{bound}, got {v!r}")
    lv = cfg.get("log_every_steps", 4)
    if not isinstance(lv, int) or isinstance(lv, bool) or not 1 <= lv <= 10_000:
        raise fail(f"log_every_steps must be an integer in [1, 10000], got {lv!r}")
    jit = cfg.get("jitter", 0.06)
    if not _finite(jit) or not 0 <= jit <= MAX_JITTER:
        raise fail(f"jitter must be a finite number in [0, {MAX_JITTER:g}], got {jit!r}")
    kr = cfg.get("keep_raw", False)
    if not isinstance(kr, bool):
        raise fail(f"keep_raw must be true or false, got {kr!r}")
    _range(cfg, "steps", 4, 10_000, where)
    _range(cfg, "severity", 0.0, 1.0, where)
    w = cfg.get("workloads")
    if not isinstance(w, dict):
        raise fail("workloads must be a mapping")
    # (the least each may be where the simulator divides by it or schedules with it: a queue of no
    # sequences or a KV cache used 0 % generated nothing, or a dataset validate then refused)
    least = {"max_num_seqs": 1, "prompt_mean": 1, "output_mean": 1, "max_num_batched_tokens": 1}
    for key in _WORKLOAD_RANGES:
        _range(w, key, least.get(key, 0), 1.0 if key == "kv_util" else None, where, "workloads.")
    if isinstance(w.get("kv_util"), list) and w["kv_util"][0] <= 0:
        raise fail(f"workloads.kv_util must lie within (0, 1], got {w['kv_util']!r}")
    if isinstance(w.get("rate"), list) and w["rate"][0] <= 0:
        raise fail(f"workloads.rate must be above 0 (requests per second), got {w['rate']!r}")
    for part in ("in_dist", "ood"):
        d = w.get(part)
        if not isinstance(d, dict):
            raise fail(f"workloads.{part} must be a mapping")
        for key, known in (
            ("models", K.MODELS),
            ("gpus", K.GPUS),
            ("arrivals", ("poisson", "bursty", "ramp")),
        ):
            vals = d.get(key, [])
            if not isinstance(vals, list) or (part == "in_dist" and not vals):
                raise fail(f"workloads.{part}.{key} must be a list (non-empty for in_dist)")
            for v in vals:
                if v not in known:
                    raise fail(f"workloads.{part}.{key}: unknown {v!r}; known: {', '.join(known)}")
    tps = w.get("tp")
    if not (isinstance(tps, list) and tps and all(isinstance(x, int) and x >= 1 for x in tps)):
        raise fail(f"workloads.tp must be a non-empty list of positive integers, got {tps!r}")
    # any model may meet any GPU (an OOD sample mixes the lists): each pair must fit at some TP under
    # the placement rule draw_workload applies (K.weights_fit)
    models = [*w["in_dist"]["models"], *w["ood"].get("models", [])]
    gpus = [*w["in_dist"]["gpus"], *w["ood"].get("gpus", [])]
    for m in dict.fromkeys(models):
        for g in dict.fromkeys(gpus):
            ms, gs = K.model_spec(m), K.gpu_spec(g)
            if not K.weights_fit(ms, gs, max(tps)):
                raise fail(
                    f"{m} does not fit on {g} at any workloads.tp (at TP {max(tps)}: "
                    f"{ms.weight_bytes() / max(tps) / 2**30:.1f} GiB of weights per rank, over 70 % of "
                    f"{gs.memory_gib:g} GiB); add a larger tp or leave the pair out"
                )
    classes = cfg.get("classes")
    if not (isinstance(classes, list) and classes):
        raise fail("classes must be a non-empty list of labels")
    if len(set(map(str, classes))) != len(classes):
        raise fail(f"classes must be distinct, got {classes!r}")
    for c in classes:
        if c not in LABELS:
            raise fail(f"unknown class {c!r}; known: {', '.join(LABELS)}")
        if c != NORMAL and FAULT_INFO[c][1] and max(tps) < 2:
            raise fail(f"class {c!r} needs tensor parallelism: add a tp >= 2 to workloads.tp")
    sp = cfg.get("splits")
    if not (
        isinstance(sp, dict)
        and set(sp) == {"train", "val", "test"}
        and all(_finite(v) and v >= 0 for v in sp.values())
        and sum(sp.values()) > 0
    ):
        raise fail(f"splits must map train, val, test to finite non-negative fractions, got {sp!r}")
    sf = cfg.get("secondary_fault_fraction", 0.0)
    if not _finite(sf) or not 0 <= sf <= 1:
        raise fail(f"secondary_fault_fraction must be in [0, 1], got {sf!r}")
    ood = cfg.get("ood_fraction")
    if not _finite(ood) or not 0 <= ood < 1:
        raise fail(f"ood_fraction must be in [0, 1), got {ood!r}")
    if ood > 0 and not any(w["ood"].get(d) for d in ("models", "gpus", "arrivals")):
        raise fail("ood_fraction > 0 needs at least one workloads.ood list")
    for d in ("models", "gpus", "arrivals"):
        both = [v for v in w["ood"].get(d, []) if v in w["in_dist"][d]]
        if both:  # (a test_ood sample drawn from them would be a workload seen in training)
            raise fail(f"workloads.ood.{d} lists {', '.join(map(repr, both))}, also in workloads.in_dist.{d}")


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplePlan:
    index: int
    sample_id: str
    label: str
    split: str

    @property
    def ood(self) -> bool:
        return self.split == "test_ood"


def sample_rng(seed: int, index: int, stream: int = 0) -> np.random.Generator:
    """The RNG of one sample: independent of the worker that generates it."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index), int(stream)]))


def plan(cfg: dict[str, Any], num_samples: int, seed: int) -> list[SamplePlan]:
    """Labels round-robin over the classes; per class, a seeded permutation assigns ``ood_fraction``
    of the samples to ``test_ood`` and splits the rest train/val/test by the configured fractions."""
    classes: list[str] = list(cfg["classes"])
    labels = [classes[i % len(classes)] for i in range(num_samples)]
    split = [""] * num_samples
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5B117]))
    fr = cfg["splits"]
    tot = float(sum(fr.values()))
    for c in classes:
        idx = np.array([i for i in range(num_samples) if labels[i] == c], dtype=np.int64)
        idx = idx[rng.permutation(len(idx))]
        n = len(idx)
        n_ood = int(round(n * float(cfg["ood_fraction"])))
        rest = n - n_ood
        n_val = int(round(rest * fr["val"] / tot))
        # (rounded apart, val and test could take more than the rest, or leave some to a train
        # fraction of 0: with train 0 and val = test, an odd count; clamped, which leaves every count
        # the shipped fractions give as it was)
        n_test = min(int(round(rest * fr["test"] / tot)), rest - n_val)
        if fr["train"] == 0:  # (no training samples asked for: what val leaves is test's)
            n_test = rest - n_val
        n_train = rest - n_val - n_test
        names = ["test_ood"] * n_ood + ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
        for i, s in zip(idx.tolist(), names, strict=True):
            split[i] = s
    return [SamplePlan(i, f"s{i:06d}", labels[i], split[i]) for i in range(num_samples)]


def draw_workload(cfg: dict[str, Any], rng: np.random.Generator, label: str, ood: bool) -> Workload:
    w = cfg["workloads"]
    ind, oo = w["in_dist"], w["ood"]
    dims = ("models", "gpus", "arrivals")
    pick_ood: set[str] = set()
    if ood:
        avail = [d for d in dims if oo.get(d)]
        if not avail:
            raise ConfigError("config: ood_fraction > 0 needs at least one workloads.ood list")
        k = int(rng.integers(1, len(avail) + 1))
        pick_ood = {avail[j] for j in rng.permutation(len(avail))[:k]}

    def choose(d: str) -> str:
        pool = oo[d] if d in pick_ood else ind[d]
        return str(pool[int(rng.integers(len(pool)))])

    model, gpu, arrival = choose("models"), choose("gpus"), choose("arrivals")
    tps = list(w["tp"])
    if label != NORMAL and FAULT_INFO[label][1]:
        tps = [t for t in tps if t >= 2]
    # the weights must fit: at most 70 % of the GPU memory per rank
    mspec, gspec = K.model_spec(model), K.gpu_spec(gpu)
    fits = [t for t in tps if K.weights_fit(mspec, gspec, t)]
    tps = fits or [max(tps)]
    tp = int(tps[int(rng.integers(len(tps)))])

    def u(key: str) -> float:
        lo, hi = w[key]
        return float(rng.uniform(lo, hi))

    steps_lo, steps_hi = cfg["steps"]
    return Workload(
        model=model,
        gpu=gpu,
        tp=tp,
        arrival=arrival,
        rate=round(u("rate"), 2),
        prompt_mean=int(u("prompt_mean")),
        output_mean=int(u("output_mean")),
        cuda_graphs=label != "eager_mode_misconfig",
        max_num_seqs=int(u("max_num_seqs")),
        max_num_batched_tokens=int(u("max_num_batched_tokens")) // 256 * 256 or 256,
        steps=int(rng.integers(steps_lo, steps_hi + 1)),
        traced_layers=int(cfg["traced_layers"]),
        init_running=int(u("init_running")),
        kv_util=round(u("kv_util"), 3),
        log_every_steps=int(cfg.get("log_every_steps", 4)),
    )


# -- one sample ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _chdir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _fault_json(f: Fault, real_base: int, pids: list[int]) -> dict[str, Any]:
    target = dict(f.target)
    r = target.get("rank")
    target["pid"] = pids[r] if r is not None and r < len(pids) else None
    return {
        "type": f.type,
        "layer": f.layer,
        "target": target,
        "start_ns": real_base + f.start_ns,
        "end_ns": real_base + f.end_ns,
        "severity": round(f.severity, 4),
        "params": f.params,
        "effect": f.effect.to_json(f.type),
    }


def _clip(f: dict[str, Any], t0: int, t1: int) -> dict[str, Any]:
    """Keep a fault window inside the trace span (whole-run faults start before the first event); an
    empty one (a fault that never acted) stays empty."""
    empty = f["end_ns"] <= f["start_ns"]
    f["start_ns"] = min(max(f["start_ns"], t0), t1)
    f["end_ns"] = f["start_ns"] if empty else max(min(f["end_ns"], t1 + 1), f["start_ns"])
    return f


def _json_dump(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")


def generate_sample(cfg: dict[str, Any], seed: int, p: SamplePlan, out_dir: Path) -> dict[str, Any]:
    """Simulate one sample into ``out_dir/<sample_id>`` (written to a temporary directory, then
    renamed: a sample directory that exists is complete). Returns its annotation."""
    from teller import trace as _trace

    rng = sample_rng(seed, p.index)
    wl = draw_workload(cfg, rng, p.label, p.ood)
    faults: list[Fault] = []
    sev_lo, sev_hi = (float(x) for x in cfg["severity"])
    if p.label != NORMAL:
        faults.append(draw_fault(p.label, rng, steps=wl.steps, tp=wl.tp, severity_range=(sev_lo, sev_hi)))
        frac = float(cfg.get("secondary_fault_fraction", 0.0))
        if frac > 0 and rng.random() < frac:
            # a milder, unrelated co-occurring fault: the label stays the primary one
            pool = [
                c
                for c in cfg["classes"]
                if c not in (NORMAL, p.label, "oom_error", "eager_mode_misconfig")
                and (wl.tp >= 2 or not FAULT_INFO[c][1])
            ]
            if pool:
                kind = pool[int(rng.integers(len(pool)))]
                sec = draw_fault(
                    kind, rng, steps=wl.steps, tp=wl.tp, severity_range=(sev_lo, min(sev_hi, 0.5))
                )
                sec.params["role"] = "secondary"
                faults.append(sec)
    # The capture's wall clock: a time drawn within a year of REAL_BASE0. Until generator version 7
    # each capture started 2 h after the one before it, so the clock told the sample index, and the
    # index the label (classes are dealt round-robin) to any reader of the raw times.
    real_base = REAL_BASE0 + int(rng.integers(0, CLOCK_SPAN_NS))
    final = out_dir / p.sample_id
    tmp = out_dir / f".tmp-{p.sample_id}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    res = simulate(wl, faults, rng, tmp / "raw", real_base=real_base, jitter=float(cfg.get("jitter", 0.06)))
    with _chdir(tmp):
        tr = _trace.load("raw", warn=False)
        tr.to_chrome("trace.json")
    (tmp / "log.txt").write_text(res.log)
    ts = tr.ts
    t_start = int(ts.min()) if len(tr) else real_base
    t_end = int((ts + tr.dur).max()) if len(tr) else real_base
    m = K.model_spec(wl.model)
    workload = wl.to_dict()
    workload.update(
        {
            "model_name": m.name,
            "model_layers": m.layers,
            "gpu_name": K.gpu_spec(wl.gpu).name,
            "kv_blocks": int(res.stats["kv_blocks"]),
            # (clock_error_ns: the rank's trace times are true time + it; fault windows are in true
            # time: culprit_mask takes it back off)
            "processes": [
                {"rank": r, "pid": pid, "device": r, "clock_error_ns": int(e)}
                for r, (pid, e) in enumerate(
                    zip(res.pids, res.clock_errors or [0] * len(res.pids), strict=True)
                )
            ],
        }
    )
    ann = {
        "format": SAMPLE_FORMAT,
        "version": DATASET_VERSION,
        "sample_id": p.sample_id,
        "label": p.label,
        "split": p.split,
        "ood": p.ood,
        "workload": workload,
        "faults": [_clip(_fault_json(f, real_base, res.pids), t_start, t_end) for f in res.faults],
        "trace": {"start_ns": t_start, "end_ns": t_end, "events": len(tr), "steps": len(tr.steps())},
        "stats": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.stats.items()},
    }
    _json_dump(ann, tmp / "annotation.json")
    if not cfg.get("keep_raw", False):
        shutil.rmtree(tmp / "raw")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return ann


def _worker(args: tuple[dict[str, Any], int, SamplePlan, str]) -> tuple[int, dict[str, Any]]:
    cfg, seed, p, out = args
    return p.index, _summary(generate_sample(cfg, seed, p, Path(out)))


def _summary(ann: dict[str, Any]) -> dict[str, Any]:
    return {"events": ann["trace"]["events"], "label": ann["label"], "split": ann["split"]}


# -- generate ------------------------------------------------------------------------------------


def generate(
    output_dir: str | os.PathLike[str],
    *,
    num_samples: int | None = None,
    seed: int = 0,
    preset: str | None = None,
    config: str | os.PathLike[str] | None = None,
    workers: int = 1,
    progress: ProgressFn | None = None,
    resume: bool = True,
    train_only: bool = False,
) -> dict[str, Any]:
    """Generate a dataset; returns the manifest. Same seed and configuration: identical bytes,
    whatever ``workers``. With ``resume``, complete sample directories already present (from an
    interrupted run with the same seed and configuration) are kept. ``train_only``: every sample in
    the train split, from the in-distribution workloads only (no OOD samples): more training data
    for a benchmark generated with another seed (``teller train --extra-train``). Another teller
    process writing ``output_dir`` meanwhile is refused (a ``DirectoryLockedError`` naming it)."""
    # Every argument checked before anything is written (a refused run leaves no stamp behind).
    for name, v, lo, hi in (
        ("--seed", seed, 0, MAX_SEED),
        ("--num-samples", num_samples, 1, MAX_SAMPLES),
        ("--workers", workers, 1, 1024),
    ):
        if v is None and name != "--seed":  # (the others have defaults: the preset's, one worker)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
            raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    cfg = load_config(preset, config)
    if train_only:
        cfg = {**cfg, "ood_fraction": 0.0, "splits": {"train": 1.0, "val": 0.0, "test": 0.0}}
        _check_config(cfg, str(config) if config is not None else f"preset {cfg['preset']}")
    n = int(num_samples if num_samples is not None else cfg["num_samples"])
    seed = int(seed)
    out = Path(output_dir)
    check_output_dir(out, "--output-dir names a directory")
    with dir_lock(out, "teller dataset generate"):  # (one writer at a time; it creates the directory)
        man_path = out / "manifest.json"
        # (a resumed run must not mix samples of two simulator versions)
        cfg_key = {"seed": int(seed), "config": cfg, "num_samples": n, "generator_version": GENERATOR_VERSION}
        stamp = out / ".generate.json"
        if stamp.exists() and resume:
            try:
                old = json.loads(stamp.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                old = None  # (damaged: not this run's stamp, so samples there are refused below)
            if old != cfg_key and _holds_samples(out):
                raise ConfigError(
                    f"{out}: holds a dataset generated with another seed, configuration or simulator "
                    f"version; use a new directory"
                )
        elif man_path.exists() and not stamp.exists():
            try:
                old_man = json.loads(man_path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                old_man = {}
            if not isinstance(old_man, dict):  # (a manifest of another shape: not this run's)
                old_man = {}
            same = {k: old_man.get(k) for k in ("seed", "config", "num_samples")} | {
                "generator_version": (old_man.get("generator") or {}).get("version")
            } == cfg_key
            if not (same and resume):
                raise ConfigError(f"{out}: already holds a dataset (manifest.json); use a new directory")
        elif not stamp.exists() and _holds_samples(out):
            # sample directories no run of ours stamped (copied in, another tool's): resuming would keep
            # them as this dataset's samples unchecked, or replace them; neither is ours to do
            raise ConfigError(
                f"{out}: holds sample directories (s000000...) that no generate run here left (no "
                ".generate.json or manifest.json): use an empty or new directory"
            )
        stamp.write_text(json.dumps(cfg_key, sort_keys=True))
        plans = plan(cfg, n, seed)
        todo = [p for p in plans if not (resume and (out / p.sample_id / "annotation.json").is_file())]
        done = n - len(todo)
        if progress:
            progress(done, n)
        args = [(cfg, int(seed), p, str(out)) for p in todo]
        if workers == 1 or len(todo) <= 1:
            for a in args:
                _worker(a)
                done += 1
                if progress:
                    progress(done, n)
        else:
            ctx = mp.get_context("spawn")  # no fork: the Rust thread pool of the parent must not be cloned
            with ctx.Pool(min(workers, len(todo))) as pool:  # (no idle interpreters for a few samples)
                for _ in pool.imap_unordered(
                    _worker, args, chunksize=max(1, min(8, len(args) // (4 * workers)))
                ):
                    done += 1
                    if progress:
                        progress(done, n)
        manifest = build_manifest(out, cfg, seed, plans)
        _json_dump(manifest, man_path)
        stamp.unlink()
    _warn_empty_splits(out, manifest, cfg, train_only)
    return manifest


def _warn_empty_splits(out: Path, man: dict[str, Any], cfg: dict[str, Any], train_only: bool) -> None:
    """A TellerWarning naming the splits the configuration asks for that came out empty: each class
    is split on its own, rounding down, so a few samples per class leave val and test (and, below
    about ten per class, test_ood) with none; training then has no validation and evaluation no
    test."""
    if train_only:
        return
    fr = cfg.get("splits") or {}
    wanted = [k for k in ("val", "test") if float(fr.get(k, 0) or 0) > 0]
    if float(cfg.get("ood_fraction", 0) or 0) > 0:
        wanted.append("test_ood")
    empty = [k for k in wanted if not (man.get("splits") or {}).get(k)]
    if empty:
        n_cls = max(1, len(cfg.get("classes") or []))
        warnings.warn(
            f"{out}: the {', '.join(empty)} split(s) hold no samples: {man.get('num_samples')} samples over "
            f"{n_cls} classes is too few for the configuration's fractions (each class is split on its "
            "own); training will have no validation and evaluation no test there: ask for more samples "
            f"(about {10 * n_cls} or more)",
            TellerWarning,
            stacklevel=3,
        )


def _holds_samples(out: Path) -> bool:
    """Whether a generate run left anything in ``out`` (a sample directory, complete or not): a stamp
    alone (a run refused or stopped before its first sample) holds nothing to protect."""
    try:
        return any(
            c.is_dir() and (re.fullmatch(r"s\d{6,}", c.name) or c.name.startswith(".tmp-"))
            for c in out.iterdir()
        )
    except OSError:
        return True


def build_manifest(out: Path, cfg: dict[str, Any], seed: int, plans: list[SamplePlan]) -> dict[str, Any]:
    labels = list(cfg["classes"])
    splits: dict[str, list[str]] = {s: [] for s in SPLITS}
    counts: dict[str, dict[str, int]] = {s: {c: 0 for c in labels} for s in SPLITS}
    events = []
    for p in plans:
        splits[p.split].append(p.sample_id)
        counts[p.split][p.label] += 1
        ann = json.loads((out / p.sample_id / "annotation.json").read_text())
        events.append(int(ann["trace"]["events"]))
    ev = np.asarray(events, dtype=np.int64)
    return {
        "format": DATASET_FORMAT,
        "version": DATASET_VERSION,
        "generator": {"name": GENERATOR, "version": GENERATOR_VERSION, "teller_version": __version__},
        "seed": int(seed),
        "preset": cfg["preset"],
        "config": cfg,
        "num_samples": len(plans),
        "labels": labels,
        "splits": splits,
        "counts": counts,
        "events": {
            "total": int(ev.sum()),
            "mean": round(float(ev.mean()), 1) if len(ev) else 0.0,
            "min": int(ev.min()) if len(ev) else 0,
            "max": int(ev.max()) if len(ev) else 0,
        },
        "samples": {p.sample_id: {"label": p.label, "split": p.split} for p in plans},
    }


# -- reading a dataset ---------------------------------------------------------------------------

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")


def is_plain_name(name: Any) -> bool:
    """``name`` is one path component of its own (a sample id, a split name, a run id): letters,
    digits, ``_``, ``-`` and ``.`` (not first); never ``..``, a separator or an absolute path."""
    return isinstance(name, str) and _PLAIN_NAME.fullmatch(name) is not None


def _short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def _decode_json(raw: bytes) -> Any:
    """Parsed JSON of a file's bytes; a ``ValueError`` saying what is wrong in a few words."""
    if not raw.strip():
        raise ValueError("empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start}; a binary file?)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e})") from None


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed JSON of ``path``; a missing file is a :class:`TellerFileNotFoundError`, a directory
    or an unreadable file a :class:`TellerIOError`, bytes that are not JSON (binary, empty,
    truncated) a :class:`DatasetError`, each naming the file and ``what`` it should be."""
    p = Path(path)
    if not p.exists():
        raise TellerFileNotFoundError(f"{p}: no {what}", path=str(p))
    if not p.is_file():
        raise TellerIOError(
            f"{p}: not a file (the {what} is expected here)",
            path=str(p),
            errno=errno.EISDIR if os.path.isdir(p) else None,
        )
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise TellerIOError(
            f"{p}: cannot read the {what}: {e.strerror or e}", path=str(p), errno=e.errno
        ) from None
    try:
        return _decode_json(raw)
    except ValueError as e:
        raise DatasetError(f"{p}: not a {what}: {e}", path=str(p), detail=str(e)) from None


def manifest_problems(man: Any) -> list[tuple[str, str]]:
    """What makes a parsed dataset ``manifest.json`` unusable for reading the dataset, as (JSON path,
    what is wrong) pairs: not an object, another format, labels that are not a list of unique names,
    ``splits`` that do not map plain split names to lists of sample ids (directory names), a sample
    listed twice, no ``num_samples``. The schema (:func:`validate`) says more; this is what
    :func:`read_manifest` (``teller tokenize``) needs, and what a schema cannot say."""
    if not isinstance(man, dict):
        return [("$", f"not a dataset manifest (a JSON object), got {_short(man)}")]
    out: list[tuple[str, str]] = []
    fmt = man.get("format", DATASET_FORMAT)
    if fmt != DATASET_FORMAT:
        hint = (
            " (tokenized shards: pass the dataset directory they were made from)"
            if fmt == "teller-shards"
            else ""
        )
        return [("$.format", f"{_short(fmt)}, not {DATASET_FORMAT!r}{hint}")]
    labels = man.get("labels")
    if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)):
        out.append(("$.labels", f"must be a non-empty list of label names, got {_short(labels)}"))
    elif len(set(labels)) != len(labels):
        out.append(("$.labels", "lists a label twice"))
    n = man.get("num_samples")
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        out.append(("$.num_samples", f"must be a non-negative integer, got {_short(n)}"))
    splits = man.get("splits")
    if not isinstance(splits, dict):
        out.append(("$.splits", f"must map split names to lists of sample ids, got {_short(splits)}"))
        return out
    seen: dict[str, str] = {}
    for name, ids in splits.items():
        if not is_plain_name(name):
            out.append(("$.splits", f"{_short(name)} is not a plain split name"))
            continue
        if not isinstance(ids, list):
            out.append((f"$.splits.{name}", f"must be a list of sample ids, got {_short(ids)}"))
            continue
        for k, sid in enumerate(ids):
            if not is_plain_name(sid):
                out.append((f"$.splits.{name}[{k}]", f"{_short(sid)} is not a sample id (a directory name)"))
            elif sid in seen:
                out.append((f"$.splits.{name}[{k}]", f"{sid!r} is listed twice (also in {seen[sid]})"))
            else:
                seen[sid] = f"splits.{name}"
    return out


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``D/manifest.json`` of a dataset directory, checked (:func:`manifest_problems`): a missing,
    unreadable or malformed manifest is a :class:`~teller.errors.TellerError` naming it."""
    d = Path(directory)
    p = d / "manifest.json"
    if not p.exists():
        raise TellerFileNotFoundError(
            f"{p}: no dataset manifest (run `teller dataset generate`)", path=str(p)
        )
    man = read_json(p, "dataset manifest")
    probs = manifest_problems(man)
    if probs:
        where, what = probs[0]
        more = (
            f" (and {len(probs) - 1} more problem(s): `teller dataset validate {d}` lists them)"
            if len(probs) > 1
            else ""
        )
        raise DatasetError(f"{p}: {where}: {what}{more}", path=str(p), detail=what)
    return man


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def annotation_problem(ann: Any, labels: list[str] | tuple[str, ...]) -> tuple[str, str] | None:
    """What makes a parsed ``annotation.json`` unusable for encoding, as (JSON path, what is wrong),
    or None: a label among the dataset's ``labels``, the trace start, and the faults (type, window,
    target, params) and processes as :func:`culprit_mask` reads them."""
    if not isinstance(ann, dict):
        return "$", f"not a sample annotation (a JSON object), got {_short(ann)}"
    label = ann.get("label")
    if not isinstance(label, str) or label not in labels:
        names = ", ".join(labels)
        names = names if len(names) <= 80 else names[:77] + "..."
        return "$.label", f"{_short(label)} is not one of the dataset's labels (manifest.json: {names})"
    tr = ann.get("trace")
    if not isinstance(tr, dict) or not _is_int(tr.get("start_ns")):
        got = tr.get("start_ns") if isinstance(tr, dict) else tr
        return "$.trace.start_ns", f"must be an integer (ns), got {_short(got)}"
    faults = ann.get("faults")
    if faults is None:  # (read as no faults)
        return None
    if not isinstance(faults, list):
        return "$.faults", f"must be a list of faults, got {_short(faults)}"
    for k, f in enumerate(faults):
        at = f"$.faults[{k}]"
        if not isinstance(f, dict):
            return at, f"must be an object, got {_short(f)}"
        if not isinstance(f.get("type"), str):
            return f"{at}.type", f"must be a fault type (a string), got {_short(f.get('type'))}"
        for key in ("start_ns", "end_ns"):
            if not _is_num(f.get(key)):
                return f"{at}.{key}", f"must be a number (ns), got {_short(f.get(key))}"
        t = f.get("target")
        if not isinstance(t, dict):
            return f"{at}.target", f"must be an object, got {_short(t)}"
        if t.get("rank") is not None and not _is_int(t["rank"]):
            return f"{at}.target.rank", f"must be an integer or null, got {_short(t['rank'])}"
        if f.get("params") is not None and not isinstance(f["params"], dict):
            return f"{at}.params", f"must be an object, got {_short(f['params'])}"
        sev = f.get("severity")
        if sev is not None and not (_is_num(sev) and 0 <= sev <= 1):  # (NaN fails the range too)
            return f"{at}.severity", f"must be a number in [0, 1], got {_short(sev)}"
    if faults:
        w = ann.get("workload")
        if not isinstance(w, dict):
            return "$.workload", f"must be an object (its processes place the faults), got {_short(w)}"
        procs = w.get("processes", [])
        if not isinstance(procs, list) or not all(
            isinstance(p, dict) and _is_int(p.get("rank")) and _is_int(p.get("pid")) for p in procs
        ):
            return "$.workload.processes", f"must be a list of {{rank, pid}} integers, got {_short(procs)}"
    return None


# a replaced byte, or a control character other than \t \n \v \f \r and ESC (colours): counted by
# the regex engine (a Python loop over the 64 KiB was 1 ms a sample of every `teller tokenize`)
_NOT_TEXT = re.compile(r"[\ufffd\x00-\x08\x0e-\x1a\x1c-\x1f]")


def log_text_problem(path: str | os.PathLike[str], head: int = 1 << 16) -> str | None:
    """Why a ``log.txt`` does not read as text (NUL bytes, or more than 5 % of the characters of its
    first 64 KiB not UTF-8 text or control characters), or None. The log tokenizer reads any bytes
    (undecodable ones replaced), so a binary log is no error there, but its tokens are garbage."""
    try:
        with open(path, "rb") as f:
            raw = f.read(head)
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if b"\0" in raw:
        return "not text: it holds NUL bytes (a binary file?)"
    text = raw.decode("utf-8", errors="replace")
    bad = len(_NOT_TEXT.findall(text))
    if bad > 0.05 * len(text):
        return f"not text: {bad} of its first {len(text)} characters are not UTF-8 text (a binary file?)"
    return None


def file_problem(path: Path) -> str | None:
    """``"missing"``, ``"a directory, not a file"`` (or another kind of non-file), or None for a file."""
    if path.is_file():
        return None
    if not path.exists():
        return "missing"
    return "a directory, not a file" if path.is_dir() else "not a regular file"


# -- validate ------------------------------------------------------------------------------------


def _schema(name: str) -> dict[str, Any]:
    return json.loads((resources.files("teller.data") / "schema" / name).read_text())


def _path_key(parts: Any) -> list[tuple[int, Any]]:
    """A sort key of a JSON path (indices and keys mixed: numbers in order, before names)."""
    return [(0, x) if isinstance(x, int) else (1, str(x)) for x in parts]


def _json_path(parts: Any) -> str:
    out = "$"
    for x in parts:
        out += f"[{x}]" if isinstance(x, int) else f".{x}"
    return out


@dataclass(frozen=True)
class Problem:
    path: str  # file (relative to the dataset) and JSON path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def validate(directory: str | os.PathLike[str], *, deep: bool = False) -> list[Problem]:
    """Check the manifest and every sample against the schemas plus the rules a schema cannot say
    (windows inside the trace, ranks that exist, labels that match the faults, files present and
    files, every split's samples present, logs that are text). With ``deep``, also parse every
    trace.json and check its event count and span."""
    import jsonschema

    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise TellerIOError(f"{d}: a file, not a dataset directory", path=str(d), errno=errno.ENOTDIR)
    if not d.is_dir():
        raise TellerFileNotFoundError(f"{d}: no such dataset directory", path=str(d))
    # (what a directory of another kind is, said once, not as every schema rule its files break)
    fmt = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fmt = json.loads((d / "manifest.json").read_text(encoding="utf-8")).get("format")
    if fmt == "teller-shards":
        raise DatasetError(
            f"{d}: tokenized shards of teller tokenize, not a dataset: validate the dataset they were "
            "made from",
            path=str(d),
        )
    if not (d / "manifest.json").exists() and (d / "annotation.json").is_file():
        raise DatasetError(
            f"{d}: one sample directory, not a dataset: validate its dataset ({d.parent})", path=str(d)
        )
    problems: list[Problem] = []
    ann_v = jsonschema.Draft202012Validator(_schema("annotation.schema.json"))
    man_v = jsonschema.Draft202012Validator(_schema("manifest.schema.json"))
    manifest: dict[str, Any] | None = None
    mp_ = d / "manifest.json"
    fp = file_problem(mp_)
    if fp is not None:
        problems.append(Problem("manifest.json", fp))
    else:
        try:
            parsed = _decode_json(mp_.read_bytes())
        except OSError as e:
            problems.append(Problem("manifest.json", f"cannot be read: {e.strerror or e}"))
        except ValueError as e:
            problems.append(Problem("manifest.json", str(e)))
        else:
            errs = sorted(man_v.iter_errors(parsed), key=lambda e: _path_key(e.absolute_path))
            for err in errs:
                problems.append(Problem(f"manifest.json {_json_path(err.absolute_path)}", err.message))
            if not errs:
                problems.extend(Problem(f"manifest.json {w}", m) for w, m in manifest_problems(parsed))
            if isinstance(parsed, dict):
                manifest = parsed
    dirs = sorted(
        p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "manifest.json"
    )
    listed = set(
        (manifest or {}).get("samples", {}) if isinstance((manifest or {}).get("samples"), dict) else {}
    )
    for sid in sorted(listed - set(dirs)):
        problems.append(Problem(f"{sid}/", "listed in manifest.json but missing"))
    if manifest is not None:
        for sid in sorted(set(dirs) - listed):
            problems.append(Problem(f"{sid}/", "sample directory not listed in manifest.json"))
        splits = manifest.get("splits")
        for split, ids in splits.items() if isinstance(splits, dict) else ():
            for k, sid in enumerate(ids if isinstance(ids, list) else ()):
                # (a sample the manifest's `samples` lists is reported missing above)
                if isinstance(sid, str) and sid not in dirs and sid not in listed:
                    problems.append(
                        Problem(f"manifest.json $.splits.{split}[{k}]", f"{sid!r}: no such sample directory")
                    )
    if manifest is not None:
        problems.extend(_manifest_agreement(manifest, set(dirs)))
    for sid in dirs:
        problems.extend(_validate_sample(d / sid, ann_v, manifest, deep))
    return problems


def _manifest_agreement(man: dict[str, Any], dirs: set[str]) -> list[Problem]:
    """Where the manifest's own parts disagree: a sample's split in ``splits`` against ``samples``
    (``tokenize`` follows ``splits``: a training sample listed under ``test`` was encoded there), a
    listed sample in no split, ``num_samples`` and ``counts`` against ``samples``."""
    samples, splits = man.get("samples"), man.get("splits")
    if not isinstance(samples, dict) or not isinstance(splits, dict):
        return []
    out: list[Problem] = []
    where: dict[str, str] = {}
    for split, ids in splits.items():
        for k, sid in enumerate(ids if isinstance(ids, list) else ()):
            if not isinstance(sid, str):
                continue
            where.setdefault(sid, split)
            rec = samples.get(sid)
            if isinstance(rec, dict) and rec.get("split") != split:
                out.append(
                    Problem(
                        f"manifest.json $.splits.{split}[{k}]",
                        f"{sid!r} is listed under {split}, $.samples says {rec.get('split')!r}",
                    )
                )
            elif sid not in samples and sid in dirs:  # (no directory either: said as such above)
                out.append(Problem(f"manifest.json $.splits.{split}[{k}]", f"{sid!r} is not in $.samples"))
    for sid in sorted(set(samples) - set(where)):
        out.append(Problem(f"manifest.json $.samples.{sid}", "in no split of $.splits"))
    n = man.get("num_samples")
    if isinstance(n, int) and not isinstance(n, bool) and n != len(samples):
        out.append(Problem("manifest.json $.num_samples", f"is {n}, $.samples lists {len(samples)}"))
    counts = man.get("counts")
    if isinstance(counts, dict):
        have: dict[tuple[str, str], int] = {}
        for rec in samples.values():
            if isinstance(rec, dict):
                key = (str(rec.get("split")), str(rec.get("label")))
                have[key] = have.get(key, 0) + 1
        for split, per in counts.items():
            for label, c in per.items() if isinstance(per, dict) else ():
                if isinstance(c, int) and c != have.get((split, label), 0):
                    out.append(
                        Problem(
                            f"manifest.json $.counts.{split}.{label}",
                            f"is {c}, $.samples has {have.get((split, label), 0)}",
                        )
                    )
        for (split, label), c in sorted(have.items()):  # (and the other way: a pair counts leaves out)
            per = counts.get(split)
            if not isinstance(per, dict) or label not in per:
                out.append(Problem(f"manifest.json $.counts.{split}.{label}", f"missing, $.samples has {c}"))
    return out


def _non_finite(x: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The JSON paths of the NaN and infinite numbers in a parsed JSON value."""
    if isinstance(x, float) and not math.isfinite(x):
        yield at
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _non_finite(v, (*at, k))
    elif isinstance(x, list):
        for k, v in enumerate(x):
            yield from _non_finite(v, (*at, k))


def _validate_sample(sd: Path, ann_v: Any, manifest: dict[str, Any] | None, deep: bool) -> list[Problem]:
    sid = sd.name
    out: list[Problem] = []
    for name in ("trace.json", "log.txt"):
        fp = file_problem(sd / name)
        if fp is None and name == "trace.json" and (sd / name).stat().st_size == 0:
            fp = "empty file"  # (not even a JSON object: caught without --deep)
        if fp is not None:
            out.append(Problem(f"{sid}/{name}", fp))
        elif name == "log.txt" and (lp := log_text_problem(sd / name)) is not None:
            out.append(Problem(f"{sid}/{name}", lp))
    ap = sd / "annotation.json"
    fp = file_problem(ap)
    if fp is not None:
        out.append(Problem(f"{sid}/annotation.json", fp))
        return out
    n_file_problems = len(out)
    try:
        ann = _decode_json(ap.read_bytes())
    except OSError as e:
        out.append(Problem(f"{sid}/annotation.json", f"cannot be read: {e.strerror or e}"))
        return out
    except ValueError as e:
        out.append(Problem(f"{sid}/annotation.json", str(e)))
        return out
    errs = sorted(ann_v.iter_errors(ann), key=lambda e: _path_key(e.absolute_path))
    for err in errs:
        out.append(Problem(f"{sid}/annotation.json {_json_path(err.absolute_path)}", err.message))
    # NaN and infinities pass a JSON schema's "number" and its bounds (every comparison is false)
    for at in _non_finite(ann):
        out.append(Problem(f"{sid}/annotation.json {_json_path(at)}", "is not a finite number"))
    if len(out) > n_file_problems:
        return out
    loc = f"{sid}/annotation.json"
    labels = (manifest or {}).get("labels")
    ap_ = annotation_problem(ann, labels if isinstance(labels, list) else LABELS)
    if ap_ is not None:
        out.append(Problem(f"{loc} {ap_[0]}", ap_[1]))
        return out
    if ann["sample_id"] != sid:
        out.append(Problem(f"{loc} $.sample_id", f"is {ann['sample_id']!r}, the directory is {sid!r}"))
    types = [f["type"] for f in ann["faults"]]
    if (ann["label"] == NORMAL) != (not types) or (types and ann["label"] not in types):
        out.append(Problem(f"{loc} $.label", f"{ann['label']!r} does not match the faults {types}"))
    tp = ann["workload"]["tp"]
    t0, t1 = ann["trace"]["start_ns"], ann["trace"]["end_ns"]
    for k, f in enumerate(ann["faults"]):
        if f["start_ns"] > f["end_ns"]:
            out.append(Problem(f"{loc} $.faults[{k}]", "start_ns is after end_ns"))
        if f["start_ns"] < t0 or f["end_ns"] > t1 + 1:  # (generate clips each window to the trace)
            out.append(
                Problem(
                    f"{loc} $.faults[{k}]",
                    f"window [{f['start_ns']}, {f['end_ns']}] is not inside the trace [{t0}, {t1}]",
                )
            )
        r = f["target"].get("rank")
        if r is not None and r >= tp:
            out.append(Problem(f"{loc} $.faults[{k}].target.rank", f"rank {r} does not exist (tp={tp})"))
    gen = (manifest or {}).get("generator")
    if (
        isinstance(gen, dict)
        and gen.get("name") == GENERATOR
        and ann.get("ood") != (ann["split"] == "test_ood")
    ):
        # (the simulator's: ood is what test_ood means; real CPU runs set it their own way)
        out.append(Problem(f"{loc} $.ood", f"is {ann.get('ood')!r} for a {ann['split']} sample"))
    if manifest is not None and isinstance(manifest.get("samples"), dict):
        m = manifest["samples"].get(sid)
        if isinstance(m, dict) and (m.get("label"), m.get("split")) != (ann["label"], ann["split"]):
            out.append(Problem(f"{loc} $.label", "label/split differ from manifest.json"))
    if deep and (sd / "trace.json").is_file():
        from teller import trace as _trace
        from teller.errors import TellerError

        try:
            tr = _trace.load(sd / "trace.json", warn=False)
        except TellerError as e:
            out.append(Problem(f"{sid}/trace.json", f"does not parse: {e}"))
            return out
        if len(tr) != ann["trace"]["events"]:
            out.append(
                Problem(f"{loc} $.trace.events", f"{ann['trace']['events']}, trace.json has {len(tr)}")
            )
        elif len(tr) and int(tr.ts.min()) != t0:
            out.append(Problem(f"{loc} $.trace.start_ns", f"{t0}, trace.json starts at {int(tr.ts.min())}"))
    return out


# -- culprit events ------------------------------------------------------------------------------

_MEMORY_BOUND = frozenset(K.MEMORY_FAMILIES) | {"elementwise"}


def kernel_family(name: str) -> str:
    """The family of a kernel name (``gemm``, ``attention``, ``rms_norm``, ``all_reduce``...)."""
    n = name
    if "gemm" in n:
        return "gemm"
    if "FlashAttn" in n or "flash_fwd" in n:
        return "attention_decode" if ("splitkv" in n or "false, true>" in n) else "attention_prefill"
    for key, fam in (
        ("rms_norm", "rms_norm"),
        ("rotary", "rotary"),
        ("reshape_and_cache", "reshape_and_cache"),
        ("act_and_mul", "silu_and_mul"),
        ("indexSelect", "embedding"),
        ("SoftMax", "sampling"),
        ("ArgMax", "sampling"),
        ("cross_device_reduce", "all_reduce"),
        ("ncclDevKernel", "all_reduce"),
        ("elementwise_kernel", "elementwise"),
    ):
        if key in n:
            return fam
    return "other"


def culprit_mask(trace: Any, annotation: dict[str, Any]) -> np.ndarray:
    """Boolean mask over the events of ``trace`` (a :class:`teller.trace.Trace` of the sample's
    ``trace.json``): the events that carry the root cause of the sample's faults. See
    ``docs/dataset.md`` ("culprit events") for the rule of each fault type. Normal samples: all False."""
    from teller.trace import LAYER_NAMES

    n = len(trace)
    mask = np.zeros(n, dtype=bool)
    if not annotation.get("faults") or n == 0:
        return mask
    layer = np.asarray(trace.layer)
    L = {name: i for i, name in enumerate(LAYER_NAMES)}
    names = trace.strings
    name_col = np.asarray(trace.name)
    uniq, inv = np.unique(name_col, return_inverse=True)
    fam_u = np.array([kernel_family(names[int(u)]) for u in uniq], dtype=object)
    fam = fam_u[inv]
    name_u = np.array([names[int(u)] for u in uniq], dtype=object)
    ev_name = name_u[inv]
    ts = np.asarray(trace.ts)
    pid = np.asarray(trace.pid)
    dev = np.asarray(trace.device)
    tid = np.asarray(trace.tid)
    procs = {int(p["rank"]): int(p["pid"]) for p in annotation["workload"].get("processes", [])}
    gpu = np.isin(layer, [L["kernel"], L["memcpy"], L["memset"]])
    # fault windows are in true time; a process's events are on its clock, off by its clock-sync
    # error (up to 2.5 us in the simulator, generator version 6 records it): taken off, so that a
    # faulty step's first ranges, which start 1-6 us into it, are not left before its window
    for p in annotation["workload"].get("processes", []):
        e = int(p.get("clock_error_ns") or 0)
        if e:
            ts = np.where((pid == int(p["pid"])) | (gpu & (dev == int(p["device"]))), ts - e, ts)
    cpu = ~gpu
    kern = layer == L["kernel"]
    for f in annotation["faults"]:
        if (f.get("params") or {}).get("role") == "secondary":
            continue  # (a co-occurring nuisance, not the root cause the label names: not a culprit)
        win = (ts >= f["start_ns"]) & (ts < f["end_ns"])
        r = f["target"].get("rank")
        if r is None:
            on_rank = np.ones(n, dtype=bool)
        else:
            on_rank = (gpu & (dev == int(r))) | (cpu & (pid == procs.get(int(r), -1)))
        t = f["type"]
        if t == "gpu_throttle":
            sel = kern & np.isin(fam, ["gemm", "attention_prefill"])
        elif t == "hbm_contention" and f.get("params", {}).get("sharing") == "time_slice":
            # every kernel of the rank started late; the host's waits for the GPU took the delay
            sel = kern | (
                (layer == L["runtime"]) & np.isin(ev_name, ["cudaStreamSynchronize", "cudaMemcpyAsync"])
            )
        elif t == "hbm_contention":
            sel = kern & (np.isin(fam, list(_MEMORY_BOUND)) | (tid != 7))
        elif t == "pcie_degradation":
            sel = (layer == L["memcpy"]) | ((layer == L["runtime"]) & (ev_name == "cudaMemcpyAsync"))
        elif t == "nvlink_degradation":
            sel = kern & (fam == "all_reduce")
        elif t in ("cpu_contention", "host_memory_pressure") and f["target"].get("name") == "workload":
            # a real CPU run (teller.data.cpu_runs): the whole process competed; its modules' ranges
            sel = cpu
        elif t == "slow_operator":  # (real CPU runs) the slowed operator's ranges
            sel = cpu & (ev_name == str(f["target"].get("name")))
        elif t in ("cpu_contention", "host_memory_pressure"):
            sel = np.isin(layer, [L["host_op"], L["runtime"]]) | (
                (layer == L["annotation"])
                & np.isin(
                    ev_name, ["schedule", "prepare_inputs", "postprocess", "recv_scheduler_output", "sample"]
                )
            )
        elif t == "kv_cache_exhaustion":
            sel = ((layer == L["annotation"]) & (ev_name == "schedule")) | (
                kern & (fam == "attention_prefill")
            )
        elif t == "nccl_straggler":
            sel = kern & (fam != "all_reduce")
        elif t == "network_delay":
            sel = (layer == L["annotation"]) & np.char.startswith(ev_name.astype(str), "engine_step")
        elif t == "eager_mode_misconfig":
            sel = (layer == L["runtime"]) & (ev_name == "cudaLaunchKernel")
        elif t == "oom_error":
            sel = cpu & (layer == L["annotation"])
        elif t == "launch_storm":
            el = kern & (fam == "elementwise") & (tid == 7)
            link = np.asarray(trace.link)
            launch = np.zeros(n, dtype=bool)
            li = link[el]
            launch[li[li >= 0]] = True
            sel = el | launch | ((layer == L["host_op"]) & (ev_name == "aten::add_"))
        else:
            sel = np.zeros(n, dtype=bool)
        mask |= sel & win & on_rank
    return mask
