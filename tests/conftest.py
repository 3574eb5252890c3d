from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
FIXTURES = sorted(p.name for p in TRACES.glob("*.kineto.json.gz"))


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    return TRACES


@pytest.fixture(scope="session")
def fixture_json():
    """Parsed JSON of each fixture (cached), from the standard json module."""
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            with gzip.open(TRACES / name, "rt") as f:
                cache[name] = json.load(f)
        return cache[name]

    return get


def _caps(field: str) -> int:
    """A capability set of this process (``CapEff``, ``CapBnd``, ...) from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    return 0


_DAC = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
_SETPCAP = 1 << 8


def _no_dac_override() -> None:
    """(preexec) Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set and clear the
    ambient set: the program exec'd next, even as root, gets file permissions checked like anyone's."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL (fails harmlessly where absent)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_permission_checked(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code args...`` in a process whose file accesses obey permission bits: as root (CI
    runs as root) without the capabilities that override them, so a read-only directory refuses
    writes there too; a process without them runs it as it is. Skips where they are held but
    cannot be dropped (no CAP_SETPCAP, or held in the inheritable set: a locked-down container)."""
    drop = bool(_caps("CapEff") & _DAC)
    if drop and (not _caps("CapEff") & _SETPCAP or _caps("CapInh") & _DAC):
        pytest.skip("this process overrides file permissions and cannot drop that (no CAP_SETPCAP)")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_no_dac_override if drop else None,
    )


def needs_shim() -> pytest.MarkDecorator:
    """A skip mark for tests that inject the collector shim, where none is built; under
    ``TELLER_REQUIRE_SHIM=1`` (``make test``, which builds it first) a missing shim is an error
    instead: a broken build or CUDA header search must not pass as skipped tests."""
    from teller.collect import shim

    if shim.locate() is not None:
        return pytest.mark.skipif(False, reason="the shim is built")
    if os.environ.get("TELLER_REQUIRE_SHIM") == "1":
        raise RuntimeError("TELLER_REQUIRE_SHIM=1 but no collector shim was found (make build builds it)")
    return pytest.mark.skipif(True, reason="the shim is not built (make build builds it)")
