# Shared by the CI step scripts and run-local.sh, so a developer's run sees what CI sees.
# Sourced, not executed.
export CI="${CI:-true}"
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1  # builtin configs never reach a hub; vLLM configs use the agent's cache
# The pipeline's artifact_paths name results/: on an agent the results go there, whatever the
# environment says; a developer's run-local.sh may put them elsewhere.
if [[ -n "${BUILDKITE:-}" ]]; then
  export QUANTGATE_RESULTS=results
else
  export QUANTGATE_RESULTS="${QUANTGATE_RESULTS:-results}"
fi

# The Python interpreter of the `quantgate` on PATH, if it is a Python entry point: its shebang
# (`#!/path/python`, `#!/usr/bin/env python3`), or the `exec` line of pip's /bin/sh launcher for
# interpreter paths too long for a shebang. Empty for anything else (a wrapper script).
quantgate_python() {
  local exe line
  exe="$(command -v quantgate 2>/dev/null)" || return 1
  line="$(head -n1 "$exe")"
  if [[ "$line" == "#!/bin/sh" ]]; then
    line="#!$(sed -n "s/^'''exec' '\{0,1\}\([^' ]*\).*/\1/p" "$exe" | head -n1)"
  fi
  line="${line#\#!}"
  line="${line#/usr/bin/env }"
  if [[ "$line" =~ ^[^[:space:]]*python[0-9.]*$ ]]; then command -v "$line"; fi
}

# Install this checkout (make install: the venv of the Makefile) unless the quantgate on PATH
# already runs this checkout's code: an agent image's own install of another version would test
# other code than the change under test. QUANTGATE_PYTHON is then the interpreter to use.
ensure_quantgate() {
  QUANTGATE_PYTHON="$(quantgate_python || true)"
  if command -v quantgate >/dev/null 2>&1 && { [[ -z "$QUANTGATE_PYTHON" ]] ||
      "$QUANTGATE_PYTHON" -c 'import os, sys, quantgate.harness as h
sys.exit(0 if os.path.realpath(h.__file__).startswith(os.path.realpath(".") + os.sep) else 1)' 2>/dev/null; }; then
    export QUANTGATE_PYTHON
    return 0
  fi
  command -v quantgate >/dev/null 2>&1 && echo "the quantgate on PATH runs another checkout's code: installing this one" >&2
  make install >&2 || return 1
  # shellcheck disable=SC1091
  source "${VENV:-.venv}/bin/activate"  # the Makefile's VENV
  QUANTGATE_PYTHON="$(command -v python)"
  export QUANTGATE_PYTHON
}
