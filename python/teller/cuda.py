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


SYSTEM_ROOT = Path("/usr/local/cuda")  # searched last
_INCLUDE = ("include", "extras/CUPTI/include", "targets/x86_64-linux/include")


def _root_groups(notes: list[str] | None = None) -> list[tuple[str, list[Path]]]:
    """The places a CUDA installation may be, in search order, each a (name, roots) group whose
    headers belong together: ``$CUDA_HOME``, ``$CUDA_PATH``, the NVIDIA wheels of one site-packages
    (one root per component wheel: they are one release), ``/usr/local/cuda``."""
    groups: list[tuple[str, list[Path]]] = []
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
            groups.append((f"${var}={v}", [Path(v)]))
            continue
        if notes is not None:
            notes.append(f"${var}={v}: {why}; ignored")
    for site in _site_dirs():
        nv = site / "nvidia"
        if nv.is_dir():
            # CUDA 13 wheels share nvidia/cu13 (one release), CUDA 12's nvidia/cu12; older CUDA 12
            # wheels use one folder per component, which belong together: three installations, not
            # one (a site holding two releases must not lend headers from both)
            for subs in (
                ("cu13",),
                ("cu12",),
                ("cuda_cupti", "cuda_runtime", "nvtx", "cuda_nvcc", "cuda_crt"),
            ):
                rs = [nv / sub for sub in subs if (nv / sub).is_dir()]
                if rs:
                    label = f"nvidia/{subs[0]}" if len(subs) == 1 else "the per-component nvidia wheels"
                    groups.append((f"{label} in {site}", rs))
    groups.append((str(SYSTEM_ROOT), [SYSTEM_ROOT]))
    return groups


def candidate_roots(
    cuda_home: str | os.PathLike[str] | None = None, notes: list[str] | None = None
) -> list[Path]:
    roots: list[Path] = [Path(cuda_home)] if cuda_home else []
    for _name, rs in _root_groups(notes):
        roots += rs
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


_LIB = ["lib", "lib64", "extras/CUPTI/lib64", "targets/x86_64-linux/lib"]


def find_cuda(cuda_home: str | os.PathLike[str] | None = None) -> CudaInfo:
    """Locate headers and libcupti. With an explicit ``cuda_home``, only that root is searched.

    Otherwise ``cuda.h``, ``cupti.h`` and ``libcupti`` come from one group of :func:`_root_groups`,
    the first that has both headers: CUPTI's activity records change between releases, so its
    headers, the CUDA headers they include and the library the shim loads must be one release. A
    toolkit without CUPTI (a distribution's package, a conda environment without ``cuda-cupti``)
    is passed over with a note rather than mixed with the wheels' CUPTI. NVTX (header-only, its
    versions side by side) is taken from that group when it has it, else from the first that does."""
    notes: list[str] = []
    inc = list(_INCLUDE)
    if cuda_home:
        groups = [(f"--cuda-home {cuda_home}", [Path(cuda_home)])]
    else:
        groups = _root_groups(notes)
    roots = candidate_roots(cuda_home, notes=None) if not cuda_home else [Path(cuda_home)]
    info = CudaInfo(roots=[str(r) for r in roots if r.exists()], notes=notes)
    chosen: list[Path] | None = None
    partial: list[str] = []
    for name, rs in groups:
        has_cuda = _first(rs, [f"{d}/cuda.h" for d in inc])
        if has_cuda and _first(rs, [f"{d}/cupti.h" for d in inc]):
            chosen = rs
            notes += [
                f"{n}: has cuda.h but no cupti.h (CUPTI not installed with it: extras/CUPTI/include); "
                f"its CUDA headers are not mixed with another installation's CUPTI: using {name}"
                for n in partial
            ]
            break
        if has_cuda:
            partial.append(name)
    if (
        chosen is None
        and len(groups) > 1
        and any(_first(rs, [f"{d}/cupti.h" for d in inc]) for _, rs in groups)
    ):
        # (doctor shows what there is; a shim build then fails naming the missing header)
        notes.append(
            "no installation has both cuda.h and cupti.h: the headers found come from different places "
            "(install the CUDA toolkit with CUPTI, or the nvidia-cuda-cupti and nvidia-cuda-runtime wheels)"
        )
    search = chosen if chosen is not None else roots  # (none complete: report what there is)
    info.cuda_h = _first(search, [f"{d}/cuda.h" for d in inc])
    info.cupti_h = _first(search, [f"{d}/cupti.h" for d in inc])
    info.libcupti = _glob_first(search, _LIB, "libcupti.so*")
    if info.libcupti is None and chosen is not None:
        # (not another installation's: its activity records would not be this cupti.h's)
        notes.append(
            f"no libcupti.so beside {info.cupti_h}: the collector loads the one on the library path "
            "(or $TELLER_CUPTI_PATH)"
        )
    elif info.libcupti is None:
        info.libcupti = _glob_first(roots, _LIB, "libcupti.so*")
    info.nvtx_h = _first(search, [f"{d}/nvtx3/nvToolsExt.h" for d in inc]) or _first(
        roots, [f"{d}/nvtx3/nvToolsExt.h" for d in inc]
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
