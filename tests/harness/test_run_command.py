"""`quantgate run`'s own flags reach the run: the runner's behaviour under each option is
test_runner's (through `run_configs`); here, that the command line sets it."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from quantgate.harness.cli import main as cli
from quantgate.harness.server import build_command
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import FAKE_SERVER, fake_args, launch, load_json, write_config

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture


def test_run_writes_junit_and_summary_where_named_and_skips_unmet_configs_only_when_asked(
        tmp_path: Path, gsm8k_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = write_config(tmp_path, "big", gsm8k_dir, requires={"gpus": 64})
    fine = write_config(tmp_path, "fine", gsm8k_dir)
    out, junit, summary = tmp_path / "out", tmp_path / "ci" / "tests.xml", tmp_path / "ci" / "annotation.md"
    # CI's default: a config this machine cannot run is an error, before any server starts
    assert cli(["run", str(big), str(fine), "--output-dir", str(out)]) == 3
    assert "big.yaml: this config requires 64 GPU(s)" in capsys.readouterr().err
    assert cli(["run", str(big), str(fine), "--output-dir", str(out), "--junit", str(junit),
                "--markdown", str(summary), "--skip-unmet-requires", "--limit", "3"]) == 0
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2" and suite.get("skipped") == "1"
    assert "1 PASS, 0 FAIL, 0 ERROR, 1 skipped" in summary.read_text()
    assert not (out / "junit.xml").exists() and not (out / "summary.md").exists()
    assert load_json(out / "fine" / "result.json")["metrics"]["n"] == 3


def test_run_evaluates_the_server_at_server_url_instead_of_launching_one(tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(build_command("vllm", "fake-model", fake_args(gsm8k_dir), {}, [sys.executable, str(FAKE_SERVER)]),
                    tmp_path / "external.log", startup_timeout_s=30)
    try:
        # launched, this command would fail at once: only the attached server can pass
        config = write_config(tmp_path, "cfg", gsm8k_dir, num_questions=3,
                              vllm_command=[sys.executable, "-c", "raise SystemExit(1)"])
        assert cli(["run", str(config), "--output-dir", str(tmp_path / "out"), "--server-url", server.base_url]) == 0
    finally:
        server.stop()
    assert load_json(tmp_path / "out" / "cfg" / "result.json")["server"]["attached"] is True


def test_run_engine_replaces_the_configs_engine(tmp_path: Path, gsm8k_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "cfg", gsm8k_dir, server_args=["--linear-backend", "cutlass"])
    assert cli(["run", str(config), "--engine", "builtin", "--output-dir", str(tmp_path / "out")]) == 3
    assert "unknown --linear-backend value 'cutlass' for engine builtin" in capsys.readouterr().err
