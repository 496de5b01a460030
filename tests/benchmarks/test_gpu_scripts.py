"""The gpu_*.sh jobs run every step even when one fails, and then exit non-zero: a caller that
reads only the exit status (the device tool's rc) must not take a failed step for success.
Run on CPU with a stand-in `python` that fails the chosen step."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_PYTHON = """#!/usr/bin/env bash
case "$1" in
  -c) exit 0 ;;
  -m) echo "1 failed"; exit "${FAKE_PYTEST_RC:-0}" ;;
  *) echo "copy bandwidth 1.00 TB/s"; echo "decode at batch 1"; exit "${FAKE_BENCH_RC:-0}" ;;
esac
"""

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


def run_job(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(fake),
            "OUT": str(tmp_path / "out"), "QUANTGATE_COMMIT": "test", "MOE_GPU_BUDGET_S": "30", **env}
    return subprocess.run(["bash", str(REPO / "benchmarks" / script)], env=full, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("script", ["gpu_linear.sh", "gpu_engine.sh", "gpu_moe.sh"])
def test_a_failing_test_step_makes_the_job_fail(tmp_path, script):
    done = run_job(tmp_path, script, FAKE_PYTEST_RC="1")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "FAILED" in done.stderr


@pytest.mark.parametrize("script", ["gpu_linear.sh", "gpu_engine.sh", "gpu_moe.sh"])
def test_a_failing_benchmark_makes_the_job_fail(tmp_path, script):
    done = run_job(tmp_path, script, FAKE_BENCH_RC="3")
    assert done.returncode != 0, done.stdout + done.stderr


@pytest.mark.parametrize("script", ["gpu_linear.sh", "gpu_engine.sh", "gpu_moe.sh"])
def test_every_step_passing_exits_zero(tmp_path, script):
    done = run_job(tmp_path, script)
    assert done.returncode == 0, done.stdout + done.stderr
