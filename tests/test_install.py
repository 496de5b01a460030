"""SPEC section 1: `pip install .` (not only the editable install the Makefile makes) gives a
working `quantgate`: the package-dir mapping puts harness, engine and kernels under quantgate."""

from __future__ import annotations

import os
import shutil
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


# -- the Makefile's venv: run for real with a stand-in python (fast: nothing is installed) --------

FAKE_PYTHON = '''\
"""A stand-in for python3 and the venv's python: logs every call to $FAKE_LOG; `-m venv [FLAGS]
DIR` makes DIR/bin/python (this script) and installs "pip" (a marker file) unless
$FAKE_INTERRUPT_VENV is set: then it exits as Ctrl-C while venv installs pip leaves it, a python
without pip. `-m pip` fails as such a python does."""
import os, shutil, sys
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
if args[:2] == ["-m", "venv"]:
    venv = Path(args[-1])
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(__file__, venv / "bin" / "python")
    if os.environ.get("FAKE_INTERRUPT_VENV"):
        sys.exit(130)
    (venv / "pip-installed").touch()
elif args[:2] == ["-m", "pip"] and not Path(sys.argv[0]).parent.parent.joinpath("pip-installed").exists():
    sys.exit(f"{sys.argv[0]}: No module named pip")
'''
# Settings a user may have exported, or that an outer `make test` passes on: not these tests' own.
_MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON", "VENV", "VENV_FLAGS", "TORCH_SPEC", "RESULTS",
             "DEMO_CONFIG")


def _make(tmp_path: Path, *args: str, interrupt: bool = False) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    fake = tmp_path / "python3"
    if not fake.exists():
        fake.write_text(f"#!{sys.executable}\n{FAKE_PYTHON}")
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in _MAKE_ENV}
    env["FAKE_LOG"] = str(tmp_path / "calls.log")
    if interrupt:
        env["FAKE_INTERRUPT_VENV"] = "1"
    return subprocess.run(["make", f"PYTHON={fake}", f"VENV={tmp_path / 'venv'}", f"RESULTS={tmp_path / 'results'}",
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("name", ["VENV", "RESULTS", "DEMO_CONFIG"])
def test_make_refuses_a_path_with_whitespace_before_running_anything(tmp_path: Path, name: str) -> None:
    """VENV="my venv" made my/ and venv/; `make clean RESULTS="my results"` would remove `my`."""
    made = _make(tmp_path, "-n", "clean", "install", f"{name}=my folder")
    assert made.returncode == 2, made.stderr
    assert f"{name}='my folder' must be one path, not empty and with no whitespace" in made.stderr
    assert "rm -rf" not in made.stdout and "venv" not in made.stdout, made.stdout


def test_an_interrupted_venv_is_made_again_not_used_without_pip(tmp_path: Path) -> None:
    first = _make(tmp_path, "install", interrupt=True)
    assert first.returncode != 0 and (tmp_path / "venv" / "bin" / "python").exists()  # no pip in it
    again = _make(tmp_path, "install")
    assert again.returncode == 0, again.stderr
    assert "No module named pip" not in again.stderr
    assert sum(call.startswith("-m venv") for call in _calls(tmp_path)) == 2
    assert (tmp_path / "venv" / ".quantgate-installed").exists()
    assert _make(tmp_path, "install").returncode == 0  # made once: nothing runs again
    assert sum(call.startswith("-m venv") for call in _calls(tmp_path)) == 2


def test_a_folder_the_makefile_did_not_finish_is_never_removed(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "mine.txt").write_text("someone's file")
    refused = _make(tmp_path, "install")
    assert refused.returncode != 0 and "is not a venv this Makefile finished" in refused.stderr
    assert "make clean" in refused.stderr and (tmp_path / "venv" / "mine.txt").exists()
    # One a make before VENV_STAMP existed finished (it has the install stamp) is remade.
    (tmp_path / "venv" / ".quantgate-installed").touch()
    assert _make(tmp_path, "install").returncode == 0
    assert not (tmp_path / "venv" / "mine.txt").exists()


def test_a_venv_made_with_other_settings_is_refused_not_silently_reused(tmp_path: Path) -> None:
    """The README's GPU set-up after a `make demo` kept the CPU torch and no system site-packages."""
    assert _make(tmp_path, "install").returncode == 0
    gpu = ("VENV_FLAGS=--system-site-packages", "TORCH_SPEC=")
    refused = _make(tmp_path, "install", *gpu)
    assert refused.returncode != 0 and "make clean" in refused.stderr, refused.stderr
    assert "VENV_FLAGS= TORCH_SPEC=torch==2.13.0" in refused.stderr  # what it was made with
    assert "VENV_FLAGS=--system-site-packages TORCH_SPEC=" in refused.stderr  # what this make asked
    assert sum(call.startswith("-m venv") for call in _calls(tmp_path)) == 1
    shutil.rmtree(tmp_path / "venv")  # what `make clean` does to it
    before = len(_calls(tmp_path))
    assert _make(tmp_path, "install", *gpu).returncode == 0
    remade = _calls(tmp_path)[before:]
    assert remade[0].startswith("-m venv --system-site-packages")
    assert not any("torch" in call for call in remade)  # TORCH_SPEC= keeps the system's torch
    assert _make(tmp_path, "install", *gpu).returncode == 0  # the same settings: the same venv
    assert sum(call.startswith("-m venv") for call in _calls(tmp_path)) == 2
