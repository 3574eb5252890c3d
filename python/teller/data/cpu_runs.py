"""Real CPU fault runs: ``teller dataset collect-cpu``.

Each sample is a real run of the tiny GPT-2 inference (``teller.workloads.tiny_gpt2``) under
``teller collect --nvtx-json transformers``, with a real fault injected on this machine while it runs:

| kind | mechanism | annotated as |
|---|---|---|
| ``cpu_contention`` | busy-looping processes competing for the cores | ``cpu_contention`` |
| ``thread_oversubscription`` | far more intra-op threads than cores | ``cpu_contention`` |
| ``host_memory_pressure`` | a process streaming through GBs of memory | ``host_memory_pressure`` |
| ``io_stall`` | log lines fsynced while a neighbour floods the disk | ``io_stall`` |
| ``slow_operator`` | a module's ``forward`` sleeps per call for a while (delay hook) | ``slow_operator`` |
| ``normal`` | nothing | no fault |

Onsets and windows are on the trace clock (realtime ns), measured when the injector actually started
and stopped. Timing-dependent, hence not byte-deterministic like the simulator: the seed fixes the
plan (kinds, severities, onsets), the machine does the rest. The samples have the dataset format of
``docs/dataset.md``. By default they all land in the ``test`` split: a small, real, second test set
for models trained on the simulator. With ``splits`` (train, val, test fractions) each kind's runs are
shared out over the three, so that the models can also be trained on real runs
(``teller dataset collect-cpu --splits 0.6,0.2,0.2``).
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing as mp
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from teller import __version__
from teller._io import check_output_dir, dir_lock, write_atomic
from teller.errors import ConfigError

KINDS = (
    "normal",
    "cpu_contention",
    "thread_oversubscription",
    "host_memory_pressure",
    "io_stall",
    "slow_operator",
)
LABEL_OF = {
    "normal": "normal",
    "cpu_contention": "cpu_contention",
    "thread_oversubscription": "cpu_contention",
    "host_memory_pressure": "host_memory_pressure",
    "io_stall": "io_stall",
    "slow_operator": "slow_operator",
}
GENERATOR = "teller-cpu-runs"
GENERATOR_VERSION = 2  # (2: fault windows clipped to the trace)
SLOW_MODULE = "transformers.models.gpt2.modeling_gpt2"
SLOW_FUNCTION = "GPT2MLP.forward"
LAYERS = 4  # of the workload's model (teller.workloads.tiny_gpt2 default)
PROMPT_LEN = 16  # (teller.workloads.tiny_gpt2 default)
# what a run's workload is made of; a collection keeps one shape (a resume with another is refused)
SHAPE_KEYS = ("requests", "new_tokens", "layers", "prompt_len")


# -- injectors (separate processes, so the workload really competes for the machine) ----------------


def _spin(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        for i in range(10000):
            x ^= i
    _ = x


def _memory_hog(stop_at: float, nbytes: int) -> None:
    buf = bytearray(nbytes)  # zero pages; touching them faults them in
    step = 4096
    while time.time() < stop_at:
        for off in range(0, nbytes, step * 16):
            buf[off] = (buf[off] + 1) & 0xFF
        mv = memoryview(buf)
        for off in range(0, nbytes, 1 << 22):  # stream through it: memory bandwidth and cache pressure
            bytes(mv[off : off + (1 << 22)])
            if time.time() >= stop_at:
                break


def _disk_flood(stop_at: float, directory: str, block: int) -> None:
    path = os.path.join(directory, f"teller-io-flood-{os.getpid()}.bin")
    data = os.urandom(block)
    try:
        with open(path, "wb") as f:
            while time.time() < stop_at:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                if f.tell() > 256 << 20:
                    f.seek(0)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


class _Injector:
    """Starts the fault's processes at ``start()``, stops them at ``stop()``; records realtime ns."""

    def __init__(self, kind: str, severity: float, workdir: Path) -> None:
        self.kind, self.severity, self.workdir = kind, severity, workdir
        self.procs: list[Any] = []
        self.start_ns = self.end_ns = 0
        self.params: dict[str, Any] = {}

    def start(self, duration_s: float) -> None:
        ctx = mp.get_context("spawn")
        stop_at = time.time() + duration_s
        self.start_ns = time.time_ns()
        if self.kind == "cpu_contention":
            n = 1 if self.severity < 0.6 else 2
            self.params = {"busy_processes": n}
            self.procs = [ctx.Process(target=_spin, args=(stop_at,), daemon=True) for _ in range(n)]
        elif self.kind == "host_memory_pressure":
            nbytes = int((0.5 + 2.5 * self.severity) * (1 << 30))
            self.params = {"hog_bytes": nbytes}
            self.procs = [ctx.Process(target=_memory_hog, args=(stop_at, nbytes), daemon=True)]
        elif self.kind == "io_stall":
            block = int((1 + 7 * self.severity) * (1 << 20))
            self.params = {"flood_block_bytes": block}
            self.procs = [
                ctx.Process(target=_disk_flood, args=(stop_at, str(self.workdir), block), daemon=True)
            ]
        for p in self.procs:
            p.start()

    def stop(self) -> None:
        for p in self.procs:
            p.join(timeout=2.0)
            if p.is_alive():
                p.terminate()
                p.join()
        self.end_ns = time.time_ns()


# -- one sample ---------------------------------------------------------------------------------------


def _clipped_faults(a: dict[str, Any]) -> Any:
    """An annotation's faults with their windows inside its trace (version 2's rule), or its faults
    as they are where it says no trace span."""
    tr = a.get("trace") if isinstance(a.get("trace"), dict) else {}
    t0, t1, faults = tr.get("start_ns"), tr.get("end_ns"), a.get("faults")
    if not (isinstance(t0, int) and isinstance(t1, int) and isinstance(faults, list)):
        return faults
    out = []
    for f in faults:
        if isinstance(f, dict) and isinstance(f.get("start_ns"), int) and isinstance(f.get("end_ns"), int):
            start = min(max(f["start_ns"], t0), t1)
            f = {**f, "start_ns": start, "end_ns": max(min(f["end_ns"], t1 + 1), start)}
        out.append(f)
    return out


def _plan(seed: int, num_samples: int, kinds: Sequence[str] = KINDS) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    plans = []
    for i in range(num_samples):
        kind = kinds[i % len(kinds)]
        plans.append(
            {
                "sample_id": f"cpu{i:04d}",
                "kind": kind,
                "severity": round(rng.uniform(0.35, 1.0), 3),
                "onset_frac": round(rng.uniform(0.1, 0.35), 3),
                "dur_frac": round(rng.uniform(0.4, 0.7), 3),
            }
        )
    return plans


def _assign_splits(
    plans: Sequence[dict[str, Any]], seed: int, fractions: tuple[float, float, float]
) -> dict[str, str]:
    """sample id -> split. Per kind, its k-th run (in plan order) goes to the split whose share of
    [0, 1) holds ``u_k = frac(offset + k * 0.618...)``, the golden-ratio sequence from an offset the
    seed draws per kind inside train's share (so the first run of every kind trains): a
    low-discrepancy sequence, so each kind's runs share out close to the fractions (within about
    three runs at any count: stratified), and the k-th run's split depends on k alone, so that
    growing a collection (a larger ``--num-samples``) never moves a finished run to another split."""
    names = ("train", "val", "test")
    total = sum(fractions)
    edges = np.cumsum([f / total for f in fractions])
    edges[-1] = 1.0
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    first = next(j for j in range(3) if fractions[j] > 0)  # (train, unless it is asked for 0)
    lo = edges[first - 1] if first else 0.0
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for p in plans:
        kind = p["kind"]
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        offset = lo + random.Random(f"{seed}:{kind}").random() * (edges[first] - lo)
        u = (offset + k * golden) % 1.0
        j = min(int(np.searchsorted(edges, u, side="right")), 2)
        while fractions[j] <= 0:  # (u on the edge of a split asked for 0: the one before it)
            j = (j - 1) % 3
        out[p["sample_id"]] = names[j]
    return out


def parse_splits(text: str) -> tuple[float, float, float]:
    """``"0.6,0.2,0.2"`` -> train, val, test fractions (any non-negative numbers; they are
    normalized). Raises ConfigError naming what is wrong."""
    parts = [t.strip() for t in text.split(",")]
    try:
        vals = [float(t) for t in parts]
    except ValueError:
        raise ConfigError(f"--splits {text!r}: expected three numbers TRAIN,VAL,TEST") from None
    if len(vals) != 3 or any(not (0 <= v < math.inf) for v in vals) or not 0 < sum(vals) < math.inf:
        raise ConfigError(
            f"--splits {text!r}: expected three non-negative fractions TRAIN,VAL,TEST with a positive sum"
        )
    return (vals[0], vals[1], vals[2])


def _workload_cmd(shape: dict[str, int], extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "teller.workloads.tiny_gpt2",
        "--requests",
        str(shape["requests"]),
        "--new-tokens",
        str(shape["new_tokens"]),
        "--layers",
        str(shape["layers"]),
        "--prompt-len",
        str(shape["prompt_len"]),
        *extra,
    ]


def _generation_window_ns(log_txt: Path) -> tuple[int, int] | None:
    """(ns of the 'model ready' line, ns of the last request line) from a collect run's log.txt."""
    ready = last = None
    for line in log_txt.read_text(errors="replace").splitlines():
        ts, _, rest = line.partition(" ")
        if not ts.isdigit():
            continue
        if "model ready" in rest:
            ready = int(ts)
        elif "generated in" in rest:
            last = int(ts)
    return (ready, last) if ready is not None and last is not None else None


def _wait_for_ready(trace_dir: Path, th: threading.Thread, timeout_s: float = 300.0) -> None:
    deadline = time.time() + timeout_s
    while th.is_alive() and time.time() < deadline:
        for log in trace_dir.glob("run-*/log.txt"):
            try:
                if "model ready" in log.read_text(errors="replace"):
                    return
            except OSError:
                pass
        time.sleep(0.02)


def _run_one(
    plan: dict[str, Any],
    out: Path,
    timing: dict[str, float],
    shape: dict[str, int],
    keep_raw: bool,
    split: str = "test",
    ood: bool = True,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"teller-cpu-{plan['sample_id']}-"))
    try:  # (the run's own files, removed however it ends: a failed run left them in the temp dir)
        return _run_one_in(work, plan, out, timing, shape, keep_raw, split, ood)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_one_in(
    work: Path,
    plan: dict[str, Any],
    out: Path,
    timing: dict[str, float],
    shape: dict[str, int],
    keep_raw: bool,
    split: str,
    ood: bool,
) -> dict[str, Any]:
    from teller.collect import collect
    from teller.trace import load

    kind, sev = plan["kind"], float(plan["severity"])
    extra: list[str] = []
    env_delay: str | None = None
    gen_s = timing["gen_s"]
    dur_s = max(0.3, plan["dur_frac"] * gen_s)
    params: dict[str, Any] = {}
    if kind == "thread_oversubscription":
        threads = 8 if sev < 0.7 else 16
        extra += ["--threads", str(threads)]
        params = {"mechanism": "thread_oversubscription", "torch_threads": threads, "cores": os.cpu_count()}
    elif kind == "io_stall":
        extra += ["--log-file", str(work / "engine.log")]
    elif kind == "slow_operator":
        delay = round(0.5 + 4.5 * sev, 2)
        # GPT2MLP.forward calls in the run: one per layer per generated token (KV cache)
        calls = shape["requests"] * shape["new_tokens"] * shape["layers"]
        first = int(plan["onset_frac"] * calls)
        last = first + max(8, int(plan["dur_frac"] * calls))
        params = {"delay_ms": delay, "function": f"{SLOW_MODULE}.{SLOW_FUNCTION}", "calls": [first, last]}
        env_delay = json.dumps(
            [
                {
                    "module": SLOW_MODULE,
                    "function": SLOW_FUNCTION,
                    "delay_ms": delay,
                    "start_call": first,
                    "end_call": last,
                }
            ]
        )
    injector = _Injector(kind, sev, work)
    result: dict[str, Any] = {}
    old_env = os.environ.get("TELLER_FAULT_DELAY")
    if env_delay:
        os.environ["TELLER_FAULT_DELAY"] = env_delay
    try:
        sink_out, sink_err = io.BytesIO(), io.BytesIO()

        def target() -> None:
            try:
                result["res"] = collect(
                    _workload_cmd(shape, extra),
                    trace_dir=work / "traces",
                    nvtx_json="transformers",
                    stdout=sink_out,
                    stderr=sink_err,
                )
            except BaseException as e:  # noqa: BLE001 - raised again on the calling thread
                result["error"] = e

        th = threading.Thread(target=target, name="teller-collect-cpu")
        th.start()
        if kind in ("cpu_contention", "host_memory_pressure", "io_stall"):
            # onset: a fraction of the generation phase after the workload says it is ready
            _wait_for_ready(work / "traces", th)
            time.sleep(plan["onset_frac"] * gen_s)
            injector.start(dur_s)
            time.sleep(dur_s)
            injector.stop()
            params = {**params, **injector.params}
        th.join()
    finally:
        if env_delay:
            if old_env is None:
                os.environ.pop("TELLER_FAULT_DELAY", None)
            else:
                os.environ["TELLER_FAULT_DELAY"] = old_env
    if "error" in result:  # (the collection's own error, not a KeyError for the missing result)
        raise result["error"]
    res = result["res"]
    run_dir: Path = res.run_dir
    if res.trace_json is None:
        raise ConfigError(f"{plan['sample_id']}: the run recorded no trace ({'; '.join(res.warnings)})")
    tr = load(run_dir, warn=False)
    t_start, t_end = int(tr.ts.min()), int(tr.end.max())
    sample = out / plan["sample_id"]
    tmp = out / f".{plan['sample_id']}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(run_dir / "trace.json", tmp / "trace.json")
    shutil.copy(run_dir / "log.txt", tmp / "log.txt")
    shutil.copy(run_dir / "run.json", tmp / "run.json")
    if keep_raw:
        shutil.copytree(run_dir / "raw", tmp / "raw")
    faults: list[dict[str, Any]] = []
    label = LABEL_OF[kind]
    pid = int(tr.pid[tr.layer_mask("annotation")][0]) if tr.layer_mask("annotation").any() else 0
    if kind != "normal":
        if kind in ("cpu_contention", "host_memory_pressure", "io_stall"):
            start_ns, end_ns = injector.start_ns, injector.end_ns
        elif kind == "slow_operator":
            # the slowed calls are the GPT2MLP ranges number first..last, in call order
            mlp = [
                i for i in range(len(tr)) if tr.layer_name(i) == "annotation" and tr.name_of(i) == "GPT2MLP"
            ]
            first, last = params["calls"]
            hit = mlp[first : min(last, len(mlp))]
            if not hit:
                raise ConfigError(f"{plan['sample_id']}: the slowed calls are not in the trace")
            start_ns, end_ns = int(tr.ts[hit[0]]), int(tr.end[hit[-1]]) + 1
        else:  # thread_oversubscription: the whole run
            start_ns, end_ns = t_start, t_end + 1
        # (inside the trace, as a simulated sample's: a contention started before the program and
        # stopped after it was in force for the whole capture, not before or after it)
        start_ns = min(max(int(start_ns), t_start), t_end)
        end_ns = max(min(int(end_ns), t_end + 1), start_ns)
        target = (
            {"kind": "operator", "name": "GPT2MLP", "rank": 0, "pid": pid}
            if kind == "slow_operator"
            else {"kind": "process", "name": "workload", "rank": 0, "pid": pid}
        )
        faults.append(
            {
                "type": label,
                "layer": "host_op",
                "target": target,
                "start_ns": int(start_ns),
                "end_ns": int(end_ns),
                "severity": sev,
                "params": {"kind": kind, **params},
            }
        )
    ann = {
        "format": "teller-sample",
        "version": 1,
        "sample_id": plan["sample_id"],
        "label": label,
        "split": split,
        "ood": ood,
        "workload": {
            "model": "gpt2-tiny",
            "model_name": f"GPT-2 ({shape['layers']} layers, 128 wide, from a config)",
            "model_layers": shape["layers"],
            "requests": shape["requests"],
            "new_tokens": shape["new_tokens"],
            "prompt_len": shape["prompt_len"],
            "gpu": "cpu",
            "tp": 1,
            "arrival": "closed_loop",
            "cuda_graphs": False,
            "processes": [{"rank": 0, "pid": pid, "device": -1}],
        },
        "faults": faults,
        "trace": {"start_ns": t_start, "end_ns": t_end, "events": len(tr), "steps": len(tr.steps())},
    }
    (tmp / "annotation.json").write_text(json.dumps(ann, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(sample, ignore_errors=True)
    os.replace(tmp, sample)
    return ann


def _calibrate(shape: dict[str, int]) -> dict[str, float]:
    """One plain run: how long start-up and generation take on this machine."""
    from teller.collect import collect

    work = Path(tempfile.mkdtemp(prefix="teller-cpu-calib-"))
    try:
        t0 = time.time_ns()
        res = collect(
            _workload_cmd(shape, []),
            trace_dir=work,
            nvtx_json="transformers",
            convert=False,
            stdout=io.BytesIO(),
            stderr=io.BytesIO(),
        )
        win = _generation_window_ns(res.run_dir / "log.txt")
        if win is None:
            raise ConfigError("calibration run failed: the workload logged no requests")
        return {"ready_s": (win[0] - t0) / 1e9, "gen_s": max(0.2, (win[1] - win[0]) / 1e9)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_kind(out: Path) -> None:
    """Refuse a directory that holds another dataset (a simulated one, `dataset generate`'s): the
    collection would write its runs among the other samples and its manifest over theirs."""
    man_path = out / "manifest.json"
    if man_path.exists():
        try:
            gen = json.loads(man_path.read_text()).get("generator")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise ConfigError(f"{man_path}: not a readable manifest ({e})", path=str(man_path)) from None
        name = gen.get("name") if isinstance(gen, dict) else gen
        if name is not None and name != GENERATOR:  # (none: a collection from before it was said)
            raise ConfigError(
                f"{out}: already holds a dataset of another kind (generator {name!r}, not {GENERATOR!r}); "
                "collect the real runs into a directory of their own",
                path=str(out),
            )
    others = sorted(
        p.parent.name for p in out.glob("*/annotation.json") if not p.parent.name.startswith("cpu")
    )
    if others:
        more = ", ..." if len(others) > 3 else ""
        raise ConfigError(
            f"{out}: holds samples of another dataset ({', '.join(others[:3])}{more}); "
            "collect the real runs into a directory of their own",
            path=str(out),
        )


def _check_shape(out: Path, shape: dict[str, int]) -> bool:
    """Refuse to resume a collection of another workload shape: its runs would not be comparable.
    The manifest says what the finished runs were (before ``layers`` and ``prompt_len`` were
    options they were the defaults); without one (an interrupted first call), or one from before
    the shape was recorded, their annotations do, as far as they say it (annotations from before
    the shape options name only ``model_layers``; their prompt was the default): runs are read
    until every part of the shape is known. Returns whether it all was (and so matched)."""
    man_path = out / "manifest.json"
    old: dict[str, Any] = {}
    src: dict[str, Path] = {}  # where each part of the shape was read (default: the manifest)
    if man_path.exists():
        try:
            cfg = json.loads(man_path.read_text()).get("config") or {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise ConfigError(f"{man_path}: not a readable manifest ({e})") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"{man_path}: 'config' is not an object")
        if all(k in cfg for k in ("requests", "new_tokens")):
            old = {"layers": LAYERS, "prompt_len": PROMPT_LEN, **{k: cfg[k] for k in SHAPE_KEYS if k in cfg}}
    if not old:
        for ann_path in sorted(out.glob("cpu*/annotation.json")):
            try:
                wl = json.loads(ann_path.read_text()).get("workload") or {}
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                continue  # (named when the run is resumed)
            if not isinstance(wl, dict):
                continue
            known = {k: wl[k] for k in ("requests", "new_tokens", "prompt_len") if k in wl}
            if "model_layers" in wl:
                known["layers"] = wl["model_layers"]
                if "requests" not in wl:  # from before the shape options: the default prompt
                    known.setdefault("prompt_len", PROMPT_LEN)
            for k, v in known.items():  # an old run names only its depth: read on
                if k not in old:
                    old[k], src[k] = v, ann_path
            if all(k in old for k in SHAPE_KEYS):
                break
    diff = [k for k in SHAPE_KEYS if k in old and old[k] != shape[k]]
    if diff:
        said = "; ".join(f"{k} {old[k]!r} there, {shape[k]!r} asked" for k in diff)
        raise ConfigError(
            f"{src.get(diff[0], man_path)}: this collection's runs have another workload shape ({said}); "
            "collect into a new directory, or resume with the same options"
        )
    return all(k in old for k in SHAPE_KEYS)


def collect_cpu(
    output_dir: str | os.PathLike[str],
    num_samples: int,
    *,
    seed: int = 0,
    requests: int = 6,
    new_tokens: int = 8,
    layers: int = LAYERS,
    prompt_len: int = PROMPT_LEN,
    keep_raw: bool = False,
    kinds: Sequence[str] | None = None,
    splits: tuple[float, float, float] = (0.0, 0.0, 1.0),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run ``num_samples`` real fault runs into ``output_dir`` (resumable) and write its manifest.
    ``kinds`` (default: all of KINDS) are cycled through; ``splits``: the train, val and test
    fractions (:func:`_assign_splits`; default all test). Runs are out-of-distribution (``ood``)
    only where none of them is for training. A resumed collection with other fractions moves the
    finished runs to their new splits (their annotation is rewritten; the run is not).
    ``requests``, ``new_tokens``, ``layers`` and ``prompt_len`` shape the workload (the tiny GPT-2's
    depth and prompt; a second collection of another shape is how transfer across workloads is
    measured). One directory holds one shape: resuming with another is refused."""
    if num_samples < 1:
        raise ConfigError("num_samples must be >= 1")
    shape = {"requests": requests, "new_tokens": new_tokens, "layers": layers, "prompt_len": prompt_len}
    bad_shape = [
        f"{k}={v!r}" for k, v in shape.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1
    ]
    if bad_shape:
        raise ConfigError(f"the workload's {', '.join(bad_shape)}: expected positive integers")
    if shape["prompt_len"] + shape["new_tokens"] > 256:  # the tiny GPT-2's n_positions
        raise ConfigError(
            f"prompt_len {prompt_len} + new_tokens {new_tokens} > 256, the tiny GPT-2's context length"
        )
    if len(splits) != 3 or any(not (0 <= f < math.inf) for f in splits) or not 0 < sum(splits) < math.inf:
        raise ConfigError(f"splits must be three non-negative fractions (train, val, test), got {splits}")
    kinds = tuple(kinds or KINDS)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ConfigError(f"unknown fault kinds {bad}; known: {', '.join(KINDS)}")
    out = Path(output_dir)
    check_output_dir(out, "--output-dir names a directory")  # (refused before any work)
    # one collection per directory at a time: two would write the same runs, and their fault runs
    # would load the CPUs the other one is timing (the lock creates the directory)
    with dir_lock(out, "teller dataset collect-cpu"):
        _check_kind(out)
        shape_known = _check_shape(out, shape)
        plans = _plan(seed, num_samples, kinds)
        # runs past --num-samples would stay on disk, out of the manifest (validate then names each)
        past = sorted(
            p.name
            for p in (out.iterdir() if out.is_dir() else ())
            if re.fullmatch(r"cpu\d{4,}", p.name)
            and int(p.name[3:]) >= num_samples
            and (p / "annotation.json").exists()
        )
        if past:
            raise ConfigError(
                f"{out}: holds {len(past)} run(s) past --num-samples {num_samples} ({past[0]}..{past[-1]}): "
                f"give --num-samples {int(past[-1][3:]) + 1} or more, or another --output-dir"
            )
        split_of = _assign_splits(plans, seed, (float(splits[0]), float(splits[1]), float(splits[2])))
        ood = not splits[0] > 0
        timing = _calibrate(shape)
        anns = []
        for k, plan in enumerate(plans):
            sid = plan["sample_id"]
            ann_path = out / sid / "annotation.json"
            if ann_path.exists():
                try:
                    a = json.loads(ann_path.read_text())
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise ConfigError(
                        f"{ann_path}: not a readable annotation ({e}); delete {out / sid}"
                    ) from None
                if not isinstance(a, dict):
                    raise ConfigError(f"{ann_path}: not an annotation (a JSON object); delete {out / sid}")
                # a run of another plan (another --seed or --kinds): resumed, the manifest would
                # record one plan and the runs another
                f0 = (a.get("faults") or [{}])[0] if isinstance(a.get("faults"), list) else {}
                was = ((f0.get("params") or {}).get("kind", "normal"), f0.get("severity"))
                want = (plan["kind"], plan["severity"] if plan["kind"] != "normal" else None)
                if was != want:
                    raise ConfigError(
                        f"{out / sid}: collected as kind {was[0]} severity {was[1]}, where --seed {seed} "
                        f"and the kinds give {want[0]} severity {want[1]}: resume with the seed and kinds "
                        "it was collected with, or use another --output-dir"
                    )
                wl = a.get("workload") if isinstance(a.get("workload"), dict) else None
                # a run from before the shape options says its shape once the collection's is known
                fill = (
                    {}
                    if wl is None or not shape_known
                    else {k: shape[k] for k in ("requests", "new_tokens", "prompt_len") if k not in wl}
                )
                # (a run of version 1 has its fault window as the injector ran it: clipped to the
                # trace, as version 2 writes it)
                faults = _clipped_faults(a)
                if (
                    (a.get("split"), a.get("ood")) != (split_of[sid], ood)
                    or fill
                    or faults != a.get("faults")
                ):
                    a = {
                        **a,
                        "split": split_of[sid],
                        "ood": ood,
                        **({"faults": faults} if "faults" in a else {}),
                    }
                    if fill:
                        a["workload"] = {**a["workload"], **fill}
                    tmp = ann_path.with_name(".annotation.json.tmp")
                    tmp.write_text(json.dumps(a, indent=1, sort_keys=True) + "\n")
                    os.replace(tmp, ann_path)
                anns.append(a)
            else:
                anns.append(_run_one(plan, out, timing, shape, keep_raw, split_of[sid], ood))
            if progress:
                progress(k + 1, len(plans))
        labels = ["normal", "cpu_contention", "host_memory_pressure", "io_stall", "slow_operator"]
        split_ids: dict[str, list[str]] = {"train": [], "val": [], "test": [], "test_ood": []}
        counts: dict[str, dict[str, int]] = {s: {c: 0 for c in labels} for s in split_ids}
        for a in anns:
            split_ids[a["split"]].append(a["sample_id"])
            counts[a["split"]][a["label"]] += 1
        events = [int(a["trace"]["events"]) for a in anns]
        manifest = {
            "format": "teller-dataset",
            "version": 1,
            "generator": {"name": GENERATOR, "version": GENERATOR_VERSION, "teller_version": __version__},
            "seed": int(seed),
            "preset": None,
            "config": {
                "kinds": list(KINDS),
                **shape,
                "timing": timing,
                "cores": os.cpu_count(),
                "plans": plans,
                "split_fractions": [float(f) for f in splits],
            },
            "num_samples": len(anns),
            "labels": labels,
            "splits": split_ids,
            "counts": counts,
            "events": {
                "total": sum(events),
                "mean": round(sum(events) / len(events), 1),
                "min": min(events),
                "max": max(events),
            },
            "samples": {a["sample_id"]: {"label": a["label"], "split": a["split"]} for a in anns},
        }
        write_atomic(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        return manifest
