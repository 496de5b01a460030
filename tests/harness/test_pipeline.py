"""`quantgate pipeline` and .buildkite/: schema-valid pipelines, tiers, pr selection by change."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from quantgate.harness.cli import main
from quantgate.harness.config import load_config
from quantgate.harness.pipeline import (
    agents_for,
    build_pipeline,
    collect,
    dependency_globs,
    exercised_backends,
    glob_match,
    select_for_changes,
    step_for,
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


@pytest.mark.parametrize("tier", ["pr", "nightly"])
def test_every_tier_of_a_tiny_matrix_validates(capsys: pytest.CaptureFixture[str], tiny_matrix: Path,
                                               tier: str) -> None:
    validate(emitted(capsys, "--tier", tier, str(tiny_matrix)))


def test_a_release_tier_with_no_release_config_is_refused(capsys: pytest.CaptureFixture[str], tiny_matrix: Path,
                                                          tmp_path: Path) -> None:
    """An empty release pipeline was a green release that tested nothing: a tag like `Release`
    or `relase` dropped the config from it silently."""
    assert main(["pipeline", "--tier", "release", str(tiny_matrix)]) == 3
    assert "is tagged release" in capsys.readouterr().err
    (tiny_matrix / "auto.yaml").write_text((tiny_matrix / "auto.yaml").read_text() + "tags: [Release]\n"
                                           "gate: wilson\nreference: {value: 0.5}\n")
    assert labels(emitted(capsys, "--tier", "release", str(tiny_matrix))) == {"auto"}


def test_bootstrap_pipeline_validates() -> None:
    validate(yaml.safe_load((REPO / ".buildkite" / "pipeline.yml").read_text()))


def test_bootstrap_retries_a_lost_or_stopped_agent_never_a_cancel() -> None:
    [step] = yaml.safe_load((REPO / ".buildkite" / "pipeline.yml").read_text())["steps"]
    rules = step["retry"]["automatic"]
    assert {"exit_status": -1, "signal_reason": "none", "limit": 2} in rules
    assert {"signal_reason": "agent_stop", "limit": 2} in rules
    assert all(rule.get("signal_reason") in ("none", "agent_stop") for rule in rules)


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
    # Exit 2 and a lost or stopped agent, never 1 or 3, nor a cancel or timeout (which Buildkite
    # reports with the status run-eval.sh exits with after its SIGTERM: 2, signal_reason cancel).
    assert step["retry"] == {"automatic": [{"exit_status": 2, "signal_reason": "none", "limit": 2},
                                           {"exit_status": -1, "signal_reason": "none", "limit": 2},
                                           {"signal_reason": "agent_stop", "limit": 2}]}
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
    odd.write_text("name: my-cfg\nmodel_name: m\naccuracy_threshold: 0.5\n")  # a ';' in a name is refused
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


def test_long_names_give_short_distinct_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for end in "ab":
        (tmp_path / f"{end}.yaml").write_text(f"name: {'x' * 119}{end}\nmodel_name: m\naccuracy_threshold: 0.5\n")
    pipeline = emitted(capsys, "--tier", "nightly", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"))
    validate(pipeline)  # the schema's maxLength 100
    keys = [step["key"] for step in pipeline["steps"]]
    assert len(set(keys)) == 2 and all(len(key) == 100 and key.startswith("x" * 80) for key in keys)


def test_a_uuid_shaped_name_gets_a_key_the_schema_allows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    name = "123e4567-e89b-12d3-a456-426614174000"
    (tmp_path / "u.yaml").write_text(f"name: {name}\nmodel_name: m\naccuracy_threshold: 0.5\n")
    pipeline = emitted(capsys, "--tier", "nightly", str(tmp_path / "u.yaml"))
    validate(pipeline)  # the key's `not` pattern
    assert pipeline["steps"][0]["key"] == f"config-{name}"


def test_a_semicolon_in_a_name_is_refused_as_the_agents_artifact_path_separator(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("name: fp8;marlin\nmodel_name: m\naccuracy_threshold: 0.5\n")
    assert main(["pipeline", "--tier", "nightly", str(tmp_path / "s.yaml")]) == 3
    err = capsys.readouterr().err
    assert "name: 'fp8;marlin' holds ';', which the Buildkite agent reads as the separator of artifact paths" in err


@pytest.mark.parametrize("file_name, body, what", [
    ("cfg[1].yaml", "", "the config file's path"),
    ("star.yaml", "name: fp8-*\n", "name 'fp8-*'"),
    ("brace.yaml", "num_fewshot: 0\ndataset: {test: 'q{1,2}.jsonl'}\n", "dataset"),
    ("cfg?.yaml", "", "the config file's path"),
    ("cfg\\1.yaml", "name: cfg-1\n", "the config file's path"),  # Buildkite's escape character
])
def test_glob_syntax_in_names_and_paths_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   file_name: str, body: str, what: str) -> None:
    # Buildkite reads if_changed and artifact_paths as globs: `cfg[1].yaml` would match cfg1.yaml
    # and never itself. Refused in every tier, so nightly finds it before a pull request does.
    (tmp_path / "q{1,2}.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    (tmp_path / file_name).write_text(f"model_name: m\naccuracy_threshold: 0.5\n{body}")
    assert main(["pipeline", "--tier", "nightly", str(tmp_path / file_name)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(str(tmp_path / file_name)) and what in err and "rename it without" in err


def test_dollar_names_stay_literal(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # upload-pipeline.sh uploads with --no-interpolation; the command quotes the path for the job's shell.
    (tmp_path / "cost$HOME.yaml").write_text('name: "fp8 $HOME"\nmodel_name: m\naccuracy_threshold: 0.5\n')
    step = emitted(capsys, "--tier", "nightly", str(tmp_path / "cost$HOME.yaml"))["steps"][0]
    assert step["label"] == "fp8 $HOME" and step["artifact_paths"][0] == "results/fp8 $HOME/**/*"
    assert shlex.split(step["command"])[-1].endswith("/cost$HOME.yaml")


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
    # `triton` names an MoE backend for a dense model: it has no layer that backend serves, so it
    # stays on a CPU agent, where auto never picks marlin.
    assert selected == {"marlin-args", "marlin-eq", "marlin-expect-only", "auto-pr"}
    # vllm-marlin runs vLLM's Marlin, not this repository's: it does not depend on kernels/.
    assert set(select_for_changes(pipeline, ["kernels/moe/triton.py"])) == {"triton", "auto-pr", "marlin-args"}
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
                     "kernels/linear/unquantized.py"):  # what `auto` picks on a GPU for lm_head
        assert expected in globs
    # Both layers name marlin: the FP8 kernels auto would pick are not this config's.
    assert "kernels/linear/triton_block.py" not in globs and "kernels/linear/torch_scaled_mm.py" not in globs
    emulation = dependency_globs(load_config(tiny_matrix / "emulation.yaml"))
    assert "kernels/linear/emulation.py" in emulation and "kernels/linear/marlin.py" not in emulation  # a CPU agent's


@pytest.mark.parametrize("body,agents", [
    # Their servers exit 3 on a CPU agent: the step goes where they can start.
    ("server_args: --linear-backend marlin\n", {"queue": "gpu", "gpus": "1", "sm80": "true"}),
    ("server_args: [--linear-backend=triton]\n", {"queue": "gpu", "gpus": "1", "sm89": "true"}),
    ("server_args: --device cuda\n", {"queue": "gpu", "gpus": "1"}),
    ("server_args: --device=cuda --moe-backend marlin\n", {"queue": "gpu", "gpus": "1"}),  # a dense model
    ("model_name: models/tiny-qwen3-moe-fp8-block-ct\nserver_args: --device=cuda --moe-backend marlin\n",
     {"queue": "gpu", "gpus": "1", "sm80": "true"}),
    # requires: stays the floor; a backend raises it, never lowers it.
    ("server_args: --linear-backend triton\nrequires: {min_compute_capability: '8.0'}\n",
     {"queue": "gpu", "gpus": "1", "sm89": "true"}),
    ("server_args: --linear-backend marlin\nrequires: {min_compute_capability: '9.0'}\n",
     {"queue": "gpu", "gpus": "1", "sm90": "true"}),
    # For the checkpoint's scheme: torch serves FP8 channel on a CPU, FP8 block only on 9.x.
    ("server_args: --linear-backend torch --moe-backend emulation\n", {"queue": "gpu", "gpus": "1", "sm90": "true"}),
    ("model_name: models/tiny-qwen3-fp8-channel-ct\nserver_args: --linear-backend torch\n", {"queue": "cpu"}),
    # triton MoE: 8.9 for FP8 experts (8.0 serves only unquantized ones); a dense model has none.
    ("model_name: models/tiny-qwen3-moe-fp8-block-ct\nserver_args: --moe-backend triton\n",
     {"queue": "gpu", "gpus": "1", "sm89": "true"}),
    ("server_args: --moe-backend triton\n", {"queue": "cpu"}),
    # A model folder not here (a variant not built yet): whatever scheme it has.
    ("model_name: models/not-built-yet\nserver_args: --moe-backend triton\n",
     {"queue": "gpu", "gpus": "1", "sm89": "true"}),
    ("server_args: --device cpu --linear-backend auto\n", {"queue": "cpu"}),
])
def test_a_builtin_server_that_needs_a_gpu_gets_a_gpu_agent(tmp_path: Path, body: str, agents: dict) -> None:
    path = tmp_path / "c.yaml"
    model = "" if body.startswith("model_name:") else "model_name: models/tiny-qwen3-fp8-block-ct\n"
    path.write_text(f"{model}accuracy_threshold: 0.5\n{body}")
    assert agents_for(load_config(path)) == agents


def test_gpu_configs_depend_on_what_auto_picks_on_every_agent_they_reach(tmp_path: Path) -> None:
    path = tmp_path / "gpu-auto.yaml"
    path.write_text("model_name: models/tiny-qwen3-fp8-block-ct\naccuracy_threshold: 0.5\n"
                    "requires: {gpus: 1, min_compute_capability: '8.0'}\n")
    globs = set(dependency_globs(load_config(path)))
    # 8.0's row (marlin), and 9.0's (torch block, triton) on the H100 agents that reach 8.0 too.
    assert {"kernels/linear/marlin.py", "kernels/linear/torch_scaled_mm.py", "kernels/linear/triton_block.py",
            "kernels/moe/triton.py", "kernels/linear/unquantized.py"} <= globs
    # The packages that hold them: an import runs their __init__.py first.
    assert {"kernels/linear/__init__.py", "kernels/moe/__init__.py", "kernels/triton/__init__.py"} <= globs


def test_unquantized_layers_rerun_gpu_configs_that_name_backends(capsys: pytest.CaptureFixture[str]) -> None:
    # lm_head and the MoE router select with auto whatever --linear-backend says: on a GPU,
    # UnquantizedLinearKernel (`quantgate kernels --device cuda --capability 9.0 --scheme unquantized`).
    groups, loose = collect(["eval_configs"])
    pipeline = build_pipeline(groups, loose, "pr")
    builtin = {c.name for c in _catalog() if c.engine == "builtin"}
    for changed in ("kernels/linear/unquantized.py", "kernels/linear/__init__.py"):
        assert builtin <= set(select_for_changes(pipeline, [changed])), changed
    assert "tiny-qwen3-fp8-block-ct-marlin" in builtin


def test_a_baseline_config_runs_in_the_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The runner runs a paired or recovery gate's baseline config first, in the same step.
    common = "model_name: models/tiny-qwen3-fp8-block-ct\nrequires: {gpus: 1, min_compute_capability: '8.9'}\n"
    (tmp_path / "base.yaml").write_text(f"{common}accuracy_threshold: 0.5\nserver_args: --linear-backend triton\n")
    (tmp_path / "cand.yaml").write_text(f"{common}gate: {{mode: paired}}\nbaseline: base\n"
                                        "server_args: --linear-backend marlin --moe-backend marlin\n")
    pipeline = emitted(capsys, "--tier", "pr", str(tmp_path / "cand.yaml"))
    validate(pipeline)
    [step] = pipeline["steps"]
    assert step["artifact_paths"][:2] == ["results/cand/**/*", "results/base/**/*"]
    assert select_for_changes(pipeline, ["kernels/linear/triton_block.py"]) == ["cand"]
    assert select_for_changes(pipeline, [shlex.split(step["command"])[-1].replace("cand", "base")]) == ["cand"]
    # A results file is read, not run: nothing of another config.
    run = tmp_path / "results" / "base"
    run.mkdir(parents=True)
    (run / "result.json").write_text("{}")
    (tmp_path / "cand.yaml").write_text(f"{common}gate: {{mode: paired}}\nbaseline: results/base/result.json\n")
    [step] = emitted(capsys, "--tier", "pr", str(tmp_path / "cand.yaml"))["steps"]
    assert step["artifact_paths"][1:] == ["results/junit.xml", "results/summary.md"]


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
    ("kernels/**/marlin.py", "kernels/marlin.py", True),  # `**/` spans no directory too
    ("kernels/linear?marlin.py", "kernels/linear/marlin.py", False),
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
    fake_tool(tmp_path / "bin", "buildkite-agent", f'[[ "$1 $2 $3 $4" == "pipeline upload --apply-if-changed '
              f'--no-interpolation" ]] && cp "$5" {record}\n')
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
    fake_venv(tmp_path, tmp_path / "bin")
    results = tmp_path / "results"
    config = "eval_configs/vllm/Qwen3-0.6B-FP8-block-auto.yaml"
    proc = run_script([".buildkite/scripts/run-local.sh", config], tmp_path / "bin", VENV=str(tmp_path / "venv"),
                      QUANTGATE_RESULTS=str(results), PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert (results / "args").read_text().split()[:2] == ["run", config]
    assert f"verdict {status}" in proc.stdout  # annotate.sh printed the summary


def fake_venv(tmp_path: Path, bin_dir: Path) -> Path:
    """The Makefile's venv (VENV, `make install` a stand-in that logs to make.log) whose python is
    this test's, except that the model build only logs to build.log and exits $FAKE_BUILD_EXIT."""
    fake_tool(bin_dir, "make", f'echo "$@" >> {tmp_path / "make.log"}\n')
    (tmp_path / "venv").mkdir()
    fake_tool(tmp_path / "venv" / "bin", "python", f'if [[ "${{1:-}}" == models/recipes/build_variants.py ]]; then '
              f'echo build >> {tmp_path / "build.log"}; exit "${{FAKE_BUILD_EXIT:-0}}"; fi\n'
              f'exec {sys.executable} "$@"\n')
    return tmp_path / "venv" / "bin" / "python"


_FAKE_RUN = """
import os, pathlib, sys
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--output-dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "args").write_text(" ".join(args))
pathlib.Path(args[args.index("--markdown") + 1]).write_text("verdict\\n")
sys.exit(int(os.environ.get("FAKE_RUN_EXIT", "0")))
"""


@pytest.fixture
def entry_point(tmp_path: Path) -> Path:
    """A bin folder with buildkite-agent, which logs to agent.log, and a stand-in `quantgate` entry
    point run by `#!.../python` as pip writes them, that python being fake_venv's."""
    bin_dir = tmp_path / "bin"
    python = fake_venv(tmp_path, bin_dir)
    fake_tool(bin_dir, "buildkite-agent", f'echo "$@" >> {tmp_path / "agent.log"}; cat > /dev/null\n')
    quantgate = bin_dir / "quantgate"
    quantgate.write_text(f"#!{python}{_FAKE_RUN}")
    quantgate.chmod(0o755)
    return bin_dir


def run_eval(bin_dir: Path, config: Path | str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_script([".buildkite/scripts/run-eval.sh", str(config)], bin_dir, PATH=f"{bin_dir}:/usr/bin:/bin",
                      QUANTGATE_RESULTS=str(bin_dir.parent / "results"), **env)


@pytest.mark.parametrize("build, status", [(0, 0), (3, 3), (1, 2)])
def test_a_wrapper_quantgate_builds_with_the_venv(tmp_path: Path, build: int, status: int) -> None:
    # A quantgate wrapper script hides its interpreter: the Makefile's venv reads the config and
    # builds the models, directly: `make models` exits 2 whatever the build's status.
    fake_tool(tmp_path / "bin", "quantgate", 'exit 0\n')
    fake_venv(tmp_path, tmp_path / "bin")
    proc = run_eval(tmp_path / "bin", "eval_configs/tiny/demo.yaml", VENV=str(tmp_path / "venv"),
                    FAKE_BUILD_EXIT=str(build))
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert (tmp_path / "make.log").read_text() == "install\n" and (tmp_path / "build.log").read_text() == "build\n"


@pytest.mark.parametrize("build, status", [(0, 0), (3, 3), (1, 2)])
def test_builtin_configs_build_the_models_first(entry_point: Path, build: int, status: int) -> None:
    # A manifest the build does not reproduce is exit 3, never retried (make would exit 2 for
    # it); other failures are retryable.
    proc = run_eval(entry_point, "eval_configs/tiny/demo.yaml", FAKE_BUILD_EXIT=str(build))
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert (entry_point.parent / "build.log").read_text() == "build\n"
    assert (entry_point.parent / "results" / "args").exists() is (build == 0)
    assert not (entry_point.parent / "make.log").exists()  # its own interpreter: nothing to install


@pytest.mark.parametrize("body", ["engine: 'vllm'\nmodel_name: q\naccuracy_threshold: 0.5\n",
                                  '"engine": "vllm"\nmodel_name: q\naccuracy_threshold: 0.5\n',
                                  "{engine: vllm, model_name: q, accuracy_threshold: 0.5}\n"])
def test_vllm_configs_build_nothing(entry_point: Path, body: str) -> None:
    # However the YAML spells it: the engine is read by quantgate's loader, not a grep.
    config = entry_point.parent / "q.yaml"
    config.write_text(body)
    proc = run_eval(entry_point, config, FAKE_BUILD_EXIT="3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (entry_point.parent / "build.log").exists()


def test_an_invalid_config_exits_3_before_anything_runs(entry_point: Path) -> None:
    config = entry_point.parent / "bad.yaml"
    config.write_text("model_name: m\naccuracy_threshold: 2\n")
    proc = run_eval(entry_point, config)
    assert proc.returncode == 3 and "accuracy_threshold" in proc.stderr
    assert not (entry_point.parent / "build.log").exists() and not (entry_point.parent / "results").exists()


def test_annotations_are_per_config_name(entry_point: Path) -> None:
    # Two gsm8k.yaml in different folders: each keeps its own annotation.
    for name in ("a", "b"):
        (entry_point.parent / name).mkdir()
        (entry_point.parent / name / "gsm8k.yaml").write_text(
            f"name: cfg-{name}\nengine: vllm\nmodel_name: Qwen/Qwen3-0.6B-FP8\naccuracy_threshold: 0.5\n")
        assert run_eval(entry_point, entry_point.parent / name / "gsm8k.yaml", FAKE_RUN_EXIT="1").returncode == 1
    contexts = [line.split("--context ")[1] for line in (entry_point.parent / "agent.log").read_text().splitlines()]
    assert contexts == ["quantgate-cfg-a", "quantgate-cfg-b"]


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


@pytest.mark.parametrize("lines, gpus", [
    ("engine: vllm\nserver_args: --tensor-parallel-size 8\n", "8"),
    ("engine: vllm\nserver_args: --tensor-parallel-size 8\nrequires: {gpus: 2}\n", "8"),
    ("engine: vllm\nserver_args: [-tp, '2', -pp, '2']\nrequires: {gpus: 1, device: h100}\n", "4"),
    ("engine: vllm\nserver_args: --tensor_parallel_size=2 --pipeline-parallel-size=3\n", "6"),
    ("engine: vllm\nserver_args: --tensor-parallel-size 2\nrequires: {gpus: 8}\n", "8"),
    # gen-1's tensor_parallel_size key is the same flag
    ("engine: vllm\ntensor_parallel_size: 4\n", "4"),
    # each data parallel replica is a tensor x pipeline parallel group of its own
    ("engine: vllm\nserver_args: --data-parallel-size 2\n", "2"),
    ("engine: vllm\nserver_args: [-dp, '2', -tp, '2']\nrequires: {gpus: 2}\n", "4"),
    ("engine: vllm\nserver_args: --data-parallel-size=2 -tp 2 -pp 2\n", "8"),
    ("engine: vllm\nserver_args: --data_parallel_size=4\n", "4"),
    # multi-node data parallelism: this machine holds the local replicas only
    ("engine: vllm\nserver_args: -dp 4 --data-parallel-size-local 2 -tp 2\n", "4"),
    ("engine: vllm\nserver_args: -dp 4 -dpl=1\n", "1"),
])
def test_tensor_and_pipeline_parallelism_ask_for_their_gpus(tmp_path: Path, lines: str, gpus: str) -> None:
    """A vLLM server of --tensor-parallel-size 8 went to a CPU agent, or to one of requires.gpus
    GPUs: it cannot start there."""
    from quantgate.harness.pipeline import agents_for

    path = tmp_path / "c.yaml"
    path.write_text("model_name: org/model\naccuracy_threshold: 0.5\n" + lines)
    agents = agents_for(load_config(path))
    assert agents["queue"] == "gpu" and agents["gpus"] == gpus


def test_no_parallelism_and_no_requires_stays_on_the_cpu_queue(tmp_path: Path) -> None:
    from quantgate.harness.pipeline import agents_for

    path = tmp_path / "c.yaml"
    path.write_text("model_name: org/model\naccuracy_threshold: 0.5\nserver_args: --max-num-seqs 4\n")
    assert agents_for(load_config(path)) == {"queue": "cpu"}


@pytest.mark.parametrize("lines", ["", "server_args: -tp 1\n", "server_args: --data-parallel-size 1\n"])
def test_a_vllm_config_without_requires_gets_one_gpu(tmp_path: Path, lines: str) -> None:
    """vLLM's server needs a GPU on CI: with no requires: and no parallelism it went to the CPU
    queue, where it cannot start."""
    from quantgate.harness.pipeline import agents_for

    path = tmp_path / "c.yaml"
    path.write_text("model_name: org/model\naccuracy_threshold: 0.5\nengine: vllm\n" + lines)
    assert agents_for(load_config(path)) == {"queue": "gpu", "gpus": "1"}


def test_the_engine_override_decides_the_queue(tmp_path: Path) -> None:
    """`pipeline --engine vllm` runs a builtin config on vLLM: a GPU agent; and the other way round."""
    from quantgate.harness.pipeline import agents_for

    path = tmp_path / "c.yaml"
    path.write_text("model_name: org/model\naccuracy_threshold: 0.5\n")
    assert agents_for(load_config(path, engine="vllm")) == {"queue": "gpu", "gpus": "1"}
    path.write_text("model_name: org/model\naccuracy_threshold: 0.5\nengine: vllm\n")
    assert agents_for(load_config(path, engine="builtin")) == {"queue": "cpu"}


def test_a_config_in_several_list_files_is_grouped_under_the_tiers_own(capsys: pytest.CaptureFixture[str]) -> None:
    """The release tier's configs sat under the group eval_configs/tiny/nightly.txt, the first list
    file by path that names them."""
    groups = {s["group"] for s in emitted(capsys, "--tier", "release")["steps"] if "group" in s}
    assert groups == {"eval_configs/tiny/release.txt", "eval_configs/vllm/release.txt"}
    pr = emitted(capsys, "--tier", "pr")["steps"]
    assert pr[0]["group"] == "eval_configs/tiny/pr.txt"


def test_a_results_file_baselines_answers_are_a_dependency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A paired gate reads the baseline's per-question answers beside its result.json: a PR
    changing only them ran no step."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").symlink_to(REPO / "models")
    base = tmp_path / "baselines" / "demo"
    base.mkdir(parents=True)
    (base / "result.json").write_text('{"schema_version": 1, "name": "demo", "verdict": "PASS", "metrics": '
                                      '{"metric": "exact_match,strict-match", "value": 0.8, "n": 10}}\n')
    (base / "samples.jsonl").write_text("")
    (tmp_path / "paired.yaml").write_text("model_name: models/tiny-qwen3\nbaseline: baselines/demo\n"
                                          "gate: {mode: paired}\n")
    globs = dependency_globs(load_config(tmp_path / "paired.yaml"))
    assert "baselines/demo/result.json" in globs and "baselines/demo/samples.jsonl" in globs


def test_a_partial_minute_of_start_up_rounds_the_timeout_up(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # 1230 s start-up + 3600 s evaluation is 80.5 minutes: at 80 the job is stopped inside the time it was given.
    (tmp_path / "slow.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\nstartup_max_wait_seconds: 1230\n")
    assert emitted(capsys, "--tier", "nightly", str(tmp_path / "slow.yaml"))["steps"][0]["timeout_in_minutes"] == 81


def test_a_vllm_config_depends_on_the_harness_not_on_this_repositorys_engine(tiny_matrix: Path) -> None:
    globs = dependency_globs(load_config(tiny_matrix / "vllm-marlin.yaml"))
    assert "harness/**" in globs
    assert not [g for g in globs if g.startswith(("engine/", "kernels/", "models/"))]


def test_no_step_is_soft_fail_or_optional(capsys: pytest.CaptureFixture[str]) -> None:
    """An optional job let a crash reach main: every step gates its build. A negative check, built
    to FAIL, passes through run-eval.sh --expect-fail, never through soft_fail."""
    for step in _steps(emitted(capsys, "--tier", "nightly")):
        assert not {"soft_fail", "skip", "allow_dependency_failure"} & step.keys(), step["label"]


def test_every_step_carries_its_tier(capsys: pytest.CaptureFixture[str], tiny_matrix: Path) -> None:
    for tier in ("pr", "nightly"):
        pipeline = emitted(capsys, "--tier", tier, str(tiny_matrix))
        assert pipeline["env"] == {"QUANTGATE_TIER": tier}
        assert all(step["env"] == {"QUANTGATE_TIER": tier} for step in _steps(pipeline)), tier


def test_requires_gpus_alone_sends_a_config_to_a_gpu_agent(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\nrequires: {gpus: 1}\n")
    assert agents_for(load_config(path)) == {"queue": "gpu", "gpus": "1"}


def test_a_recovery_gates_baseline_config_runs_in_the_step_too(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    common = "model_name: models/tiny-qwen3-fp8-block-ct\nrequires: {gpus: 1, min_compute_capability: '8.9'}\n"
    (tmp_path / "base.yaml").write_text(f"{common}accuracy_threshold: 0.5\nserver_args: --linear-backend triton\n")
    (tmp_path / "cand.yaml").write_text(f"{common}gate: {{mode: recovery}}\nbaseline: base\n"
                                        "server_args: --linear-backend marlin --moe-backend marlin\n")
    pipeline = emitted(capsys, "--tier", "pr", str(tmp_path / "cand.yaml"))
    assert pipeline["steps"][0]["artifact_paths"][:2] == ["results/cand/**/*", "results/base/**/*"]
    assert select_for_changes(pipeline, ["kernels/linear/triton_block.py"]) == ["cand"]


def test_configs_named_alike_in_two_folders_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "gsm8k.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    assert main(["pipeline", str(tmp_path / "a"), str(tmp_path / "b")]) == 3
    assert "'gsm8k' is also the name of" in capsys.readouterr().err


def test_a_config_outside_the_repository_root_is_warned_about(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    (tmp_path / "away.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    assert main(["pipeline", str(tmp_path / "away.yaml")]) == 0
    assert "warning: 1 step(s) name configs outside the current directory (away)" in capsys.readouterr().err


def test_keys_stay_whole_up_to_the_limit_and_distinct_beyond_it(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    # Beyond 100 characters, names that differ only in a character no key holds ('.' and '-')
    # must still get two keys: the hash is of the name, not of the key.
    names = ["x" * 100, f"{'y' * 60}.{'y' * 60}", f"{'y' * 60}-{'y' * 60}"]
    for index, name in enumerate(names):
        (tmp_path / f"{index}.yaml").write_text(f"name: {name}\nmodel_name: m\naccuracy_threshold: 0.5\n")
    pipeline = emitted(capsys, "--tier", "nightly", *(str(tmp_path / f"{index}.yaml") for index in range(3)))
    validate(pipeline)
    keys = [step["key"] for step in pipeline["steps"]]
    assert keys[0] == names[0] and len(set(keys)) == 3


def test_a_folder_and_its_config_of_the_same_name_get_different_keys(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "gsm8k.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    monkeypatch.chdir(tmp_path)
    [group] = emitted(capsys, "--tier", "nightly", "gsm8k")["steps"]
    assert group["key"] != group["steps"][0]["key"]  # Buildkite refuses a pipeline whose steps share a key


def test_auto_is_no_exercised_backend(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear-backend auto --moe-backend marlin\n")
    assert exercised_backends(load_config(path)) == {"marlin"}


def test_a_module_imported_by_name_from_its_package_is_a_dependency(tmp_path: Path) -> None:
    from quantgate.harness.pipeline import _kernel_imports

    source = tmp_path / "kernel.py"
    source.write_text("from . import experts\nfrom .. import quant\n")
    imported = _kernel_imports("quantgate.kernels.moe.kernel", source)
    assert {"quantgate.kernels.moe.experts", "quantgate.kernels.quant"} <= set(imported)


def test_a_step_that_runs_a_baseline_config_has_an_agent_and_the_time_for_both(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The runner runs a paired gate's baseline config first, in the same step: a candidate that
    runs on a CPU took its GPU baseline to a CPU agent, whose runner refused the baseline's
    requires: (exit 3, never retried), and the step had the time of one run."""
    model = "model_name: models/tiny-qwen3-fp8-block-ct\n"
    (tmp_path / "base.yaml").write_text(f"{model}accuracy_threshold: 0.5\nrequires: {{device: h100}}\n"
                                        "server_args: --linear-backend triton\nstartup_max_wait_seconds: 600\n")
    (tmp_path / "cand.yaml").write_text(f"{model}gate: {{mode: paired}}\nbaseline: base\n")
    step = step_for(load_config(tmp_path / "cand.yaml"), "nightly")
    assert step["agents"] == {"queue": "gpu", "gpus": "1", "device": "h100", "sm89": "true"}
    assert step["timeout_in_minutes"] == 80 + 70  # (1200 + 3600) / 60 the candidate's, (600 + 3600) / 60 the baseline's
    (tmp_path / "cand.yaml").write_text(f"{model}gate: {{mode: paired}}\nbaseline: base\nrequires: {{device: a100}}\n")
    assert main(["pipeline", "--tier", "nightly", str(tmp_path / "cand.yaml")]) == 3
    err = capsys.readouterr().err
    assert "requires.device: 'a100', but its baseline config" in err and "give both the same requires.device" in err


def test_a_cpu_config_whose_baseline_needs_a_gpu_depends_on_what_auto_picks_on_the_gpu(tmp_path: Path) -> None:
    """Its step runs on the baseline's GPU agent, where `auto` picks GPU kernels for it: a change to
    one of them must re-run it in a pull request (its globs held only the CPU agent's picks)."""
    model = "model_name: models/tiny-qwen3-fp8-block-ct\n"
    (tmp_path / "base.yaml").write_text(f"{model}accuracy_threshold: 0.5\nserver_args: --linear-backend triton\n")
    (tmp_path / "cand.yaml").write_text(f"{model}gate: {{mode: paired}}\nbaseline: base\n")
    (tmp_path / "alone.yaml").write_text(f"{model}accuracy_threshold: 0.5\n")
    on_cpu = set(dependency_globs(load_config(tmp_path / "alone.yaml")))
    assert "kernels/linear/marlin.py" not in on_cpu  # auto on a CPU agent: emulation
    globs = set(dependency_globs(load_config(tmp_path / "cand.yaml")))
    assert {"kernels/linear/marlin.py", "kernels/linear/torch_scaled_mm.py"} <= globs  # auto's on 8.9+ GPUs
