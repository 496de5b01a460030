#!/usr/bin/env bash
# One-shot GPU job for the MoE kernels (issue 4), under 150 s on an H200 including compilation:
#   1. the GPU-marked MoE tests and every row of the tile tables against float64 (< 60 s, in four
#      processes; their kernels stay in Triton's cache for the benchmark),
#   2. the benchmark (peers in the same run; numerics against float64 in fp16 and bf16),
#   3. the short table, last.
# A stage that fails or runs out of time is reported and the next one still runs; the job then
# exits 1 (0 when every stage was ok or skipped for want of pytest). The tile sweep
# (`python benchmarks/bench_moe.py --tune --budget-s S --out DIR`) is a separate job. The compile
# check (sm_80/89/90 builds, registers, spills, no FP8 tensor-core instructions) needs no GPU:
# `python benchmarks/bench_moe.py --compile-check` runs it anywhere.
#
#   QUANTGATE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_moe.sh [OUT_DIR]
#
# QUANTGATE_COMMIT names the tree measured: the device's .git may be stale, so without it
# bench_moe.json says unverified:<sha> (gpu_env.sh).
#
# OUT_DIR defaults to $OUT/moe when $OUT is set, else benchmarks/results/moe. It receives
# pytest_moe.log, bench_moe.json, bench_moe.md and bench_moe.log.
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
DEST=${1:-${OUT:+$OUT/moe}}
DEST=${DEST:-$REPO/benchmarks/results/moe}
mkdir -p "$DEST"
BUDGET_S=${MOE_GPU_BUDGET_S:-150}
START=$SECONDS
declare -A STATUS

left() { echo $((BUDGET_S - (SECONDS - START))); }
cap() {  # seconds for a stage: its own cap, or what is left of the budget
    local want=$1 have
    have=$(left)
    ((have < want)) && want=$have
    ((want < 10)) && want=10
    echo "$want"
}
run_stage() {  # name, time cap, log file, command...
    local name=$1 limit log=$3
    limit=$(cap "$2")
    shift 3
    echo "== $name (limit ${limit}s, $(left)s of the budget left)"
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$log" | tail -n 30
    local rc=${PIPESTATUS[0]}
    case $rc in
        0) STATUS[$name]="ok" ;;
        124 | 137) STATUS[$name]="TIMED OUT after ${limit}s (partial results kept)" ;;
        *) STATUS[$name]="FAILED (exit $rc, see $(basename "$log"))" ;;
    esac
}

source benchmarks/gpu_env.sh

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

gpu_tests() {  # limit, log: four pytest processes at once, since Triton compilation (one CPU
    # core each) rather than the GPU is what takes the time; the benchmark reuses their kernels.
    local limit=$1 log=$2 rc=0 pids=() part
    echo "== GPU tests (limit ${limit}s, $(left)s of the budget left)"
    local pytest=(timeout --kill-after=5 "$limit" python -m pytest -q -p no:cacheprovider --durations=5)
    "${pytest[@]}" -m gpu tests/kernels/test_moe_triton.py -k "(fp16 or partial) and not every_tile_row" > "$log.1" 2>&1 & pids+=($!)
    "${pytest[@]}" -m gpu tests/kernels/test_moe_triton.py -k "not (fp16 or partial or every_tile_row)" > "$log.2" 2>&1 & pids+=($!)
    "${pytest[@]}" -m gpu tests/kernels/test_moe_marlin.py tests/kernels/test_moe_emulation.py \
        tests/kernels/test_moe_reference.py > "$log.3" 2>&1 & pids+=($!)
    # Not GPU-marked (its block and bf16 rows run on CPU too): every tile row, compiled.
    "${pytest[@]}" tests/kernels/test_moe_triton.py -k every_tile_row > "$log.4" 2>&1 & pids+=($!)
    for part in 0 1 2 3; do
        wait "${pids[$part]}"
        local status=$?
        ((status > rc)) && rc=$status
    done
    cat "$log.1" "$log.2" "$log.3" "$log.4" > "$log" && rm -f "$log.1" "$log.2" "$log.3" "$log.4"
    grep -E "passed|failed|error|FAILED|ERROR" "$log" | tail -n 20
    case $rc in
        0) STATUS["GPU tests"]="ok" ;;
        124 | 137) STATUS["GPU tests"]="TIMED OUT after ${limit}s (see pytest_moe.log)" ;;
        *) STATUS["GPU tests"]="FAILED (see pytest_moe.log)" ;;
    esac
}

if python -c "import pytest" 2>/dev/null; then
    gpu_tests "$(cap 70)" "$DEST/pytest_moe.log"
else
    STATUS["GPU tests"]="skipped: pytest is not installed (the benchmark still checks numerics)"
fi

run_stage "benchmark" 110 "$DEST/bench_moe.log" python benchmarks/bench_moe.py --out "$DEST"

echo
echo "== stages ($((SECONDS - START))s)"
for name in "GPU tests" "benchmark"; do
    printf '  %-12s %s\n' "$name" "${STATUS[$name]:-not run}"
done
echo "results in $DEST"
if [ -f "$DEST/bench_moe.json" ]; then
    python benchmarks/bench_moe.py --summary "$DEST/bench_moe.json"
else
    echo "no benchmark results"
fi
failed=()
for name in "GPU tests" "benchmark"; do
    case ${STATUS[$name]:-not run} in ok | skipped:*) ;; *) failed+=("$name: ${STATUS[$name]:-not run}") ;; esac
done
if ((${#failed[@]})); then
    printf 'gpu_moe: FAILED %s\n' "${failed[@]}" >&2
    exit 1
fi
exit 0
