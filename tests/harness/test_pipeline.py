"""`quantgate pipeline` and .buildkite/: schema-valid pipelines, tiers, pr selection by change."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from quantgate.harness.cli import main
from quantgate.harness.config import load_config
from quantgate.harness.pipeline import (
    build_pipeline,
    collect,
    dependency_globs,
    exercised_backends,
    glob_match,
    select_for_changes,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "buildkite" / "buildkite-pipeline-schema.json").read_text())
MARLIN_LINEAR = "kernels/linear/marlin.py"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # pipeline paths are repository-relative, as on a Buildkite agent


def validate(pipeline: dict) -> None:
    jsonschema.validate(pipeline, SCHEMA)


def emitted(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["pipeline", *args]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def _steps(pipeline: dict) -> list[dict]:
    return [s for step in pipeline["steps"] for s in (step["steps"] if "group" in step else [step])]


def labels(pipeline: dict) -> set[str]:
    out = set()
    for step in pipeline["steps"]:
        out |= {s["label"] for s in step["steps"]} if "group" in step else {step["label"]}
    return out


@pytest.fixture
def tiny_matrix(tmp_path: Path) -> Path:
    """Builtin configs naming marlin in different ways, others not, one tagged pr."""
    configs = {
        "marlin-args": "server_args: --linear-backend marlin --moe-backend marlin\n",
        "marlin-eq": "server_args: [--moe-backend=MARLIN]\n",
        "marlin-expect-only": "expect: {linear_kernel: MarlinFp8LinearKernel}\n",
        "triton": "server_args: --moe-backend triton\nexpect: {moe_kernel: triton}\n",
        "emulation": "server_args: --linear-backend emulation\n",
        "auto": "",
        "auto-pr": "tags: [pr]\n",
        "vllm-marlin": "engine: vllm\nserver_args: --moe-backend marlin\n",
    }
    for name, body in configs.items():
        (tmp_path / f"{name}.yaml").write_text(f"model_name: models/tiny-qwen3-fp8-block-ct\n"
                                               f"accuracy_threshold: 0.5\n{body}")
    (tmp_path / "pr.txt").write_text("auto-pr.yaml\nmarlin-args.yaml\n")
    return tmp_path


# -- schema validity of every tier ----------------------------------------------------------------


@pytest.mark.parametrize("tier", ["pr", "nightly", "release"])
def test_every_tier_of_the_catalog_validates(capsys: pytest.CaptureFixture[str], tier: str) -> None:
    pipeline = emitted(capsys, "--tier", tier)
    validate(pipeline)
    assert pipeline["steps"], tier


@pytest.mark.parametrize("tier", ["pr", "nightly", "release"])
def test_every_tier_of_a_tiny_matrix_validates(capsys: pytest.CaptureFixture[str], tiny_matrix: Path,
                                               tier: str) -> None:
    validate(emitted(capsys, "--tier", tier, str(tiny_matrix)))


def test_bootstrap_pipeline_validates() -> None:
    validate(yaml.safe_load((REPO / ".buildkite" / "pipeline.yml").read_text()))


# -- steps ----------------------------------------------------------------------------------------------


def test_step_shape(capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = emitted(capsys, "--tier", "nightly", "eval_configs/vllm/nightly-fp8-moe.txt")
    [group] = pipeline["steps"]
    assert group["group"] == "eval_configs/vllm/nightly-fp8-moe.txt" and len(group["steps"]) == 6
    step = group["steps"][0]
    assert step["label"] == "vllm-Qwen3-30B-A3B-Fp8-AutoFp8-marlin"
    assert step["command"] == ".buildkite/scripts/run-eval.sh eval_configs/vllm/Qwen3-30B-A3B-Fp8-AutoFp8-marlin.yaml"
    # requires: {gpus: 2, device: h100, min_compute_capability: "8.0"}: the capability as the tag an
    # agent sets for each capability it reaches.
    assert step["agents"] == {"queue": "gpu", "gpus": "2", "device": "h100", "sm80": "true"}
    assert step["retry"] == {"automatic": [{"exit_status": 2, "limit": 2}]}  # never 1 or 3
    assert step["timeout_in_minutes"] == 80  # 1200 s start-up + 3600 s evaluation
    assert step["artifact_paths"] == ["results/vllm-Qwen3-30B-A3B-Fp8-AutoFp8-marlin/**/*", "results/junit.xml",
                                      "results/summary.md"]
    assert "if_changed" not in step  # nightly runs everything


def test_triton_configs_ask_for_agents_that_reach_8_9(capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = emitted(capsys, "--tier", "nightly", "eval_configs/tiny/tiny-qwen3-fp8-block-native-triton.yaml")
    assert pipeline["steps"][0]["agents"] == {"queue": "gpu", "gpus": "1", "sm89": "true"}


def test_engine_override_reaches_the_step_and_names_are_quoted(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    step = emitted(capsys, "--tier", "nightly", "--engine", "vllm",
                   "eval_configs/tiny/tiny-qwen3-fp8-block-ct-marlin.yaml")["steps"][0]
    assert step["command"] == (".buildkite/scripts/run-eval.sh --engine vllm "
                               "eval_configs/tiny/tiny-qwen3-fp8-block-ct-marlin.yaml")
    odd = tmp_path / "my cfg;x.yaml"
    odd.write_text("model_name: m\naccuracy_threshold: 0.5\n")
    step = emitted(capsys, "--tier", "nightly", str(odd))["steps"][0]
    assert shlex.split(step["command"])[-1].endswith("/my cfg;x.yaml")  # one argument, not two commands


def test_clashing_keys_and_empty_inputs_are_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for name in ("qwen3-0.6b", "qwen3-0-6b"):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nmodel_name: m\naccuracy_threshold: 0.5\n")
    assert main(["pipeline", str(tmp_path)]) == 3
    assert "both become the Buildkite key 'qwen3-0-6b'" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["pipeline", str(tmp_path / "empty")]) == 3
    assert "no configs in the given paths" in capsys.readouterr().err


def test_ci_files_rerun_every_pr_config(capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = emitted(capsys, "--tier", "pr", "eval_configs")
    for changed in ("constraints.txt", ".buildkite/scripts/run-eval.sh", "Makefile"):
        assert select_for_changes(pipeline, [changed]) == [s["label"] for s in _steps(pipeline)], changed


def test_cpu_configs_go_to_the_cpu_queue(capsys: pytest.CaptureFixture[str], tiny_matrix: Path) -> None:
    pipeline = emitted(capsys, "--tier", "nightly", str(tiny_matrix / "auto.yaml"))
    assert pipeline["steps"][0]["agents"] == {"queue": "cpu"}


def test_release_tier_takes_tagged_statistical_configs(capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = emitted(capsys, "--tier", "release")
    assert labels(pipeline) == {c.name for c in _catalog() if "release" in c.tags}
    assert all(c.gate.mode in ("hypothesis", "wilson", "paired") for c in _catalog() if "release" in c.tags)


def test_each_config_is_one_step_even_when_listed_twice(capsys: pytest.CaptureFixture[str], tiny_matrix: Path) -> None:
    pipeline = emitted(capsys, "--tier", "nightly", str(tiny_matrix))
    steps = [s["label"] for g in pipeline["steps"] for s in g["steps"]]
    assert sorted(steps) == sorted(set(steps)) and len(steps) == 8
    assert pipeline["steps"][0]["group"].endswith("pr.txt")


# -- pr tier: selection by change -------------------------------------------------------------------------


def test_marlin_kernel_change_selects_marlin_configs_and_pr_tagged(tiny_matrix: Path) -> None:
    groups, loose = collect([tiny_matrix])
    pipeline = build_pipeline(groups, loose, "pr")
    selected = set(select_for_changes(pipeline, [MARLIN_LINEAR]))
    assert selected == {"marlin-args", "marlin-eq", "marlin-expect-only", "auto-pr"}
    # vllm-marlin runs vLLM's Marlin, not this repository's: it does not depend on kernels/.
    assert set(select_for_changes(pipeline, ["kernels/moe/triton.py"])) == {"triton", "auto-pr"}
    assert set(select_for_changes(pipeline, ["kernels/registry.py"])) == labels(pipeline) - {"vllm-marlin"}
    assert set(select_for_changes(pipeline, ["README.md"])) == {"auto-pr"}
    model_change = set(select_for_changes(pipeline, ["models/tiny-qwen3/model.safetensors"]))
    assert model_change == labels(pipeline) - {"vllm-marlin"}


def test_marlin_change_on_the_catalog_selects_exactly_its_marlin_configs(capsys: pytest.CaptureFixture[str]) -> None:
    catalog = _catalog()
    expected = {c.name for c in catalog if "pr" in c.tags
                or (c.engine == "builtin" and "marlin" in exercised_backends(c))}
    groups, loose = collect(["eval_configs"])
    assert set(select_for_changes(build_pipeline(groups, loose, "pr"), [MARLIN_LINEAR])) == expected


def test_changed_files_option_filters_here(capsys: pytest.CaptureFixture[str], tiny_matrix: Path,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    changes = tmp_path_factory.mktemp("diff") / "changed.txt"
    changes.write_text(f"{MARLIN_LINEAR}\n\n")
    pipeline = emitted(capsys, "--tier", "pr", "--changed-files", str(changes), str(tiny_matrix))
    validate(pipeline)
    assert labels(pipeline) == {"marlin-args", "marlin-eq", "marlin-expect-only", "auto-pr"}
    assert "if_changed" not in json.dumps(pipeline)


def test_dependencies_of_a_builtin_config(tiny_matrix: Path) -> None:
    globs = dependency_globs(load_config(tiny_matrix / "marlin-args.yaml"))
    assert globs[0].endswith("marlin-args.yaml")
    for expected in ("models/tiny-qwen3/**", "models/recipes/**", "engine/**", "kernels/*.py",
                     "kernels/linear/marlin.py", "kernels/moe/marlin.py",
                     "kernels/linear/emulation.py"):  # what `auto` picks on CPU for the other layers
        assert expected in globs
    assert "kernels/moe/triton.py" not in globs and "kernels/linear/triton_block.py" not in globs


def test_kernel_dependencies_follow_imports(tiny_matrix: Path) -> None:
    # The MoE emulation kernel reuses the linear emulation's activation quantization and the
    # shared expert helpers: a change to either re-runs the configs that use it.
    globs = dependency_globs(load_config(tiny_matrix / "auto.yaml"))
    assert {"kernels/moe/emulation.py", "kernels/moe/experts.py", "kernels/linear/emulation.py"} <= set(globs)


@pytest.mark.parametrize("pattern, path, hit", [
    ("kernels/*.py", "kernels/registry.py", True),
    ("kernels/*.py", "kernels/linear/marlin.py", False),
    ("engine/**", "engine/a/b.py", True),
    ("models/tiny-qwen3/**", "models/tiny-qwen3-moe/config.json", False),
    ("kernels/triton/*marlin*", "kernels/triton/marlin_gemm.py", True),
    ("**.go", "a/b/c.go", True),
])
def test_glob_semantics(pattern: str, path: str, hit: bool) -> None:
    assert glob_match(pattern, path) is hit


def test_invalid_input_exits_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["pipeline", str(tmp_path / "absent")]) == 3
    assert main(["pipeline", "--tier", "nightly", "--changed-files", "x"]) == 3
    (tmp_path / "r.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\ntags: [release]\n")
    assert main(["pipeline", "--tier", "release", str(tmp_path)]) == 3
    assert "statistical gate" in capsys.readouterr().err


# -- the scripts -------------------------------------------------------------------------------------------------


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_script(args: list[str], bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(args, cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)


def test_upload_script_pipes_the_tier_into_the_agent(tmp_path: Path) -> None:
    record = tmp_path / "uploaded.yml"
    fake_tool(tmp_path / "bin", "buildkite-agent", f'[[ "$1 $2 $3" == "pipeline upload --apply-if-changed" ]] '
              f'&& cp "$4" {record}\n')
    proc = run_script([".buildkite/scripts/upload-pipeline.sh"], tmp_path / "bin", BUILDKITE_PULL_REQUEST="123")
    assert proc.returncode == 0, proc.stderr
    uploaded = yaml.safe_load(record.read_text())
    validate(uploaded)
    assert uploaded["env"]["QUANTGATE_TIER"] == "pr"


def test_annotate_without_agent_prints_the_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("| config | verdict |\n")
    proc = run_script([".buildkite/scripts/annotate.sh", str(summary), "ctx", "1"], tmp_path / "empty",
                      PATH="/usr/bin:/bin")
    assert proc.returncode == 0 and "buildkite-agent not found" in proc.stdout and "| config |" in proc.stdout


def test_annotate_with_agent_sets_style_and_context(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("FAIL\n")
    record = tmp_path / "args"
    fake_tool(tmp_path / "bin", "buildkite-agent", f'echo "$@" > {record}; cat >> {record}\n')
    proc = run_script([".buildkite/scripts/annotate.sh", str(summary), "ctx", "1"], tmp_path / "bin")
    assert proc.returncode == 0
    assert record.read_text() == "annotate --style error --context ctx\nFAIL\n"


@pytest.mark.parametrize("status", [0, 1, 2])
def test_run_local_reproduces_the_step_exit_status(tmp_path: Path, status: int) -> None:
    # A stand-in quantgate: the script plumbing (install, run, annotate, exit status) is what
    # is under test here; the real runs are the runner's tests.
    fake_tool(tmp_path / "bin", "quantgate", f'mkdir -p "$4"; echo "verdict {status}" > "$4/summary.md"; '
              f'echo "$@" > "$4/args"; exit {status}\n')
    results = tmp_path / "results"
    config = "eval_configs/vllm/Qwen3-0.6B-FP8-block-auto.yaml"
    proc = run_script([".buildkite/scripts/run-local.sh", config], tmp_path / "bin",
                      QUANTGATE_RESULTS=str(results), PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert (results / "args").read_text().split()[:2] == ["run", config]
    assert f"verdict {status}" in proc.stdout  # annotate.sh printed the summary


def _catalog():
    groups, loose = collect(["eval_configs"])
    return [c for g in groups for c in g.configs] + loose


def test_any_requires_key_sends_a_config_to_a_gpu_agent(tmp_path: Path) -> None:
    """The runner refuses any requires: on a machine without a GPU: a CPU agent would exit 3."""
    from quantgate.harness.config import load_config
    from quantgate.harness.pipeline import agents_for

    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\nrequires: {device: h100}\n")
    assert agents_for(load_config(path)) == {"queue": "gpu", "gpus": "1", "device": "h100"}
