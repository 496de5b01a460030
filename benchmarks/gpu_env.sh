# Sourced by the gpu_*.sh jobs: makes `import quantgate.*` work on the GPU machine, where the
# checkout is copied but not installed (no package index there). pyproject maps quantgate.kernels ->
# kernels/ etc.; a temporary package of symlinks does the same. Also runs kernels compiled, not
# interpreted, and names the commit measured.
#   source benchmarks/gpu_env.sh   (from the repository root)
if ! "${PYTHON:-python}" -c "import quantgate.kernels" 2>/dev/null; then
    QUANTGATE_SHIM=$(mktemp -d)
    mkdir -p "$QUANTGATE_SHIM/quantgate"
    touch "$QUANTGATE_SHIM/quantgate/__init__.py"
    for part in kernels engine harness; do ln -s "$PWD/$part" "$QUANTGATE_SHIM/quantgate/$part"; done
    export PYTHONPATH="$QUANTGATE_SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
unset TRITON_INTERPRET
# The commit measured. The device machine may keep a stale .git from an earlier call (runs 8 and
# 9 recorded an older commit than the tree they measured), so pass QUANTGATE_COMMIT with the job:
#   QUANTGATE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_linear.sh
# Without it, git's answer is recorded as `unverified:<sha>`, with `-dirty` when tracked files
# differ from that commit (as a copied tree over a stale .git does), or `unknown` without git.
quantgate_unverified_commit() {
    local sha
    sha=$(git rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
    [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && sha="$sha-dirty"
    echo "unverified:$sha"
}
export QUANTGATE_COMMIT=${QUANTGATE_COMMIT:-$(quantgate_unverified_commit)}
# Python packages the GPU image lacks (lm-eval, fastapi, uvicorn, compressed-tensors...) travel as
# wheels in .whl/ (benchmarks/fetch_gpu_wheels.sh fills it here; carry `.whl` with the call): a
# job that runs the harness end to end calls this to install them into a temporary folder.
quantgate_carried_wheels() {
    [[ -d .whl ]] || return 0
    compgen -G '.whl/*.whl' > /dev/null || { echo "error: .whl holds no wheel: run benchmarks/fetch_gpu_wheels.sh" >&2; return 3; }
    local site
    site=$(mktemp -d)
    "${PYTHON:-python}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
        || { echo "error: installing the carried wheels in .whl failed" >&2; return 3; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}
