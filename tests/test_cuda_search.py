"""Where teller finds CUDA, CUPTI and NVTX (``teller.cuda.find_cuda``): on fake installations laid
out as a toolkit, the NVIDIA wheels and a toolkit without CUPTI."""

from __future__ import annotations

from pathlib import Path

import pytest
from teller import cuda


def _touch(root: Path, *rels: str) -> Path:
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(
            "#define CUPTI_API_VERSION 130202\n" if rel.endswith("cupti_version.h") else ""
        )
    return root


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    site = tmp_path / "site"
    cu = _touch(
        site / "nvidia" / "cu13",
        "include/cuda.h",
        "include/cupti.h",
        "include/cupti_version.h",
        "include/nvtx3/nvToolsExt.h",
        "lib/libcupti.so.13",
    )
    monkeypatch.setattr(cuda, "_site_dirs", lambda: [site])
    monkeypatch.setattr(cuda, "SYSTEM_ROOT", tmp_path / "no-system-cuda")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    return cu


def test_the_wheels_alone(wheels) -> None:
    info = cuda.find_cuda()
    assert info.cuda_h == str(wheels / "include/cuda.h") and info.cupti_h == str(wheels / "include/cupti.h")
    assert info.libcupti == str(wheels / "lib/libcupti.so.13") and info.cupti_version == 130202
    assert info.include_dirs == [str(wheels / "include")] and info.notes == []


def test_a_toolkit_without_cupti_is_not_mixed_with_the_wheels(wheels, tmp_path, monkeypatch) -> None:
    # a distribution's toolkit: cuda.h, NVTX, its own libcupti-less lib64; no CUPTI headers
    tk = _touch(tmp_path / "tk", "include/cuda.h", "include/nvtx3/nvToolsExt.h", "lib64/libcudart.so")
    monkeypatch.setenv("CUDA_HOME", str(tk))
    info = cuda.find_cuda()
    # every CUDA/CUPTI header and the library from one release: the wheels'
    assert info.cuda_h == str(wheels / "include/cuda.h") and info.cupti_h == str(wheels / "include/cupti.h")
    assert info.libcupti == str(wheels / "lib/libcupti.so.13")
    assert info.nvtx_h == str(wheels / "include/nvtx3/nvToolsExt.h")
    assert len(info.notes) == 1
    assert info.notes[0].startswith(f"$CUDA_HOME={tk}: has cuda.h but no cupti.h")
    assert "using nvidia/cu13 in" in info.notes[0]


def test_a_complete_toolkit_comes_first(wheels, tmp_path, monkeypatch) -> None:
    # CUPTI under extras/, NVTX absent: CUDA and CUPTI from the toolkit, NVTX (header-only) from the wheels
    tk = _touch(
        tmp_path / "tk",
        "include/cuda.h",
        "extras/CUPTI/include/cupti.h",
        "extras/CUPTI/include/cupti_version.h",
        "extras/CUPTI/lib64/libcupti.so.12",
    )
    monkeypatch.setenv("CUDA_PATH", str(tk))
    info = cuda.find_cuda()
    assert info.cuda_h == str(tk / "include/cuda.h")
    assert info.cupti_h == str(tk / "extras/CUPTI/include/cupti.h")
    assert info.libcupti == str(tk / "extras/CUPTI/lib64/libcupti.so.12")
    assert info.nvtx_h == str(wheels / "include/nvtx3/nvToolsExt.h") and info.notes == []
    assert info.include_dirs == [
        str(tk / "include"),
        str(tk / "extras/CUPTI/include"),
        str(wheels / "include"),
    ]


def test_an_explicit_cuda_home_is_searched_alone(wheels, tmp_path) -> None:
    tk = _touch(tmp_path / "tk", "include/cuda.h")
    info = cuda.find_cuda(tk)
    assert info.cuda_h == str(tk / "include/cuda.h")
    assert info.cupti_h is None and info.libcupti is None and info.nvtx_h is None and info.notes == []


def test_nothing_complete_reports_what_there_is(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    cupti = _touch(site / "nvidia" / "cuda_cupti", "include/cupti.h")
    monkeypatch.setattr(cuda, "_site_dirs", lambda: [site])
    monkeypatch.setattr(cuda, "SYSTEM_ROOT", tmp_path / "no-system-cuda")
    tk = _touch(tmp_path / "tk", "include/cuda.h")
    monkeypatch.setenv("CUDA_HOME", str(tk))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    info = cuda.find_cuda()
    # no installation has both: doctor shows each header where it is and says so; the shim build
    # names the gap
    assert info.cuda_h == str(tk / "include/cuda.h") and info.cupti_h == str(cupti / "include/cupti.h")
    assert len(info.notes) == 1 and info.notes[0].startswith("no installation has both cuda.h and cupti.h")


def test_two_releases_in_one_site_are_not_mixed(wheels, tmp_path) -> None:
    # the same site holds CUDA 12's per-component wheels beside nvidia/cu13: cu13 complete, first
    site = tmp_path / "site" / "nvidia"
    _touch(site / "cuda_cupti", "include/cupti.h", "lib/libcupti.so.12")
    _touch(site / "cuda_runtime", "include/cuda.h")
    info = cuda.find_cuda()
    assert info.cuda_h == str(wheels / "include/cuda.h") and info.cupti_h == str(wheels / "include/cupti.h")
    assert info.libcupti == str(wheels / "lib/libcupti.so.13")
    # without cu13's CUPTI, the per-component wheels are one complete installation: both from them
    (wheels / "include/cupti.h").unlink()
    info = cuda.find_cuda()
    assert info.cuda_h == str(site / "cuda_runtime/include/cuda.h")
    assert info.cupti_h == str(site / "cuda_cupti/include/cupti.h")
    assert info.libcupti == str(site / "cuda_cupti/lib/libcupti.so.12")
    assert "nvidia/cu13" in info.notes[0] and "has cuda.h but no cupti.h" in info.notes[0]


def test_a_complete_installation_without_libcupti_lends_none(wheels, tmp_path, monkeypatch) -> None:
    (wheels / "lib/libcupti.so.13").unlink()
    other = _touch(tmp_path / "other", "include/cuda.h", "lib64/libcupti.so.11")
    monkeypatch.setattr(cuda, "SYSTEM_ROOT", other)
    info = cuda.find_cuda()
    assert info.cupti_h == str(wheels / "include/cupti.h") and info.libcupti is None
    assert info.notes == [f"no libcupti.so beside {info.cupti_h}: the collector loads the one on the library "
                          "path (or $TELLER_CUPTI_PATH)"]  # fmt: skip
