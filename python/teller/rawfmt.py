"""A Python writer for teller's raw MessagePack event stream (``docs/trace-format.md``).

Used by tests and by the simulator; the C collector writes the same records. Example::

    with RawWriter("out/raw/teller-host-42-0.tmsgpack", pid=42) as w:
        r = w.begin("annotation", "forward", tid=42, ts=1000)
        w.span("runtime", "cudaLaunchKernel", tid=42, start=1100, end=1150, corr=7)
        w.gpu("kernel", "void gemm<128>(float*)", device=0, stream=7, start=1300, end=1900, corr=7)
        w.end(r, tid=42, ts=2000)
"""

from __future__ import annotations

import os
import socket
import time
from types import TracebackType
from typing import Any, BinaryIO

import msgpack

MAGIC = "teller-trace"
FORMAT_VERSION = 1

HEADER, STRING, SPAN, GPU, BEGIN, END, MARK, THREAD_NAME, COUNTER, DROPPED, CLOCK_SYNC, DIAG = range(1, 13)

LAYERS = {
    "other": 0,
    "annotation": 1,
    "host_op": 2,
    "python": 3,
    "runtime": 4,
    "driver": 5,
    "kernel": 6,
    "memcpy": 7,
    "memset": 8,
    "sync": 9,
    "marker": 10,
    "gpu_annotation": 11,
}

TOPOLOGY_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
)


def topology_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Only the variables that describe topology or teller itself: traces get shared, secrets must not."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k in TOPOLOGY_ENV or k.startswith("TELLER_")}


def _layer(layer: str | int) -> int:
    if isinstance(layer, int):
        return layer
    try:
        return LAYERS[layer]
    except KeyError:
        raise ValueError(f"unknown layer {layer!r}; known: {', '.join(LAYERS)}") from None


class RawWriter:
    """Writes one raw file. Strings are interned per file (written once as STRING records)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pid: int | None = None,
        ppid: int | None = None,
        host: str | None = None,
        argv: list[str] | None = None,
        clock_sync: tuple[int, int] | None = None,
        start_ns: int | None = None,
        env: dict[str, str] | None = None,
        producer: str | None = None,
        extra_meta: dict[str, Any] | None = None,
    ) -> None:
        from teller import __version__

        self.path = os.fspath(path)
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._packer = msgpack.Packer(use_bin_type=True)
        self._strings: dict[str, int] = {}
        self._next_range = 1
        if clock_sync is None:
            clock_sync = (time.monotonic_ns(), time.time_ns())
        meta: dict[str, Any] = {
            "pid": os.getpid() if pid is None else pid,
            "ppid": os.getppid() if ppid is None else ppid,
            "host": socket.gethostname() if host is None else host,
            "argv": [] if argv is None else list(argv),
            "clock": "CLOCK_MONOTONIC",
            "clock_sync": [int(clock_sync[0]), int(clock_sync[1])],
            "start_ns": int(clock_sync[0]) if start_ns is None else int(start_ns),
            "env": topology_env() if env is None else dict(env),
            "producer": producer or f"teller-python {__version__}",
        }
        if extra_meta:
            meta.update(extra_meta)
        self.meta = meta
        self._write([HEADER, MAGIC, FORMAT_VERSION, meta])

    # -- low level ------------------------------------------------------------------------------
    def _write(self, rec: list[Any]) -> None:
        self._f.write(self._packer.pack(rec))

    def record(self, rec: list[Any]) -> None:
        """Write an arbitrary record (tests use this for malformed input)."""
        self._write(rec)

    def sid(self, s: str) -> int:
        """The string id of ``s``, writing a STRING record the first time."""
        i = self._strings.get(s)
        if i is None:
            i = len(self._strings) + 1
            self._strings[s] = i
            self._write([STRING, i, s])
        return i

    # -- records --------------------------------------------------------------------------------
    def span(
        self,
        layer: str | int,
        name: str,
        *,
        tid: int,
        start: int,
        end: int,
        corr: int = 0,
        ext: int = 0,
        args: dict[str, Any] | None = None,
    ) -> None:
        rec: list[Any] = [SPAN, _layer(layer), self.sid(name), tid, start, end, corr, ext]
        if args:
            rec.append(args)
        self._write(rec)

    def gpu(
        self,
        layer: str | int,
        name: str,
        *,
        device: int,
        stream: int,
        start: int,
        end: int,
        corr: int = 0,
        args: dict[str, Any] | None = None,
    ) -> None:
        rec: list[Any] = [GPU, _layer(layer), self.sid(name), device, stream, start, end, corr]
        if args:
            rec.append(args)
        self._write(rec)

    def begin(
        self,
        layer: str | int,
        name: str,
        *,
        tid: int,
        ts: int,
        domain: str | None = None,
        args: dict[str, Any] | None = None,
    ) -> int:
        rid = self._next_range
        self._next_range += 1
        rec: list[Any] = [BEGIN, rid, _layer(layer), self.sid(name), tid, ts]
        if domain is not None or args:
            rec.append(self.sid(domain) if domain is not None else 0)
        if args:
            rec.append(args)
        self._write(rec)
        return rid

    def end(self, range_id: int, *, tid: int, ts: int) -> None:
        self._write([END, range_id, tid, ts])

    def mark(
        self, layer: str | int, name: str, *, tid: int, ts: int, args: dict[str, Any] | None = None
    ) -> None:
        rec: list[Any] = [MARK, _layer(layer), self.sid(name), tid, ts]
        if args:
            rec.append(args)
        self._write(rec)

    def thread_name(self, tid: int, name: str) -> None:
        self._write([THREAD_NAME, tid, self.sid(name)])

    def counter(self, name: str, *, ts: int, value: float) -> None:
        self._write([COUNTER, self.sid(name), ts, value])

    def dropped(self, count: int, reason: str) -> None:
        self._write([DROPPED, count, self.sid(reason)])

    def clock_sync(self, mono_ns: int, realtime_ns: int) -> None:
        self._write([CLOCK_SYNC, mono_ns, realtime_ns])

    def diag(self, ts: int, severity: int, message: str) -> None:
        self._write([DIAG, ts, severity, self.sid(message)])

    # -- lifecycle ------------------------------------------------------------------------------
    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> RawWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_records(path: str | os.PathLike[str]) -> list[list[Any]]:
    """Decode every complete record of a raw file with the msgpack package, skipping zero padding.
    A slow, independent reader used as a test oracle for the Rust reader."""
    with open(path, "rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    out: list[list[Any]] = []
    while True:
        try:
            rec = unpacker.unpack()
        except msgpack.OutOfData:
            break
        if rec == 0:  # zero padding byte
            continue
        out.append(rec)
    return out
