"""Finding CUDA, CUPTI and NVTX headers and libraries without assuming a toolkit.

Search order: an explicit ``cuda_home`` (``--cuda-home``), ``$CUDA_HOME`` / ``$CUDA_PATH``, the NVIDIA
PyPI wheels installed next to torch (``nvidia/cu13``, ``nvidia/cuda_cupti``, ...), then
``/usr/local/cuda``. Each item reports where it was found, so ``teller doctor`` can say so.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class CudaInfo:
    roots: list[str] = field(default_factory=list)
    cuda_h: str | None = None
    cupti_h: str | None = None
    nvtx_h: str | None = None
    libcupti: str | None = None
    cupti_version: int | None = None  # from cupti_version.h (CUPTI_API_VERSION)
    # what the search set aside and why ($CUDA_HOME naming no toolkit): said by doctor and shim build
    notes: list[str] = field(default_factory=list)

    @property
    def include_dirs(self) -> list[str]:
        dirs: list[str] = []
        for h, up in ((self.cuda_h, 1), (self.cupti_h, 1), (self.nvtx_h, 2)):
            if h:
                d = str(Path(h).parents[up - 1])
                if d not in dirs:
                    dirs.append(d)
        return dirs

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["include_dirs"] = self.include_dirs
        return d


def _site_dirs() -> list[Path]:
    out = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and Path(p) not in out:
            out.append(Path(p))
    for p in sys.path:
        if p.endswith("site-packages") and Path(p) not in out:
            out.append(Path(p))
    return out


_INCLUDE = ("include", "extras/CUPTI/include", "targets/x86_64-linux/include")


def candidate_roots(
    cuda_home: str | os.PathLike[str] | None = None, notes: list[str] | None = None
) -> list[Path]:
    roots: list[Path] = []
    if cuda_home:
        roots.append(Path(cuda_home))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        v = os.environ.get(var)
        if not v:
            continue
        # a toolkit root has its cuda.h; one without would lend only some headers, to be mixed with
        # another root's of another version (the shim then fails to compile far from the cause)
        if not Path(v).is_dir():
            why = "no such directory"
        elif not any((Path(v) / d / "cuda.h").is_file() for d in _INCLUDE):
            why = "no include/cuda.h under it (not a CUDA toolkit's root)"
        else:
            roots.append(Path(v))
            continue
        if notes is not None:
            notes.append(f"${var}={v}: {why}; ignored")
    for site in _site_dirs():
        nv = site / "nvidia"
        if nv.is_dir():
            # CUDA 13 wheels share nvidia/cu13; CUDA 12 wheels use one folder per component.
            for sub in ("cu13", "cu12", "cuda_cupti", "cuda_runtime", "nvtx", "cuda_nvcc", "cuda_crt"):
                if (nv / sub).is_dir():
                    roots.append(nv / sub)
    roots.append(Path("/usr/local/cuda"))
    seen: list[Path] = []
    for r in roots:
        if r not in seen:
            seen.append(r)
    return seen


def _first(roots: list[Path], rels: list[str]) -> str | None:
    for r in roots:
        for rel in rels:
            p = r / rel
            if p.exists():
                return str(p)
    return None


def _glob_first(roots: list[Path], dirs: list[str], pattern: str) -> str | None:
    for r in roots:
        for d in dirs:
            base = r / d
            if base.is_dir():
                hits = sorted(base.glob(pattern))
                if hits:
                    return str(hits[0])
    return None


def find_cuda(cuda_home: str | os.PathLike[str] | None = None) -> CudaInfo:
    """Locate headers and libcupti. With an explicit ``cuda_home``, only that root is searched."""
    notes: list[str] = []
    roots = [Path(cuda_home)] if cuda_home else candidate_roots(notes=notes)
    info = CudaInfo(roots=[str(r) for r in roots if r.exists()], notes=notes)
    inc = list(_INCLUDE)
    info.cuda_h = _first(roots, [f"{d}/cuda.h" for d in inc])
    info.cupti_h = _first(roots, [f"{d}/cupti.h" for d in inc])
    info.nvtx_h = _first(roots, [f"{d}/nvtx3/nvToolsExt.h" for d in inc])
    info.libcupti = _glob_first(
        roots, ["lib", "lib64", "extras/CUPTI/lib64", "targets/x86_64-linux/lib"], "libcupti.so*"
    )
    if info.cupti_h:
        vh = Path(info.cupti_h).with_name("cupti_version.h")
        try:
            for line in vh.read_text(errors="replace").splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "#define" and parts[1] == "CUPTI_API_VERSION":
                    info.cupti_version = int(parts[2])
                    break
        except (OSError, ValueError):
            pass
    return info
