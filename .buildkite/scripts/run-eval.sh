#!/usr/bin/env bash
# One eval step: install, run the config, annotate the build. The exit status is quantgate's
# (0 pass, 1 gate failed, 2 error without a verdict: retried by the pipeline, 3 invalid config).
set -uo pipefail
cd "$(dirname "$0")/../.."
config="${1:?usage: run-eval.sh CONFIG}"

source .buildkite/scripts/env.sh
ensure_quantgate || exit 2
if ! grep -Eq '^engine:[[:space:]]*"?vllm' "$config"; then
  make models >&2 || exit 2  # builtin configs: FP8 variants of the shipped checkpoints are built, not tracked
fi

out="$QUANTGATE_RESULTS"
echo "--- :test_tube: quantgate run $config"
quantgate run "$config" --output-dir "$out" --junit "$out/junit.xml" --markdown "$out/summary.md"
status=$?

echo "--- :memo: annotate"
.buildkite/scripts/annotate.sh "$out/summary.md" "quantgate-$(basename "$config" .yaml)" "$status"
exit "$status"
