#!/usr/bin/env bash
# run-local.sh [--expect-fail] CONFIG: the CI step of CONFIG on this machine (the arguments of
# the step's run-eval.sh command), with CI's environment and scripts, so its verdict (exit
# status) is the one CI reaches.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${1:?usage: run-local.sh [--expect-fail] CONFIG}"
export QUANTGATE_TIER="${QUANTGATE_TIER:-nightly}"
exec .buildkite/scripts/run-eval.sh "$@"
