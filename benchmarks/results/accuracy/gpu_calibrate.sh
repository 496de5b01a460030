#!/usr/bin/env bash
# Calibrate the GPU-only tiny configs (triton, marlin) on this machine's GPU: the
# `reference:` their YAML carries until then is the CPU emulation calibration of the same
# checkpoint. Each config: `quantgate calibrate ... --runs 2` into $OUT/accuracy/<name>/; the
# table (accuracy.md/json, calibrations/<name>.json) goes to $OUT/accuracy/ and is printed last.
#
#   OUT=/tmp/out JOBS=6 bash benchmarks/results/accuracy/gpu_calibrate.sh [NAME...]
#
# NAME: config file stems under eval_configs/tiny (default: every tiny config whose `requires:`
# this GPU meets, and the two bf16 `-emulation` configs, so the table's deltas against bf16 are
# measured on the same GPU). JOBS configs are calibrated at once (default 1): a tiny model leaves
# most of the GPU idle, and each server sizes its KV cache to --max-num-seqs, not to free memory.
# Stops starting new configs when less than PER_CONFIG_S of BUDGET_S (default 540 s) is left, so
# a 10-minute job returns its table; run it again with the names it skipped.
# Needs on the machine: torch with CUDA, triton, transformers, lm-eval, fastapi, uvicorn,
# safetensors, compressed-tensors. Where they are missing, carry them as wheels: run
# benchmarks/fetch_gpu_wheels.sh here (it fills .whl/) and carry `.whl`; this script installs
# them into a temporary folder first.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/gpu_calibrate}
DEST="$OUT/accuracy"
mkdir -p "$DEST"
PY=${PYTHON:-python}
BUDGET_S=${BUDGET_S:-540}
PER_CONFIG_S=${PER_CONFIG_S:-150}
START=$SECONDS

source benchmarks/gpu_env.sh
JOBS=${JOBS:-1}
quantgate_carried_wheels || exit 3
QG=("$PY" -m quantgate.harness.cli)

{ nvidia-smi; $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$DEST/environment.txt" 2>&1
missing=$($PY - <<'EOF'
import importlib.util
need = ["torch", "triton", "transformers", "lm_eval", "fastapi", "uvicorn", "safetensors", "compressed_tensors"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
if [[ -n "$missing" ]]; then
  echo "error: this machine lacks Python packages the run needs: $missing" | tee -a "$DEST/environment.txt"
  exit 3
fi

# FP8 variants: built here, checked against models/MANIFEST.json (a mismatch is reported, the
# variants are still usable: it means another torch wrote other bytes).
$PY models/recipes/build_variants.py > "$DEST/build_variants.log" 2>&1
echo "build_variants exit $? (log: $DEST/build_variants.log)"

if (($# == 0)); then
  mapfile -t names < <($PY - <<'EOF'
from pathlib import Path
import torch
from quantgate.harness.config import load_config
cap = torch.cuda.get_device_capability(0)
for path in sorted(Path("eval_configs/tiny").glob("*.yaml")):
    config = load_config(path)
    need = config.requires.min_compute_capability
    gpu_only = config.requires.gpus >= 1 and (need is None or tuple(map(int, need.split("."))) <= cap)
    if gpu_only or path.stem.endswith("-bf16-emulation"):
        print(path.stem)
EOF
)
else
  names=("$@")
fi

: > "$DEST/steps.txt"
calibrate_one() {
  local name=$1 left=$2 begin=$SECONDS
  timeout --signal=INT --kill-after=15 "$left" "${QG[@]}" calibrate "eval_configs/tiny/$name.yaml" --runs 2 \
    --output-dir "$DEST/$name" > "$DEST/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - begin))s" | tee -a "$DEST/steps.txt"
}
for name in "${names[@]}"; do
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
  left=$((BUDGET_S - (SECONDS - START)))
  if ((left < PER_CONFIG_S)); then
    echo "$name: skipped (${left}s of the budget left)" | tee -a "$DEST/steps.txt"
    continue
  fi
  calibrate_one "$name" "$left" &
done
wait

# Samples are large and the table keeps what matters (per-run results stay for inspection).
$PY benchmarks/results/accuracy/build_table.py "$DEST" --out "$DEST" > "$DEST/table.log" 2>&1 || cat "$DEST/table.log"
find "$DEST" -name samples.jsonl -delete
echo "== steps"; cat "$DEST/steps.txt"
echo "== table"; sed -n '/^| config/,$p' "$DEST/accuracy.md" 2>/dev/null | cut -c1-200
