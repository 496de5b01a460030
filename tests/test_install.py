"""SPEC section 1: `pip install .` (not only the editable install the Makefile makes) gives a
working `quantgate`: the package-dir mapping puts harness, engine and kernels under quantgate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_regular_install_gives_a_working_command(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), str(REPO)], check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import quantgate.harness.cli, quantgate.engine.serve_args, "
                            "quantgate.kernels as k; print(k.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where  # the installed copy, not the checkout
    config = tmp_path / "c.yaml"
    config.write_text("model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear-backend marlin\n")
    script = site / "bin" / "quantgate"
    assert script.is_file()
    lint = subprocess.run([sys.executable, str(script), "lint", str(config)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0 and "1 config(s): 0 error(s)" in lint.stderr, lint.stderr
    kernels = subprocess.run([sys.executable, str(script), "kernels", "--capability", "8.0", "--scheme", "fp8-block"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert kernels.returncode == 0 and "MarlinFp8LinearKernel" in kernels.stdout, kernels.stderr
