#!/usr/bin/env bash
# One-shot GPU job for the MoE kernels (issue 4), under 6 minutes on an H200:
#   1. compile every MoE kernel variant for sm_80, sm_89 and sm_90 (the 8.0 paths really build),
#   2. the GPU-marked MoE tests, 3. the benchmark (peers in the same run),
#   4. a tile sweep with the time that is left, 5. the short table, last.
# A stage that fails or runs out of time is reported and the next one still runs.
#
#   QUANTGATE_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_moe.sh [OUT_DIR]
#
# OUT_DIR defaults to $OUT/moe when $OUT is set, else benchmarks/results/moe. It receives
# compile_check_moe.json, pytest_moe.log, bench_moe.json, bench_moe.md, bench_moe_tune.json.
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
DEST=${1:-${OUT:+$OUT/moe}}
DEST=${DEST:-$REPO/benchmarks/results/moe}
mkdir -p "$DEST"
BUDGET_S=${MOE_GPU_BUDGET_S:-340}
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
run_stage() {  # name, time cap, command...
    local name=$1 limit
    limit=$(cap "$2")
    shift 2
    echo "== $name (limit ${limit}s, $(left)s of the budget left)"
    timeout --kill-after=5 "$limit" "$@"
    local rc=$?
    case $rc in
        0) STATUS[$name]="ok" ;;
        124 | 137) STATUS[$name]="TIMED OUT after ${limit}s (partial results kept)" ;;
        *) STATUS[$name]="FAILED (exit $rc)" ;;
    esac
}

# pyproject maps quantgate.kernels -> kernels/ etc.; without an install, a shim package does it.
if ! python -c "import quantgate.kernels" 2>/dev/null; then
    SHIM=$(mktemp -d)
    mkdir -p "$SHIM/quantgate"
    for part in kernels engine harness; do ln -s "$REPO/$part" "$SHIM/quantgate/$part"; done
    export PYTHONPATH="$SHIM:$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
unset TRITON_INTERPRET

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

run_stage "compile check sm_80/89/90" 60 \
    python benchmarks/bench_moe.py --compile-check --targets 80 89 90 --out "$DEST"

if python -c "import pytest" 2>/dev/null; then
    run_stage "GPU tests" 110 \
        bash -c "python -m pytest -m gpu tests/kernels/test_moe_*.py -q -p no:cacheprovider 2>&1 | tee '$DEST/pytest_moe.log' | tail -n 25; exit \${PIPESTATUS[0]}"
else
    STATUS["GPU tests"]="skipped: pytest is not installed (the benchmark still checks numerics)"
fi

run_stage "benchmark" 150 python benchmarks/bench_moe.py --out "$DEST"

TUNE_S=$(($(left) - 30))
if ((TUNE_S >= 20)); then
    run_stage "tile sweep" $((TUNE_S + 25)) python benchmarks/bench_moe.py --tune --budget-s "$TUNE_S" --out "$DEST"
else
    STATUS["tile sweep"]="skipped: no time left"
fi

echo
echo "== stages ($((SECONDS - START))s)"
for name in "compile check sm_80/89/90" "GPU tests" "benchmark" "tile sweep"; do
    printf '  %-28s %s\n' "$name" "${STATUS[$name]:-not run}"
done
echo "results in $DEST"
if [ -f "$DEST/bench_moe.json" ]; then
    python benchmarks/bench_moe.py --summary "$DEST/bench_moe.json"
else
    echo "no benchmark results"
fi
