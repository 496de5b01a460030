#!/usr/bin/env bash
# One eval step: install, run the config, annotate the build. The exit status is quantgate's
# (0 pass, 1 gate failed, 2 error without a verdict: retried by the pipeline, 3 invalid config).
# --expect-fail: a negative check (tag `negative-check`), built to FAIL: a FAIL on the check it
# exercises (`expect:` when it names a kernel other than server_args' backend, else the accuracy
# gate) exits 0; a PASS exits 1
# (the check has stopped catching what it must), and so does a FAIL on another check or a run
# that failed on another config (a baseline run with it); 2 and 3 stay.
# --engine E: `quantgate pipeline --engine E` overrides every config's engine.
set -uo pipefail
cd "$(dirname "$0")/../.."
expect_fail=false
engine=()
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --expect-fail) expect_fail=true; shift ;;
    --engine) engine=(--engine "${2:?--engine needs a value}"); shift 2 ;;
    *) echo "run-eval.sh: unknown option $1" >&2; exit 3 ;;
  esac
done
config="${1:?usage: run-eval.sh [--expect-fail] [--engine E] CONFIG}"

source .buildkite/scripts/env.sh
ensure_quantgate || exit 2
if [[ -z "${QUANTGATE_PYTHON:-}" ]]; then
  # A wrapper hides its interpreter: the Makefile's venv of this checkout reads the config and
  # builds the models instead (what `make models` would run).
  make install >&2 || exit 2
  QUANTGATE_PYTHON="${VENV:-.venv}/bin/python"  # the Makefile's VENV
fi
# The engine and the unique name, as quantgate loads the config (YAML quoting, --engine).
facts="$("$QUANTGATE_PYTHON" - "$config" "${engine[1]:-}" <<'PY'
import sys
from quantgate.harness.config import ConfigError, load_config
try:
    config = load_config(sys.argv[1], sys.argv[2] or None)
except (ConfigError, OSError) as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
print(config.engine)
print(config.name)
PY
)"
read_status=$?
# 3: the config is invalid, as `quantgate run` would say; anything else (a broken install) is the agent's.
if (( read_status != 0 )); then exit $(( read_status == 3 ? 3 : 2 )); fi
{ IFS= read -r config_engine; IFS= read -r config_name; } <<< "$facts"
if [[ "$config_engine" == builtin ]]; then
  # The FP8 variants of the shipped checkpoints are built, not tracked. A manifest they do not
  # reproduce (exit 3) fails the same way on every retry. Run directly: make would turn the
  # recipe's 3 into its own 2.
  "$QUANTGATE_PYTHON" models/recipes/build_variants.py >&2
  built=$?
  if (( built != 0 )); then exit $(( built == 3 ? 3 : 2 )); fi
fi

out="$QUANTGATE_RESULTS"
echo "--- :test_tube: quantgate run $config"
# In the background, so that this script outlives an agent's cancel (SIGTERM to the job's
# process group) while quantgate tears its server down and writes its results, then annotates.
child=
trap '[[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null' TERM INT
quantgate run "$config" "${engine[@]}" --output-dir "$out" --junit "$out/junit.xml" --markdown "$out/summary.md" &
child=$!
wait "$child"
status=$?
while kill -0 "$child" 2>/dev/null; do  # a trapped signal ended `wait` early: the run is still tearing down
  wait "$child"
  status=$?
done
trap - TERM INT
(( status > 128 )) && status=2  # killed by a signal before its own handler was up: no verdict, retryable
if $expect_fail; then
  # Exit 1 says some config failed; a negative check's run may hold its baseline config too, so
  # the check's own verdict decides, and only a FAIL on the check it exercises (results.py).
  verdict="$("$QUANTGATE_PYTHON" -c 'import json, sys
from quantgate.harness.results import negative_check_verdict
print(negative_check_verdict(json.load(open(sys.argv[1]))))' "$out/$config_name/result.json" 2>/dev/null)"
  case "$status:$verdict" in
    1:FAIL) echo "negative check: the verdict is FAIL, on the check it exercises, as it must be"; status=0 ;;
    1:) echo "negative check: the run failed, but $out/$config_name/result.json could not be read, so whether this check failed is unknown" >&2 ;;
    1:FAIL*) echo "negative check: $config_name's verdict is $verdict: the check it exercises did not catch its case" >&2 ;;
    1:*) echo "negative check: the run failed, but $config_name's verdict is $verdict, not FAIL: another config of the run (its baseline?) failed" >&2 ;;
    0:*) echo "negative check PASSED but must FAIL: the check it exercises no longer catches its case" >&2; status=1 ;;
  esac
fi

echo "--- :memo: annotate"
# Per config name, unique in a pipeline: two gsm8k.yaml in different folders keep their own.
.buildkite/scripts/annotate.sh "$out/summary.md" "quantgate-$config_name" "$status"
exit "$status"
