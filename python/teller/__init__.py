"""teller: non-intrusive, cross-layer root-cause analysis of LLM inference."""

from __future__ import annotations

from teller._native import __version__, build_profile
from teller.errors import (
    ConfigError,
    CudaNotFoundError,
    DatasetError,
    DirectoryLockedError,
    EmptyTraceError,
    TellerError,
    TellerFileNotFoundError,
    TellerIOError,
    TellerIsADirectoryError,
    TellerNotADirectoryError,
    TellerPermissionError,
    TellerWarning,
    TokenizerError,
    TraceFormatError,
    TrainingDivergedError,
)

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
    "__version__",
    "build_profile",
]

from teller import compare, findings, tpe, trace  # noqa: E402  (re-exported as teller.tpe, teller.trace, ...)

__all__ += ["compare", "findings", "tpe", "trace"]
