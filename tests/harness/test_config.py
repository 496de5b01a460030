"""Config loading: vLLM's real files unchanged, the extensions, and located errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from quantgate.harness.config import (
    ConfigError,
    check_unique_names,
    expand_paths,
    inspect_config,
    load_config,
    parallel_gpus,
    read_list_file,
)

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
GSM8K = FIXTURES / "gsm8k"
GEN1 = FIXTURES / "lm-eval-harness"


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def errors_of(path: Path, engine: str | None = None) -> list[str]:
    return [str(e) for e in inspect_config(path, engine).errors]


# -- real vLLM files ---------------------------------------------------------------------------


def test_every_listed_gen2_config_loads_unchanged() -> None:
    paths = read_list_file(GSM8K / "models-small.txt")
    assert len(paths) == 8
    configs = [load_config(p) for p in paths]
    qwen = next(c for c in configs if c.name == "Qwen3-0.6B-FP8")
    assert qwen.model_name == "Qwen/Qwen3-0.6B-FP8"
    assert qwen.accuracy_threshold == 0.375 and qwen.tolerance == 0.08
    assert qwen.num_questions == 1319 and qwen.num_fewshot == 5
    assert qwen.server_args == ["--enforce-eager", "--max-model-len", "4096"]
    assert qwen.gate.mode == "absolute" and qwen.engine == "builtin"
    assert qwen.startup_max_wait_seconds == 1200 and qwen.max_tokens == 256


def test_gen2_extra_keys_are_kept_and_reported() -> None:
    report = inspect_config(GSM8K / "DeepSeek-V2-Lite-Instruct-FP8.yaml")
    assert report.errors == []
    assert report.config is not None
    assert report.config.extra == {"rocm_request_timeout_seconds": 1800}
    assert report.config.request_timeout_seconds == 2400 and report.config.startup_max_wait_seconds == 2400
    [warning] = report.warnings
    assert (warning.line, warning.field) == (8, "rocm_request_timeout_seconds")


def test_gen2_max_model_len_key_becomes_the_server_flag() -> None:
    config = load_config(GSM8K / "Llama-3.2-1B-Instruct-INT8-CT.yaml")
    assert config.server_args == ["--max-model-len", "4096"]


def test_folded_server_args_keep_every_argument() -> None:
    config = load_config(GSM8K / "Laguna-XS.2-NVFP4.yaml")
    assert config.server_args[:4] == ["--max-model-len", "4096", "--moe-backend", "marlin"]
    assert config.server_args[-1] == "39" and len(config.server_args) == 4 + 1 + 40
    assert config.backend_flags() == {"--moe-backend": "marlin"}


def test_gen1_config_maps_to_a_relative_gate() -> None:
    config = load_config(GEN1 / "Meta-Llama-3-8B-Instruct-FP8-compressed-tensors.yaml")
    assert config.task == "gsm8k" and config.metric == "exact_match,strict-match"
    assert config.reference is not None and config.reference.value == 0.755
    assert config.num_questions == 1000 and config.gate.mode == "relative" and config.effective_rtol == 0.08


def test_gen1_with_another_metric_gates_what_it_lists(tmp_path: Path) -> None:
    text = ("model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - {name: 'exact_match,flexible-extract', value: 0.7}\n"
            "max_model_len: 4096\n")
    config = load_config(write(tmp_path, text), engine="vllm")
    assert (config.task, config.metric, config.reference.value) == ("gsm8k", "exact_match,flexible-extract", 0.7)
    assert config.server_args == ["--max-model-len", "4096"]


def test_a_task_quantgate_cannot_rebuild_is_refused_at_load_on_its_line() -> None:
    """aime25's YAML calls Python (`!function`): its run would fail only after the server started."""
    [error] = inspect_config(GEN1 / "gpt-oss-120b.yaml", engine="vllm").errors
    assert (error.line, error.field) == (4, "tasks[0].name")
    assert "'aime25'" in error.message and "!function" in error.message and "gsm8k" in error.message


def test_gen1_engine_options_become_flags(tmp_path: Path) -> None:
    text = ('model_name: "/root/engines/c4"\ntasks:\n- name: "gsm8k"\n  metrics:\n  - name: "exact_match,strict-match"\n'
            "    value: 0.65\nlimit: 512\nmax_num_batched_tokens: 128\n")
    config = load_config(write(tmp_path, text), "vllm")
    assert config.server_args == ["--max-num-batched-tokens", "128"]
    assert (config.task, config.metric, config.num_questions) == ("gsm8k", "exact_match,strict-match", 512)


def test_a_group_of_tasks_is_refused_at_load(tmp_path: Path) -> None:
    text = "model_name: m\ntasks:\n- name: metabench\n  metrics:\n  - {name: 'acc,none', value: 0.65}\n"
    [error] = inspect_config(write(tmp_path, text), engine="vllm").errors
    assert error.field == "tasks[0].name" and "a group of tasks" in error.message


def test_gen1_engine_options_builtin_does_not_take_stay_in_extra() -> None:
    report = inspect_config(GEN1 / "Qwen3-30B-A3B-FP8.yaml")
    assert report.config is not None and report.config.extra == {"trust_remote_code": True}
    assert report.config.server_args == []
    assert [w.field for w in report.warnings] == ["trust_remote_code"]


def test_moe_refactor_backend_flags_load_for_both_engines() -> None:
    path = GSM8K / "moe-refactor" / "Qwen3-30B-A3B-Fp8-AutoFp8-marlin.yaml"
    config = load_config(path, engine="vllm")
    assert config.backend_flags() == {"--linear-backend": "marlin", "--moe-backend": "marlin"}
    # Both engines have marlin; only the file's -tp 2 is refused once builtin is chosen (as run would).
    [error] = inspect_config(path, engine="builtin").errors
    assert error.field == "server_args" and "--tensor-parallel-size 2 is not supported" in error.message


def test_legacy_env_is_an_error_with_the_exact_fix() -> None:
    path = GSM8K / "moe-refactor" / "Qwen3-30B-A3B-Fp8-CT-Channel-marlin.yaml"
    [error] = inspect_config(path).errors
    assert (error.line, error.field) == (7, "env.VLLM_TEST_FORCE_FP8_MARLIN")
    assert "--linear-backend marlin --moe-backend marlin" in error.message
    assert str(error).startswith(f"{path}:7: env.VLLM_TEST_FORCE_FP8_MARLIN: ")
    with pytest.raises(ConfigError, match="--linear-backend marlin --moe-backend marlin"):
        load_config(path)


def test_legacy_env_vars_of_gen1_are_rejected_too(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nenv_vars:\n  VLLM_USE_DEEP_GEMM: '1'\n")
    [error] = inspect_config(path, "vllm").errors
    assert error.line == 4 and "--linear-backend deep_gemm --moe-backend deep_gemm" in error.message


# -- shapes and located errors -----------------------------------------------------------------


def test_all_comments_file_is_reported_empty(tmp_path: Path) -> None:
    path = write(tmp_path, "# model_name: x\n# accuracy_threshold: 0.5\n")
    assert errors_of(path) == [f"{path}:1: empty config: the file has no keys (all commented out?)"]


@pytest.mark.parametrize("text, line, field, words", [
    ("model_name: m\naccuracy_threshold: high\n", 2, "accuracy_threshold", "valid number"),
    ("model_name: m\naccuracy_threshold: 1.5\n", 2, "accuracy_threshold", "less than or equal to 1"),
    ("accuracy_threshold: 0.5\n", 1, "model_name", "required"),
    ("model_name: m\naccuracy_threshold: 0.5\ngate:\n  mode: absolute\n  mdoe: x\n", 5, "gate.mdoe", "did you mean 'mode'"),
    ("model_name: m\naccuracy_threshold: 0.5\ngate: {mode: bayes}\n", 3, "gate.mode", "'absolute'"),
    ("model_name: m\naccuracy_threshold: 0.5\nnum_fewshot: -1\n", 3, "num_fewshot", "greater than or equal to 0"),
    ("model_name: m\naccuracy_threshold: 0.5\nserver_args: \"--a 'b\"\n", 3, "server_args", "cannot split"),
    ("model_name: m\naccuracy_threshold: 0.5\nengine: tgi\n", 3, "engine", "'builtin' or 'vllm'"),
    ("model_name: m\naccuracy_threshold: 0.5\nrequires: {min_compute_capability: abc}\n", 3,
     "requires.min_compute_capability", "compute capability"),
    ("model_name: m\naccuracy_threshold: 0.5\ntasks:\n- name: a\n- name: b\n", 5, "tasks[1]", "one task per config"),
])
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, words: str) -> None:
    path = write(tmp_path, text)
    errors = inspect_config(path).errors
    assert errors, text
    error = errors[0]
    assert (error.line, error.field) == (line, field), str(error)
    assert words in error.message
    assert str(error) == f"{path}:{line}: {field}: {error.message}"


def test_yaml_syntax_error_has_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\nserver_args: [a, b\naccuracy_threshold: 0.5\n")
    [error] = inspect_config(path).errors
    assert error.line >= 2 and "invalid YAML" in error.message


def test_duplicate_keys_are_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\nmodel_name: n\naccuracy_threshold: 0.5\n")
    [error] = inspect_config(path).errors
    assert "invalid YAML" in error.message and "duplicate" in error.message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- a\n- b\n")
    assert "mapping" in errors_of(path)[0]


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    assert errors_of(tmp_path / "nope.yaml") == [f"{tmp_path / 'nope.yaml'}: no such file"]


# -- backend names and expect ------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    "--linear-backend MARLIN --moe-backend Marlin",
    "--linear-backend=marlin --moe_backend=marlin",
    "--linear-backend emulation --moe-backend auto",
])
def test_backend_names_are_case_and_dash_insensitive(tmp_path: Path, args: str) -> None:
    path = write(tmp_path, f"model_name: m\naccuracy_threshold: 0.5\nserver_args: {args!r}\n")
    assert errors_of(path) == []


def test_unknown_backend_gets_did_you_mean_on_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args:\n  - --moe-backend\n  - marlni\n")
    [error] = inspect_config(path).errors
    assert (error.line, error.field) == (4, "server_args[0]")
    assert "did you mean 'marlin'" in error.message and "known: auto, emulation" in error.message


def test_vllm_only_backend_under_builtin_points_at_engine_vllm(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args: --moe-backend flashinfer-cutlass\n")
    [error] = inspect_config(path).errors
    assert "engine vllm" in error.message and "--engine vllm" in error.message
    assert inspect_config(path, "vllm").errors == []


def test_flag_without_value_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args: --enforce-eager --linear-backend\n")
    assert "--linear-backend needs a value" in errors_of(path)[0]


@pytest.mark.parametrize("engine, expect, ok", [
    ("builtin", "{linear_kernel: marlin, moe_kernel: MarlinMoEKernel}", True),
    ("builtin", "{linear_kernel: MarlinFp8LinearKernel}", True),
    ("builtin", "{linear_kernel: deep_gemm}", False),
    ("builtin", "{moe_kernel: MarlinFp8LinearKernel}", False),  # a linear class for the MoE layer
    ("builtin", "{linear_kernel: auto}", False),
    ("vllm", "{linear_kernel: deep_gemm, moe_kernel: flashinfer_cutlass}", True),
    ("vllm", "{linear_kernel: CutlassFP8ScaledMMLinearKernel}", True),
    ("vllm", "{moe_kernel: flashinfer-cutlas}", False),
])
def test_expect_names_a_backend_or_kernel_class(tmp_path: Path, engine: str, expect: str, ok: bool) -> None:
    path = write(tmp_path, f"model_name: m\naccuracy_threshold: 0.5\nengine: {engine}\nexpect: {expect}\n")
    errors = inspect_config(path).errors
    assert (errors == []) is ok, errors
    if not ok:
        assert errors[0].line == 4 and errors[0].field.startswith("expect.")


# -- gates: a missing input is a load-time error ------------------------------------------------


@pytest.mark.parametrize("text, words", [
    ("model_name: m\n", "no accuracy gate"),
    ("model_name: m\ngate: relative\n", "needs reference"),
    ("model_name: m\ngate: {mode: hypothesis}\n", "needs reference"),
    ("model_name: m\naccuracy_threshold: 0.5\ngate: {mode: paired}\n", "needs baseline"),
    ("model_name: m\nreference: {value: 0.5}\ngate: {mode: absolute}\n", "needs accuracy_threshold"),
])
def test_gate_inputs_are_checked_at_load(tmp_path: Path, text: str, words: str) -> None:
    assert words in " ".join(errors_of(write(tmp_path, text)))


@pytest.mark.parametrize("name, value", [("alpha", 0.5), ("alpha", 0.9), ("beta", 0.95)])
def test_gate_alpha_and_beta_stay_below_one_half(tmp_path: Path, name: str, value: float) -> None:
    # One-sided: at 0.5 z is 0, above it the bound flips to the other side of the estimate.
    path = write(tmp_path, f"model_name: m\nreference: {{value: 0.8}}\ngate:\n  mode: hypothesis\n  {name}: {value}\n")
    [error] = inspect_config(path).errors
    assert (error.line, error.field) == (5, f"gate.{name}")
    assert error.message.startswith(f"must be below 0.5, got {value}: " + (
        "a model exactly as good as its reference or baseline then fails" if name == "alpha" else
        "the minimum detectable drop is then smaller"))
    assert errors_of(write(tmp_path, f"model_name: m\nreference: {{value: 0.8}}\ngate: {{mode: wilson, {name}: "
                                     "0.49}\n", "ok.yaml")) == []


def test_release_configs_need_a_statistical_gate(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ntags: [nightly, release]\n")
    [error] = inspect_config(path).errors
    assert (error.line, error.field) == (3, "tags") and "statistical gate" in error.message
    ok = write(tmp_path, "model_name: m\nreference: {value: 0.5}\ngate: hypothesis\ntags: [release]\n", "ok.yaml")
    assert errors_of(ok) == []


def test_gate_defaults_and_rtol(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "model_name: m\nreference: {value: 0.7, n: 1319, date: 2026-11-29}\n"
                                         "rtol: 0.05\ngate: {mode: wilson, alpha: 0.01}\n"))
    assert (config.gate.mode, config.gate.alpha, config.effective_rtol) == ("wilson", 0.01, 0.05)
    assert config.reference.date == "2026-11-29"


def test_baseline_resolves_to_a_sibling_config(tmp_path: Path) -> None:
    write(tmp_path, "name: tiny-bf16\nmodel_name: m\naccuracy_threshold: 0.5\n", "bf16.yaml")
    config = load_config(write(tmp_path, "model_name: m\nbaseline: tiny-bf16\ngate: {mode: recovery}\n"))
    assert config.baseline_path == (tmp_path / "bf16.yaml").resolve()
    missing = write(tmp_path, "model_name: m\nbaseline: nothing-here\ngate: paired\n", "c.yaml")
    assert "no config named 'nothing-here'" in errors_of(missing)[0]


# -- dataset ------------------------------------------------------------------------------------


def test_dataset_paths_are_absolute_and_hash_checked(tmp_path: Path) -> None:
    data = write(tmp_path, '{"question": "1+1?", "answer": "#### 2"}\n', "data/test.jsonl")
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    text = (f"model_name: m\naccuracy_threshold: 0.5\nnum_fewshot: 0\ndataset:\n  test: data/test.jsonl\n"
            f"  sha256: {{test: {digest}}}\n")
    config = load_config(write(tmp_path, text))
    assert config.dataset.test == data.resolve() and config.dataset.train is None
    data.write_text('{"question": "changed", "answer": "#### 3"}\n')
    [error] = inspect_config(tmp_path / "cfg.yaml").errors
    assert (error.line, error.field) == (6, "dataset.sha256.test") and "expected" in error.message


@pytest.mark.parametrize("task, refused", [("gsm8k", True), ("gsm8k_cot", False)])
def test_few_shot_without_a_train_file_is_refused_only_for_tasks_that_draw_from_it(
        tmp_path: Path, task: str, refused: bool) -> None:
    """gsm8k_cot lists its eight few-shot examples in its YAML: it needs no train file."""
    write(tmp_path, '{"question": "1+1?", "answer": "#### 2"}\n', "data/test.jsonl")
    text = f"model_name: m\naccuracy_threshold: 0.5\ntask: {task}\nnum_fewshot: 8\ndataset: {{test: data/test.jsonl}}\n"
    errors = errors_of(write(tmp_path, text))
    assert bool(errors) == refused, errors
    if refused:
        assert "task gsm8k's few-shot examples come from the train file" in errors[0]


def test_missing_dataset_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ndataset: {test: nowhere.jsonl}\n")
    assert "no such file" in errors_of(path)[0]


# -- values ---------------------------------------------------------------------------------------


def test_server_args_list_and_env_scalars_become_text(tmp_path: Path) -> None:
    text = "model_name: m\naccuracy_threshold: 0.5\nserver_args: [--max-model-len, 4096]\nenv: {A: 1, B: true}\n"
    config = load_config(write(tmp_path, text))
    assert config.server_args == ["--max-model-len", "4096"] and config.env == {"A": "1", "B": "1"}


def test_name_defaults_to_stem_and_must_be_unique(tmp_path: Path) -> None:
    a = load_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "x/same.yaml"))
    b = load_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "y/same.yaml"))
    assert a.name == "same"
    [error] = check_unique_names([a, b])
    assert error.field == "name" and "unique" in error.message


def test_names_differing_only_in_case_are_one_run_folder_on_macos_and_refused(tmp_path: Path) -> None:
    a = load_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "x/Gsm8k.yaml"))
    b = load_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "y/gsm8k.yaml"))
    [error] = check_unique_names([a, b])
    assert "'gsm8k' is in another case 'Gsm8k', the name of" in error.message and "ignoring case" in error.message


# -- list files and paths -------------------------------------------------------------------------


def test_list_file_relative_paths_comments_and_blanks(tmp_path: Path) -> None:
    write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "configs/a.yaml")
    write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "configs/sub/b.yaml")
    listing = write(tmp_path, "# the small set\n\na.yaml  # first\n   \nsub/b.yaml\n", "configs/small.txt")
    assert read_list_file(listing) == [tmp_path / "configs/a.yaml", tmp_path / "configs/sub/b.yaml"]


def test_missing_listed_config_is_an_error_with_its_line(tmp_path: Path) -> None:
    listing = write(tmp_path, "# header\nmissing.yaml\n", "list.txt")
    with pytest.raises(ConfigError) as info:
        read_list_file(listing)
    assert info.value.line == 2 and "missing.yaml" in info.value.message


def test_list_file_including_itself_is_an_error(tmp_path: Path) -> None:
    listing = write(tmp_path, "loop.txt\n", "loop.txt")
    with pytest.raises(ConfigError, match="includes itself"):
        read_list_file(listing)


def test_expand_paths_files_lists_directories(tmp_path: Path) -> None:
    a = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "d/a.yaml")
    b = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "d/e/b.yml")
    listing = write(tmp_path, "a.yaml\n", "d/l.txt")
    assert expand_paths([listing, tmp_path / "d", a]) == [a, b]
    with pytest.raises(ConfigError, match="no such file"):
        expand_paths([tmp_path / "absent.yaml"])


@pytest.mark.parametrize("text, line, message", [
    ("alpha: 0.1\n", 3, "alpha: belongs under gate: (gate: {alpha: ...}); at the top level nothing reads it"),
    ("max_invalid_rate: 0.1\n", 3, "max_invalid_rate: belongs under gate:"),
    ("requires: {device: cpu}\n", 3, "requires.device: names a GPU model as nvidia-smi lists it"),
    ("requires: {device: ' CPU '}\n", 3, "requires.device: names a GPU model as nvidia-smi lists it"),
])
def test_keys_a_beginner_misplaces_are_errors_not_silently_ignored(tmp_path: Path, text: str, line: int,
                                                                    message: str) -> None:
    [error] = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n" + text)).errors
    assert error.line == line and message in str(error)


def test_an_rtol_set_twice_warns_which_one_is_used(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\nreference: {value: 0.8}\nrtol: 0.5\ngate: {mode: relative, rtol: 0.01}\n")
    report = inspect_config(path)
    assert report.errors == [] and report.config.effective_rtol == 0.01
    [warning] = report.warnings
    assert "gate.rtol (0.01) is used, the top-level rtol (0.5) is not" in str(warning)


def test_gate_keys_the_mode_does_not_read_are_warned_about(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ngate: {mode: absolute, alpha: 0.1, recovery: 0.5}\n")
    report = inspect_config(path)
    assert report.errors == [] and [w.field for w in report.warnings] == ["gate.alpha", "gate.recovery"]
    assert "not read by mode absolute" in str(report.warnings[0])
    quiet = write(tmp_path, "model_name: m\nreference: {value: 0.8}\ngate: {mode: wilson, alpha: 0.1, rtol: 0.05, "
                            "max_invalid_rate: 0.1}\n", "quiet.yaml")
    assert inspect_config(quiet).warnings == []


def test_a_vllm_command_the_builtin_engine_never_runs_is_warned_about(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nvllm_command: my-vllm serve\n")
    [warning] = inspect_config(path).warnings
    assert warning.line == 3 and "not used: engine builtin runs `quantgate serve`" in str(warning)
    assert inspect_config(path, "vllm").warnings == []


# -- values a run would only trip over mid-way ------------------------------------------------------


@pytest.mark.parametrize("key", ["name: ../escaped", "name: '.'", "name: a/b", "name: \"a\\tb\"", "name: ' '",
                                 "name: 'demo '",
                                 "name: " + "m" * 256, "name: " + "模" * 86])
def test_a_name_that_is_not_one_folder_is_an_error(tmp_path: Path, key: str) -> None:
    [error] = inspect_config(write(tmp_path, f"model_name: m\naccuracy_threshold: 0.5\n{key}\n")).errors
    assert error.field == "name" and "--output-dir" in error.message


@pytest.mark.parametrize("text, field", [
    ("request_timeout_seconds: .inf\n", "request_timeout_seconds"),
    ("temperature: .inf\n", "temperature"),
    ("startup_max_wait_seconds: .nan\n", "startup_max_wait_seconds"),
    ("seed: 99999999999999999999999\n", "seed"),
    ("env: {'A=B': '1'}\n", "env"),
    ("gate: {mode: recovery, recovery: 5}\nbaseline: b.json\n", "gate.recovery"),
])
def test_values_every_request_or_the_server_start_would_refuse_are_errors(tmp_path: Path, text: str,
                                                                          field: str) -> None:
    write(tmp_path, "{}", "b.json")
    errors = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n" + text)).errors
    assert [e.field for e in errors] == [field]


@pytest.mark.parametrize("text, field", [
    ("num_questions: true\n", "num_questions"), ("accuracy_threshold: true\n", "accuracy_threshold"),
    ("seed: false\n", "seed"), ("requires: {gpus: true}\n", "requires.gpus"),
    ("reference: {value: 0.5, n: true}\n", "reference.n"), ("limit: true\n", "limit"),
])
def test_a_boolean_where_a_number_belongs_is_an_error(tmp_path: Path, text: str, field: str) -> None:
    base = "model_name: m\n" + ("" if text.startswith("accuracy") else "accuracy_threshold: 0.5\n")
    [error] = inspect_config(write(tmp_path, base + text)).errors
    assert error.field == field and "expected a number, got" in error.message


@pytest.mark.parametrize("value, flags", [("yes", ["--enforce-eager"]), ("on", ["--enforce-eager"]),
                                          ("'1'", ["--enforce-eager"]), ("no", []), ("off", [])])
def test_yaml_1_1_switch_words_turn_engine_switches_on_and_off(tmp_path: Path, value: str, flags: list[str]) -> None:
    config = load_config(write(tmp_path, f"model_name: m\naccuracy_threshold: 0.5\nenforce_eager: {value}\n"))
    assert config.server_args == flags


def test_a_switch_value_that_is_neither_on_nor_off_is_an_error(tmp_path: Path) -> None:
    [error] = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nenforce_eager: maybe\n")).errors
    assert (error.line, error.field) == (3, "enforce_eager") and "'maybe'" in error.message


def test_what_run_refuses_at_plan_time_lint_refuses_too(tmp_path: Path) -> None:
    write(tmp_path, '{"question": "1+1?", "answer": "#### 2"}\n', "test.jsonl")
    cases = {
        "metric: exact_match,strict-mach\n": "metric",
        "task: gsm8kk\n": "task",
        "dataset: {test: test.jsonl}\n": "dataset",  # five few-shot examples, no train file
        "baseline: cfg.yaml\ngate: {mode: paired}\n": "baseline",  # itself
        "engine: builtin\nserver_args: [--no-such-flag]\n": "server_args",
    }
    for text, field in cases.items():
        errors = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n" + text)).errors
        assert [e.field for e in errors] == [field], text


def test_a_flag_the_builtin_engine_refuses_only_warns_in_a_file_that_names_no_engine(tmp_path: Path) -> None:
    report = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args: [--no-such-flag]\n"))
    assert report.errors == [] and "quantgate run` refuses this config" in report.warnings[0].message


def test_a_bare_gen1_metric_name_becomes_the_tasks_one_filter_of_it(tmp_path: Path) -> None:
    text = "model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - {name: exact_match, value: 0.5}\n"
    [error] = inspect_config(write(tmp_path, text)).errors  # gsm8k has two filters of exact_match
    assert error.field == "tasks[0].metrics[0].name" and "exact_match,strict-match" in error.message


def test_server_args_mistakes_are_located_and_named(tmp_path: Path) -> None:
    def check(text: str) -> tuple[list[str], list[str]]:
        report = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n" + text))
        return [str(e) for e in report.errors], [str(w) for w in report.warnings]

    errors, _ = check("server_args: [--linear-backend, emulation, --linear-backend, EMULATION]\n")
    assert errors == []  # one backend in two spellings
    errors, _ = check("server_args: ['--linear-backend emulation']\n")
    assert len(errors) == 1 and "one list item holding several arguments" in errors[0]
    errors, warnings = check("server_args: [--linear-backend, --max-model-len, '1280']\n")
    assert any("--linear-backend needs a value" in e for e in errors) and not any("1280" in w for w in warnings)
    _, warnings = check("server_args: [--max-model-len, '1280', --max-model-len, '64']\n")
    assert any("--max-model-len given twice" in w for w in warnings)
    _, warnings = check("server_args: [--max-model-len, '1280']\nmax_model_len: 4096\n")
    assert any(w.startswith(f"{tmp_path / 'cfg.yaml'}:4: max_model_len: not used") for w in warnings)
    errors, _ = check("server_args: [--max-model-len, '1280']\n\n\nmoe_backend: marlinn\n")
    assert len(errors) == 1 and errors[0].startswith(f"{tmp_path / 'cfg.yaml'}:6: moe_backend:")


def test_one_file_named_two_ways_is_one_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "base.yaml")
    listing = write(tmp_path, "../base.yaml\n", "sub/l.txt")
    monkeypatch.chdir(tmp_path)
    assert expand_paths([listing, "base.yaml", config]) == [listing.parent / "../base.yaml"]


def test_a_path_too_long_to_open_is_a_config_error(tmp_path: Path) -> None:
    long = tmp_path / ("a" * 300 + ".yaml")
    with pytest.raises(ConfigError, match="cannot be read: File name too long"):
        expand_paths([long])
    assert "File name too long" in errors_of(long)[0]


def test_a_list_file_may_start_with_a_bom(tmp_path: Path) -> None:
    config = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "a.yaml")
    listing = tmp_path / "l.txt"
    listing.write_bytes("\ufeffa.yaml\n".encode())
    assert read_list_file(listing) == [config]


def test_gen_prefix_with_chat_completions_is_warned_about(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nuse_chat_completions: true\ngen_prefix: 'Answer:'\n")
    [warning] = inspect_config(path).warnings
    assert (warning.line, warning.field) == (4, "gen_prefix")
    assert "the answer does not continue the prefix" in warning.message
    assert not inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ngen_prefix: 'Answer:'\n",
                                    "plain.yaml")).warnings


@pytest.mark.parametrize("text, line, field, needed", [
    ("server_args: --tensor-parallel-size 8\nrequires: {gpus: 2}\n", 5, "requires.gpus", 8),
    ("server_args: [--max-model-len, '4096', -tp, '2', -pp, '2']\n", 4, "server_args[2]", 4),
    ("tensor_parallel_size: 4\nrequires:\n  device: h100\n", 5, "requires", 4),
    ("tensor_parallel_size: 4\n", 4, "tensor_parallel_size", 4),
    # data parallelism multiplies: each replica is a tensor x pipeline parallel group
    ("server_args: -tp 2 --data-parallel-size 2\nrequires: {gpus: 2}\n", 5, "requires.gpus", 4),
    ("server_args: [--data-parallel-size=2]\n", 4, "server_args[0]", 2),
])
def test_requires_gpus_below_the_parallel_size_is_a_warning(tmp_path: Path, text: str, line: int, field: str,
                                                           needed: int) -> None:
    """`quantgate run` checks the machine against requires: only; the server needs TP x PP x DP GPUs."""
    report = inspect_config(write(tmp_path, "engine: vllm\nmodel_name: org/m\naccuracy_threshold: 0.5\n" + text))
    assert report.errors == []
    [warning] = [w for w in report.warnings if "GPUs" in w.message]
    assert (warning.line, warning.field) == (line, field)
    assert f"run vLLM on {needed} GPUs" in warning.message and f"requires: {{gpus: {needed}}}" in warning.message


@pytest.mark.parametrize("engine, text, line, field", [
    # a gen-1 file naming no engine: a warning, at the key that added the refused flag, not at
    # max_model_len (the first engine option key, which the builtin engine accepts)
    ("", "max_model_len: 4096\ntensor_parallel_size: 2\n", 4, "tensor_parallel_size"),
    ("engine: builtin\n", "server_args: --max-num-seqs 4\nmax_model_len: 4096\ntensor_parallel_size: 2\n", 6,
     "tensor_parallel_size"),
    # server_args refused on their own: named there
    ("engine: builtin\n", "server_args: --bogus\nmax_model_len: 4096\n", 4, "server_args"),
])
def test_flags_the_builtin_engine_refuses_are_named_where_they_come_from(tmp_path: Path, engine: str, text: str,
                                                                          line: int, field: str) -> None:
    report = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n" + engine + text))
    [problem] = [p for p in report.errors + report.warnings if "refuses these flags" in p.message]
    assert (problem.line, problem.field) == (line, field)
    assert problem in (report.errors if engine else report.warnings)


def test_the_parallel_gpus_warning_names_each_size(tmp_path: Path) -> None:
    text = ("engine: vllm\nmodel_name: org/m\naccuracy_threshold: 0.5\nserver_args: -tp 2 -dp 3\n"
            "requires: {gpus: 2}\n")
    [warning] = inspect_config(write(tmp_path, text)).warnings
    assert "run vLLM on 6 GPUs (tensor parallel 2 x pipeline parallel 1 x data parallel 3)" in warning.message


def test_requires_gpus_that_cover_the_parallel_size_are_quiet(tmp_path: Path) -> None:
    text = "engine: vllm\nmodel_name: org/m\naccuracy_threshold: 0.5\nserver_args: -tp 2\nrequires: {gpus: 2}\n"
    assert inspect_config(write(tmp_path, text)).warnings == []


# -- gen-1: every listed metric is gated, as vLLM's test gates it ---------------------------------

TWO_METRICS = ("model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - name: exact_match,strict-match\n    value: 0.671\n"
               "  - name: exact_match,flexible-extract\n    value: {flexible}\nlimit: 1000\n")


def test_gen1_metrics_besides_the_gated_one_are_kept_to_gate() -> None:
    """vLLM gates strict-match and flexible-extract alike; quantgate kept only the gated one."""
    config = load_config(GEN1 / "Meta-Llama-3-8B-Instruct-FP8-compressed-tensors.yaml")
    assert config.metric == "exact_match,strict-match" and config.reference.value == 0.755
    assert config.other_references == {"exact_match,flexible-extract": 0.755}


def test_gen1_gating_flexible_keeps_strict_to_gate(tmp_path: Path) -> None:
    path = write(tmp_path, "metric: exact_match,flexible-extract\n" + TWO_METRICS.format(flexible=0.664))
    config = load_config(path)
    assert (config.metric, config.reference.value) == ("exact_match,flexible-extract", 0.664)
    assert config.other_references == {"exact_match,strict-match": 0.671}


def test_other_references_is_no_key_of_the_file(tmp_path: Path) -> None:
    report = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nother_references: {a: 1}\n"))
    assert report.config is not None and report.config.other_references == {}
    assert [w.field for w in report.warnings] == ["other_references"]


@pytest.mark.parametrize("entry, line, field, words", [
    # a run measures the gated metric, strict-match and flexible-extract: nothing else can be gated
    ("  - name: 'acc,none'\n    value: 0.5\n", 9, "tasks[0].metrics[2].name", "'acc,none' is gated by vLLM's test too"),
    ("  - name: exact_match,flexible-extract\n    value: 0.5\n", 9, "tasks[0].metrics[2].name", "listed twice"),
])
def test_a_listed_metric_that_cannot_be_gated_is_refused_on_its_line(tmp_path: Path, entry: str, line: int,
                                                                    field: str, words: str) -> None:
    text = TWO_METRICS.format(flexible=0.664).replace("limit:", entry + "limit:")
    [error] = inspect_config(write(tmp_path, text)).errors
    assert (error.line, error.field) == (line, field) and words in error.message


def test_another_listed_metric_is_checked_like_the_gated_one(tmp_path: Path) -> None:
    [error] = inspect_config(write(tmp_path, TWO_METRICS.format(flexible=66.4))).errors
    assert (error.line, error.field) == (8, "tasks[0].metrics[1].value") and "66.4" in error.message
    text = ("model_name: m\ntasks:\n- name: arc_easy\n  metrics:\n  - {name: 'acc,none', value: 0.7}\n"
            "  - {name: 'exact_match,flexible-extract', value: 0.7}\n")
    [error] = inspect_config(write(tmp_path, text)).errors  # arc_easy has no flexible-extract filter
    assert (error.line, error.field) == (6, "tasks[0].metrics[1].name")
    assert "'exact_match,flexible-extract' is not reported by task 'arc_easy'" in error.message


def test_tags_read_as_the_tiers_read_them_and_near_misses_are_warned(tmp_path: Path) -> None:
    """`Release` is the release tier's tag; `relase` is no tier's and was silently inert."""
    config = load_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ntags: [Nightly, ' pr ']\n"))
    assert config.tags == ["nightly", "pr"]
    [warning] = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ntags: [relase, team-a]\n")).warnings
    assert warning.field == "tags[0]" and "did you mean 'release'" in warning.message


def test_labels_that_only_resemble_a_tier_tag_are_quiet(tmp_path: Path) -> None:
    assert not inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n"
                                              "tags: [nightly-h100, demo, nightly]\n")).warnings
    [warning] = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ntags: [neg-check]\n")).warnings
    assert "did you mean 'negative-check'" in warning.message


@pytest.mark.parametrize("text, line, field, words", [
    # a YAML merge key (`<<: *defaults`): the problem is located where the merged value is written
    ("x-gate: &g {mode: hypothesis, alpha: 0.7}\nreference: {value: 0.5}\ngate:\n  <<: *g\n  beta: 0.1\n", 3,
     "gate.alpha", "below 0.5"),
    ("x-defaults: &d\n  num_fewshot: -1\n<<: *d\n", 4, "num_fewshot", "greater than or equal to 0"),
    ("x-env: &e {VLLM_TEST_FORCE_FP8_MARLIN: '1'}\nenv:\n  <<: *e\n  HF_HUB_OFFLINE: '1'\n", 3,
     "env.VLLM_TEST_FORCE_FP8_MARLIN", "legacy kernel switch"),
])
def test_problems_in_merged_keys_are_located_where_they_are_written(tmp_path: Path, text: str, line: int,
                                                                     field: str, words: str) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n" + text)
    [error] = inspect_config(path).errors
    assert (error.line, error.field) == (line, field), str(error)
    assert words in error.message


@pytest.mark.parametrize("text, line, words", [
    ("model_name: m\naccuracy_threshold: 0.5\n---\nmodel_name: n\n", 3,
     "expected a single document in the stream (from line 1), but found another document; a config file holds one "
     "YAML document"),
    ("model_name: m\naccuracy_threshold: 0.5\nrequires:\n\tgpus: 1\n", 4, "use spaces: YAML does not allow a tab"),
    ("model_name: m\nserver_args: \"--max-model-len 4096\naccuracy_threshold: 0.5\n", 4,
     "while scanning a quoted scalar (from line 2): found unexpected end of stream"),
])
def test_yaml_syntax_errors_say_what_the_parser_was_reading_and_the_fix(tmp_path: Path, text: str, line: int,
                                                                         words: str) -> None:
    path = write(tmp_path, text)
    [error] = inspect_config(path).errors
    assert error.line == line and words in error.message, str(error)


def test_tags_written_as_one_comma_separated_string_are_warned_about(tmp_path: Path) -> None:
    # `tags: pr, release` is the one tag "pr, release": no tier acts on it, so the config would
    # silently run in no pr or release tier.
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ntags: pr, nightly\n")
    report = inspect_config(path)
    assert report.errors == []
    [warning] = report.warnings
    assert (warning.line, warning.field) == (3, "tags")
    assert "one tag holding a comma" in warning.message and "tags: [pr, nightly]" in warning.message


def test_an_env_with_every_variable_commented_out_is_empty(tmp_path: Path) -> None:
    # as gen-1's `env_vars:` is read; not "Input should be a valid dictionary (got None)"
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nenv:\n  # VLLM_USE_DEEP_GEMM: '1'\n")
    assert load_config(path).env == {}


def test_a_value_tagged_str_is_the_text(tmp_path: Path) -> None:
    # `!!str 0.1` keeps a number-like name text; the round-trip reader returns it tagged, which was
    # refused as "got TaggedScalar(...)".
    config = load_config(write(tmp_path, "model_name: !!str 0.1\naccuracy_threshold: 0.5\n"))
    assert config.model_name == "0.1"


def test_a_reference_key_close_to_a_known_one_is_warned_about(tmp_path: Path) -> None:
    # reference keeps extra keys as provenance, so `stdv:` was silently no stdev for calibrate's checks
    path = write(tmp_path, "model_name: m\nreference: {value: 0.5, stdv: 0.01, hardware: h200}\n")
    report = inspect_config(path)
    assert report.errors == []
    [warning] = report.warnings
    assert warning.field == "reference.stdv" and "did you mean 'stdev'?" in warning.message


def test_provenance_keys_close_to_other_provenance_keys_are_quiet(tmp_path: Path) -> None:
    # measured_by, measured_at and commit_sha were warned about as typos of measured_on and commit,
    # text provenance read by no gate either: renaming them would change nothing.
    path = write(tmp_path, "model_name: m\nreference: {value: 0.5, measured_by: alice, measured_at: h200, "
                           "commit_sha: abc123, valu: 0.4}\n")
    report = inspect_config(path)
    assert [(w.field, w.message.rsplit("; ", 1)[-1]) for w in report.warnings] == \
        [("reference.valu", "did you mean 'value'?")]


# -- mutation-testing follow-ups: behaviour no test pinned ---------------------------------------


def test_a_file_that_is_an_empty_mapping_is_reported_empty(tmp_path: Path) -> None:
    # `{}` has no keys, as a file whose keys are all commented out (SPEC 2), not "model_name: required".
    path = write(tmp_path, "{}\n")
    assert errors_of(path) == [f"{path}:1: empty config: the file has no keys (all commented out?)"]


@pytest.mark.parametrize("text, field", [
    ("reference: {value: 0.8}\nrtol: 1\n", "rtol"),
    ("reference: {value: 0.8}\ngate: {mode: relative, rtol: 1}\n", "gate.rtol"),
])
def test_an_rtol_of_one_is_refused(tmp_path: Path, text: str, field: str) -> None:
    # reference * (1 - 1) = 0: a relative gate that can never fail.
    [error] = inspect_config(write(tmp_path, "model_name: m\n" + text)).errors
    assert error.field == field and "less than 1" in error.message


def test_gate_defaults_of_the_spec(tmp_path: Path) -> None:
    write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\n", "base.yaml")
    config = load_config(write(tmp_path, "model_name: m\nbaseline: base\ngate: recovery\n"))
    assert (config.gate.mode, config.gate.recovery) == ("recovery", 0.95)  # SPEC 3: recovery default 0.95
    assert (config.gate.alpha, config.gate.beta) == (0.05, 0.2)


@pytest.mark.parametrize("value, normal", [("9", "9.0"), ("'8.9'", "8.9"), ("' 08.0 '", "8.0")])
def test_min_compute_capability_is_written_as_major_dot_minor(tmp_path: Path, value: str, normal: str) -> None:
    text = f"model_name: m\naccuracy_threshold: 0.5\nrequires: {{gpus: 1, min_compute_capability: {value}}}\n"
    assert load_config(write(tmp_path, text)).requires.min_compute_capability == normal


@pytest.mark.parametrize("text, line, field, words", [
    # limit is gen-1's num_questions: both set, one would silently win
    ("num_questions: 10\nlimit: 20\n", 4, "limit", "set either num_questions or limit"),
    ("env: {HF_HUB_OFFLINE: '1'}\nenv_vars: {HF_HUB_OFFLINE: '0'}\n", 4, "env_vars",
     "HF_HUB_OFFLINE set in both env and env_vars"),
    ("task: gsm8k_cot\ntasks:\n- name: gsm8k\n  metrics: [{name: 'exact_match,strict-match', value: 0.5}]\n", 3, "task",
     "task 'gsm8k_cot' contradicts tasks[0].name 'gsm8k'"),
    ("metric: 'exact_match,flexible-extract'\ntasks:\n- name: gsm8k\n  metrics: [{name: 'exact_match,strict-match', "
     "value: 0.5}]\n", 3, "metric", "'exact_match,flexible-extract' is not among tasks[0].metrics"),
])
def test_gen1_and_gen2_keys_that_contradict_each_other_are_refused(tmp_path: Path, text: str, line: int, field: str,
                                                                   words: str) -> None:
    base = "model_name: m\naccuracy_threshold: 0.5\n" if "tasks" not in text else "model_name: m\nrtol: 0.1\n"
    [error] = inspect_config(write(tmp_path, base + text)).errors
    assert (error.line, error.field) == (line, field), str(error)
    assert words in error.message


def test_a_backend_flag_given_twice_with_different_values_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args: [--linear-backend, marlin, "
                           "--linear-backend, emulation]\n")
    [error] = inspect_config(path).errors
    assert error.field == "server_args[2]" and "--linear-backend given twice (marlin, emulation)" in error.message


def test_an_empty_inline_backend_value_needs_a_value(tmp_path: Path) -> None:
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args: [--moe-backend=]\n")
    [error] = inspect_config(path).errors
    assert error.field == "server_args[0]" and error.message == "--moe-backend needs a value"


def test_parallel_sizes_that_are_no_positive_integer_count_as_one() -> None:
    # The server refuses them; the GPU count must not drop to 0 (or crash) because of them.
    assert parallel_gpus(["-tp", "0", "-pp", "2"]) == 2
    assert parallel_gpus(["-tp", "x", "--data-parallel-size", "3"]) == 3
    # str.isdigit() holds for '²', which int() refuses: lint crashed with a ValueError traceback.
    assert parallel_gpus(["-tp", "²", "-pp", "2"]) == 2


def test_a_parallel_size_int_refuses_is_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "engine: vllm\nmodel_name: org/m\naccuracy_threshold: 0.5\nserver_args: -tp ² -pp 2\n")
    report = inspect_config(path)
    assert report.errors == [] and report.config is not None


def test_recovery_needs_a_baseline(tmp_path: Path) -> None:
    [error] = inspect_config(write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\ngate: recovery\n")).errors
    assert error.field == "gate.mode" and "mode recovery needs baseline" in error.message


def test_a_baseline_named_by_the_configs_own_stem_is_not_itself(tmp_path: Path) -> None:
    # Compared with itself a paired or recovery gate always passes.
    [error] = inspect_config(write(tmp_path, "model_name: m\nbaseline: cfg\ngate: paired\n")).errors
    assert error.field == "baseline" and "no config named 'cfg'" in error.message


def test_a_dataset_hash_in_upper_case_matches(tmp_path: Path) -> None:
    data = write(tmp_path, '{"question": "1+1?", "answer": "#### 2"}\n', "test.jsonl")
    digest = hashlib.sha256(data.read_bytes()).hexdigest().upper()
    text = f"model_name: m\naccuracy_threshold: 0.5\nnum_fewshot: 0\ndataset: {{test: test.jsonl, sha256: {{test: {digest}}}}}\n"
    assert errors_of(write(tmp_path, text)) == []


def test_a_legacy_switch_that_is_off_is_removed_without_naming_server_args(tmp_path: Path) -> None:
    # It turns nothing on; the message said "server_args already choose the backend" for a file
    # whose server_args choose nothing.
    path = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '0'\n")
    [error] = inspect_config(path).errors
    assert (error.line, error.field) == (4, "env.VLLM_TEST_FORCE_FP8_MARLIN")
    assert "remove it: as set here (VLLM_TEST_FORCE_FP8_MARLIN=0) it turns no kernel on" in error.message
    assert "server_args already choose" not in error.message
    chosen = write(tmp_path, "model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear-backend marlin "
                             "--moe-backend marlin\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n", "chosen.yaml")
    assert "remove it: server_args already choose the backend" in errors_of(chosen)[0]
