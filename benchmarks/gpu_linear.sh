#!/usr/bin/env bash
# One-shot GPU job for the dense FP8 linear kernels (issue 3), at most 220 s on an H200 (run 6
# took 54 s: tests 13 s, bench 41 s, before the bench timed host time per call):
#   1. the GPU-marked linear kernel tests (tests/kernels/test_linear_*, test_quant), default
#      configs, one layer shape, in three processes (mostly compiling; limit 45 s),
#   2. bench_linear.py: graph timings of every backend and peer (what every acceptance check
#      reads), eager and host times as information, correctness in fp16 and bf16 with
#      diagnostics, the acceptance checks, the tuned configs with every candidate's time, the
#      fastest backend per scheme and M (limit 150 s, measurements stop at 130 s).
# Each step has its own time limit (SIGINT, then the bench writes what it measured) and a failing
# step does not stop the other. Everything goes to $OUT/lin; the short table is printed last. The
# job exits 1 when a step failed or ran out of time (named last, on stderr), else 0.
#
#   OUT=/tmp/out QUANTGATE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_linear.sh
#
# QUANTGATE_COMMIT names the tree measured (the device's .git may be stale; without it the
# results say unverified:<sha>). Works without installing the package (no pip there): see gpu_env.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_linear}
LIN="$OUT/lin"
mkdir -p "$LIN"
PY=${PYTHON:-python}

source benchmarks/gpu_env.sh

{ nvidia-smi; $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$LIN/environment.txt" 2>&1

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $LIN/NAME.log, remember the status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$LIN/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "(stopped after the ${limit}s limit)" >> "$LIN/$name.log"
  printf '%-6s exit %-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >> "$LIN/steps.txt"
  [ $rc -eq 0 ] || FAILED+=("$name (exit $rc)")
}
FAILED=()

: > "$LIN/steps.txt"
gpu_tests() {  # three pytest processes at once: Triton compilation (one CPU core each), not the
  # GPU, is what takes the time. Default configs: numerics are the tests' concern (the bench
  # checks the output of every configuration the tuner picks), and the bench reuses the kernels.
  local start=$SECONDS rc=0 status pids=() part
  local pytest=(timeout --signal=INT --kill-after=10 45 env QUANTGATE_AUTOTUNE=0
                $PY -m pytest -q -m gpu -p no:cacheprovider -o addopts="")
  "${pytest[@]}" tests/kernels/test_linear_triton.py --junitxml="$LIN/tests1.xml" > "$LIN/tests1.log" 2>&1 &
  pids+=($!)
  "${pytest[@]}" tests/kernels/test_linear_marlin.py --junitxml="$LIN/tests2.xml" > "$LIN/tests2.log" 2>&1 &
  pids+=($!)
  "${pytest[@]}" tests/kernels/test_quant.py tests/kernels/test_linear_torch.py tests/kernels/test_linear_reload.py \
    --junitxml="$LIN/tests3.xml" > "$LIN/tests3.log" 2>&1 &
  pids+=($!)
  for part in 0 1 2; do
    wait "${pids[$part]}"
    status=$?
    ((status > rc)) && rc=$status
  done
  cat "$LIN/tests1.log" "$LIN/tests2.log" "$LIN/tests3.log" > "$LIN/tests.log"
  [ $rc -eq 124 ] && echo "(stopped after the 45s limit)" >> "$LIN/tests.log"
  printf '%-6s exit %-3s %4ss\n' tests "$rc" "$((SECONDS - start))" >> "$LIN/steps.txt"
  [ $rc -eq 0 ] || FAILED+=("tests (exit $rc)")
}
if $PY -c "import pytest" 2>/dev/null; then
  gpu_tests
else
  echo "pytest is not installed here: GPU tests not run" > "$LIN/tests.log"
  echo "tests  skipped (no pytest)" >> "$LIN/steps.txt"
fi
step bench 150 $PY benchmarks/bench_linear.py --out "$LIN" --budget-s 130

echo "===================== gpu_linear summary ($(date -u +%FT%TZ), commit $QUANTGATE_COMMIT)"
cat "$LIN/steps.txt"
echo "--- tests (GPU-marked)"
grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed|error|skipped)|stopped after" "$LIN/tests.log" | tail -25
echo "--- bench (full tables: $LIN/bench_linear.md)"
grep -E "stopped after|^interrupted|budget|Traceback|Error" "$LIN/bench.log" | head -5
sed -n '/^copy bandwidth/,$p' "$LIN/bench.log" | grep -v "^full results"
if ((${#FAILED[@]})); then
  echo "gpu_linear: FAILED steps: ${FAILED[*]} (logs in $LIN)" >&2
  exit 1
fi
exit 0
