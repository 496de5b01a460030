#!/usr/bin/env bash
# One-shot GPU job for the dense FP8 linear kernels (issue 3), about 5 minutes on an H200:
#   1. compile check: every Triton variant for sm_80, sm_89 and sm_90 (the A100 path is real),
#   2. bench_linear.py with a small tile-config sweep (JSON + markdown),
#   3. the kernel tests on the GPU (tests/kernels/test_linear_*, test_quant, test_registry).
# Each step has its own time limit and a failing step does not stop the others. Full logs and
# results go to $OUT; a short summary is printed at the end.
#
#   OUT=/tmp/out bash benchmarks/gpu_linear.sh
#
# Works without installing the package (no pip there): a temporary `quantgate` package of
# symlinks to this checkout is put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_linear}
mkdir -p "$OUT"
PY=${PYTHON:-python}

shim=$(mktemp -d)
mkdir "$shim/quantgate"
touch "$shim/quantgate/__init__.py"
for part in kernels engine harness; do ln -s "$PWD/$part" "$shim/quantgate/$part"; done
export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
export QUANTGATE_COMMIT=${QUANTGATE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

{ nvidia-smi; $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/environment.txt" 2>&1

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, remember the status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "(stopped after the ${limit}s limit)" >> "$OUT/$name.log"
  printf '%-14s exit %-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.txt"
}

: > "$OUT/steps.txt"
step compile_check 60 $PY benchmarks/compile_check.py --targets 80 89 90 --json "$OUT/compile_check.json"
step bench 190 $PY benchmarks/bench_linear.py --out "$OUT" --sweep --sweep-budget-s 45
if $PY -c "import pytest" 2>/dev/null; then
  step tests 90 $PY -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/kernels/test_registry.py tests/kernels/test_quant.py tests/kernels/test_linear_emulation.py \
    tests/kernels/test_linear_torch.py tests/kernels/test_linear_triton.py tests/kernels/test_linear_marlin.py \
    tests/kernels/test_linear_reload.py --junitxml="$OUT/tests.xml"
else
  echo "pytest is not installed here: GPU tests not run" > "$OUT/tests.log"
  echo "tests          skipped (no pytest)" >> "$OUT/steps.txt"
fi
rm -rf "$shim"

echo "===================== gpu_linear summary ($(date -u +%FT%TZ), commit $QUANTGATE_COMMIT)"
cat "$OUT/steps.txt"
echo "--- compile check (sm_80 = A100 path)"
grep -E "variants compiled| NO |stopped after" "$OUT/compile_check.log" | head -20
echo "--- tests"
grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed|error)" "$OUT/tests.log" | tail -25
echo "--- bench (full tables: $OUT/bench_linear.md)"
sed -n '/^copy bandwidth/,$p' "$OUT/bench.log" | grep -v "^full results" | head -90
