#!/usr/bin/env bash
# annotate.sh SUMMARY_MD CONTEXT [EXIT_STATUS]: put the markdown summary on the build page.
# Without buildkite-agent (a developer's machine) it prints the summary instead.
set -uo pipefail
summary="${1:?usage: annotate.sh SUMMARY_MD CONTEXT [EXIT_STATUS]}"
context="${2:-quantgate}"
status="${3:-0}"
case "$status" in
  0) style=success ;;
  1) style=error ;;
  *) style=warning ;;
esac
if [[ ! -f "$summary" ]]; then
  echo "annotate: no summary at $summary (the run produced none); nothing to annotate" >&2
  exit 0
fi
if command -v buildkite-agent >/dev/null 2>&1; then
  buildkite-agent annotate --style "$style" --context "$context" < "$summary"
else
  echo "annotate: buildkite-agent not found, not annotating; the summary ($style):"
  cat "$summary"
fi
