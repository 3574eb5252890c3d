#!/usr/bin/env bash
# One prepared GPU-machine check of the collector, run from the repository root:
#   bash tests/gpu/device_check.sh OUT_DIR [WHEEL_DIR]
# WHEEL_DIR (optional) holds wheels to install first with --no-deps into a private --target (a teller
# wheel built for that machine's Python, the `nvtx` package), for machines whose Python has torch and
# transformers but not teller. Every step runs under its own time limit and failures do not stop the
# next one; the exit status is the number of checks that failed (the collector's runs, the shim's GPU
# check, the pytest run); the console goes to OUT_DIR/console.txt and each capture to OUT_DIR/NAME.tgz.
#   1. environment: GPU, torch, CUDA; `teller doctor`; `teller shim build` (wheels, then CUDA_HOME)
#   2. tests/gpu/llm_decode.py (a Llama serving loop): plain; under `teller collect`; under
#      torch.profiler (the peer capture of the same workload); under `teller collect` with a
#      noisy neighbour (another process copying HBM), a real hbm_contention-like fault; with --torch-nvtx;
#      then plain and collected twice more, interleaved, for the cost (timings only)
#   3. cupti_shim/tests/gpu_check.sh: the record walker under the real libcupti, a smoke capture
#   4. tests/gpu (pytest): a transformers generate collected, kernels linked to calls and NVTX ranges
# Each capture is packed as soon as it is written, so a run stopped at its limit returns what it made.
# The summaries are made afterwards, off the GPU machine.
set -uo pipefail
OUT="${1:?usage: device_check.sh OUT_DIR [WHEEL_DIR]}"
WHL="${2:-}"
mkdir -p "$OUT"
CAP="$(mktemp -d)/captures"
mkdir -p "$CAP"
main() {
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY="${PYTHON:-python3}"
step() { echo; echo "=== $(date +%T) $*"; }
FAILED=()  # the checks that failed: the script's exit status is their count (0: all passed)
failed() { FAILED+=("$1"); echo "=== FAILED: $1"; }
pack() { [ -d "$CAP/$1" ] && tar -C "$CAP" -czf "$OUT/$1.tgz" "$1"; }  # one archive per capture, written at once
if [ -n "$WHL" ]; then
  step "install wheels from $WHL"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/teller-site "$WHL"/*.whl ||
    for w in "$WHL"/*.whl; do "$PY" -m zipfile -e "$w" /tmp/teller-site; done  # a wheel is a zip
  export PYTHONPATH="/tmp/teller-site${PYTHONPATH:+:$PYTHONPATH}"
fi
TELLER=("$PY" -m teller)

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
timeout 60 "${TELLER[@]}" doctor || failed "teller doctor"
CUDA_ARGS=()
if ! timeout 120 "${TELLER[@]}" shim build; then
  for h in "${CUDA_HOME:-}" /usr/local/cuda; do
    [ -n "$h" ] && [ -d "$h" ] || continue
    step "shim build --cuda-home $h"
    if timeout 120 "${TELLER[@]}" shim build --cuda-home "$h"; then CUDA_ARGS=(--cuda-home "$h"); break; fi
  done
  [ ${#CUDA_ARGS[@]} -gt 0 ] || failed "teller shim build"
fi

W="tests/gpu/llm_decode.py"
step "llm_decode plain"
mkdir -p "$CAP/plain" "$CAP/kineto"
timeout 120 "$PY" "$W" | tee "$CAP/plain/plain.txt"
pack plain
step "llm_decode under teller collect"
timeout 150 "${TELLER[@]}" collect ${CUDA_ARGS[@]+"${CUDA_ARGS[@]}"} --trace-dir "$CAP/teller" --nvtx-json transformers -- "$PY" "$W" ||
  failed "llm_decode under teller collect"
pack teller
step "llm_decode under torch.profiler (the peer)"
timeout 150 "$PY" "$W" --reps 1 --kineto "$CAP/kineto/kineto.json" | tee "$CAP/kineto/kineto-run.txt"
gzip -f "$CAP/kineto/kineto.json" 2>/dev/null
pack kineto
step "llm_decode under teller collect, with a noisy neighbour copying HBM in another process"
"$PY" - <<'EOF' &
import torch
a = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
print("neighbour: copying 4 GiB buffers", flush=True)
while True:  # killed when the capture beside it ends
    b.copy_(a)
    torch.cuda.synchronize()
EOF
HOG=$!
sleep 8
timeout 150 "${TELLER[@]}" collect ${CUDA_ARGS[@]+"${CUDA_ARGS[@]}"} --trace-dir "$CAP/teller-hog" --nvtx-json transformers -- "$PY" "$W" ||
  failed "llm_decode under teller collect beside a neighbour"
kill "$HOG" 2>/dev/null; wait "$HOG" 2>/dev/null
pack teller-hog

step "llm_decode under teller collect --torch-nvtx (torch's own per-operator ranges), one rep"
timeout 120 "${TELLER[@]}" collect ${CUDA_ARGS[@]+"${CUDA_ARGS[@]}"} --trace-dir "$CAP/teller-torchnvtx" --torch-nvtx -- "$PY" "$W" --reps 1 ||
  failed "llm_decode under teller collect --torch-nvtx"
pack teller-torchnvtx
step "overhead: llm_decode --reps 10, plain and under teller collect, interleaved (timings only)"
for i in 1 2; do
  timeout 90 "$PY" "$W" --reps 10 | tail -1 | sed 's/^/plain: /'
  timeout 120 "${TELLER[@]}" collect ${CUDA_ARGS[@]+"${CUDA_ARGS[@]}"} --trace-dir /tmp/overhead --nvtx-json transformers \
    -- "$PY" "$W" --reps 10 2>/dev/null | tail -1 | sed 's/^/collect: /'
done

step "cupti_shim/tests/gpu_check.sh"
inc=$("$PY" -c "import sys; from teller.cuda import find_cuda; print(':'.join(find_cuda(sys.argv[1] or None).include_dirs))" "${CUDA_ARGS[1]:-}")
TELLER_CUDA_INCLUDE="$inc" timeout 200 bash cupti_shim/tests/gpu_check.sh /tmp/shim-gpu "$PY" || failed "cupti_shim/tests/gpu_check.sh"
cp -r /tmp/shim-gpu/gpu-work "$CAP/shim-gpu-work" 2>/dev/null; pack shim-gpu-work

step "pytest tests/gpu"
timeout 180 "$PY" -m pytest -q -p no:cacheprovider -x tests/gpu -k cuda_inference -o addopts="" -rA || failed "pytest tests/gpu"


ls -la "$OUT"
echo "=== ${#FAILED[@]} check(s) failed${FAILED[*]:+: ${FAILED[*]}}"
return "${#FAILED[@]}"
}
# (a pipe rather than exec > >(tee ...): the script ends only after tee has written everything)
main 2>&1 | tee "$OUT/console.txt"
