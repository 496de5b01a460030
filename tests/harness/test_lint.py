"""`quantgate lint`: output lines, exit codes, list files and directories."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantgate.harness.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
GOOD = "model_name: m\naccuracy_threshold: 0.5\n"


def test_clean_real_configs_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(FIXTURES / "gsm8k" / "models-small.txt")]) == 0
    out, err = capsys.readouterr()
    assert "8 config(s): 0 error(s)" in err
    assert ": warning: rocm_request_timeout_seconds:" in out  # unknown keys warn, never fail


def test_errors_exit_3_with_file_line_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD + "env:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n")
    assert main(["lint", str(bad)]) == 3
    out, _ = capsys.readouterr()
    assert out.startswith(f"{bad}:4: env.VLLM_TEST_FORCE_FP8_MARLIN: ")
    assert "--linear-backend marlin --moe-backend marlin" in out


def test_engine_option_checks_against_that_engine(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "gsm8k" / "moe-refactor" / "Qwen3-30B-A3B-Fp8-CT-Channel-vllm-cutlass.yaml")
    assert main(["lint", "--engine", "vllm", path]) == 0


def test_directory_checks_yaml_and_list_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.yaml").write_text(GOOD)  # same stem: a duplicate test id
    (tmp_path / "all.txt").write_text("a.yaml\nsub/gone.yaml\n")
    assert main(["lint", str(tmp_path)]) == 3
    out, _ = capsys.readouterr()
    assert f"{tmp_path / 'all.txt'}:2: listed file 'sub/gone.yaml' does not exist" in out
    assert "must be unique" in out


def test_missing_path_and_bad_usage_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(tmp_path / "nothing.yaml")]) == 3
    assert main(["lint"]) == 3
    assert main(["lint", "--engine", "tgi", str(tmp_path)]) == 3


def test_installed_command(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(GOOD + "gate: {mode: paired}\n")
    exe = shutil.which("quantgate") or f"{sys.executable} -m quantgate.harness.cli"
    proc = subprocess.run([*exe.split(), "lint", str(tmp_path / "c.yaml")], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert f"{tmp_path / 'c.yaml'}:3: gate.mode: mode paired needs baseline" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_problems_print_in_line_order_and_an_empty_folder_is_an_error(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "types.yaml"
    config.write_text("model_name: m\naccuracy_threshold: 2\ntolerance: -1\nnum_fewshot: x\nmax_tokens: -3\n")
    assert main(["lint", str(config)]) == 3
    lines = [int(line.split(":")[1]) for line in capsys.readouterr().out.splitlines()]
    assert lines == [2, 3, 4, 5]
    (tmp_path / "empty").mkdir()
    assert main(["lint", str(tmp_path / "empty")]) == 3
    assert "no config files in" in capsys.readouterr().err


def test_validator_messages_say_what_they_got_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "m.yaml"
    config.write_text("model_name: m\naccuracy_threshold: 0.5\nrequires: {min_compute_capability: x}\nserver_args: 42\n")
    assert main(["lint", str(config)]) == 3
    out = capsys.readouterr().out
    assert "requires.min_compute_capability: expected a compute capability like 8.0 or 9.0, got 'x'\n" in out
    assert "server_args: expected a string of arguments (split like a shell) or a list, got int" in out
    # A digit int() refuses gets the same message, not int()'s own.
    config.write_text("model_name: m\naccuracy_threshold: 0.5\nrequires: {min_compute_capability: '9\u00b2'}\n")
    assert main(["lint", str(config)]) == 3
    assert "expected a compute capability like 8.0 or 9.0, got '9\u00b2'" in capsys.readouterr().out


def test_expect_names_are_checked_in_the_same_pass_as_schema_errors(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "e.yaml"
    config.write_text("model_name: m\naccuracy_threshold: 5\nexpect: {linear_kernel: marlinn}\n")
    assert main(["lint", str(config)]) == 3
    out = capsys.readouterr().out
    assert f"{config}:2: accuracy_threshold" in out and "did you mean 'marlin'?" in out


@pytest.mark.parametrize("text, line, words", [
    ("model_name: m\naccuracy_threshold: 0.05\ntolerance: 0.08\n", 3,
     "tolerance: tolerance 0.08 >= accuracy_threshold 0.05: the threshold accuracy_threshold - tolerance is -0.03, "
     "so the gate can never fail"),
    ("model_name: m\naccuracy_threshold: 0.05\n", 2, "accuracy_threshold: tolerance 0.08 >= accuracy_threshold 0.05"),
    # equal: the threshold is 0, which every measured value reaches
    ("model_name: m\naccuracy_threshold: 0.08\n", 2, "accuracy_threshold: tolerance 0.08 >= accuracy_threshold 0.08: "
     "the threshold accuracy_threshold - tolerance is 0, so the gate can never fail"),
    ("model_name: m\ngate: hypothesis\nreference:\n  n: 50\n  value: 1.0\n", 5,
     "reference.value: reference 1 with gate hypothesis has no spread (sigma = sqrt(p (1 - p)) = 0): the threshold "
     "is the reference itself, so any single miss fails"),
    ("model_name: m\ngate: wilson\nreference: {value: 0}\n", 3, "the threshold is 0, so the gate can never fail"),
    ("model_name: m\ngate: {mode: wilson, rtol: 0}\nreference: {value: 1}\n", 3,
     "the threshold is 1, which no Wilson lower bound reaches"),
    ("model_name: m\ngate: relative\nreference: {value: 0}\n", 3,
     "reference.value: reference 0 with gate relative: the threshold reference * (1 - rtol) is 0, so the gate can "
     "never fail"),
    ("model_name: m\nnum_questions: 5\ngate: hypothesis\nreference: {value: 0.5}\n", 2,
     "num_questions: gate hypothesis on 5 question(s) against reference 0.5 has a threshold of -0.0201 (at or below "
     "0), so it can never fail"),
    ("model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - name: exact_match,strict-match\n    value: 0.5\n"
     "  - name: exact_match,flexible-extract\n    value: 0\n", 8,
     "tasks[0].metrics[1].value: exact_match,flexible-extract is listed with value 0: gate relative gates it against "
     "a threshold of 0, so it can never fail"),
])
def test_gates_that_cannot_decide_warn_on_their_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                     line: int, words: str) -> None:
    config = tmp_path / "g.yaml"
    config.write_text(text)
    assert main(["lint", str(config)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{config}:{line}: warning: ") and words in out, out
    assert "0 error(s), 1 warning(s)" in err


def test_a_paired_gate_on_too_few_questions_to_fail_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    config = tmp_path / "g.yaml"
    config.write_text("model_name: m\nbaseline: base\ngate: paired\nnum_questions: 4\n")
    assert main(["lint", str(config)]) == 0
    out, err = capsys.readouterr()
    assert f"{config}:4: warning: num_questions: gate paired on 4 question(s) can never fail: even 4 of 4 answers " \
           "turning wrong has a one-sided p-value of 0.5^4 = 0.0625, not below alpha 0.05" in out, out
    config.write_text("model_name: m\nbaseline: base\ngate: paired\nnum_questions: 5\n")  # 0.5^5 < 0.05: it can
    assert main(["lint", str(config)]) == 0
    assert "0 warning(s)" in capsys.readouterr().err
    # Tagged release, a gate that cannot fail is refused: a release verdict must be able to fail.
    config.write_text("model_name: m\nbaseline: base\ngate: paired\nnum_questions: 4\ntags: [release]\n")
    assert main(["lint", str(config)]) == 3
    out, err = capsys.readouterr()
    assert f"{config}:4: num_questions: gate paired on 4 question(s) can never fail" in out, out
    assert "a config tagged release must be able to fail" in out


def test_num_questions_beyond_the_test_file_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 3 questions and num_questions 12: a run evaluates 3, and a hypothesis threshold set for 12 means nothing.
    row = '{"question": "1 + 1?", "answer": "#### 2"}\n'
    (tmp_path / "test.jsonl").write_text(row * 3)
    config = tmp_path / "g.yaml"
    config.write_text("model_name: m\ndataset: {test: test.jsonl}\nnum_fewshot: 0\nnum_questions: 12\n"
                      "accuracy_threshold: 0.5\n")
    assert main(["lint", str(config)]) == 0
    out, err = capsys.readouterr()
    assert f"{config}:4: warning: num_questions: num_questions is 12, but the test file {tmp_path / 'test.jsonl'} " \
           "holds 3 questions: a run evaluates those 3 only" in out, out
    assert "0 error(s), 1 warning(s)" in err


def test_a_gate_that_can_decide_does_not_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "g.yaml"
    config.write_text("model_name: m\naccuracy_threshold: 0.09\nreference: {value: 1.0}\n")  # gated absolute
    assert main(["lint", str(config)]) == 0
    assert "0 warning(s)" in capsys.readouterr().err


def test_one_file_named_two_ways_is_linted_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "base.yaml").write_text(GOOD)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "l.txt").write_text("../base.yaml\n")
    monkeypatch.chdir(tmp_path)
    assert main(["lint", "sub/l.txt", "base.yaml", str(tmp_path / "base.yaml")]) == 0
    assert "1 config(s): 0 error(s)" in capsys.readouterr().err


def test_a_path_too_long_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(tmp_path / ("a" * 300 + ".yaml"))]) == 3
    assert "cannot be read: File name too long" in capsys.readouterr().out


def test_a_task_is_linted_by_its_lm_eval_name_not_its_file_name(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """gsm8k_cot (gsm8k/gsm8k-cot.yaml) was refused; gsm8k-cot linted clean, then failed the run."""
    good = tmp_path / "cot.yaml"
    good.write_text(GOOD + "task: gsm8k_cot\n")
    assert main(["lint", str(good)]) == 0, capsys.readouterr()
    for task, says in (("gsm8k-cot", "Did you mean 'gsm8k_cot'?"), ("mmlu", "groups are refused")):
        bad = tmp_path / f"{task}.yaml"
        bad.write_text(GOOD + f"task: {task}\n")
        assert main(["lint", str(bad)]) == 3
        out, _ = capsys.readouterr()
        assert out.startswith(f"{bad}:3: task: ") and says in out, out


# -- gen-1 files: the listed metric values only the reference modes read -------------------------

GEN1_TWO = ("model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - name: exact_match,strict-match\n    value: 0.671\n"
            "  - name: exact_match,flexible-extract\n    value: 0.664\nlimit: 100\n")


@pytest.mark.parametrize("gate, compared", [
    ("accuracy_threshold: 0.6\n", "with accuracy_threshold - tolerance"),  # absolute by default
    ("gate: paired\nbaseline: base.yaml\n", "with the baseline base.yaml's answers, question by question"),
    ("gate: {mode: recovery}\nbaseline: base.yaml\n", "with the baseline base.yaml's measured value"),
])
def test_listed_gen1_values_a_gate_does_not_read_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str], gate: str,
                                                      compared: str) -> None:
    """Only relative, hypothesis and wilson gate every listed metric (as vLLM's gen-1 test does):
    under another gate the values were silently unread and flexible-extract not gated at all."""
    (tmp_path / "base.yaml").write_text("model_name: b\naccuracy_threshold: 0.5\nlimit: 100\n")
    config = tmp_path / "g.yaml"
    config.write_text(GEN1_TWO + gate)
    assert main(["lint", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "0 error(s), 1 warning(s)" in err
    assert out.startswith(f"{config}:4: warning: tasks[0].metrics: gate ")
    assert ("reads none of the values listed here (exact_match,strict-match 0.671, exact_match,flexible-extract "
            f"0.664): it compares exact_match,strict-match {compared}, so exact_match,flexible-extract is not gated "
            "at all") in out
    assert "set gate: {mode: relative}" in out and "remove tasks[0].metrics" in out
    assert "gate exact_match,flexible-extract in a config of its own (metric: 'exact_match,flexible-extract')" in out


def test_the_gen1_warning_of_a_paired_gate_without_baseline_names_no_baseline(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "g.yaml"
    config.write_text(GEN1_TWO + "gate: paired\n")
    assert main(["lint", str(config)]) == 3  # the missing baseline is the error; the warning still reads right
    out, _ = capsys.readouterr()
    assert "with the baseline's answers, question by question" in out and "None" not in out, out


def test_one_listed_gen1_value_an_absolute_gate_does_not_read_warns(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "g.yaml"
    config.write_text("model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - {name: 'exact_match,strict-match', "
                      "value: 0.671}\naccuracy_threshold: 0.6\n")
    assert main(["lint", str(config)]) == 0
    out = capsys.readouterr().out
    assert "gate absolute reads none of the values listed here (exact_match,strict-match 0.671)" in out
    assert "not gated at all" not in out and "in a config of its own" not in out


@pytest.mark.parametrize("gate", ["", "gate: relative\n", "gate: hypothesis\n", "gate: {mode: wilson}\n"])
def test_listed_gen1_values_a_gate_reads_are_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   gate: str) -> None:
    config = tmp_path / "g.yaml"
    config.write_text(GEN1_TWO + gate)
    assert main(["lint", str(config)]) == 0
    assert "0 warning(s)" in capsys.readouterr().err


def test_a_builtin_model_folder_that_is_not_there_warns_on_its_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """lint passed a typo in model_name that `quantgate run` then refused (exit 3) before any server."""
    (tmp_path / "models" / "real").mkdir(parents=True)
    (tmp_path / "models" / "real" / "config.json").write_text("{}")
    (tmp_path / "models" / "real" / "tokenizer.json").write_text("{}")
    (tmp_path / "models" / "untokenized").mkdir()
    (tmp_path / "models" / "untokenized" / "config.json").write_text("{}")
    (tmp_path / "notok.yaml").write_text("accuracy_threshold: 0.5\nmodel_name: models/untokenized\n")
    (tmp_path / "typo.yaml").write_text("accuracy_threshold: 0.5\nmodel_name: models/reel\n")
    (tmp_path / "found.yaml").write_text("accuracy_threshold: 0.5\nmodel_name: models/real\n")
    # A hub id names no local folder (no `Qwen/` here), whatever the engine; neither does a bare name.
    (tmp_path / "hub.yaml").write_text("accuracy_threshold: 0.5\nmodel_name: Qwen/Qwen3-8B\n")
    (tmp_path / "bare.yaml").write_text("accuracy_threshold: 0.5\nmodel_name: m\n")
    (tmp_path / "absolute.yaml").write_text(f"accuracy_threshold: 0.5\nmodel_name: {tmp_path / 'nowhere'}\n")
    files = [str(tmp_path / f"{name}.yaml") for name in ("typo", "found", "hub", "bare", "absolute", "notok")]
    assert main(["lint", *files]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{tmp_path / 'typo.yaml'}:2: warning: model_name: models/reel is not a model folder here")
    assert f"{tmp_path / 'absolute.yaml'}:2: warning: model_name: {tmp_path / 'nowhere'} is not a model folder" in out
    # Served token ids only: every text prompt of the evaluation would be a 400 (a retryable ERROR).
    assert f"{tmp_path / 'notok.yaml'}:2: warning: model_name: models/untokenized has no tokenizer.json" in out
    assert "make models" in out and "6 config(s): 0 error(s), 3 warning(s)" in err


def test_a_paired_gate_whose_best_p_value_equals_alpha_cannot_fail(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # The gate fails iff p < alpha: 3 of 3 answers turning wrong give p = 0.5^3 = 0.125, not below alpha 0.125.
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    config = tmp_path / "g.yaml"
    config.write_text("model_name: m\nbaseline: base\ngate: {mode: paired, alpha: 0.125}\nnum_questions: 3\n")
    assert main(["lint", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"{config}:4: warning: num_questions: gate paired on 3 question(s) can never fail" in out, out


def test_num_questions_equal_to_the_test_file_is_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n' * 3)
    config = tmp_path / "g.yaml"
    config.write_text("model_name: m\ndataset: {test: test.jsonl}\nnum_fewshot: 0\nnum_questions: 3\n"
                      "accuracy_threshold: 0.5\n")
    assert main(["lint", str(config)]) == 0
    assert "0 error(s), 0 warning(s)" in capsys.readouterr().err


# -- from mutation testing: the flag, the counts and the messages a user reads ------------------


def test_engine_option_replaces_the_configs_engine_both_ways(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--engine was only ever tried on a config of that same engine, where ignoring it passes too."""
    config = tmp_path / "b.yaml"
    config.write_text(GOOD + "engine: builtin\nserver_args: --linear-backend cutlass\n")
    assert main(["lint", str(config)]) == 3
    assert ("unknown --linear-backend value 'cutlass' for engine builtin" in capsys.readouterr().out)
    assert main(["lint", "--engine", "vllm", str(config)]) == 0
    assert "1 config(s): 0 error(s), 0 warning(s)" in capsys.readouterr().err
    config.write_text(GOOD + "engine: vllm\nserver_args: --linear-backend cutlass\n")
    assert main(["lint", str(config)]) == 0
    capsys.readouterr()
    assert main(["lint", "--engine", "builtin", str(config)]) == 3
    assert f"{config}:4: server_args: unknown --linear-backend value 'cutlass' for engine builtin" \
        in capsys.readouterr().out


def test_a_missing_path_is_named_as_missing_not_as_an_empty_folder(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(tmp_path / "nothing.yaml")]) == 3
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'nothing.yaml'}: no such file or directory\n"
    assert err == "0 config(s): 1 error(s), 0 warning(s)\n"


def test_no_config_files_names_every_path_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    assert main(["lint", str(tmp_path / "a"), str(tmp_path / "b")]) == 3
    assert capsys.readouterr().err == \
        f"no config files in {tmp_path / 'a'}, {tmp_path / 'b'} (*.yaml, *.yml or *.txt)\n"


def test_a_folder_is_searched_for_yml_files_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "short.yml").write_text("model_name: m\naccuracy_threshold: 2\n")
    (tmp_path / "notes.md").write_text("not a config")
    assert main(["lint", str(tmp_path)]) == 3
    out, err = capsys.readouterr()
    assert out.startswith(f"{tmp_path / 'sub' / 'short.yml'}:2: accuracy_threshold: ")
    assert err == "1 config(s): 1 error(s), 0 warning(s)\n"


def test_the_count_includes_configs_that_do_not_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "torn.yaml").write_text("model_name: [m\n")
    (tmp_path / "bad.yaml").write_text("model_name: m\naccuracy_threshold: 2\n")
    assert main(["lint", str(tmp_path)]) == 3
    assert capsys.readouterr().err == "3 config(s): 2 error(s), 0 warning(s)\n"


def test_files_print_in_the_order_found_each_by_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Sorted by line alone, b.yaml's line 2 came before a.yaml's line 4: two files' problems interleaved."""
    (tmp_path / "a.yaml").write_text(GOOD + "tolerance: -1\nnum_fewshot: x\n")
    (tmp_path / "b.yaml").write_text("model_name: m\naccuracy_threshold: 2\n")
    assert main(["lint", str(tmp_path)]) == 3
    located = [":".join(line.split(":")[:2]) for line in capsys.readouterr().out.splitlines()]
    assert located == [f"{tmp_path / 'a.yaml'}:3", f"{tmp_path / 'a.yaml'}:4", f"{tmp_path / 'b.yaml'}:2"]
