# Shared by the CI step scripts and run-local.sh, so a developer's run sees what CI sees.
# Sourced, not executed.
export CI="${CI:-true}"
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1  # builtin configs never reach a hub; vLLM configs use the agent's cache
export QUANTGATE_RESULTS="${QUANTGATE_RESULTS:-results}"

# Install this checkout (make install: the venv of the Makefile) unless quantgate is already
# importable from the active environment, e.g. a GPU agent's own image with vLLM beside it.
ensure_quantgate() {
  if ! command -v quantgate >/dev/null 2>&1; then
    make install >&2
    # shellcheck disable=SC1091
    source .venv/bin/activate
  fi
}
