"""End to end: `quantgate run` as a process, through a real `quantgate serve` process, real
lm-eval and the real kernel report.

The first test serves a small random FP8-block checkpoint (the engine tests' builder), so it
runs on any checkout; its accuracy is 0 by construction and the gate is set accordingly. The
second runs the shipped tiny model's demo config when the model is present.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from quantgate.kernels import Scheme
from tests.engine.tiny_models import quantize_folder, write_model
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import REPO, load_json, pid_alive, run_cli

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture
DEMO_CONFIG = REPO / "eval_configs" / "tiny" / "demo.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fp8_block_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    return quantize_folder(write_model(root / "bf16"), root / "fp8-block", Scheme.FP8_BLOCK, "fp8")


def _config(directory: Path, name: str, model: Path, data: Path, **fields) -> Path:
    config = {"name": name, "model_name": str(model),
              "server_args": "--linear-backend auto --max-model-len 512",
              "dataset": {"train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")},
              "num_fewshot": 2, "num_questions": 6, "max_tokens": 8, "max_concurrency": 4,
              "accuracy_threshold": 0.0, "tolerance": 0.0, "startup_max_wait_seconds": 300, **fields}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_run_through_quantgate_serve_proves_the_kernel(tmp_path: Path, gsm8k_dir: Path,
                                                       fp8_block_model: Path) -> None:
    ran = _config(tmp_path, "fp8-emulation", fp8_block_model, gsm8k_dir, expect={"linear_kernel": "emulation"})
    claimed = _config(tmp_path, "fp8-claims-marlin", fp8_block_model, gsm8k_dir, expect={"linear_kernel": "marlin"})
    run = run_cli("run", ran, claimed, "--output-dir", tmp_path / "out", timeout=600)
    assert run.returncode == 1, run.output  # the second config's kernel claim is false
    good = load_json(tmp_path / "out" / "fp8-emulation" / "result.json")
    assert good["verdict"] == "PASS", good["reason"]
    assert good["kernels"]["source"] == "GET /v1/kernels"
    modules = good["kernels"]["modules"]
    quantized = {name: m for name, m in modules.items() if m["scheme"] == "fp8-block"}
    assert quantized and all(m["kernel"] == "EmulationLinearKernel" for m in quantized.values())
    assert good["metrics"]["n"] == 6 and good["versions"]["engine"]
    assert good["server"]["exit_status"] is not None and not pid_alive(good["server"]["pid"])
    assert len((tmp_path / "out" / "fp8-emulation" / "samples.jsonl").read_text().splitlines()) == 6
    bad = load_json(tmp_path / "out" / "fp8-claims-marlin" / "result.json")
    assert bad["verdict"] == "FAIL" and bad["gate"]["passed"] is True
    assert "expected 'marlin'" in bad["reason"] and "EmulationLinearKernel (backend emulation)" in bad["reason"]
    assert "model.layers.0.self_attn.q_proj" in bad["reason"]  # 128-row scale blocks would straddle q/k/v (64 rows each)
    assert "accuracy passed, but the backend under test did not run" in run.output


@pytest.mark.skipif(not DEMO_CONFIG.is_file(), reason="eval_configs/tiny/demo.yaml is not in this checkout yet")
def test_demo_config_reaches_a_verdict(tmp_path: Path) -> None:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    model = REPO / config["model_name"] if not Path(config["model_name"]).is_absolute() else Path(config["model_name"])
    if not (model / "config.json").is_file():
        pytest.skip(f"{model} is not built (make models)")
    run = run_cli("run", DEMO_CONFIG, "--limit", "20", "--output-dir", tmp_path / "out", timeout=600, cwd=REPO)
    result = load_json(next((tmp_path / "out").glob("*/result.json")))
    assert run.returncode in (0, 1), run.output
    assert result["verdict"] in ("PASS", "FAIL") and result["metrics"]["n"] == 20
    assert result["kernels"]["source"] == "GET /v1/kernels" and result["expect"]["passed"]
    # 20 questions are too few for the gate (its margin is set for 500), not for a floor: the
    # model scores 0.882 on all 500, and a broken kernel or prompt path scores near 0.
    assert result["metrics"]["value"] >= 0.5, result["metrics"]
