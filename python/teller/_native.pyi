"""Type stubs for the compiled extension ``teller._native`` (Rust, PyO3). Use ``teller.trace``."""

from typing import Any, Literal, NoReturn, final, overload

import numpy as np
import numpy.typing as npt

__version__: str
build_profile: str  # "release" or "debug"
LAYER_NAMES: tuple[str, ...]
NORMALIZATION_VERSION: int
DEFAULT_STEP_PATTERNS: tuple[str, ...]

@final
class NativeTrace:
    """Made by ``load`` or ``from_snapshot`` only: the class has no constructor (``NativeTrace()`` raises
    TypeError)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> NoReturn: ...
    def __len__(self) -> int: ...
    @overload
    def column(self, name: Literal["layer", "flags"]) -> npt.NDArray[np.uint8]: ...
    @overload
    def column(self, name: Literal["name", "cat", "symbol"]) -> npt.NDArray[np.uint32]: ...
    @overload
    def column(self, name: Literal["ts", "dur", "pid", "tid", "link", "parent"]) -> npt.NDArray[np.int64]: ...
    @overload
    def column(self, name: Literal["device", "step"]) -> npt.NDArray[np.int32]: ...
    @overload
    def column(self, name: Literal["corr", "ext"]) -> npt.NDArray[np.uint64]: ...
    @overload
    def column(self, name: Literal["source"]) -> npt.NDArray[np.uint16]: ...
    @overload
    def column(self, name: str) -> np.ndarray:
        """Read-only zero-copy view of a column: layer, name, cat, ts, dur, pid, tid, device, corr, ext,
        flags, source, link, parent, step, symbol (ValueError for any other name)."""
    def strings(self) -> list[str]: ...
    def symbols(self) -> list[str]: ...
    def warnings(self) -> list[str]: ...
    def steps(self) -> list[tuple[int, str, int, int, int, int, int]]: ...
    def sources(self) -> list[dict[str, Any]]: ...
    def args(self, i: int) -> dict[str, Any]: ...
    def process_names(self) -> list[tuple[int, str]]: ...
    def thread_names(self) -> list[tuple[int, int, str]]: ...
    def id_labels(self) -> list[tuple[int, str]]: ...
    def num_flows(self) -> int: ...
    def num_counters(self) -> int: ...
    def sequences(
        self, close_layers: list[str] | None = None, skip_instants: bool = False
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-step symbol sequences in call-chain order: (names, ids u32, segment starts i64, steps u32,
        event i64 (-1 for <close>), start_ns i64, dur_ns i64)."""
    def snapshot(self) -> bytes: ...
    def to_chrome(self, path: str, highlight: list[int] | None = None) -> None: ...
    def summary(self, top: int = 10) -> dict[str, Any]: ...

def load(
    paths: list[str], step_names: list[str] | None = None, normalize: dict[str, Any] | None = None
) -> NativeTrace:
    """Load and align traces; raises teller.errors.TellerError subclasses. Releases the GIL."""

def from_snapshot(data: bytes) -> NativeTrace: ...
def symbol(layer: str, name: str, normalize: dict[str, Any] | None = None) -> str: ...
def is_collective(names: list[str]) -> list[bool]:
    """Per kernel name, whether the GPU breakdown counts it as communication."""

class NativeTpe:
    def __init__(self, base_size: int, merges: list[tuple[int, int]]) -> None: ...
    @property
    def base_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    def merges(self) -> list[tuple[int, int]]: ...
    def token_lens(self) -> np.ndarray: ...
    def encode_ids(self, ids: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens u32, token_offsets i64 [n+1], segment_starts i64); parallel, GIL released."""
    def decode(self, tokens: np.ndarray) -> np.ndarray: ...
    def features(
        self,
        ids: np.ndarray,
        dur_ns: np.ndarray,
        start_ns: np.ndarray,
        token_offsets: np.ndarray,
        segment_starts: np.ndarray,
        count: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray,
    ) -> np.ndarray:
        """n_tokens x 5 float32 timing features."""

def tpe_train(
    ids: np.ndarray,
    starts: np.ndarray,
    base_size: int,
    num_merges: int,
    min_frequency: int = 2,
    max_token_events: int | None = None,
    progress: Any | None = None,
) -> tuple[list[tuple[int, int]], list[int]]:
    """Learn merges (ties: smallest pair). progress(done, total) may raise to cancel. GIL released."""

def tpe_symbol_stats(ids: np.ndarray, dur_ns: np.ndarray, base_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def tpe_synth_corpus(
    n_events: int, seed: int = 42, n_symbols: int = 1500, step_events: int = 2000
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]: ...
def symbol_rows(
    sid: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    pid: np.ndarray,
    x: np.ndarray,
    ex: np.ndarray,
    gap: np.ndarray,
    early: np.ndarray,
    w: np.ndarray,
    tbin: np.ndarray,
    step: np.ndarray,
    coll: np.ndarray,
    sord: np.ndarray | None,
    xrank: np.ndarray,
    host: np.ndarray,
    gpu: np.ndarray,
    host_shift: float,
    gpu_shift: float,
    ref_resid: np.ndarray | None,
    fam: np.ndarray | None,
    fam_stats: np.ndarray | None,
    log1p_count: np.ndarray,
    baseline_frac: float,
    by_position: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """One summary row per distinct ``sid`` (ascending): ``(ids int64, rows float64 [S * 25])``, column 6
    left 0 (the caller's)."""
    ...

class NativeLogVocab:
    """A log tokenizer's vocabulary, ready to encode lines (``teller.data.tokenize.LogTokenizer``)."""

    def __init__(self, vocab: list[str]) -> None: ...
    def encode(
        self, texts: list[str], stderr: list[bool]
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.float64], list[tuple[int, int]]]:
        """``(ids uint32, line uint32, num float64, deferred)``; ``deferred``: the non-ASCII lines,
        ``(line, token index after its stream token)``, for the caller to split. ValueError unless
        ``texts`` and ``stderr`` have the same length."""
        ...

def log_token_counts(texts: list[str]) -> tuple[list[tuple[str, int]], list[int]]:
    """Token string counts over the ASCII lines, and the indices of the non-ASCII lines (not counted)."""
    ...
