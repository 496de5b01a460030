#!/usr/bin/env bash
# run-local.sh CONFIG: the CI step of CONFIG on this machine, with CI's environment and
# scripts, so its verdict (exit status) is the one CI reaches.
set -uo pipefail
cd "$(dirname "$0")/../.."
config="${1:?usage: run-local.sh CONFIG}"
export QUANTGATE_TIER="${QUANTGATE_TIER:-nightly}"
exec .buildkite/scripts/run-eval.sh "$config"
