"""Loading, inspecting and writing traces.

>>> import teller
>>> tr = teller.trace.load("run-dir-or-trace.json.gz")      # doctest: +SKIP
>>> tr.ts[:3], tr.layer_name(0), len(tr.steps())            # doctest: +SKIP

Columns are read-only numpy views of the Rust buffers (no per-event Python objects). Event ``i``'s
name is ``tr.strings[tr.name[i]]``; its normalized symbol is ``tr.symbols[tr.symbol[i]]``.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from teller import _native
from teller.errors import ConfigError, EmptyTraceError, TellerIOError, TellerWarning, TraceFormatError

LAYER_NAMES: tuple[str, ...] = tuple(_native.LAYER_NAMES)
DEFAULT_STEP_PATTERNS: tuple[str, ...] = tuple(_native.DEFAULT_STEP_PATTERNS)
GPU_ACTIVITY_LAYERS = frozenset({"kernel", "memcpy", "memset"})

FLAG_INSTANT = 1
FLAG_UNFINISHED = 2

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Step:
    """One step (segment) of a trace: a profiler step, an engine step, or a fallback range."""

    index: int
    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    event: int  # defining event index, -1 for a synthetic step

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


class CallTree:
    """The call-chain tree of (a step of) a trace: CPU ranges nested by time per thread, GPU work
    under the runtime/driver call that launched it."""

    def __init__(self, trace: Trace, nodes: np.ndarray) -> None:
        self.trace = trace
        self.nodes = nodes  # event indices in call-chain order
        parent = trace.parent[nodes]
        inside = np.isin(parent, nodes)
        self.roots: list[int] = [
            int(i) for i, p, ok in zip(nodes, parent, inside, strict=True) if p < 0 or not ok
        ]
        self._children: dict[int, list[int]] = {}
        for i, p, ok in zip(nodes, parent, inside, strict=True):
            if p >= 0 and ok:
                self._children.setdefault(int(p), []).append(int(i))

    def children(self, i: int) -> list[int]:
        return self._children.get(int(i), [])

    def __len__(self) -> int:
        return len(self.nodes)

    def walk(self) -> Iterator[tuple[int, int]]:
        """(depth, event) pairs in depth-first call-chain order."""
        stack = [(0, r) for r in reversed(self.roots)]
        while stack:
            d, i = stack.pop()
            yield d, i
            for c in reversed(self.children(i)):
                stack.append((d + 1, c))

    def render(self, max_lines: int = 200, width: int = 100) -> str:
        """The tree as indented text: at most ``max_lines`` lines (>= 0) of names cut to ``width``
        (>= 4) characters, then a ``... (N more)`` line."""
        max_lines = _int_arg(max_lines, "max_lines", 0)
        width = _int_arg(width, "width", 4)
        tr = self.trace
        lines = []
        for n, (d, i) in enumerate(self.walk()):
            if n >= max_lines:
                lines.append(f"... ({len(self.nodes) - max_lines} more)")
                break
            name = tr.name_of(i)
            if len(name) > width:
                name = name[: width - 3] + "..."
            lines.append(f"{'  ' * d}{tr.layer_name(i)}: {name}  [{tr.dur[i] / 1000:.1f} us]")
        return "\n".join(lines)


class Trace:
    """An aligned trace: every event of every input on one time base (realtime ns)."""

    def __init__(self, native: Any) -> None:
        self._n = native
        # the step names and normalization it was loaded with (None: the defaults); `load` sets them
        self.load_options: dict[str, Any] = {"step_names": None, "normalize": None}

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle, copy and multiprocessing (`Pool.map(teller.trace.load, paths)`) carry the loaded
        # trace as teller_core::snapshot bytes: columns and string tables copied, nothing re-parsed
        # or re-aligned on the other side. The cached column views are not pickled; they are views
        # of the new native trace when first read.
        return (_from_snapshot, (self._n.snapshot(), self.load_options))

    # -- columns (zero-copy views) ------------------------------------------------------------
    def _col(self, name: str) -> np.ndarray:
        return self._n.column(name)

    @cached_property
    def layer(self) -> np.ndarray:
        """uint8 layer code, see LAYER_NAMES."""
        return self._col("layer")

    @cached_property
    def name(self) -> np.ndarray:
        """uint32 index into ``strings``."""
        return self._col("name")

    @cached_property
    def cat(self) -> np.ndarray:
        """uint32 index into ``strings`` of the original category (0 = none)."""
        return self._col("cat")

    @cached_property
    def ts(self) -> np.ndarray:
        """int64 start, ns since the epoch (realtime)."""
        return self._col("ts")

    @cached_property
    def dur(self) -> np.ndarray:
        """int64 duration in ns."""
        return self._col("dur")

    @cached_property
    def pid(self) -> np.ndarray:
        return self._col("pid")

    @cached_property
    def tid(self) -> np.ndarray:
        """Thread id for CPU events, stream for GPU events."""
        return self._col("tid")

    @cached_property
    def device(self) -> np.ndarray:
        """GPU device for GPU events, -1 for CPU events."""
        return self._col("device")

    @cached_property
    def corr(self) -> np.ndarray:
        return self._col("corr")

    @cached_property
    def ext(self) -> np.ndarray:
        return self._col("ext")

    @cached_property
    def flags(self) -> np.ndarray:
        return self._col("flags")

    @cached_property
    def source(self) -> np.ndarray:
        return self._col("source")

    @cached_property
    def link(self) -> np.ndarray:
        """For GPU activities: index of the launching runtime/driver call, else -1."""
        return self._col("link")

    @cached_property
    def parent(self) -> np.ndarray:
        """Call-chain parent, -1 for roots."""
        return self._col("parent")

    @cached_property
    def step(self) -> np.ndarray:
        """Step index, -1 outside every step."""
        return self._col("step")

    @cached_property
    def symbol(self) -> np.ndarray:
        """uint32 index into ``symbols`` (normalized ``layer:name``)."""
        return self._col("symbol")

    @cached_property
    def strings(self) -> list[str]:
        return self._n.strings()

    @cached_property
    def symbols(self) -> list[str]:
        return self._n.symbols()

    @property
    def warnings(self) -> list[str]:
        w = self._n.warnings()
        return [*w, self._apart] if self._apart else w

    @cached_property
    def _apart(self) -> str | None:
        return _sources_apart(self)

    @property
    def sources(self) -> list[dict[str, Any]]:
        return self._n.sources()

    @property
    def device_properties(self) -> list[dict[str, Any]]:
        """The GPUs the capture's processes saw (Kineto's ``deviceProperties``: ``id``, ``name``,
        ``totalGlobalMem``, ``computeMajor``, ...), merged over its sources as the Chrome writer
        merges them: by integer ``id`` (the first source's entry wins), sorted by it, then the
        entries without one, once per distinct content. Empty when no source recorded them;
        entries that are not objects are skipped."""
        import json

        by_id: dict[int, dict[str, Any]] = {}
        other: dict[str, dict[str, Any]] = {}
        for src in self.sources:
            text = src.get("metadata", {}).get("deviceProperties")
            if not text:
                continue
            try:
                devs = json.loads(text)
            except ValueError:
                continue
            for d in devs if isinstance(devs, list) else []:
                if not isinstance(d, dict):
                    continue
                i = d.get("id")
                if isinstance(i, int) and not isinstance(i, bool):
                    by_id.setdefault(i, d)
                else:
                    other.setdefault(json.dumps(d, sort_keys=True), d)
        return [by_id[k] for k in sorted(by_id)] + list(other.values())

    @property
    def num_flows(self) -> int:
        return self._n.num_flows()

    @property
    def num_counters(self) -> int:
        return self._n.num_counters()

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def __len__(self) -> int:
        return len(self._n)

    def __repr__(self) -> str:
        return f"<teller.Trace {len(self)} events, {len(self.steps())} steps, {len(self.sources)} source(s)>"

    # -- per-event helpers --------------------------------------------------------------------
    def _index(self, i: int) -> int:
        """``i`` as an event index, negative ones from the end as for a list; an IndexError (a
        TypeError for what is no integer: 1.5 is not event 1) otherwise."""
        if isinstance(i, (bool, np.bool_)):
            raise TypeError(f"event indices are integers, got {type(i).__name__}")
        k = operator.index(i)
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"event index {k} is out of range (the trace has {n} events)")
        return k + n if k < 0 else k

    def name_of(self, i: int) -> str:
        return self.strings[int(self.name[i])]

    def symbol_of(self, i: int) -> str:
        return self.symbols[int(self.symbol[i])]

    def layer_name(self, i: int) -> str:
        return LAYER_NAMES[int(self.layer[i])]

    def args(self, i: int) -> dict[str, Any]:
        return self._n.args(self._index(i))

    def event(self, i: int) -> dict[str, Any]:
        """One event as a dict (for inspection; use the columns for bulk work)."""
        i = self._index(i)
        return {
            "index": i,
            "layer": self.layer_name(i),
            "name": self.name_of(i),
            "cat": self.strings[int(self.cat[i])],
            "symbol": self.symbol_of(i),
            "ts": int(self.ts[i]),
            "dur": int(self.dur[i]),
            "pid": int(self.pid[i]),
            "tid": int(self.tid[i]),
            "device": int(self.device[i]),
            "corr": int(self.corr[i]),
            "ext": int(self.ext[i]),
            "link": int(self.link[i]),
            "parent": int(self.parent[i]),
            "step": int(self.step[i]),
            "args": self.args(i),
        }

    def layer_mask(self, *layers: str) -> np.ndarray:
        bad = [x for x in layers if x not in LAYER_NAMES]
        if bad:
            raise ConfigError(f"unknown layer {bad[0]!r} (the layers: {', '.join(LAYER_NAMES)})")
        codes = [LAYER_NAMES.index(x) for x in layers]
        return np.isin(self.layer, codes)

    # -- structure ----------------------------------------------------------------------------
    def steps(self) -> list[Step]:
        return [
            Step(index=k, name=name, start_ns=s, end_ns=e, pid=p, tid=t, event=ev)
            for k, (ev, name, s, e, p, t, _src) in enumerate(self._n.steps())
        ]

    def step_events(self, step: int) -> np.ndarray:
        """Indices of the events of one step, in call-chain order."""
        return np.flatnonzero(self.step == step)

    def tree(self, step: int | None = None, *, pid: int | None = None, tid: int | None = None) -> CallTree:
        """The call-chain tree of one step (or of the whole trace), optionally one thread's part.
        ``step`` is a step index ``0 <= step < len(self.steps())`` (ConfigError otherwise)."""
        if step is not None:
            n = len(self._n.steps())
            if isinstance(step, bool) or not hasattr(step, "__index__"):
                raise ConfigError(f"step must be an integer step index, got {step!r}")
            step = operator.index(step)
            if not 0 <= step < n:
                raise ConfigError(
                    f"step {step} out of range: the trace has {n} step(s)" + (f" (0..{n - 1})" if n else "")
                )
        for name, v in (("pid", pid), ("tid", tid)):
            if v is not None:
                _int_arg(v, name, -(2**63), 2**63 - 1)
        mask = np.ones(len(self), dtype=bool) if step is None else (self.step == step)
        if pid is not None:
            mask &= self.pid == pid
        if tid is not None:
            mask &= self.tid == tid
        return CallTree(self, np.flatnonzero(mask))

    # -- output -------------------------------------------------------------------------------
    def to_chrome(self, path: PathLike, *, highlight: Sequence[int] | None = None) -> None:
        """Write a Chrome trace (gzip when ``path`` ends in .gz) that opens in Perfetto; ``highlight``:
        indices of events to mark (each in ``range(len(self))``, else :class:`teller.ConfigError`)."""
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"to_chrome takes an output path, got {type(path).__name__}")
        hl = None
        if highlight is not None:
            if isinstance(highlight, (str, bytes, dict)) or not isinstance(highlight, Iterable):
                raise ConfigError(
                    f"highlight must be a sequence of event indices, got {type(highlight).__name__}"
                )
            hl = []
            for k, x in enumerate(highlight):
                if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                    raise ConfigError(f"highlight[{k}] must be an event index (int), got {type(x).__name__}")
                if not 0 <= int(x) < len(self):
                    raise ConfigError(
                        f"highlight[{k}] = {int(x)} is not an event of this trace (0..{len(self) - 1})"
                    )
                hl.append(int(x))
        for f in (sys.stdout, sys.stderr):  # (`/dev/stdout`: what was printed before comes first)
            with contextlib.suppress(Exception):
                f.flush()
        self._n.to_chrome(_utf8_path(os.fspath(path)), hl)

    def summary(self, top: int = 10) -> dict[str, Any]:
        """Counts per layer and category, the ``top`` (>= 0) kernels, GPU busy/idle, steps, warnings."""
        s = self._n.summary(min(_int_arg(top, "top", 0), sys.maxsize))
        if self._apart and isinstance(s.get("warnings"), list):
            s["warnings"] = [*s["warnings"], self._apart]
        return s


def load(
    paths: PathLike | Sequence[PathLike],
    *,
    step_names: Sequence[str] | None = None,
    normalize: dict[str, Any] | None = None,
    warn: bool = True,
) -> Trace:
    """Load and align traces.

    ``paths``: a teller run directory, raw ``.tmsgpack`` files, Chrome/Kineto JSON (plain or .gz), or
    a list of them (several processes/ranks are merged onto one time base).
    ``step_names``: glob patterns of the ranges that delimit steps (first pattern with matches wins;
    one string is one pattern). Bad arguments raise :class:`teller.ConfigError`.
    ``normalize``: symbol normalization options (strip_namespaces, collapse_tiles, collapse_digits, max_len).
    Problems that do not prevent loading (a truncated raw file, unknown categories) are emitted as
    :class:`teller.TellerWarning` and kept in ``Trace.warnings``; the collector's info notes
    (``FILE: collector info: ...``) are only kept there.
    """
    plist = _path_list(paths)
    opts = {"step_names": step_patterns(step_names), "normalize": check_normalize(normalize)}
    try:
        native = _native.load(plist, opts["step_names"], opts["normalize"])
    except TraceFormatError as e:
        # (one of teller's own directories: its JSON files are not traces, and the error said so of
        # the first one; what the directory is, and where it goes, helps more)
        for d in plist:
            kind = _teller_directory(d)
            if kind is not None:
                raise TraceFormatError(f"{d}: {kind}", path=d) from None
        if not isinstance(e, EmptyTraceError):
            raise
        sample = _dataset_sample(e.path)
        if sample is None:
            raise
        raise EmptyTraceError(
            f"{e.path}: a dataset directory (one sample directory per trace), not a trace: give one "
            f"sample's trace, e.g. {sample} (tpe train takes the whole dataset directory)",
            path=e.path,
            detail=e.detail,
        ) from None
    tr = Trace(native)
    # (how it was loaded: a tokenizer trained on it records the same, to load what it encodes alike)
    tr.load_options = opts
    if warn:
        for w in split_collector_notes(tr.warnings)[1]:
            warnings.warn(w, TellerWarning, stacklevel=2)
    return tr


# Sources further apart in time than this (and than the longest of them lasts) are not processes or
# ranks of one capture: a directory of unrelated profiles read as one (it gave a 5-year "span")
_APART_NS = 600 * 10**9


def _sources_apart(tr: Trace) -> str | None:
    """What to say where a trace's sources fall into groups far apart in time, or None."""
    srcs = tr.sources
    if len(srcs) < 2 or len(tr) == 0:
        return None
    sid = tr.source.astype(np.int64)
    lo = np.full(len(srcs), np.iinfo(np.int64).max)
    hi = np.full(len(srcs), np.iinfo(np.int64).min)
    np.minimum.at(lo, sid, tr.ts)
    np.maximum.at(hi, sid, tr.end)
    have = lo <= hi  # (a source with no events has no time)
    if have.sum() < 2:
        return None
    order = np.argsort(lo[have])
    a, b = lo[have][order], hi[have][order]
    longest = int((b - a).max())
    reach = np.maximum.accumulate(b)
    gaps = a[1:] - reach[:-1]
    big = gaps > max(_APART_NS, longest)
    if not big.any():
        return None
    k = int(np.argmax(gaps))
    idx = np.flatnonzero(have)[order]
    before = int(idx[int(np.argmax(b[: k + 1]))])  # (the source whose end the gap follows)
    if all(s.get("kind") == "raw" for s in srcs) and len({os.path.dirname(s["path"]) for s in srcs}) == 1:
        return None  # (the processes of one collected run: one capture, however far apart they ran)
    return (
        f"{int(have.sum())} sources merged onto one timeline fall into {int(big.sum()) + 1} groups far "
        f"apart in time ({_human_span(int(gaps[k]))} between the end of {srcs[before]['path']} and the "
        f"start of {srcs[int(idx[k + 1])]['path']}): they are read as the processes or ranks of one "
        "capture; load each capture on its own to read it as one"
    )


def _human_span(ns: int) -> str:
    s = ns / 1e9
    for unit, n in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.1f} {unit}"
    return f"{s:.1f} s"


def _from_snapshot(data: bytes, load_options: dict[str, Any]) -> Trace:
    """A trace from ``Trace.__reduce__``'s bytes (made by the same snapshot version of teller)."""
    tr = Trace(_native.from_snapshot(data))
    tr.load_options = dict(load_options)
    return tr


def _teller_directory(path: str) -> str | None:
    """What one of teller's own output directories is (a training run, tokenized shards, a TPE
    tokenizer, a directory of collected runs), or None."""
    p = Path(path)
    if not p.is_dir():
        return None

    def fmt(name: str) -> Any:
        try:
            d = json.loads((p / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return d.get("format") if isinstance(d, dict) else None

    if (p / "model.safetensors").is_file() or str(fmt("config.json") or "").startswith("teller-"):
        return "a run directory of teller train, not a capture (give it as --checkpoint)"
    if fmt("manifest.json") == "teller-shards":
        return "tokenized shards of teller tokenize, not a capture"
    if fmt("tokenizer.json") == "teller-tpe":
        return "a TPE tokenizer directory of teller tpe train, not a capture"
    if fmt("manifest.json") == "teller-dataset":
        return None  # (a dataset's samples may hold run.json too, `dataset collect-cpu`: said below)
    try:
        runs = [c for c in p.iterdir() if c.is_dir() and (c / "run.json").is_file()]
    except OSError:
        return None
    if runs:
        return (
            f"a directory of {len(runs)} collected run(s) of teller collect, not one capture: give one "
            f"run, e.g. {sorted(runs)[0]}"
        )
    return None


def _dataset_sample(path: str | None) -> str | None:
    """For a dataset directory (sample directories holding trace.json), its first sample's trace."""
    if not path or not os.path.isdir(path):
        return None
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    for n in names:
        for t in ("trace.json", "trace.json.gz"):
            if os.path.isfile(os.path.join(path, n, t)):
                return os.path.join(path, n, t)
    return None


_COLLECTOR_INFO = ": collector info: "  # how the raw reader words a collector's info-level DIAG


def split_collector_notes(messages: Sequence[str]) -> tuple[list[str], list[str]]:
    """``Trace.warnings`` split into the collector's info-level notes (libcupti path, CUPTI version,
    record counts), each as ``FILE: message``, and the real warnings."""
    notes = [w.replace(_COLLECTOR_INFO, ": ", 1) for w in messages if _COLLECTOR_INFO in w]
    return notes, [w for w in messages if _COLLECTOR_INFO not in w]


def symbol(layer: str, name: str, normalize: dict[str, Any] | None = None) -> str:
    """The normalized symbol ``layer:canonical`` of an event name."""
    for arg, v in (("layer", layer), ("name", name)):
        if not isinstance(v, str):
            raise ConfigError(f"symbol: {arg} must be a string, got {type(v).__name__}")
    return _native.symbol(layer, name, check_normalize(normalize))


# -- argument checks (a ConfigError naming the argument, not a TypeError/OverflowError from Rust) ----


def _int_arg(v: Any, name: str, lo: int, hi: int | None = None) -> int:
    """``v`` as an int (numpy's too, not a bool) in ``lo..hi``, else a ConfigError naming ``name``."""
    try:
        ok = not isinstance(v, bool) and lo <= operator.index(v) and (hi is None or operator.index(v) <= hi)
    except TypeError:
        ok = False
    if not ok:
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ConfigError(f"{name} must be an integer {rng}, got {v!r}")
    return operator.index(v)


def _path_list(paths: Any) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [_utf8_path(os.fspath(paths))]
    if isinstance(paths, (bytes, bytearray, dict)) or not isinstance(paths, Iterable):
        raise ConfigError(
            f"paths must be a path or a list of paths (str or os.PathLike), got {type(paths).__name__}"
        )
    out = []
    for k, p in enumerate(paths):
        if not isinstance(p, (str, os.PathLike)):
            raise ConfigError(f"paths[{k}] must be a path (str or os.PathLike), got {type(p).__name__}")
        out.append(os.fspath(p))
    return [_utf8_path(p) for p in out]


def _utf8_path(p: Any) -> str:
    """``p`` as a str the Rust core can take: a path whose bytes are not UTF-8 (Python holds them as
    surrogate escapes) is refused with its name, not a UnicodeEncodeError from the binding."""
    if isinstance(p, bytes):
        raise ConfigError(f"paths must be str or os.PathLike, got bytes ({p!r})")
    if p == "":
        raise ConfigError("the path is empty")
    try:
        p.encode("utf-8")
    except UnicodeEncodeError:
        shown = p.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise TellerIOError(
            f"{shown}: the path is not valid UTF-8: teller reads UTF-8 paths (rename the file)", path=shown
        ) from None
    return p


def step_patterns(step_names: Any, name: str = "step_names") -> list[str] | None:
    """Step-name patterns as a list: None stays None, one string is one pattern (not a list of
    characters); every pattern must be a non-empty string (ConfigError)."""
    if step_names is None:
        return None
    if isinstance(step_names, str):
        step_names = [step_names]
    elif isinstance(step_names, (bytes, bytearray, dict)) or not isinstance(step_names, Iterable):
        raise ConfigError(f"{name} must be a glob pattern or a list of them, got {type(step_names).__name__}")
    out = list(step_names)
    if not out:
        raise ConfigError(f"{name} must not be empty")
    for k, s in enumerate(out):
        if not isinstance(s, str):
            raise ConfigError(f"{name}[{k}] must be a string (a glob pattern), got {type(s).__name__}")
        if not s.strip():
            raise ConfigError(f"{name}[{k}] is an empty pattern")
    return out


_NORMALIZE_BOOLS = ("strip_namespaces", "collapse_tiles", "collapse_digits")


def check_normalize(normalize: Any) -> dict[str, Any] | None:
    """Normalization options checked (types and ranges): None or a dict of the known options."""
    if normalize is None:
        return None
    if not isinstance(normalize, dict):
        raise ConfigError(
            f"normalize must be a dict of normalization options or None, got {type(normalize).__name__}"
        )
    for k, v in normalize.items():
        if k in _NORMALIZE_BOOLS:
            if not isinstance(v, (bool, np.bool_)):
                raise ConfigError(f"normalization option {k!r} must be true or false, got {v!r}")
        elif k == "max_len":
            _int_arg(v, "normalization option 'max_len'", 1, 2**63 - 1)
        elif not isinstance(k, str):
            raise ConfigError(f"normalization option names are strings, got {k!r}")
        else:  # (said here, not first by the native loader: a saved tokenizer's settings are checked too)
            known = ", ".join((*_NORMALIZE_BOOLS, "max_len"))
            raise ConfigError(f"unknown normalization option {k!r} (known: {known})")
    return {
        k: bool(v) if k in _NORMALIZE_BOOLS else operator.index(v) if k == "max_len" else v
        for k, v in normalize.items()
    }


__all__ = ["DEFAULT_STEP_PATTERNS", "LAYER_NAMES", "CallTree", "Step", "Trace", "load", "symbol"]
