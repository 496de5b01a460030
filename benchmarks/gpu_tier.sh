#!/usr/bin/env bash
# Run a tier list's tiny configs that need a GPU (and this GPU meets) through `quantgate run`, as a
# GPU CI agent would, JOBS lists at once (a tiny model leaves the GPU mostly idle). Each group's
# results go to $OUT/tier/group-<i>/ (summary.md, junit.xml, <config>/result.json; samples
# deleted); the summaries are printed last. Exit 1 when any group's run did not exit 0.
#
#   OUT=/tmp/out JOBS=4 bash benchmarks/gpu_tier.sh [LIST]     # LIST: default eval_configs/tiny/nightly.txt
#
# Needs what gpu_calibrate.sh needs (carry .whl where the image lacks lm-eval and the server).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_tier}
LIST=${1:-eval_configs/tiny/nightly.txt}
JOBS=${JOBS:-4}
PY=${PYTHON:-python}
DEST="$OUT/tier"
mkdir -p "$DEST"
source benchmarks/gpu_env.sh
quantgate_carried_wheels || exit 3
$PY models/recipes/build_variants.py > "$DEST/build_variants.log" 2>&1 || echo "build_variants failed: $DEST/build_variants.log"

listing=$($PY - "$LIST" <<'PY'
import sys
from pathlib import Path
import torch
from quantgate.harness.config import expand_paths, load_config, parse_capability
cap = torch.cuda.get_device_capability(0)
for path in expand_paths([sys.argv[1]]):
    config = load_config(path)
    need = config.requires.min_compute_capability
    if config.requires.gpus >= 1 and (need is None or parse_capability(need) <= cap):
        print(path)
PY
) || { echo "error: listing the GPU configs of $LIST failed (the traceback is above)" >&2; exit 3; }
mapfile -t configs <<< "$listing"
[[ -n "$listing" ]] || { echo "error: $LIST names no config that needs a GPU this one meets" >&2; exit 3; }
echo "${#configs[@]} GPU configs of $LIST in $JOBS groups"
pids=()
for ((g = 0; g < JOBS; g++)); do
  group=()
  for ((i = g; i < ${#configs[@]}; i += JOBS)); do group+=("${configs[i]}"); done
  ((${#group[@]})) || continue
  $PY -m quantgate.harness.cli run "${group[@]}" --output-dir "$DEST/group-$g" > "$DEST/group-$g.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
find "$DEST" -name samples.jsonl -delete
for summary in "$DEST"/group-*/summary.md; do sed -n '1,/^$/p;/^| config/,/^$/p' "$summary" | cut -c1-160; done
exit $status
