#!/usr/bin/env bash
# Calibrate CPU configs on a many-core machine: `quantgate calibrate ... --runs 2` per config,
# JOBS configs at once, each pinned to its own CORES cores (the engine takes all but one of
# them, the harness and lm-eval the last), so runs neither share cores nor see a GPU. Configs
# are handed out in the order given; none starts when less than PER_CONFIG_S of BUDGET_S is
# left, so a 10-minute job returns its table. Output as gpu_calibrate.sh's, $OUT/accuracy/, with
# the runs' samples kept: a table combining calibrations of several machines is built from them.
#
#   OUT=/tmp/out JOBS=5 CORES=3 FIRST_CORE=0 bash benchmarks/results/accuracy/cpu_calibrate.sh NAME...
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/cpu_calibrate}
DEST="$OUT/accuracy"
mkdir -p "$DEST"
PY=${PYTHON:-python}
JOBS=${JOBS:-1} CORES=${CORES:-3} FIRST_CORE=${FIRST_CORE:-0}
BUDGET_S=${BUDGET_S:-540} PER_CONFIG_S=${PER_CONFIG_S:-300}
START=$SECONDS
(($# > 0)) || { echo "error: name the configs to calibrate (file stems under eval_configs/tiny)" >&2; exit 2; }
last_core=$((FIRST_CORE + JOBS * CORES - 1))
if ((last_core >= $(nproc --all))); then
  echo "error: JOBS=$JOBS x CORES=$CORES from FIRST_CORE=$FIRST_CORE needs cores up to $last_core; this machine" \
       "has $(nproc --all): lower JOBS or CORES" >&2
  exit 2
fi

source benchmarks/gpu_env.sh
quantgate_carried_wheels || exit 3
{ lscpu | head -20; $PY -c "import torch; print('torch', torch.__version__)"; } > "$DEST/environment.txt" 2>&1
$PY models/recipes/build_variants.py > "$DEST/build_variants.log" 2>&1
echo "build_variants exit $? (log: $DEST/build_variants.log)"

: > "$DEST/steps.txt"
queue="$DEST/queue.txt"
printf '%s\n' "$@" > "$queue"
# Each worker takes the next name under a lock, so the configs go to whichever worker is free.
worker() {
  local slot=$1 cores name left begin
  cores="$((FIRST_CORE + slot * CORES))-$((FIRST_CORE + slot * CORES + CORES - 1))"
  while true; do
    name=$(flock "$queue.lock" bash -c 'head -n1 "$1"; sed -i 1d "$1"' _ "$queue")
    [[ -n "$name" ]] || return 0
    left=$((BUDGET_S - (SECONDS - START)))
    if ((left < PER_CONFIG_S)); then
      echo "$name: skipped (${left}s of the budget left)" | tee -a "$DEST/steps.txt"
      continue
    fi
    begin=$SECONDS
    CUDA_VISIBLE_DEVICES="" taskset -c "$cores" timeout --signal=INT --kill-after=15 "$left" \
      "$PY" -m quantgate.harness.cli calibrate "eval_configs/tiny/$name.yaml" --runs 2 \
      --output-dir "$DEST/$name" > "$DEST/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - begin))s on cores $cores" | tee -a "$DEST/steps.txt"
  done
}
for ((slot = 0; slot < JOBS; slot++)); do worker "$slot" & done
wait

$PY benchmarks/results/accuracy/build_table.py "$DEST" --out "$DEST" > "$DEST/table.log" 2>&1 || cat "$DEST/table.log"
echo "== steps"; cat "$DEST/steps.txt"
echo "== table"; sed -n '/^| config/,$p' "$DEST/accuracy.md" 2>/dev/null | cut -c1-200
