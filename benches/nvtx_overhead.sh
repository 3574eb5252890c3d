#!/usr/bin/env bash
# NVTX push/pop overhead: no tool vs teller's shim (BEGIN/END mode and SPAN mode).
# Usage: benches/nvtx_overhead.sh [BUILD_DIR] [RUNS] [PAIRS]
# Prints the median ns per push/pop pair over RUNS runs of PAIRS pairs (default 7 x 10M).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="${1:-$ROOT/build/cupti_shim}"
RUNS="${2:-7}"
PAIRS="${3:-10000000}"
"$ROOT/cupti_shim/build.sh" "$B" >/dev/null
B="$(cd "$B" && pwd)"
cc -std=c11 -O2 -Wall -Wextra -Werror $(tr "\n" " " < "$B/include_flags") "$ROOT/benches/nvtx_overhead.c" -o "$B/nvtx_overhead" -pthread -ldl
TD="$(mktemp -d "${TMPDIR:-/tmp}/teller-bench.XXXXXX")"
trap 'rm -rf "$TD"' EXIT

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
measure() { # label env...
  local label="$1"; shift
  local xs=()
  for _ in $(seq "$RUNS"); do
    rm -rf "$TD/trace"
    xs+=("$(env "$@" TELLER_TRACE_DIR="$TD/trace" "$B/nvtx_overhead" "$PAIRS")")
  done
  local m; m=$(printf '%s\n' "${xs[@]}" | median)
  printf '%-28s %8s ns/pair   (runs: %s)\n' "$label" "$m" "${xs[*]}"
}
echo "NVTX push/pop, $PAIRS pairs, median of $RUNS runs ($(nproc) cores, $(uname -r))"
measure "no tool"
measure "teller shim (BEGIN/END)" NVTX_INJECTION64_PATH="$B/libteller_shim.so"
measure "teller shim (SPAN mode)" NVTX_INJECTION64_PATH="$B/libteller_shim.so" TELLER_NVTX_MODE=span
measure "shim BEGIN/END, clock_gettime" NVTX_INJECTION64_PATH="$B/libteller_shim.so" TELLER_CLOCK=gettime

# Python `nvtx` package (domain push/pop with a cached attribute object), if PYTHON has it
PY="${PYTHON:-python3}"
if "$PY" -c "import nvtx" 2>/dev/null; then
  measure_py() {
    local label="$1"; shift
    local xs=()
    for _ in $(seq "$RUNS"); do
      rm -rf "$TD/trace"
      xs+=("$(env "$@" TELLER_TRACE_DIR="$TD/trace" "$PY" "$ROOT/benches/nvtx_overhead_py.py" 1000000)")
    done
    printf '%-28s %8s ns/pair   (runs: %s)\n' "$label" "$(printf '%s\n' "${xs[@]}" | median)" "${xs[*]}"
  }
  echo "Python nvtx push_range/pop_range, 1M pairs, median of $RUNS runs"
  measure_py "python: no tool"
  measure_py "python: teller shim" NVTX_INJECTION64_PATH="$B/libteller_shim.so"
else
  echo "(Python nvtx benchmark skipped: $PY has no nvtx package)"
fi
