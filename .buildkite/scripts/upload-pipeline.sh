#!/usr/bin/env bash
# Generate the eval steps for this build's tier and hand them to the Buildkite agent.
# `if_changed` (pr tier) is applied by the agent against the build's git diff; its values are
# lists of globs, which need buildkite-agent >= 3.109.
# Tier: pull requests run `pr`, tag builds `release`, every other build (scheduled, branch
# pushes, the UI) `nightly`; QUANTGATE_TIER overrides.
set -euo pipefail
cd "$(dirname "$0")/../.."

tier="${QUANTGATE_TIER:-}"
if [[ -z "$tier" ]]; then
  if [[ "${BUILDKITE_PULL_REQUEST:-false}" != "false" ]]; then
    tier=pr
  elif [[ -n "${BUILDKITE_TAG:-}" ]]; then
    tier=release
  else
    tier=nightly
  fi
fi
echo "--- quantgate pipeline --tier $tier" >&2

source .buildkite/scripts/env.sh
ensure_quantgate
generated="$(mktemp --suffix=.yml)"
trap 'rm -f "$generated"' EXIT
quantgate pipeline --tier "$tier" "${QUANTGATE_PIPELINE_PATHS:-eval_configs}" > "$generated"
# --no-interpolation: the steps are literal (a config name or path may hold `$`) and need no
# variable of the agent.
buildkite-agent pipeline upload --apply-if-changed --no-interpolation "$generated"
