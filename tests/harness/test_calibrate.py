"""`quantgate calibrate`: the proposal follows the config's own gate, and a gate with a baseline
gets its baseline measured first (end to end on the fake server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.harness import gates
from quantgate.harness.cli import main as cli
from quantgate.harness.commands.calibrate import format_proposal, propose
from quantgate.harness.config import load_config
from quantgate.harness.results import RunRecord
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import write_config

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture


def _proposal(tmp_path: Path, text: str, values: list[float], n: int, limit: int | None = None) -> str:
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\n" + text)
    records = [RunRecord(name="c", verdict="PASS", reason="", config={"engine": "builtin", "server_args": []},
                         metrics={"value": v, "n": n}) for v in values]
    return format_proposal(propose(load_config(path), records, limit))


def test_thresholds_use_the_configs_gate_settings(tmp_path: Path) -> None:
    # rtol 0.02: the lowest run is below 0.7867 * 0.98, which the default 0.08 would have hidden.
    text = _proposal(tmp_path, "reference: {value: 0.8}\ngate: {mode: relative, rtol: 0.02}\n",
                     [0.80, 0.77, 0.79], 1319)
    assert "#   relative (rtol 0.02): 0.7710" in text  # of the pasted 0.7867, not of the mean 0.78667
    assert ("# WARNING: with this reference the config would fail 1 of 3 runs: 0.7700 (exact_match,strict-match "
            "0.7700 vs threshold 0.7710)") in text
    text = _proposal(tmp_path, "reference: {value: 0.8}\ngate: {mode: wilson, alpha: 0.01, beta: 0.1}\nrtol: 0.05\n",
                     [0.80, 0.82], 100)
    wilson_needed = gates.wilson(0.81, 100, 0.81, 0.05, 0.01)[1]["measured_threshold"]
    hypothesis = gates.hypothesis(0.81, 0.81, 100, 0.01, 0.1, 100)[1]
    assert f"#   wilson (alpha 0.01, rtol 0.05, n 100): measured >= {wilson_needed:.4f}" in text
    assert f"#   hypothesis (alpha 0.01, beta 0.1, n 100): {hypothesis['threshold']:.4f}" in text
    # At n 100 the mean itself fails (its lower bound is below 0.81 * 0.95): not noise, too few questions.
    assert "# WARNING: at n 100 the reference itself (0.81) fails the wilson gate" in text and "more questions" in text


def test_noise_warning_against_the_configs_own_gate(tmp_path: Path) -> None:
    # Hypothesis: 0.755 is below its threshold 0.7605, and 3 * stdev exceeds its margin.
    text = _proposal(tmp_path, "reference: {value: 0.8}\ngate: hypothesis\n", [0.80, 0.755, 0.805], 1319)
    assert "would fail 1 of 3 runs: 0.7550 (exact_match,strict-match 0.7550 vs threshold 0.7605)" in text
    assert "# WARNING: 3 * stdev = 0.0826 exceeds the hypothesis margin (reference - threshold = 0.0262)" in text
    # Absolute: accuracy_threshold - tolerance, the config's own numbers, whatever the reference.
    text = _proposal(tmp_path, "accuracy_threshold: 0.8\ntolerance: 0.02\n", [0.77, 0.80], 1319)
    assert "would fail 1 of 2 runs: 0.7700 (exact_match,strict-match 0.7700 vs threshold 0.7800)" in text
    assert "would fail" not in _proposal(tmp_path, "accuracy_threshold: 0.8\n", [0.77, 0.80], 1319)
    # The absolute gate's own threshold, and what to paste to gate on this measurement.
    text = _proposal(tmp_path, "accuracy_threshold: 0.8\ntolerance: 0.04\n", [0.842, 0.842], 500)
    assert ("#   absolute (the config's gate): accuracy_threshold 0.8 - tolerance 0.04 = 0.7600; this gate does not "
            "read `reference:`. To gate on this measurement: accuracy_threshold: 0.842") in text
    assert "(one standard error at n 500: 0.0163)" in text
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    text = _proposal(tmp_path, "baseline: base\ngate: paired\n", [0.10, 0.80], 1319)
    assert "# note: gate paired compares each run with its baseline, not with a reference" in text
    assert "would fail" not in text


@pytest.mark.parametrize(("gate", "hits"), [("{mode: relative, rtol: 0.01}", (942, 961)),
                                             ("hypothesis", (909, 985))])
def test_the_proposal_is_checked_with_the_reference_it_pastes(tmp_path: Path, gate: str, hits: tuple[int, int]) -> None:
    # The pasted value is the mean rounded to 4 places; the thresholds and the warning were of the
    # unrounded mean, so a run just above that threshold failed the gate the pasted reference gives.
    values = [k / 1319 for k in hits]
    path = tmp_path / "c.yaml"
    path.write_text(f"model_name: m\nreference: {{value: 0.7}}\ngate: {gate}\n")
    records = [RunRecord(name="c", verdict="PASS", reason="", config={"engine": "builtin", "server_args": []},
                         metrics={"value": v, "n": 1319}) for v in values]
    proposal = propose(load_config(path), records)
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text(f"model_name: m\nreference: {json.dumps(proposal['reference'])}\ngate: {gate}\n")
    outcome = gates.evaluate_gate(load_config(pasted), {"value": min(values), "n": 1319})
    assert not outcome.passed  # the lowest run fails the gate with the pasted reference...
    assert proposal["gate_threshold"] == pytest.approx(outcome.numbers["threshold"], abs=1e-12)
    assert proposal["failing_runs"] == [min(values)]
    assert "# WARNING: with this reference the config would fail 1 of 2 runs" in format_proposal(proposal)  # ...and says so


def test_the_noise_warning_tells_apart_a_run_and_a_threshold_that_round_alike(tmp_path: Path) -> None:
    # 942/1319 = 0.714177 against 0.7214 * 0.99 = 0.714186: at .4f "0.7142 is below 0.7142".
    text = _proposal(tmp_path, "reference: {value: 0.7}\ngate: {mode: relative, rtol: 0.01}\n",
                     [942 / 1319, 961 / 1319], 1319)
    assert "0.7142 (exact_match,strict-match 0.71418 vs threshold 0.71419)" in text


def test_limit_warns_when_the_gate_evaluates_the_whole_test_set(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n' * 40)
    with_data = "accuracy_threshold: 0.5\nnum_fewshot: 0\ndataset: {test: test.jsonl}\n"
    text = _proposal(tmp_path, with_data, [0.8, 0.82], 8, limit=8)
    assert ("# WARNING: measured on 8 of the 40 test questions, but the config sets no num_questions, so its gate "
            "evaluates the whole test set: calibrate without --limit") in text
    assert "num_questions" not in _proposal(tmp_path, with_data, [0.8, 0.82], 40, limit=50)  # the whole set
    text = _proposal(tmp_path, "accuracy_threshold: 0.5\n", [0.8, 0.82], 50, limit=50)  # the task's own data
    assert "# WARNING: measured with --limit 50, but the config sets no num_questions" in text
    assert "WARNING: measured" not in _proposal(tmp_path, "accuracy_threshold: 0.5\n", [0.8, 0.82], 1319)


def test_a_gate_with_a_baseline_gets_it_measured_first(tmp_path: Path, gsm8k_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 0.8})
    cand = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 0.7}, baseline="base", gate="paired")
    out_dir = tmp_path / "cal"
    assert cli(["calibrate", str(cand), "--runs", "2", "--limit", "8", "--output-dir", str(out_dir)]) == 0
    output = capsys.readouterr()
    assert "baseline of cand (gate paired), measured once" in output.err
    assert json.loads((out_dir / "baseline" / "base" / "result.json").read_text())["metrics"]["n"] == 8
    for index in (1, 2):
        gate = json.loads((out_dir / f"run-{index}" / "cand" / "result.json").read_text())["gate"]
        assert gate["mode"] == "paired" and gate["n_common"] == 8
    assert "# note: gate paired compares each run with its baseline" in output.out
    # A second calibration reuses the baseline's result, as `quantgate run` does its cache.
    assert cli(["calibrate", str(cand), "--runs", "2", "--limit", "8", "--output-dir", str(out_dir)]) == 0
    assert "measured once" not in capsys.readouterr().err


def test_a_baseline_that_errors_stops_calibrate_with_the_runners_exit_code(
        tmp_path: Path, gsm8k_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_config(tmp_path, "base", gsm8k_dir, {"exit_during_startup": 0.1})
    cand = write_config(tmp_path, "cand", gsm8k_dir, baseline="base", gate="recovery")
    out_dir = tmp_path / "cal"
    assert cli(["calibrate", str(cand), "--runs", "2", "--limit", "4", "--output-dir", str(out_dir)]) == 2
    assert "error: baseline base measured nothing (server " in capsys.readouterr().err
    assert not (out_dir / "run-1").exists() and not (out_dir / "calibration.json").exists()


def test_measured_on_names_a_cpu_once_and_the_backends_however_written(tmp_path: Path) -> None:
    from quantgate.harness.commands.calibrate import _measured_on

    record = RunRecord(name="c", verdict="PASS", reason="", config={"engine": "builtin", "server_args": []},
                       kernels={"platform": {"device": "cpu", "name": "cpu", "capability": None}})
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear_backend=emulation\n")
    assert _measured_on(record, load_config(path)) == "cpu, engine builtin, --linear-backend emulation"


def test_runs_the_pasted_config_would_fail_on_another_listed_metric_or_invalid_answers(tmp_path: Path) -> None:
    """Only the gated metric was checked: a gen-1 file's other listed value, or max_invalid_rate,
    failed every run with the pasted reference while calibrate said nothing."""
    gen1 = ("tasks:\n- name: gsm8k\n  metrics:\n  - {name: 'exact_match,strict-match', value: 0.5}\n"
            "  - {name: 'exact_match,flexible-extract', value: 0.99}\nrtol: 0.02\n")
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\n" + gen1)
    records = [RunRecord(name="c", verdict="FAIL", reason="", config={"engine": "builtin", "server_args": []},
                         metrics={"value": 0.95, "strict_match": 0.95, "flexible_extract": v, "n": 20})
               for v in (0.95, 0.96)]
    proposal = propose(load_config(path), records)
    text = format_proposal(proposal)
    assert proposal["failing_runs"] == [0.95, 0.95]
    assert "would fail 2 of 2 runs: 0.9500 (exact_match,flexible-extract 0.9500 vs threshold 0.9702)" in text
    assert ("# exact_match,flexible-extract, also listed and gated: measured mean 0.9550 against its listed value "
            "0.99: update that value in tasks[0].metrics too") in text
    path.write_text("model_name: m\naccuracy_threshold: 0.5\ngate: {mode: absolute, max_invalid_rate: 0.05}\n")
    records = [RunRecord(name="c", verdict="FAIL", reason="", config={"engine": "builtin", "server_args": []},
                         metrics={"value": 0.8, "n": 100, "invalid_rate": 0.2}) for _ in range(2)]
    assert "invalid_rate 0.2000 > max_invalid_rate 0.0500" in format_proposal(propose(load_config(path), records))


def test_an_error_every_run_repeats_is_exit_3_after_the_first_run(tmp_path: Path, gsm8k_dir: Path) -> None:
    """`quantgate run` exits 3 on this config (a retry repeats it); calibrate exited 2, after every run."""
    message = "This model's maximum context length is 512 tokens. However, you requested 940 tokens"
    config = write_config(tmp_path, "short", gsm8k_dir, {"error_after": 0, "error_status": 400,
                                                         "error_message": message}, max_concurrency=1, num_questions=2)
    assert cli(["run", str(config), "--output-dir", str(tmp_path / "run")]) == 3
    assert cli(["calibrate", str(config), "--runs", "3", "--output-dir", str(tmp_path / "cal")]) == 3
    assert (tmp_path / "cal" / "run-1").is_dir() and not (tmp_path / "cal" / "run-2").exists()


def test_a_failed_calibration_leaves_no_earlier_proposal_beside_its_runs(tmp_path: Path, gsm8k_dir: Path) -> None:
    good = write_config(tmp_path, "c", gsm8k_dir, {"accuracy": 0.8})
    out = tmp_path / "cal"
    assert cli(["calibrate", str(good), "--runs", "2", "--limit", "4", "--output-dir", str(out)]) == 0
    assert (out / "calibration.json").exists()
    bad = write_config(tmp_path, "c", gsm8k_dir, {"exit_during_startup": 0.1})
    assert cli(["calibrate", str(bad), "--runs", "2", "--limit", "4", "--output-dir", str(out)]) == 2
    assert json.loads((out / "run-1" / "c" / "result.json").read_text())["verdict"] == "ERROR"
    assert not (out / "calibration.json").exists()


def test_no_limit_warning_when_the_test_set_is_all_a_run_evaluates(tmp_path: Path) -> None:
    """num_questions 30 on a 12-question file, no --limit: the gate evaluates the same 12."""
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n' * 12)
    text = _proposal(tmp_path, "accuracy_threshold: 0.5\nnum_fewshot: 0\nnum_questions: 30\n"
                     "dataset: {test: test.jsonl}\n", [0.8, 0.8], 12)
    assert "WARNING: measured" not in text, text
    text = _proposal(tmp_path, "accuracy_threshold: 0.5\nnum_fewshot: 0\nnum_questions: 30\n"
                     "dataset: {test: test.jsonl}\n", [0.8, 0.8], 8, limit=8)
    assert "# WARNING: measured on 8 of the 12 questions the config's gate evaluates (--limit)" in text


def test_each_config_gets_its_own_default_output_folder(tmp_path: Path, gsm8k_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every config shared results/calibrate: the second one's proposal replaced the first's."""
    monkeypatch.chdir(tmp_path)
    for name, accuracy in (("a", 0.8), ("b", 0.6)):
        assert cli(["calibrate", str(write_config(tmp_path, name, gsm8k_dir, {"accuracy": accuracy})), "--runs", "2",
                    "--limit", "4"]) == 0
    for name in ("a", "b"):
        proposal = json.loads((tmp_path / "results" / "calibrate" / name / "calibration.json").read_text())
        assert proposal["config"].endswith(f"{name}.yaml")


def test_runs_of_different_sizes_propose_the_smallest_n_and_say_so(tmp_path: Path) -> None:
    # The reference claims no more questions than every run evaluated.
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\nreference: {value: 0.8}\ngate: hypothesis\n")
    records = [RunRecord(name="c", verdict="PASS", reason="", config={"engine": "builtin", "server_args": []},
                         metrics={"value": 0.8, "n": n}) for n in (120, 100)]
    proposal = propose(load_config(path), records)
    assert proposal["reference"]["n"] == 100 and proposal["n_per_run"] == [100, 120]
    assert "# WARNING: runs evaluated different numbers of questions" in format_proposal(proposal)
    same_n = _proposal(tmp_path, "reference: {value: 0.8}\ngate: hypothesis\n", [0.8, 0.82], 100)
    assert "different numbers" not in same_n


def test_the_summary_line_has_the_spread_of_the_runs(tmp_path: Path) -> None:
    text = _proposal(tmp_path, "accuracy_threshold: 0.5\n", [0.80, 0.77, 0.79], 1319)
    assert "mean 0.7867, sample stdev 0.0153, min 0.7700, max 0.8000, n per run 1319" in text


def test_the_pasted_reference_has_the_spread_and_count_of_the_runs(tmp_path: Path) -> None:
    text = _proposal(tmp_path, "accuracy_threshold: 0.5\n", [0.80, 0.77, 0.79], 1319)
    reference = json.loads(text.split("reference: ", 1)[1].splitlines()[0])
    assert [reference[key] for key in ("value", "stdev", "runs", "n")] == [0.7867, 0.0153, 3, 1319]
    assert "#   run-to-run spread: 3 * stdev = 0.0458 (a gate tighter than this below the mean flakes)" in text
    # The absolute gate's tolerance hint: one standard error of a 0.5 mean at n 20 is sqrt(0.25 / 20).
    assert "(one standard error at n 20: 0.1118)" in _proposal(tmp_path, "accuracy_threshold: 0.5\n", [0.5, 0.5], 20)


def test_the_hypothesis_noise_warning_comes_before_any_run_fails(tmp_path: Path) -> None:
    # Both runs pass (threshold 0.7665), but 3 * stdev 0.0318 exceeds the margin 0.0260 (2 * stdev would not).
    text = _proposal(tmp_path, "reference: {value: 0.8}\ngate: hypothesis\n", [0.80, 0.785], 1319)
    assert "would fail" not in text
    assert "# WARNING: 3 * stdev = 0.0318 exceeds the hypothesis margin (reference - threshold = 0.0260)" in text


def test_a_recovery_gate_checks_no_run_against_a_reference(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    text = _proposal(tmp_path, "baseline: base\ngate: recovery\n", [0.10, 0.80], 1319)
    assert "# note: gate recovery compares each run with its baseline, not with a reference" in text
    assert "would fail" not in text


def test_the_hypothesis_noise_warning_is_for_a_hypothesis_gate_only(tmp_path: Path) -> None:
    # 3 * stdev 0.0826 exceeds the hypothesis margin 0.0262, but a relative gate has no such margin.
    text = _proposal(tmp_path, "reference: {value: 0.8}\ngate: {mode: relative, rtol: 0.1}\n", [0.80, 0.755, 0.805],
                     1319)
    assert "hypothesis margin" not in text


def test_a_dirty_checkout_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\n")
    records = [RunRecord(name="c", verdict="PASS", reason="", config={"engine": "builtin", "server_args": []},
                         metrics={"value": v, "n": 100}) for v in (0.8, 0.82)]
    proposal = propose(load_config(path), records)
    proposal["reference"]["commit"] = "0123abcd-dirty"
    assert "# WARNING: measured on a checkout with uncommitted changes" in format_proposal(proposal)


def _run_records(monkeypatch: pytest.MonkeyPatch, records: list[RunRecord]) -> None:
    """Each run of calibrate returns the next of `records`, no server started."""
    from quantgate.harness.commands import calibrate

    pending = iter(records)
    monkeypatch.setattr(calibrate, "run_one", lambda *args: next(pending))


def test_a_config_error_after_a_retryable_one_exits_3(tmp_path: Path, gsm8k_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry of the calibration repeats the config's own error: 3, as `quantgate run` exits."""
    _run_records(monkeypatch, [RunRecord(name="c", verdict="ERROR", reason="server died", config={}),
                               RunRecord(name="c", verdict="ERROR", reason="prompt too long", config={},
                                         usage_error=True)])
    config = write_config(tmp_path, "c", gsm8k_dir)
    assert cli(["calibrate", str(config), "--runs", "3", "--output-dir", str(tmp_path / "cal")]) == 3


def test_a_baseline_with_the_configs_own_error_exits_3(tmp_path: Path, gsm8k_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The baseline's own config error (a retry repeats it) is 3, as `quantgate run` exits, not 2."""
    _run_records(monkeypatch, [RunRecord(name="base", verdict="ERROR", reason="prompt too long", config={},
                                         usage_error=True)])
    write_config(tmp_path, "base", gsm8k_dir)
    cand = write_config(tmp_path, "cand", gsm8k_dir, baseline="base", gate="paired")
    assert cli(["calibrate", str(cand), "--runs", "2", "--output-dir", str(tmp_path / "cal")]) == 3
    assert "error: baseline base measured nothing (prompt too long)" in capsys.readouterr().err


def test_a_run_without_a_value_measured_nothing(tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _run_records(monkeypatch, [RunRecord(name="c", verdict="FAIL", reason="no answers", config={},
                                         metrics={"value": None, "n": 0})] * 2)
    config = write_config(tmp_path, "c", gsm8k_dir)
    assert cli(["calibrate", str(config), "--runs", "2", "--output-dir", str(tmp_path / "cal")]) == 1
    assert "error: 2 of 2 runs measured nothing (no answers)" in capsys.readouterr().err
    assert not (tmp_path / "cal" / "calibration.json").exists()
