#!/usr/bin/env bash
# One-shot GPU job for the engine (issues 2 and 5), about 6 minutes on an H200:
#   1. the GPU-marked engine tests (CUDA graph replay equals eager; reload under captured graphs),
#   2. bench_engine.py decode: Qwen3-1.7B-shaped random model, batch 1, bf16 and FP8 block,
#      CUDA graphs vs --enforce-eager (targets: FP8+graphs >= 1.2x bf16+graphs, >= 3x FP8 eager).
# Each step has its own time limit and a failing step does not stop the others. Full logs and
# results go to $OUT; a short summary is printed at the end.
#
#   OUT=/tmp/out bash benchmarks/gpu_engine.sh            # FP8 layers with --linear-backend auto
#   OUT=/tmp/out LINEAR_BACKEND=marlin bash benchmarks/gpu_engine.sh
#
# Works without installing the package (no pip there): a temporary `quantgate` package of
# symlinks to this checkout is put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_engine}
mkdir -p "$OUT"
PY=${PYTHON:-python}
BACKEND=${LINEAR_BACKEND:-auto}

shim=$(mktemp -d)
mkdir "$shim/quantgate"
touch "$shim/quantgate/__init__.py"
for part in kernels engine harness; do ln -s "$PWD/$part" "$shim/quantgate/$part"; done
export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

{ nvidia-smi; $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/environment.txt" 2>&1

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "(stopped after the ${limit}s limit)" >> "$OUT/$name.log"
  printf '%-14s exit %-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.txt"
}

: > "$OUT/steps.txt"
step engine_tests 180 $PY -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_cuda_graphs.py \
  --junitxml "$OUT/engine_tests.xml"
step bench_decode 300 $PY benchmarks/bench_engine.py decode --shape qwen3-1.7b --variants bf16 fp8-block \
  --linear-backend "$BACKEND" --out "$OUT"

echo "== steps"; cat "$OUT/steps.txt"
echo "== engine tests"; tail -n 5 "$OUT/engine_tests.log"
echo "== decode benchmark"; sed -n '/^decode tokens/,$p' "$OUT/bench_decode.log" | tail -n 12
