"""Building and locating the collector shim (``cupti_shim/``, C).

``teller shim build`` compiles ``libteller_shim.so`` into a cache keyed by the shim's sources, the
headers it builds against (CUPTI version) and the compiler, so a rebuild happens only when one of
them changes. ``teller collect --so LIB`` uses a prebuilt library instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from teller.cuda import find_cuda
from teller.errors import CudaNotFoundError, TellerError, TellerFileNotFoundError

LIB_NAME = "libteller_shim.so"


class ShimBuildError(TellerError, RuntimeError):
    """The shim failed to compile."""


def source_dir() -> Path:
    """The shim sources: ``$TELLER_SHIM_SRC``, else the nearest ``cupti_shim/`` above this file: the
    checkout's in a source tree, the copy a wheel installs next to ``teller/`` in site-packages
    (pyproject.toml, ``tool.maturin.include``)."""
    env = os.environ.get("TELLER_SHIM_SRC")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for up in here.parents:
        cand = up / "cupti_shim"
        if (cand / "build.sh").is_file():
            return cand
    raise TellerFileNotFoundError(
        "cupti_shim sources not found (set TELLER_SHIM_SRC to the cupti_shim/ directory of a teller checkout)"
    )


def cache_root() -> Path:
    # (absolute: the library's path goes into the program's environment, which may change directory
    # before its first NVTX or CUDA call loads it)
    return Path(os.environ.get("TELLER_CACHE_DIR") or Path.home() / ".cache" / "teller").absolute() / "shim"


def _cc_version() -> str:
    cc = os.environ.get("CC", "cc")
    try:
        return subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def build_key(src: Path, include_dirs: list[str], cupti_version: int | None) -> str:
    h = hashlib.sha256()
    for f in sorted(src.rglob("*")):
        if (
            f.is_file()
            and f.suffix in (".c", ".h", ".sh", ".txt")
            and "tests" not in f.relative_to(src).parts
        ):
            h.update(str(f.relative_to(src)).encode())
            h.update(f.read_bytes())
    h.update(json.dumps([include_dirs, cupti_version, _cc_version()]).encode())
    return h.hexdigest()[:16]


# the headers cupti_shim/build.sh compiles against, and the wheel that ships each
SHIM_HEADERS = (
    ("nvtx3/nvToolsExt.h", "nvidia-nvtx"),
    ("cupti.h", "nvidia-cuda-cupti"),
    ("cuda.h", "nvidia-cuda-runtime"),
    ("crt/host_defines.h", "nvidia-cuda-crt"),
)


def check_cuda_home(cuda_home: str | os.PathLike[str] | None) -> None:
    """Refuse a --cuda-home that is no directory (with --so too, where no build looks at it)."""
    if cuda_home and not Path(cuda_home).is_dir():
        what = "a file, not a directory" if Path(cuda_home).exists() else "no such directory"
        raise CudaNotFoundError(f"--cuda-home {cuda_home}: {what} (a CUDA toolkit's root)")


def _plan(cuda_home: str | os.PathLike[str] | None) -> tuple[Path, list[str], Any, str]:
    src = source_dir()
    check_cuda_home(cuda_home)
    info = find_cuda(cuda_home)
    if not info.nvtx_h and cuda_home:
        raise CudaNotFoundError(
            f"--cuda-home {cuda_home}: no NVTX headers (nvtx3/nvToolsExt.h) in its include directories"
        )
    if not info.nvtx_h:
        raise CudaNotFoundError(
            "NVTX headers (nvtx3/nvToolsExt.h) not found: install the nvidia-nvtx wheel or pass --cuda-home"
            + (f" (searched {', '.join(info.roots)})" if info.roots else "")
        )
    include_dirs = info.include_dirs
    # every header build.sh needs, all named at once (build.sh stops at the first, and its advice to
    # set TELLER_CUDA_INCLUDE is for running it by hand: teller passes the directories it found)
    missing = [
        (h, pkg)
        for h, pkg in SHIM_HEADERS
        if not any(os.path.isfile(os.path.join(d, h)) for d in include_dirs)
    ]
    if missing:
        names = ", ".join(h for h, _ in missing)
        if cuda_home:
            raise CudaNotFoundError(
                f"--cuda-home {cuda_home}: {names} not found in its include directories "
                f"({', '.join(include_dirs) or 'none'}; a toolkit has cupti.h under extras/CUPTI/include)"
            )
        raise CudaNotFoundError(
            f"CUDA headers not found: {names}: install "
            + ", ".join(dict.fromkeys(pkg for _, pkg in missing))
            + " (pip) or pass --cuda-home"
            + (f" (searched {', '.join(include_dirs)})" if include_dirs else "")
        )
    return src, include_dirs, info, build_key(src, include_dirs, info.cupti_version)


def _compile(src: Path, include_dirs: list[str], info: Any, key: str) -> tuple[Any, Path]:
    """Build into a fresh temporary directory of the cache; (the build's process result, the directory)."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}.tmp-", dir=cache_root()))
        # (mkdtemp makes it 0700: the cache keeps the permissions a plain mkdir gives, so that a
        # cache shared by several users, TELLER_CACHE_DIR, stays readable to them)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
    except OSError as e:
        raise ShimBuildError(f"{cache_root()}: cannot write the shim cache: {e.strerror or e}") from None
    env = dict(os.environ, TELLER_CUDA_INCLUDE=":".join(include_dirs), PYTHON=sys.executable)
    p = subprocess.run(["bash", str(src / "build.sh"), str(tmp)], env=env, capture_output=True, text=True)
    if p.returncode != 0 or not (tmp / LIB_NAME).is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise ShimBuildError(
            f"building the shim failed (exit {p.returncode}):\n{p.stdout}{p.stderr}".rstrip()
        )
    meta = {
        "key": key,
        "source": str(src),
        "include_dirs": include_dirs,
        "cupti_header_version": info.cupti_version,
        "cupti_found": bool(info.cupti_h),
        "libcupti": info.libcupti,
        "compiler": _cc_version(),
    }
    try:
        (tmp / "build.json").write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ShimBuildError(f"{tmp / 'build.json'}: cannot write it: {e.strerror or e}") from None
    return p, tmp


def build(
    cuda_home: str | os.PathLike[str] | None = None, *, force: bool = False, quiet: bool = True
) -> Path:
    """Build (or reuse) the shim; returns the path of the library."""
    src, include_dirs, info, key = _plan(cuda_home)
    if info.notes:  # ($CUDA_HOME set aside: said once, where the headers are chosen for a build)
        import warnings

        from teller.errors import TellerWarning

        for n in info.notes:
            warnings.warn(n, TellerWarning, stacklevel=2)
    out_dir = cache_root() / key
    lib = out_dir / LIB_NAME
    if lib.is_file() and not force:
        return lib
    try:
        cache_root().mkdir(parents=True, exist_ok=True)
        lock = open(cache_root() / f"{key}.lock", "a")  # noqa: SIM115 (held until the build is in place)
    except OSError as e:
        raise ShimBuildError(f"{cache_root()}: cannot write the shim cache: {e.strerror or e}") from None
    # One build per key at a time (`srun -n 8 teller collect ...` on a fresh cache): the others wait
    # for it and take its library; a temporary directory of its own per builder (not named by pid
    # alone: two nodes sharing an NFS home may have the same pid)
    with lock:
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # (said: a wait of seconds would otherwise look like a hang)
                print(
                    f"teller: waiting for another process's build of the shim ({lock.name})", file=sys.stderr
                )
                fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as e:  # (no locks on this file system: ENOLCK on some NFS mounts)
            raise ShimBuildError(f"{lock.name}: cannot lock it: {e.strerror or e}") from None
        if lib.is_file() and not force:
            return lib
        p, tmp = _compile(src, include_dirs, info, key)
        try:
            if out_dir.exists():
                # (moved aside, then removed: the path never names half a directory, and a program
                # that has loaded the old library keeps its mapping)
                old = Path(tempfile.mkdtemp(prefix=f"{key}.old-", dir=cache_root()))
                os.replace(out_dir, old / "lib")
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, out_dir)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ShimBuildError(
                f"{out_dir}: cannot put the built shim in place: {e.strerror or e}"
            ) from None
    if not quiet:
        print(p.stdout, end="")
    return lib


def locate(cuda_home: str | os.PathLike[str] | None = None) -> Path | None:
    """The cached library for the current sources and headers, if built."""
    try:
        _src, _inc, _info, key = _plan(cuda_home)
    except TellerError:
        return None
    lib = cache_root() / key / LIB_NAME
    return lib if lib.is_file() else None


def status(cuda_home: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What ``teller doctor`` shows about the shim."""
    try:
        src, _inc, info, key = _plan(cuda_home)
    except TellerError as e:
        return {"built": False, "reason": str(e)}
    lib = cache_root() / key / LIB_NAME
    out: dict[str, Any] = {
        "built": lib.is_file(),
        "path": str(lib),
        "key": key,
        "source": str(src),
        "cupti_header_version": info.cupti_version,
        "libcupti": info.libcupti,
    }
    if not lib.is_file():
        out["reason"] = "not built for the current sources/headers (run `teller shim build`)"
    else:
        try:
            out.update(
                {k: v for k, v in json.loads((lib.parent / "build.json").read_text()).items() if k not in out}
            )
        except (OSError, ValueError):
            pass
    return out
