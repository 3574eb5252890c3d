#!/usr/bin/env bash
# GPU-machine check of the CUPTI path (needs a CUDA device and a CUDA build of torch in PYTHON's env).
# Usage: cupti_shim/tests/gpu_check.sh [BUILD_DIR] [PYTHON]   -> "N passed, N failed"
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
B="${1:-$HERE/../../build/cupti_shim}"
PY="${2:-python3}"
PYTHON="$PY" "$HERE/../build.sh" "$B" --tests || { echo "0 passed, 1 failed"; exit 1; }
B="$(cd "$B" && pwd)"
W="$B/gpu-work"; rm -rf "$W"; mkdir -p "$W"
PASS=0; FAIL=0
run() { # name extra-env...
  local name="$1"; shift
  local d="$W/$name"; mkdir -p "$d"
  if env "$@" TELLER_TRACE_DIR="$d" CUDA_INJECTION64_PATH="$B/libteller_shim.so" NVTX_INJECTION64_PATH="$B/libteller_shim.so" \
       timeout 300 "$PY" "$HERE/gpu_smoke.py" > "$d/facts.json" 2> "$d/stderr.txt" \
     && "$PY" "$HERE/check_raw.py" gpu "$d" "$d/facts.json"; then
    echo "PASS $name"; PASS=$((PASS + 1))
  else
    echo "FAIL $name"; tail -20 "$d/stderr.txt"; FAIL=$((FAIL + 1))
  fi
}
# the conversion test, walked by the real libcupti this time (it needs a driver)
CUPTI_LIB="$("$PY" -c "
import os, nvidia
for p in nvidia.__path__:
    f = os.path.join(p, 'cu13', 'lib', 'libcupti.so.13')
    if os.path.exists(f): print(f); break")"
d="$W/convert"; mkdir -p "$d"
if TELLER_CUPTI_PATH="$CUPTI_LIB" TELLER_TRACE_DIR="$d" "$B/test_cupti_convert" > "$d/facts.json" 2> "$d/stderr.txt" \
   && grep -q "walker: libcupti" "$d/stderr.txt" && "$PY" "$HERE/check_raw.py" convert "$d" "$d/facts.json"; then
  echo "PASS cupti-convert-libcupti-walk"; PASS=$((PASS + 1))
else
  echo "FAIL cupti-convert-libcupti-walk"; cat "$d/stderr.txt"; FAIL=$((FAIL + 1))
fi
run gpu-default
run gpu-gettime TELLER_CLOCK=gettime
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
