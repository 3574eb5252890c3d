"""The exceptions teller raises.

Every error that crosses the Rust/Python boundary is a :class:`TellerError`, and each subclass also
subclasses the built-in a caller would naturally catch (``ValueError`` for bad data,
``FileNotFoundError`` for a missing path), in the manner of pydantic-core's error mapping.
The Rust binding looks these classes up by name, so they are the single source of truth.
"""

from __future__ import annotations

import errno as _errno
import os as _os
from typing import Any


class TellerError(Exception):
    """Base class of every teller error.

    Attributes (``None`` where not applicable): ``path`` (the file), ``offset`` (byte offset in the
    decompressed stream), ``index`` (event/record index), ``detail`` (what is wrong).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        index: int | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.index = index
        self.detail = detail


class TraceFormatError(TellerError, ValueError):
    """A trace file is malformed: bad JSON/MessagePack/gzip, wrong field types, unknown phases."""


class EmptyTraceError(TraceFormatError):
    """A trace file (or a set of inputs) holds no events."""


class TellerIOError(TellerError, OSError):
    """An I/O error (permissions, a directory where a file was expected, a missing file).

    Given the operating system's ``errno``, the error is created as the subclass that also subclasses
    the matching built-in, as ``OSError(errno, ...)`` itself does: :class:`TellerFileNotFoundError`
    (``FileNotFoundError``), :class:`TellerPermissionError` (``PermissionError``),
    :class:`TellerIsADirectoryError`, :class:`TellerNotADirectoryError`. ``errno``, ``strerror``
    and ``filename`` (the ``path``) are set; ``str()`` is teller's message (naming the file), not
    ``[Errno N] ...``."""

    def __new__(cls, message: str = "", *args: object, errno: int | None = None, **kwargs: object):
        if cls is TellerIOError and errno in _IO_BY_ERRNO:
            cls = _IO_BY_ERRNO[errno]
        return super().__new__(cls, message)

    def __init__(self, message: str, *, errno: int | None = None, **where: str | int | None) -> None:
        super().__init__(message, **where)  # type: ignore[arg-type]  (path, offset, index, detail)
        self.errno = errno
        self.strerror = _os.strerror(errno) if errno else None
        self.filename = self.path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        # (pickled across processes: errno and strerror are OSError slots, not in __dict__)
        slots = {"errno": self.errno, "strerror": self.strerror, "filename": self.filename}
        return (type(self), self.args, {**self.__dict__, **slots})


class TellerFileNotFoundError(TellerIOError, FileNotFoundError):
    """An input path does not exist (ENOENT)."""

    def __init__(self, message: str, *, errno: int | None = _errno.ENOENT, **where: str | int | None) -> None:
        super().__init__(message, errno=errno, **where)


class TellerPermissionError(TellerIOError, PermissionError):
    """Permission denied (EACCES, EPERM)."""


class TellerIsADirectoryError(TellerIOError, IsADirectoryError):
    """A directory where a file was expected (EISDIR)."""


class TellerNotADirectoryError(TellerIOError, NotADirectoryError):
    """A file where a directory was expected, or in a path's directories (ENOTDIR)."""


_IO_BY_ERRNO: dict[int, type[TellerIOError]] = {
    _errno.ENOENT: TellerFileNotFoundError,
    _errno.EACCES: TellerPermissionError,
    _errno.EPERM: TellerPermissionError,
    _errno.EISDIR: TellerIsADirectoryError,
    _errno.ENOTDIR: TellerNotADirectoryError,
}


class DirectoryLockedError(TellerIOError, BlockingIOError):
    """An output directory another teller process is writing (its lock, ``.teller.lock``, is held)."""


class ConfigError(TellerError, ValueError):
    """A configuration value (step names, normalization options, CLI arguments) is invalid."""


class CudaNotFoundError(TellerError, RuntimeError):
    """CUDA/CUPTI headers or libraries needed for an operation were not found."""


class TokenizerError(TellerError, ValueError):
    """Bad tokenizer input: ids out of range, bad segment offsets, a malformed tokenizer file."""


class DatasetError(TellerError, ValueError):
    """A dataset or tokenized-shards file is malformed: a manifest, a sample's annotation or files, a
    shard's arrays (missing, truncated, inconsistent), or a run directory holding other data."""


class TrainingDivergedError(TellerError, FloatingPointError):
    """Training met a loss that is not a finite number (NaN or infinity): the run diverged. The epochs
    already saved are kept."""


class TellerWarning(UserWarning):
    """Recoverable problems in input data (truncated raw files, orphan flows, unknown categories)."""


__all__ = [
    "ConfigError",
    "CudaNotFoundError",
    "DatasetError",
    "DirectoryLockedError",
    "EmptyTraceError",
    "TellerError",
    "TellerFileNotFoundError",
    "TellerIOError",
    "TellerIsADirectoryError",
    "TellerNotADirectoryError",
    "TellerPermissionError",
    "TellerWarning",
    "TokenizerError",
    "TraceFormatError",
    "TrainingDivergedError",
]
