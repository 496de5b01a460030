#!/usr/bin/env bash
# One-shot GPU job for the engine (issues 2 and 5), about 3 minutes on an H200:
#   1. the GPU-marked engine tests (CUDA graph replay equals eager; reload under captured graphs;
#      overlapped decode equals reading every step first;
#      the Triton norm/RoPE/attention kernels on the device),
#   2. bench_engine.py decode: Qwen3-1.7B-shaped random model, batch 1, bf16 and FP8 block (one run
#      per backend in LINEAR_BACKENDS), CUDA graphs vs --enforce-eager, with a per-step breakdown
#      (host ms, GPU ms, kernels per step, graph captures while timing). Targets: FP8+graphs >= 1.2x
#      bf16+graphs, >= 3x FP8 eager. Also batch 32 with graphs (information: batched decode).
# Each step has its own time limit and a failing step does not stop the others. Full logs and
# results go to $OUT; a short summary is printed at the end, the decode table last. The job exits
# 1 when a step failed or ran out of time (named last, on stderr), else 0.
#
#   OUT=/tmp/out QUANTGATE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_engine.sh   # FP8: marlin, triton
#   OUT=/tmp/out QUANTGATE_COMMIT=... LINEAR_BACKENDS=marlin bash benchmarks/gpu_engine.sh
#
# QUANTGATE_COMMIT names the tree measured (the device's .git may be stale; without it the
# results say unverified:<sha>); the summary and bench_engine_decode.json record it. Works
# without installing the package (no pip there): see gpu_env.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_engine}
mkdir -p "$OUT"
PY=${PYTHON:-python}
BACKENDS=${LINEAR_BACKENDS:-${LINEAR_BACKEND:-marlin triton}}

source benchmarks/gpu_env.sh

{ nvidia-smi; $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/environment.txt" 2>&1

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "(stopped after the ${limit}s limit)" >> "$OUT/$name.log"
  printf '%-14s exit %-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.txt"
  [ $rc -eq 0 ] || FAILED+=("$name (exit $rc)")
}
FAILED=()

: > "$OUT/steps.txt"
step engine_tests 110 $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py \
  tests/engine/test_triton_ops.py --junitxml "$OUT/engine_tests.xml"
# shellcheck disable=SC2086  # one argument per backend
step bench_decode 180 $PY benchmarks/bench_engine.py decode --shape qwen3-1.7b --variants bf16 fp8-block \
  --linear-backend $BACKENDS --batch 1 32 --repeats 2 --eager-tokens 32 --out "$OUT"

echo "===================== gpu_engine summary ($(date -u +%FT%TZ), commit $QUANTGATE_COMMIT)"
echo "== steps"; cat "$OUT/steps.txt"
echo "== engine tests"; tail -n 8 "$OUT/engine_tests.log"
# The decode table and ratios; the tuned GEMM shapes that follow them stay in bench_decode.log
# (printing the log's last lines showed those and cut the table off).
echo "== decode benchmark (tuned shapes: $OUT/bench_decode.log)"
awk '/^decode at batch 1/ {on = 1} /^tuned GEMM shapes/ {skip = 1; next} skip && /^  / {next} {skip = 0} on' \
  "$OUT/bench_decode.log"
if ((${#FAILED[@]})); then
  echo "gpu_engine: FAILED steps: ${FAILED[*]} (logs in $OUT)" >&2
  exit 1
fi
exit 0
