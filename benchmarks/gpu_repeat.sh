#!/usr/bin/env bash
# Is a config reproducible run to run on this GPU, and if not, why? Runs each CONFIG RUNS times
# in a row, alone on the GPU, in two modes: `tune` (each run tunes afresh, as CI runs it) and
# `off` (QUANTGATE_AUTOTUNE=0: every GEMM takes its default launch configuration). Reports per
# config: each run's score, the responses that differ between consecutive runs and the answers
# that flip (`quantgate compare`), and whether the tuner's choices (the server log's `tuned ...`
# lines) differed. Runs that still differ with tuning off differ for reasons besides the launch
# configurations (per-tensor activation scales are computed over the whole batch, for one).
#
#   OUT=/tmp/out RUNS=2 [LIMIT=N] [MODES=off] bash benchmarks/gpu_repeat.sh CONFIG...
#   (LIMIT: questions per run; MODES: default tune off)
#
# Needs what gpu_tier.sh needs (carry .whl where the image lacks lm-eval and the server).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_repeat}
RUNS=${RUNS:-2}
PY=${PYTHON:-python}
(($#)) || { echo "usage: OUT=DIR RUNS=N [LIMIT=N] bash benchmarks/gpu_repeat.sh CONFIG..." >&2; exit 3; }
source benchmarks/gpu_env.sh
quantgate_carried_wheels || exit 3
$PY models/recipes/build_variants.py > "$OUT.build_variants.log" 2>&1 || echo "build_variants failed: $OUT.build_variants.log"
mkdir -p "$OUT"
status=0
for config in "$@"; do
  name=$($PY -c 'import sys; from quantgate.harness.config import load_config; print(load_config(sys.argv[1]).name)' \
         "$config") || { echo "error: $config does not load (the message is above)" >&2; status=3; continue; }
  mkdir -p "$OUT/$name"
  for mode in ${MODES:-tune off}; do
    dirs=()
    for ((r = 1; r <= RUNS; r++)); do
      dir="$OUT/$name/$mode-run$r"
      case $mode in
        tune) env=(QUANTGATE_AUTOTUNE=1) ;;
        off) env=(QUANTGATE_AUTOTUNE=0) ;;
      esac
      env "${env[@]}" $PY -m quantgate.harness.cli run "$config" --output-dir "$dir" ${LIMIT:+--limit "$LIMIT"} \
        > "$dir.log" 2>&1 || status=1
      dirs+=("$dir/$name")
    done
    echo "== $name, $mode: ${env[*]}"
    for dir in "${dirs[@]}"; do
      $PY - "$dir/result.json" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
r = json.loads(path.read_text()) if path.is_file() else {"verdict": "no result.json", "reason": f"see {path.parent}.log"}
print(f"  {path.parts[-3]}: {r['verdict']} {(r.get('metrics') or {}).get('value')} {r.get('reason', '')[:120]}")
PY
      grep -o 'tuned .*' "$dir/server.log" | sed 's/ ([0-9.]* us.*)$//' | sort > "$dir/tuned.txt"
    done
    for ((r = 1; r < ${#dirs[@]}; r++)); do
      $PY -m quantgate.harness.cli compare "${dirs[r-1]}" "${dirs[r]}" > "${dirs[r]}/compare.txt" 2>&1
      $PY - "${dirs[r-1]}/samples.jsonl" "${dirs[r]}/samples.jsonl" "${dirs[r-1]}" "${dirs[r]}" <<'PY'
import json, os, sys
a, b = ({row["id"]: row["response"] for row in map(json.loads, open(path))} if os.path.isfile(path) else {}
        for path in sys.argv[1:3])
first, second = (path.split("/")[-2] for path in sys.argv[3:5])
print(f"  {first} vs {second}: {sum(a[q] != b.get(q) for q in a)} of {len(a)} responses differ")
PY
      grep -E '^(right|wrong) ->' "${dirs[r]}/compare.txt" | sed 's/^/    /'
      if cmp -s "${dirs[r-1]}/tuned.txt" "${dirs[r]}/tuned.txt"; then
        echo "    tuner choices: the same ($(wc -l < "${dirs[r]}/tuned.txt") keys)"
      else
        echo "    tuner choices differ:"; diff "${dirs[r-1]}/tuned.txt" "${dirs[r]}/tuned.txt" | grep '^[<>]' | cut -c1-160 | head -20
      fi
    done
  done
done
# samples.jsonl files are kept: a call returns few files, so the caller tars $OUT.
exit $status
