#!/usr/bin/env bash
# Build libteller_shim.so (and, with --tests, the C test programs) with the C compiler only: no cmake.
# Usage: cupti_shim/build.sh [BUILD_DIR] [--tests]
# Headers: $TELLER_CUDA_INCLUDE (colon-separated) or every <nvidia>/cu13/include directory that
# $PYTHON (default: python3) can see (PyPI wheels nvidia-cuda-cupti, nvidia-cuda-runtime,
# nvidia-cuda-crt, nvidia-nvtx).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="${1:-$HERE/../build/cupti_shim}"
[ "${1:-}" = "--tests" ] && BUILD="$HERE/../build/cupti_shim"
TESTS=0
for a in "$@"; do [ "$a" = "--tests" ] && TESTS=1; done
CC="${CC:-cc}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$BUILD"

INC=()
if [ -n "${TELLER_CUDA_INCLUDE:-}" ]; then
  IFS=: read -r -a dirs <<< "$TELLER_CUDA_INCLUDE"
else
  mapfile -t dirs < <("$PYTHON" - <<'PY'
import os
try:
    import nvidia
    for p in nvidia.__path__:
        d = os.path.join(p, "cu13", "include")
        if os.path.isdir(d):
            print(d)
except ImportError:
    pass
PY
)
fi
for d in "${dirs[@]}"; do [ -n "$d" ] && INC+=("-I$d"); done

check_header() {
  local h="$1" pkg="$2"
  for d in "${dirs[@]}"; do [ -f "$d/$h" ] && return 0; done
  echo "build.sh: $h not found in: ${dirs[*]:-<none>} (pip install $pkg, or set TELLER_CUDA_INCLUDE)" >&2
  exit 1
}
check_header nvtx3/nvToolsExt.h nvidia-nvtx
check_header cupti.h nvidia-cuda-cupti
check_header cuda.h nvidia-cuda-runtime
check_header crt/host_defines.h nvidia-cuda-crt

printf '%s\n' "${INC[@]}" > "$BUILD/include_flags"

CFLAGS=(-std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -pthread ${EXTRA_CFLAGS:-})
SRC=(tl_clock tl_writer tl_nvtx tl_cupti_convert tl_cupti)
OBJS=()
for s in "${SRC[@]}"; do
  "$CC" "${CFLAGS[@]}" -fvisibility=hidden "${INC[@]}" -c "$HERE/src/$s.c" -o "$BUILD/$s.o"
  OBJS+=("$BUILD/$s.o")
done
"$CC" -shared ${EXTRA_CFLAGS:-} -o "$BUILD/libteller_shim.so" "${OBJS[@]}" -pthread -ldl -Wl,--no-undefined -Wl,-z,defs
echo "built $BUILD/libteller_shim.so"

if [ "$TESTS" = 1 ]; then
  T="$HERE/tests"
  "$CC" "${CFLAGS[@]}" "${INC[@]}" "$T/test_nvtx.c" -o "$BUILD/test_nvtx" -pthread -ldl
  "$CC" "${CFLAGS[@]}" -fvisibility=hidden "${INC[@]}" -I"$HERE/src" "$T/test_cupti_convert.c" \
      "$HERE/src/tl_cupti_convert.c" "$HERE/src/tl_writer.c" "$HERE/src/tl_clock.c" -o "$BUILD/test_cupti_convert" -pthread -ldl
  "$CC" "${CFLAGS[@]}" -shared "${INC[@]}" "$T/nvtx_user_lib.c" -o "$BUILD/libnvtx_user.so" -ldl
  "$CC" "${CFLAGS[@]}" -DTL_CLOCK_TESTING -I"$HERE/src" "$T/test_clock.c" "$HERE/src/tl_clock.c" -o "$BUILD/test_clock"
  "$CC" "${CFLAGS[@]}" "${INC[@]}" "$T/test_inject.c" -o "$BUILD/test_inject" -pthread -ldl
  "$CC" "${CFLAGS[@]}" -shared "${INC[@]}" "$T/fake_cupti.c" -o "$BUILD/libfake_cupti.so" -pthread
  mkdir -p "$BUILD/fake_cuda" "$BUILD/fake_cu13/lib"
  # a wheel-like layout: libcudart.so.13 and libcupti.so.13 side by side, neither on the search path
  "$CC" "${CFLAGS[@]}" -shared -Wl,-soname,libcudart.so.13 "${INC[@]}" "$T/fake_cuda.c" -o "$BUILD/fake_cu13/lib/libcudart.so.13" -ldl
  "$CC" "${CFLAGS[@]}" -shared -Wl,-soname,libcupti.so.13 "${INC[@]}" "$T/fake_cupti.c" -o "$BUILD/fake_cu13/lib/libcupti.so.13" -pthread
  "$CC" "${CFLAGS[@]}" -shared -Wl,-soname,libcuda.so.1 "${INC[@]}" "$T/fake_cuda.c" -o "$BUILD/fake_cuda/libcuda.so.1" -ldl
  echo "built tests in $BUILD"
fi
