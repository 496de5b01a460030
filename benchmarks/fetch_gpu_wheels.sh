#!/usr/bin/env bash
# Fill .whl/ with the Python 3.12 wheels of benchmarks/gpu_wheels.txt, for a GPU machine that
# cannot reach a package index; carry `.whl` with the job (gpu_calibrate.sh installs them).
#   bash benchmarks/fetch_gpu_wheels.sh      (from the repository root, after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=(.venv/bin/python -m pip)
rm -rf .whl && mkdir .whl
mapfile -t binary < <(sed -n '/^# published as source only/q;/^[^#]/p' benchmarks/gpu_wheels.txt)
mapfile -t source < <(sed -n '/^# published as source only/,$p' benchmarks/gpu_wheels.txt | grep -v '^#')
"${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${binary[@]}"
"${PIP[@]}" wheel -q --no-deps -w .whl "${source[@]}"
echo "$(ls .whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1))"
