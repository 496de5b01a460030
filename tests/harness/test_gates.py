"""Gates: the published figures, each mode's boundary, and the arithmetic in the output."""

from __future__ import annotations

import math
import random
import re
import time
from pathlib import Path
from statistics import NormalDist

import pytest

from quantgate.harness import gates
from quantgate.harness.config import load_config
from quantgate.harness.gates import Baseline, GateInputError, GateInputMismatch, evaluate_gate


def config(tmp_path: Path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\n" + text, encoding="utf-8")
    return load_config(path)


# -- published figures ----------------------------------------------------------------------------


def test_hypothesis_reproduces_the_tensorrt_llm_figures() -> None:
    # n = 1319 (GSM8K test), sigma = 0.5 (p = 0.5), alpha 0.05, beta 0.2.
    passed, numbers, text = gates.hypothesis(0.5, 0.5, 1319)
    assert numbers["sigma"] == pytest.approx(0.5)
    assert round(numbers["margin"], 4) == 0.0320
    assert round(numbers["theta"], 4) == 0.0484
    assert "0.0320 below the reference" in text and "= 0.0484" in text and passed


def test_hypothesis_boundary() -> None:
    threshold = 0.5 - 0.0320259
    assert gates.hypothesis(threshold + 1e-4, 0.5, 1319)[0]
    assert not gates.hypothesis(threshold - 1e-4, 0.5, 1319)[0]


def test_wilson_published_check() -> None:
    assert gates.relative(0.72, 0.755, 0.08)[0]
    passed_100, numbers_100, _ = gates.wilson(0.72, 100, 0.755, 0.08)
    passed_1000, numbers_1000, _ = gates.wilson(0.72, 1000, 0.755, 0.08)
    assert not passed_100 and passed_1000
    assert numbers_100["threshold"] == pytest.approx(0.6946)
    assert numbers_100["wilson_lower_bound"] < 0.6946 < numbers_1000["wilson_lower_bound"]


def test_wilson_bound_matches_its_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        n = rng.randint(1, 5000)
        p = rng.randint(0, n) / n
        z = rng.uniform(0.5, 3.0)
        # The Wilson interval is where |p - q| = z sqrt(q(1-q)/n): its lower root.
        a = 1 + z * z / n
        b = -(2 * p + z * z / n)
        c = p * p
        lower = (-b - math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a)
        assert gates.wilson_lower_bound(p, n, z) == pytest.approx(lower, abs=1e-9)


def test_hypothesis_uses_the_reference_n(tmp_path: Path) -> None:
    # A reference measured on 50 questions is as noisy as the run on 1319 is not: its variance counts.
    _, numbers, text = gates.hypothesis(0.8, 0.8, 1319, n_reference=50)
    se = 0.4 * math.sqrt(1 / 1319 + 1 / 50)
    assert numbers["standard_error"] == pytest.approx(se) and (numbers["n"], numbers["n_reference"]) == (1319, 50)
    assert numbers["threshold"] == pytest.approx(0.8 - 1.6448536 * se)
    assert numbers["theta"] == pytest.approx((1.6448536 + 0.8416212) * se)
    assert "sqrt(1/1319 + 1/50)" in text and "n_ref: reference.n" in text
    # Without reference.n the reference counts as measured on the run's n: SPEC's sqrt(2 sigma^2 / n).
    _, same, text = gates.hypothesis(0.8, 0.8, 1319)
    assert same["standard_error"] == pytest.approx(math.sqrt(2 * 0.16 / 1319)) and same["n_reference"] == 1319
    assert "reference.n not given" in text
    cfg = config(tmp_path, "reference: {value: 0.8, n: 50}\ngate: hypothesis\n")
    assert evaluate_gate(cfg, {"value": 0.8, "n": 1319}).numbers["threshold"] == pytest.approx(numbers["threshold"])


def test_wilson_threshold_on_the_measured_scale(seed: int) -> None:
    _, numbers, text = gates.wilson(0.72, 100, 0.755, 0.08)
    needed = numbers["measured_threshold"]
    z = numbers["z"]
    assert gates.wilson_lower_bound(needed, 100, z) >= numbers["threshold"] - 1e-12
    assert gates.wilson_lower_bound(needed - 2e-9, 100, z) < numbers["threshold"]
    assert 0.72 < needed and f"at n = 100 that takes measured >= {needed:.4f}" in text
    assert gates.wilson(0.72, 1000, 0.755, 0.08)[1]["measured_threshold"] < 0.72
    rng = random.Random(seed)
    for _ in range(200):  # measured vs measured_threshold agrees with the verdict
        n = rng.randint(1, 3000)
        measured = rng.randint(0, n) / n
        passed, numbers, _ = gates.wilson(measured, n, rng.random(), rng.uniform(0, 0.2), rng.uniform(0.001, 0.2))
        if numbers["measured_threshold"] is None:
            assert not passed
        elif abs(measured - numbers["measured_threshold"]) > 1e-8:
            assert passed == (measured > numbers["measured_threshold"])
    # At n = 10 a lower bound never reaches 0.9, whatever the model scores.
    passed, numbers, text = gates.wilson(1.0, 10, 1.0, 0.1)
    assert not passed and numbers["measured_threshold"] is None
    assert "no measured accuracy passes at n = 10 (even 1.0 has lower bound 0.7871): evaluate more" in text


# -- absolute, relative, recovery ----------------------------------------------------------------


def test_absolute_is_vllm_gen2_with_float_rounding_forgiven() -> None:
    passed, numbers, text = gates.absolute(0.72, 0.80, 0.08)
    assert passed and numbers["threshold"] == pytest.approx(0.72)
    assert "0.8000 - 0.0800 = 0.7200" in text
    assert not gates.absolute(0.7199, 0.80, 0.08)[0]


def test_relative_boundary() -> None:
    assert gates.relative(0.755 * 0.92, 0.755, 0.08)[0]
    assert not gates.relative(0.755 * 0.92 - 1e-6, 0.755, 0.08)[0]


def test_recovery_ratio() -> None:
    passed, numbers, text = gates.recovery(0.76, 0.80, 0.95, n=100, baseline_n=100)
    assert passed and numbers["recovery_ratio"] == pytest.approx(0.95) and "0.7600 / 0.8000" in text
    assert not gates.recovery(0.75, 0.80, 0.95, n=100, baseline_n=100)[0]
    with pytest.raises(GateInputMismatch, match="baseline scored 0"):  # the baseline's files say so: exit 3
        gates.recovery(0.5, 0.0, n=100, baseline_n=100)


def test_recovery_threshold_on_the_measured_scale_and_the_same_n() -> None:
    _, numbers, text = gates.recovery(0.75, 0.80, 0.95, n=1319, baseline_n=1319)
    assert numbers["measured_threshold"] == pytest.approx(0.76) and "baseline * recovery = 0.7600" in text
    assert (numbers["n"], numbers["baseline_n"]) == (1319, 1319)
    # A baseline measured on 50 questions against a run on all 1319: not a recovery of anything.
    with pytest.raises(GateInputError, match="evaluated 1319 questions and the baseline 50.*same num_questions"):
        gates.recovery(0.75, 0.80, 0.95, n=1319, baseline_n=50)


def test_a_failed_comparison_is_printed_with_the_places_that_tell_it_apart() -> None:
    # .4f printed "0.9500 < recovery 0.9500" and "measured 0.6725 < 0.6725": a FAIL that reads as a tie.
    passed, _, text = gates.recovery(968 / 1319, 1019 / 1319, 0.95, n=1319, baseline_n=1319)
    assert not passed and "0.94995 < recovery 0.95000 -> FAIL; i.e. measured 0.73389 < baseline * recovery = 0.73393" \
        in text
    passed, _, text = gates.hypothesis(887 / 1319, 0.7018, 1319)
    assert not passed and "= 0.67250 (0.0293 below the reference); measured 0.67248 < 0.67250 -> FAIL" in text
    # A gap of 1e-9 takes nine places; within the gates' EPSILON the two are equal and print so.
    assert gates.shown(0.5 - 1e-9, 0.5) == ("0.499999999", "0.500000000")
    assert gates.shown(0.5 - 1e-13, 0.5) == ("0.5000", "0.5000") and gates.absolute(0.5 - 1e-13, 0.5, 0.0)[0]
    assert gates.shown(0.7339, 0.75) == ("0.7339", "0.7500")  # apart at 4 places: 4 places
    assert gates.shown(0.049996, 0.05, kind="g") == ("0.049996", "0.05")  # paired's p-value against alpha


def test_printed_comparisons_never_contradict_the_verdict(seed: int) -> None:
    rng = random.Random(seed)
    pattern = r"(-?\d+\.\d+) (<|>=) (?:recovery |baseline \* recovery = )?(-?\d+\.\d+) -> (PASS|FAIL)"
    for _ in range(2000):
        n = rng.choice([50, 100, 1319])
        measured, reference = rng.randint(0, n) / n, rng.randint(1, 10_000) / 10_000
        rtol = rng.choice([0.0, 0.01, 0.05])
        for passed, _, text in (gates.relative(measured, reference, rtol), gates.hypothesis(measured, reference, n),
                                gates.wilson(measured, n, reference, rtol),
                                gates.recovery(measured, reference, 0.95, n=n, baseline_n=n),
                                gates.absolute(measured, reference, rtol)):
            compared = re.findall(pattern, text)
            assert compared, text
            for left, sign, right, verdict in compared:
                assert verdict == ("PASS" if passed else "FAIL") and (sign == ">=") == passed, text
                assert (float(left) >= float(right)) == passed, text


# -- paired -------------------------------------------------------------------------------------------


def test_binomial_tail_is_the_exact_sum_in_linear_time(seed: int) -> None:
    rng = random.Random(seed)
    for n in [*range(0, 201, 7), *(rng.randint(1, 200) for _ in range(10))]:
        for k in range(-1, n + 2):
            exact = sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2**n  # the definition
            assert gates.binomial_tail(k, n) == exact, (k, n)
    stats = pytest.importorskip("scipy.stats")
    started = time.monotonic()
    for k in (0, 9_800, 9_950, 10_000, 10_100, 10_300, 20_000):
        assert gates.binomial_tail(k, 20_000) == pytest.approx(stats.binom.sf(k - 1, 20_000, 0.5), rel=1e-9,
                                                             abs=1e-300)
    # Summing math.comb(n, i) term by term took 162 s for one tail at n = 20000 (quadratic).
    assert time.monotonic() - started < 5.0


def test_paired_counts_flips_both_ways(seed: int) -> None:
    rng = random.Random(seed)
    base = {str(i): rng.random() < 0.7 for i in range(300)}
    cand = {k: (v if rng.random() < 0.9 else not v) for k, v in base.items()}
    _, numbers, text = gates.paired(cand, base)
    losses = sum(base[k] and not cand[k] for k in base)
    wins = sum(cand[k] and not base[k] for k in base)
    assert (numbers["flips_right_to_wrong"], numbers["flips_wrong_to_right"]) == (losses, wins)
    assert numbers["both_right"] + numbers["both_wrong"] + losses + wins == 300
    assert f"{losses} right->wrong" in text and f"{wins} wrong->right" in text


def test_paired_fails_only_when_significantly_worse() -> None:
    base = {str(i): True for i in range(100)}
    assert not gates.paired({**base, **{str(i): False for i in range(10)}}, base)[0]  # 10 losses, 0 wins
    assert gates.paired({**base, **{str(i): False for i in range(4)}}, base)[0]  # p = 1/16 >= 0.05
    better = {str(i): i >= 10 for i in range(100)}
    assert gates.paired({str(i): True for i in range(100)}, better)[0]  # candidate better: passes
    # Exact boundary: 5 losses, 0 wins -> p = 1/32 < 0.05 fails; alpha 0.01 passes.
    five = {**base, **{str(i): False for i in range(5)}}
    assert not gates.paired(five, base, 0.05)[0] and gates.paired(five, base, 0.01)[0]


def test_paired_refuses_different_question_sets() -> None:
    # Dropping the questions one run lacks (a killed run's hard tail) would bias the test.
    with pytest.raises(GateInputError, match="1 only in the candidate, 2 only in the baseline, 2 in both; "
                                             "evaluate both on the same data set with the same num_questions"):
        gates.paired({"a": True, "b": True, "c": False}, {"a": True, "b": True, "d": True, "e": False})
    with pytest.raises(GateInputError, match="1 only in the candidate, 1 only in the baseline, 0 in both"):
        gates.paired({"a": True}, {"b": True})
    numbers = gates.paired({"a": True, "b": False}, {"b": True, "a": True})[1]
    assert numbers["n_common"] == 2 and numbers["only_candidate"] == numbers["only_baseline"] == 0


# -- evaluate_gate: config in, outcome out ------------------------------------------------------------


def test_evaluate_gate_absolute_from_a_gen2_config(tmp_path: Path) -> None:
    cfg = config(tmp_path, "accuracy_threshold: 0.375\n")
    outcome = evaluate_gate(cfg, {"value": 0.29, "n": 1319})
    assert not outcome.passed and outcome.mode == "absolute"
    assert outcome.numbers["threshold"] == pytest.approx(0.295)
    assert evaluate_gate(cfg, {"value": 0.30, "n": 1319}).passed
    assert outcome.to_dict()["mode"] == "absolute" and "explanation" in outcome.to_dict()


def test_evaluate_gate_wilson_uses_measured_n(tmp_path: Path) -> None:
    cfg = config(tmp_path, "reference: {value: 0.755}\ngate: wilson\n")
    assert not evaluate_gate(cfg, {"value": 0.72, "n": 100}).passed
    assert evaluate_gate(cfg, {"value": 0.72, "n": 1000}).passed


def test_evaluate_gate_max_invalid_rate(tmp_path: Path) -> None:
    cfg = config(tmp_path, "accuracy_threshold: 0.5\ngate: {mode: absolute, max_invalid_rate: 0.05}\n")
    ok = evaluate_gate(cfg, {"value": 0.9, "n": 100, "invalid_rate": 0.05})
    bad = evaluate_gate(cfg, {"value": 0.9, "n": 100, "invalid_rate": 0.06})
    assert ok.passed and not bad.passed and "invalid_rate 0.0600 > max_invalid_rate 0.0500" in bad.explanation
    with pytest.raises(GateInputError, match="invalid_rate"):
        evaluate_gate(cfg, {"value": 0.9, "n": 100})


def test_evaluate_gate_paired_and_recovery_need_the_baseline(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    paired = config(tmp_path, "baseline: base\ngate: paired\n")
    samples = [{"id": i, "correct": i % 2 == 0} for i in range(20)]
    with pytest.raises(GateInputError, match="per-sample"):
        evaluate_gate(paired, {"value": 0.5, "n": 20}, samples, None)
    with pytest.raises(GateInputMismatch, match="per-sample results of baseline 'base'"):  # its files lack them
        evaluate_gate(paired, {"value": 0.5, "n": 20}, samples, Baseline("base", {"value": 0.5, "n": 20}))
    base = Baseline("base", {"value": 0.5, "n": 20}, samples)
    assert evaluate_gate(paired, {"value": 0.5, "n": 20}, samples, base).numbers["discordant"] == 0
    recovery = config(tmp_path, "baseline: base\ngate: {mode: recovery, recovery: 0.9}\n")
    outcome = evaluate_gate(recovery, {"value": 0.45, "n": 20}, None, base)
    assert outcome.passed and outcome.numbers["recovery_ratio"] == pytest.approx(0.9)
    assert outcome.numbers["baseline_n"] == 20
    with pytest.raises(GateInputError, match="evaluated 19 questions and the baseline 20"):
        evaluate_gate(recovery, {"value": 0.45, "n": 19}, None, base)


def test_evaluate_gate_paired_refuses_rows_it_cannot_pair(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    paired = config(tmp_path, "baseline: base\ngate: paired\n")
    rows = [{"id": i, "correct": i % 2 == 0, "target": f"#### {i}"} for i in range(20)]
    metrics = {"value": 0.5, "n": 20}
    other_data = [{**row, "target": f"#### {100 + row['id']}"} for row in rows]
    with pytest.raises(GateInputError, match="different targets for 20 question id.*different data sets"):
        evaluate_gate(paired, metrics, rows, Baseline("base", metrics, other_data))
    with pytest.raises(GateInputError, match="0 only in the candidate, 5 only in the baseline"):
        evaluate_gate(paired, {"value": 0.5, "n": 15}, rows[:15], Baseline("base", metrics, rows))
    duplicated = rows + [{**rows[3], "correct": True}]
    with pytest.raises(GateInputError, match="baseline base: row 21: question id '3' appears twice"):
        evaluate_gate(paired, metrics, rows, Baseline("base", metrics, duplicated))
    for text in ("false", None, 0):
        with pytest.raises(GateInputError, match=f"row 2 .question id '1'.: 'correct' must be true or false, "
                                                 f"got {text!r}"):
            evaluate_gate(paired, metrics, [rows[0], {**rows[1], "correct": text}, *rows[2:]],
                          Baseline("base", metrics, rows))


def test_evaluate_gate_refuses_a_baseline_sent_other_prompts(tmp_path: Path) -> None:
    # Same ids and targets, other prompts (another num_fewshot): paired and recovery refuse to compare.
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    rows = [{"id": i, "correct": i % 2 == 0, "target": f"#### {i}", "prompt_hash": f"p{i}"} for i in range(20)]
    metrics = {"value": 0.5, "n": 20}
    other_prompts = [{**row, "prompt_hash": f"q{row['id']}"} if row["id"] >= 15 else row for row in rows]
    for mode in ("paired", "recovery"):
        gated = config(tmp_path, f"baseline: base\ngate: {mode}\n")
        with pytest.raises(GateInputMismatch, match=f"gate {mode}: .* different prompts for 5 of 20 question id.s. "
                                                    ".first: '15'.*num_fewshot"):
            evaluate_gate(gated, metrics, rows, Baseline("base", metrics, other_prompts))
        assert evaluate_gate(gated, metrics, rows, Baseline("base", metrics, rows)).passed
        # Rows that do not record their prompt (hand-made, older results) are compared as before.
        unrecorded = [{k: v for k, v in row.items() if k != "prompt_hash"} for row in other_prompts]
        assert evaluate_gate(gated, metrics, rows, Baseline("base", metrics, unrecorded)).passed


def test_evaluate_gate_recovery_refuses_a_baseline_of_other_questions(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    recovery = config(tmp_path, "baseline: base\ngate: recovery\n")
    rows = [{"id": i, "correct": True, "target": f"#### {i}"} for i in range(20)]
    metrics = {"value": 1.0, "n": 20}
    assert evaluate_gate(recovery, metrics, rows, Baseline("base", metrics, rows)).passed
    # As many questions is not the same questions: other ids, or the same ids of another test file.
    other_ids = [{**row, "id": 100 + row["id"]} for row in rows]
    with pytest.raises(GateInputMismatch, match="gate recovery: .*20 only in the candidate, 20 only in the baseline"):
        evaluate_gate(recovery, metrics, rows, Baseline("base", metrics, other_ids))
    other_targets = [{**row, "target": f"#### {100 + row['id']}"} for row in rows]
    with pytest.raises(GateInputMismatch, match="different targets for 20 question id.*different data sets"):
        evaluate_gate(recovery, metrics, rows, Baseline("base", metrics, other_targets))
    # Without per-sample results on either side, the test files' hashes decide.
    ours, theirs = {"test": "a" * 64, "train": "c" * 64}, {"test": "b" * 64, "train": "c" * 64}
    with pytest.raises(GateInputMismatch, match="different test files .sha256 aaaaaaaaaaaa... and bbbbbbbbbbbb"):
        evaluate_gate(recovery, metrics, None, Baseline("base", metrics, None, theirs), dataset=ours)
    with pytest.raises(GateInputMismatch, match="different test files"):
        evaluate_gate(recovery, metrics, rows, Baseline("base", metrics, None, theirs), dataset=ours)
    assert evaluate_gate(recovery, metrics, None, Baseline("base", metrics, None, dict(ours)), dataset=ours).passed
    assert evaluate_gate(recovery, metrics, None, Baseline("base", metrics, None, None), dataset=ours).passed


@pytest.mark.parametrize("mode", ["paired", "recovery"])
def test_evaluate_gate_refuses_a_baseline_of_another_metric(tmp_path: Path, mode: str) -> None:
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    cfg = config(tmp_path, f"baseline: base\ngate: {mode}\n")
    rows = [{"id": i, "correct": True, "target": f"#### {i}"} for i in range(20)]
    metrics = {"value": 1.0, "n": 20, "metric": cfg.metric}
    flexible = Baseline("base", {"value": 1.0, "n": 20, "metric": "exact_match,flexible-extract"}, rows)
    with pytest.raises(GateInputMismatch, match=f"gate {mode}: this run gates exact_match,strict-match and baseline "
                                                "base gated exact_match,flexible-extract"):
        evaluate_gate(cfg, metrics, rows, flexible)
    assert evaluate_gate(cfg, metrics, rows, Baseline("base", {**flexible.metrics, "metric": cfg.metric}, rows)).passed
    assert evaluate_gate(cfg, metrics, rows, Baseline("base", {"value": 1.0, "n": 20}, rows)).passed  # names none


@pytest.mark.parametrize("alpha", [1e-17, 1e-300])
def test_any_alpha_the_config_accepts_gates(tmp_path: Path, alpha: float) -> None:
    # 1 - 1e-17 == 1.0: z(1 - alpha) as inv_cdf(1 - alpha) raised StatisticsError after the whole eval.
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    metrics = {"value": 0.9, "n": 1319}
    z = -NormalDist().inv_cdf(alpha)
    hypothesis = evaluate_gate(config(tmp_path, f"reference: {{value: 0.8}}\n"
                                                f"gate: {{mode: hypothesis, alpha: {alpha!r}, beta: {alpha!r}}}\n"), metrics)
    assert all(math.isfinite(v) for v in hypothesis.numbers.values() if isinstance(v, float)), hypothesis.numbers
    wilson = evaluate_gate(config(tmp_path, f"reference: {{value: 0.8}}\ngate: {{mode: wilson, alpha: {alpha!r}}}\n"),
                           metrics)
    assert all(math.isfinite(v) for v in wilson.numbers.values() if isinstance(v, float)), wilson.numbers
    assert wilson.numbers["z"] == pytest.approx(z) and wilson.numbers["wilson_lower_bound"] == pytest.approx(
        gates.wilson_lower_bound(0.9, 1319, z))
    rows = [{"id": i, "correct": True} for i in range(20)]
    paired = config(tmp_path, f"baseline: base\ngate: {{mode: paired, alpha: {alpha!r}}}\n")
    assert evaluate_gate(paired, {"value": 1.0, "n": 20}, rows, Baseline("base", {"value": 1.0, "n": 20}, rows)).passed


def test_evaluate_gate_rejects_malformed_metrics(tmp_path: Path) -> None:
    cfg = config(tmp_path, "reference: {value: 0.7}\ngate: hypothesis\n")
    for metrics in ({"n": 10}, {"value": "0.5", "n": 10}, {"value": float("nan"), "n": 10}, {"value": 0.5, "n": 0}):
        with pytest.raises(GateInputError):
            evaluate_gate(cfg, metrics)


# -- gen-1: every listed metric gated -------------------------------------------------------------

GEN1 = ("tasks:\n- name: gsm8k\n  metrics:\n  - {name: 'exact_match,strict-match', value: 0.50}\n"
        "  - {name: 'exact_match,flexible-extract', value: 1.0}\nlimit: 20\nrtol: 0.01\n")


def test_gen1_fails_when_any_listed_metric_fails(tmp_path: Path) -> None:
    """vLLM's test: success = success and measured >= value * (1 - rtol), for each listed metric.
    A run whose strict-match passed and flexible-extract failed passed here."""
    cfg = config(tmp_path, GEN1)
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.95, "n": 20})
    assert not outcome.passed and outcome.mode == "relative"
    assert (outcome.numbers["metric"], outcome.numbers["measured"]) == ("exact_match,strict-match", 0.6)
    [other] = outcome.numbers["other_metrics"]
    assert other["metric"] == "exact_match,flexible-extract" and not other["passed"]
    assert other["measured"] == 0.95 and other["threshold"] == pytest.approx(0.99)
    lines = outcome.explanation.splitlines()
    assert lines[0].startswith("exact_match,strict-match: relative: threshold = reference * (1 - rtol) = 0.5000")
    assert lines[0].endswith("-> PASS")
    assert lines[1] == ("exact_match,flexible-extract: relative: threshold = reference * (1 - rtol) = 1.0000 * "
                        "(1 - 0.0100) = 0.9900; measured 0.9500 < 0.9900 -> FAIL")
    assert lines[2] == "every listed metric must pass, as in vLLM's gen-1 test: FAIL (exact_match,flexible-extract)"
    passing = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.99, "n": 20})
    assert passing.passed and passing.explanation.endswith("vLLM's gen-1 test: PASS")


def test_gen1_other_metrics_take_the_configs_statistical_mode(tmp_path: Path) -> None:
    cfg = config(tmp_path, GEN1.replace("1.0}", "0.9}") + "gate: wilson\n")
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.85, "n": 1000})
    [other] = outcome.numbers["other_metrics"]
    assert other["wilson_lower_bound"] < other["threshold"] == pytest.approx(0.891) and not outcome.passed
    assert "exact_match,flexible-extract: wilson: " in outcome.explanation
    cfg = config(tmp_path, GEN1 + "gate: {mode: relative, max_invalid_rate: 0.1}\n")
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.5, "n": 20,
                                  "invalid_rate": 0.0})
    assert not outcome.passed and outcome.numbers["accuracy_passed"] is False


def test_gen1_other_metrics_under_hypothesis_take_the_references_n(tmp_path: Path) -> None:
    # Listed in the same file, measured on the same questions as the gated metric's reference.
    cfg = config(tmp_path, GEN1 + "gate: hypothesis\nreference: {value: 0.5, n: 1319}\n")
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.99, "n": 20})
    [other] = outcome.numbers["other_metrics"]
    assert other["n_reference"] == outcome.numbers["n_reference"] == 1319


def test_gen1_other_metric_missing_from_the_run_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(GateInputError, match="exact_match,flexible-extract"):
        evaluate_gate(config(tmp_path, GEN1), {"value": 0.6, "strict_match": 0.6, "flexible_extract": None, "n": 20})


def test_the_metrics_gen1_can_gate_are_those_a_run_reports() -> None:
    from quantgate.harness.config import REPORTED_METRICS
    from quantgate.harness.evaluate import FLEXIBLE, STRICT, _metrics

    reported = _metrics({STRICT: 0.5, FLEXIBLE: 0.6}, [], STRICT, 10)
    assert {name: reported[key] for name, key in REPORTED_METRICS.items()} == {STRICT: 0.5, FLEXIBLE: 0.6}


def test_gen1_other_metrics_use_the_rtol_set_under_gate(tmp_path: Path) -> None:
    """`gate: {rtol: 0.01}` with no top-level rtol: every listed metric is gated with 0.01, not the
    top-level default 0.08. Guards against the other metrics reading `config.rtol` (threshold 0.92,
    so flexible-extract's 0.95 would pass) while the gated one reads gate.rtol."""
    gen1 = GEN1.replace("rtol: 0.01\n", "")
    cfg = config(tmp_path, gen1 + "gate: {mode: relative, rtol: 0.01}\n")
    assert (cfg.rtol, cfg.effective_rtol) == (0.08, 0.01)  # the top-level default, and what gates
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.95, "n": 20})
    assert not outcome.passed and outcome.numbers["rtol"] == 0.01
    [other] = outcome.numbers["other_metrics"]
    assert other["rtol"] == 0.01 and other["threshold"] == pytest.approx(0.99) and not other["passed"]
    # wilson reads the rtol too: a lower bound of ~0.863 at n = 1000 clears 0.9 * 0.92, not 0.9 * 0.99
    cfg = config(tmp_path, gen1.replace("1.0}", "0.9}") + "gate: {mode: wilson, rtol: 0.01}\n")
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.88, "n": 1000})
    [other] = outcome.numbers["other_metrics"]
    assert other["threshold"] == pytest.approx(0.891) and not other["passed"] and not outcome.passed
    assert 0.9 * 0.92 < other["wilson_lower_bound"] < 0.891


# -- exact boundaries: equality passes, as each published rule says -----------------------------------


def test_paired_passes_when_the_p_value_equals_alpha() -> None:
    """McNemar fails only when p < alpha: five losses and no wins give p = 1/32 exactly, which
    passes at alpha = 1/32. Guards against the rule becoming p <= alpha."""
    base = {str(i): True for i in range(40)}
    five = {**base, **{str(i): False for i in range(5)}}
    passed, numbers, text = gates.paired(five, base, 1 / 32)
    assert numbers["p_value_worse"] == 1 / 32 and passed and "-> PASS" in text
    assert not gates.paired(five, base, 1 / 32 + 1e-9)[0]


def test_hypothesis_passes_at_its_own_threshold(seed: int) -> None:
    """measured >= threshold (within the gates' EPSILON of float rounding) passes; just below fails.
    Guards against a strict comparison or a lost EPSILON at the boundary."""
    rng = random.Random(seed)
    for _ in range(100):
        n, reference = rng.randint(10, 5000), rng.uniform(0.05, 0.95)
        alpha, beta = rng.uniform(0.001, 0.2), rng.uniform(0.05, 0.5)
        threshold = gates.hypothesis(reference, reference, n, alpha, beta)[1]["threshold"]
        assert gates.hypothesis(threshold, reference, n, alpha, beta)[0], (n, reference, alpha)
        assert gates.hypothesis(threshold - gates.EPSILON / 2, reference, n, alpha, beta)[0]
        assert not gates.hypothesis(threshold - 1e-9, reference, n, alpha, beta)[0]


def test_wilson_passes_when_the_lower_bound_equals_the_threshold(seed: int) -> None:
    """The lower bound reaching reference * (1 - rtol) exactly (or within EPSILON) passes; 1e-9
    short fails. Guards against a strict comparison or a lost EPSILON at the boundary."""
    rng = random.Random(seed)
    for _ in range(100):
        n = rng.randint(10, 5000)
        measured, alpha = rng.randint(1, n) / n, rng.uniform(0.001, 0.2)
        lower = gates.wilson_lower_bound(measured, n, -NormalDist().inv_cdf(alpha))
        passed, numbers, _ = gates.wilson(measured, n, lower, 0.0, alpha)  # threshold = lower * (1 - 0)
        assert numbers["threshold"] == numbers["wilson_lower_bound"] == lower and passed, (measured, n, alpha)
        assert gates.wilson(measured, n, lower + gates.EPSILON / 2, 0.0, alpha)[0]
        assert not gates.wilson(measured, n, lower + 1e-9, 0.0, alpha)[0]


def test_a_gate_that_cannot_fail_on_so_few_questions_says_so() -> None:
    """A small --limit leaves a hypothesis threshold at or below 0, or no paired outcome below
    alpha: the PASS then says nothing, and the explanation must say so (lint cannot: --limit is
    given at run time)."""
    passed, numbers, text = gates.hypothesis(0.0, 0.5, 5)
    assert passed and numbers["can_fail"] is False and "this gate cannot fail: evaluate more questions" in text
    assert gates.hypothesis(0.4, 0.5, 500)[1]["can_fail"] is True
    ids = [str(i) for i in range(4)]
    passed, numbers, text = gates.paired(dict.fromkeys(ids, False), dict.fromkeys(ids, True))
    assert passed and numbers["can_fail"] is False and "0.5^4 = 0.0625 >= alpha" in text
    passed, numbers, text = gates.paired(dict.fromkeys(ids + ["4"], False), dict.fromkeys(ids + ["4"], True))
    assert not passed and numbers["can_fail"] is True and "cannot fail" not in text


# -- mutation survivors (session 17): each assertion fails on one mutation of gates.py -----------------


def test_gen1_other_metrics_under_hypothesis_are_gated_against_their_own_reference(tmp_path: Path) -> None:
    """flexible-extract's reference is 1.0 (sigma 0, threshold 1.0): 0.99 fails it. Against the
    gated metric's reference 0.5 it would pass: guards against the other metrics reading
    config.reference.value."""
    cfg = config(tmp_path, GEN1 + "gate: hypothesis\nreference: {value: 0.5, n: 1319}\n")
    outcome = evaluate_gate(cfg, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.99, "n": 20})
    [other] = outcome.numbers["other_metrics"]
    assert other["reference"] == 1.0 and other["threshold"] == pytest.approx(1.0) and other["passed"] is False
    assert not outcome.passed and outcome.numbers["failed_metrics"] == ["exact_match,flexible-extract"]


def test_hypothesis_and_paired_take_alpha_and_beta_from_the_config(tmp_path: Path) -> None:
    """A config's gate.alpha / gate.beta decide the verdict; the defaults (0.05, 0.2) must not."""
    metrics = {"value": 0.46, "n": 1319}
    strict = config(tmp_path, "reference: {value: 0.5}\ngate: {mode: hypothesis, alpha: 0.001, beta: 0.1}\n")
    outcome = evaluate_gate(strict, metrics)
    expected = gates.hypothesis(0.46, 0.5, 1319, 0.001, 0.1)[1]
    assert (outcome.numbers["alpha"], outcome.numbers["beta"]) == (0.001, 0.1)
    assert outcome.numbers["threshold"] == pytest.approx(expected["threshold"])
    assert outcome.numbers["theta"] == pytest.approx(expected["theta"])
    assert outcome.passed and not evaluate_gate(config(tmp_path, "reference: {value: 0.5}\ngate: hypothesis\n"),
                                                metrics).passed  # 0.46 < 0.4677 at alpha 0.05
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    rows = [{"id": i, "correct": True} for i in range(40)]
    five_lost = [{"id": i, "correct": i >= 5} for i in range(40)]  # p = 1/32: fails at 0.05, passes at 0.01
    base = Baseline("base", {"value": 1.0, "n": 40}, rows)
    lenient = evaluate_gate(config(tmp_path, "baseline: base\ngate: {mode: paired, alpha: 0.01}\n"),
                            {"value": 35 / 40, "n": 40}, five_lost, base)
    assert lenient.passed and lenient.numbers["alpha"] == 0.01
    assert not evaluate_gate(config(tmp_path, "baseline: base\ngate: paired\n"), {"value": 35 / 40, "n": 40},
                             five_lost, base).passed


def test_evaluate_gate_rejects_bool_and_fractional_counts(tmp_path: Path) -> None:
    cfg = config(tmp_path, "reference: {value: 0.7}\ngate: hypothesis\n")
    with pytest.raises(GateInputError, match="no numeric 'value' .got True"):
        evaluate_gate(cfg, {"value": True, "n": 10})
    with pytest.raises(GateInputError, match="n must be a positive count, got 10.5"):
        evaluate_gate(cfg, {"value": 0.5, "n": 10.5})


def test_paired_refuses_rows_without_correct_and_a_candidate_with_extra_questions() -> None:
    with pytest.raises(GateInputMismatch, match="row 2: per-sample rows need 'id' and 'correct', got keys \\['id'\\]"):
        gates.correct_by_id([{"id": 1, "correct": True}, {"id": 2}], "candidate")
    # Questions only the candidate answered: refused as the reverse is, never a KeyError or dropped.
    with pytest.raises(GateInputMismatch, match="1 only in the candidate, 0 only in the baseline, 2 in both"):
        gates.paired({"a": True, "b": True, "c": False}, {"a": True, "b": True})
    with pytest.raises(GateInputError, match="no per-question results"):
        gates.paired({}, {})


def test_paired_explanation_and_two_sided_p_value_agree_with_the_verdict() -> None:
    base = {str(i): True for i in range(40)}
    five = {**base, **{str(i): False for i in range(5)}}
    passed, numbers, text = gates.paired(five, base)
    assert not passed and "= 0.03125 < alpha 0.05 -> FAIL" in text
    assert numbers["p_value_two_sided"] == pytest.approx(2 / 32) and "(two-sided p = 0.0625)" in text


def test_paired_on_so_few_questions_that_all_wrong_has_p_equal_to_alpha_cannot_fail() -> None:
    """p = 0.5^5 = alpha passes (McNemar fails only below alpha), so 5 questions at alpha 1/32
    cannot fail: can_fail must say so. Guards against `0.5^n <= alpha`."""
    ids = [str(i) for i in range(5)]
    passed, numbers, text = gates.paired(dict.fromkeys(ids, False), dict.fromkeys(ids, True), 1 / 32)
    assert passed and numbers["can_fail"] is False and "cannot fail" in text


def test_hypothesis_with_a_small_positive_threshold_can_fail() -> None:
    passed, numbers, text = gates.hypothesis(0.3, 0.5, 6)  # threshold 0.0252 on 6 questions
    assert 0 < numbers["threshold"] < 0.05 and numbers["can_fail"] is True and "cannot fail" not in text
    assert not gates.hypothesis(0.0, 0.5, 6)[0]


def test_wilson_measured_threshold_at_the_edges() -> None:
    """None when even 1.0 falls short (by less than 0.01 here); 0.0 when any measured value passes."""
    z = -NormalDist().inv_cdf(0.05)
    lower_at_1 = gates.wilson_lower_bound(1.0, 50, z)  # 0.9487
    passed, numbers, text = gates.wilson(1.0, 50, lower_at_1 + 0.005, 0.0)
    assert not passed and numbers["measured_threshold"] is None and "no measured accuracy passes at n = 50" in text
    assert gates.wilson_measured_threshold(0.0, 10, z) == 0.0
    passed, numbers, text = gates.wilson(0.0, 10, 0.0, 0.1)
    assert passed and numbers["measured_threshold"] == 0.0 and "takes measured >= 0.0000" in text


def test_invalid_rate_line_says_fail_when_it_fails(tmp_path: Path) -> None:
    cfg = config(tmp_path, "accuracy_threshold: 0.5\ngate: {mode: absolute, max_invalid_rate: 0.05}\n")
    bad = evaluate_gate(cfg, {"value": 0.9, "n": 100, "invalid_rate": 0.06})
    assert bad.explanation.endswith("invalid answers: invalid_rate 0.0600 > max_invalid_rate 0.0500 -> FAIL")
    assert (bad.numbers["invalid_rate_passed"], bad.numbers["accuracy_passed"]) == (False, True)
    ok = evaluate_gate(cfg, {"value": 0.9, "n": 100, "invalid_rate": 0.05})
    assert ok.explanation.endswith("invalid_rate 0.0500 <= max_invalid_rate 0.0500 -> PASS")
