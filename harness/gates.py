"""Accuracy gates (SPEC section 3): every mode returns its whole arithmetic.

`evaluate_gate` answers pass/fail together with `numbers` (every input and intermediate
value, for result.json) and `explanation` (the same computation as a reader would check it
by hand). Statistics use only the standard library: `statistics.NormalDist` for normal
quantiles and `math.comb` for the exact binomial tail of McNemar's test.

Inputs that only exist after a run (per-sample results, a baseline's results) raise
`GateInputError` when absent; the config-side inputs (threshold, reference, baseline name)
are checked when the config loads (`quantgate.harness.config`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from .config import REFERENCE_MODES, REPORTED_METRICS, EvalConfig

# Float rounding of threshold arithmetic (0.80 - 0.08 = 0.7200000000000001) is not a failure.
EPSILON = 1e-12
_NORMAL = NormalDist()


class GateInputError(ValueError):
    """A gate lacks a run-time input (per-sample results, a baseline result); the run is an ERROR."""


class GateInputMismatch(GateInputError):
    """The run and its baseline cannot be compared (other questions, targets, n, metric; malformed
    rows; a paired baseline without per-sample results, a recovery baseline that scored 0):
    running them again gives the same mismatch, so the run's ERROR is never retried (exit 3)."""


@dataclass(frozen=True)
class Baseline:
    """The run a paired or recovery gate compares against (its result.json and samples.jsonl)."""

    name: str
    metrics: Mapping[str, Any]  # result.json "metrics": at least "value" and "n"
    samples: Sequence[Mapping[str, Any]] | None = None  # samples.jsonl rows: "id", "correct"
    dataset: Mapping[str, Any] | None = None  # result.json "dataset"."sha256": data file hashes by role
    origin: Mapping[str, Any] | None = None  # which run it is (result path, engine, started_at), for result.json


@dataclass(frozen=True)
class GateOutcome:
    passed: bool
    mode: str
    numbers: dict[str, Any] = field(default_factory=dict)
    explanation: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The result.json `gate` object."""
        return {"mode": self.mode, "passed": self.passed, **self.numbers, "explanation": self.explanation}


def evaluate_gate(config: EvalConfig, metrics: Mapping[str, Any], samples: Sequence[Mapping[str, Any]] | None = None,
                  baseline: Baseline | None = None, dataset: Mapping[str, Any] | None = None) -> GateOutcome:
    """Gate `metrics` (result.json "metrics": "value", "n", "invalid_rate") by `config.gate`;
    `dataset`: this run's data file hashes (result.json "dataset"."sha256"), which a recovery
    gate compares with its baseline's when either run has no per-sample results."""
    mode = config.gate.mode
    measured = _number(metrics, "value", "metrics")
    gate = config.gate
    if mode == "absolute":
        passed, numbers, text = absolute(measured, _need(config.accuracy_threshold, "accuracy_threshold"),
                                         config.tolerance)
    elif mode == "relative":
        passed, numbers, text = relative(measured, _reference(config), config.effective_rtol)
    elif mode == "hypothesis":
        n_reference = config.reference.n if config.reference else None
        passed, numbers, text = hypothesis(measured, _reference(config), _n(metrics), gate.alpha, gate.beta,
                                           n_reference)
    elif mode == "wilson":
        passed, numbers, text = wilson(measured, _n(metrics), _reference(config), config.effective_rtol, gate.alpha)
    elif mode == "paired":
        if samples is None:
            raise GateInputError("gate paired needs the run's per-sample results (samples.jsonl)")
        if baseline is None:
            raise GateInputError(f"gate paired needs the per-sample results of baseline {config.baseline!r}")
        if baseline.samples is None:  # the baseline's files say so (plan refuses it first): a retry cannot help
            raise GateInputMismatch(f"gate paired needs the per-sample results of baseline {config.baseline!r}")
        who = f"baseline {baseline.name}"
        check_same_metric(config.metric, baseline, mode)
        candidate, base = correct_by_id(samples, "candidate"), correct_by_id(baseline.samples, who)
        check_same_targets(samples, baseline.samples, "the candidate", who)
        check_same_prompts(samples, baseline.samples, "the candidate", who, f"gate {mode}")
        passed, numbers, text = paired(candidate, base, gate.alpha)
    elif mode == "recovery":
        if baseline is None:
            raise GateInputError(f"gate recovery needs the result of baseline {config.baseline!r}")
        who = f"baseline {baseline.name}"
        check_same_metric(config.metric, baseline, mode)
        passed, numbers, text = recovery(measured, _number(baseline.metrics, "value", who), gate.recovery,
                                         n=_n(metrics), baseline_n=_n(baseline.metrics, who))
        # The same count is not the same questions (another test file of as many lines): a ratio of
        # accuracies on different questions says nothing about what quantization cost.
        if samples is not None and baseline.samples is not None:
            check_same_ids(mode, correct_by_id(samples, "candidate"), correct_by_id(baseline.samples, who))
            check_same_targets(samples, baseline.samples, "the candidate", who)
            check_same_prompts(samples, baseline.samples, "the candidate", who, f"gate {mode}")
        else:
            check_same_test_data(mode, dataset, baseline)
    else:  # pragma: no cover - GateSpec.mode is a Literal
        raise ValueError(f"unknown gate mode {mode!r}")
    if config.other_references and mode in REFERENCE_MODES:
        passed, numbers, text = _with_other_metrics(config, metrics, (passed, numbers, text))
    numbers = {"metric": config.metric, **numbers}
    if gate.max_invalid_rate is not None:
        invalid = _number(metrics, "invalid_rate", "metrics")
        ok = invalid <= gate.max_invalid_rate + EPSILON
        numbers.update(invalid_rate=invalid, max_invalid_rate=gate.max_invalid_rate, invalid_rate_passed=ok,
                       accuracy_passed=passed)
        shown_invalid, shown_max = shown(invalid, gate.max_invalid_rate)
        text += (f"\ninvalid answers: invalid_rate {shown_invalid} {'<=' if ok else '>'} max_invalid_rate "
                 f"{shown_max} -> {'PASS' if ok else 'FAIL'}")
        passed = passed and ok
    return GateOutcome(passed=passed, mode=mode, numbers=numbers, explanation=text)


# ---------------------------------------------------------------------------------------------
# The six modes, each (passed, numbers, explanation) from plain numbers.

Result = tuple[bool, dict[str, Any], str]


def _with_other_metrics(config: EvalConfig, metrics: Mapping[str, Any], gated: Result) -> Result:
    """vLLM's gen-1 test gates every metric its file lists and passes only if all pass: each of
    `config.other_references` is gated by the same mode against its own value. The numbers stay
    the gated metric's, with `other_metrics` holding each other metric's and `failed_metrics`
    naming those that failed (a summary shows the first), and the explanation gives every
    metric's arithmetic."""
    passed, numbers, text = gated
    gate = config.gate
    failed = [] if passed else [config.metric]
    others: list[dict[str, Any]] = []
    lines = [f"{config.metric}: {text}"]
    for name, reference in config.other_references.items():
        key = REPORTED_METRICS[name]
        measured = _number(metrics, key, f"metrics (the run's {name}, which tasks[0].metrics lists to gate)")
        if gate.mode == "relative":
            ok, other, line = relative(measured, reference, config.effective_rtol)
        elif gate.mode == "hypothesis":
            # Measured on the same file's questions as the gated metric's reference: the same n_ref.
            ok, other, line = hypothesis(measured, reference, _n(metrics), gate.alpha, gate.beta,
                                         config.reference.n if config.reference else None)
        else:
            ok, other, line = wilson(measured, _n(metrics), reference, config.effective_rtol, gate.alpha)
        others.append({"metric": name, "passed": ok, **other})
        lines.append(f"{name}: {line}")
        failed += [] if ok else [name]
    verdict = "PASS" if not failed else f"FAIL ({', '.join(failed)})"
    lines.append(f"every listed metric must pass, as in vLLM's gen-1 test: {verdict}")
    return not failed, {**numbers, "other_metrics": others, "failed_metrics": failed}, "\n".join(lines)


def absolute(measured: float, accuracy_threshold: float, tolerance: float) -> Result:
    """vLLM gen-2: measured >= accuracy_threshold - tolerance."""
    threshold = accuracy_threshold - tolerance
    passed = measured >= threshold - EPSILON
    m, t = shown(measured, threshold)
    text = (f"absolute: threshold = accuracy_threshold - tolerance = {accuracy_threshold:.4f} - {tolerance:.4f} "
            f"= {t}; measured {m} {_cmp(passed)} {t} -> {_verdict(passed)}")
    return passed, {"measured": measured, "accuracy_threshold": accuracy_threshold, "tolerance": tolerance,
                    "threshold": threshold}, text


def relative(measured: float, reference: float, rtol: float) -> Result:
    """vLLM gen-1: measured >= reference * (1 - rtol)."""
    threshold = reference * (1 - rtol)
    passed = measured >= threshold - EPSILON
    m, t = shown(measured, threshold)
    text = (f"relative: threshold = reference * (1 - rtol) = {reference:.4f} * (1 - {rtol:.4f}) = {t}; "
            f"measured {m} {_cmp(passed)} {t} -> {_verdict(passed)}")
    return passed, {"measured": measured, "reference": reference, "rtol": rtol, "threshold": threshold}, text


def hypothesis(measured: float, reference: float, n: int, alpha: float = 0.05, beta: float = 0.2,
               n_reference: int | None = None) -> Result:
    """TensorRT-LLM's accuracy test: a one-sided two-sample z-test against the reference.

    sigma = sqrt(p (1 - p)) with p the reference; se = sigma * sqrt(1/n + 1/n_ref), the standard
    error of the difference of two proportions measured on n and n_ref questions (n_ref defaults
    to n: SPEC's sqrt(2 sigma^2 / n)). The threshold is ref + z(alpha) * se (z(alpha) < 0), and
    theta = -(z(alpha) + z(beta)) * se is the smallest true drop the test detects with power 1 - beta.
    """
    given = n_reference is not None
    n_ref = n_reference if n_reference is not None else n
    sigma = math.sqrt(reference * (1 - reference))
    scale = sigma * math.sqrt(1 / n + 1 / n_ref)
    z_alpha, z_beta = _NORMAL.inv_cdf(alpha), _NORMAL.inv_cdf(beta)
    threshold = reference + z_alpha * scale
    theta = -(z_alpha + z_beta) * scale
    passed = measured >= threshold - EPSILON
    m, t = shown(measured, threshold)
    text = (f"hypothesis: sigma = sqrt(p * (1 - p)) = sqrt({reference:.4f} * {1 - reference:.4f}) = {sigma:.4f}; "
            f"se = sigma * sqrt(1/n + 1/n_ref) = {sigma:.4f} * sqrt(1/{n} + 1/{n_ref}) = {scale:.6f} "
            f"(n: this run's questions; n_ref: {'reference.n' if given else 'reference.n not given, so n'}); "
            f"z(alpha={alpha:g}) = {z_alpha:.4f}; threshold = reference + z(alpha) * se = {reference:.4f} + "
            f"({z_alpha:.4f} * {scale:.6f}) = {t} ({reference - threshold:.4f} below the reference); "
            f"measured {m} {_cmp(passed)} {t} -> {_verdict(passed)}; "
            f"minimum detectable drop theta = -(z(alpha) + z(beta={beta:g})) * se = -({z_alpha:.4f} + {z_beta:.4f}) "
            f"* {scale:.6f} = {theta:.4f}")
    can_fail = threshold > EPSILON  # on few questions (a small --limit) the threshold falls to 0 or below
    if not can_fail:
        text += f"; the threshold is not above 0 on {n} questions, so this gate cannot fail: evaluate more questions"
    return passed, {"measured": measured, "reference": reference, "n": n, "n_reference": n_ref, "alpha": alpha,
                    "beta": beta, "sigma": sigma, "standard_error": scale, "z_alpha": z_alpha, "z_beta": z_beta,
                    "threshold": threshold, "margin": reference - threshold, "theta": theta,
                    "can_fail": can_fail}, text


def wilson_lower_bound(p: float, n: int, z: float) -> float:
    """Lower end of the Wilson score interval for a proportion p observed on n samples."""
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (centre - spread) / (1 + z2 / n)


def wilson_measured_threshold(threshold: float, n: int, z: float) -> float | None:
    """The smallest measured accuracy (to 1e-9) whose Wilson lower bound at n reaches `threshold`;
    None when even 1.0 does not. Bisection is exact enough because the bound increases with p."""
    if wilson_lower_bound(1.0, n, z) < threshold - EPSILON:
        return None
    low, high = 0.0, 1.0
    if wilson_lower_bound(low, n, z) >= threshold - EPSILON:
        return low
    while high - low > 1e-9:
        middle = (low + high) / 2
        if wilson_lower_bound(middle, n, z) >= threshold - EPSILON:
            high = middle
        else:
            low = middle
    return high


def wilson(measured: float, n: int, reference: float, rtol: float, alpha: float = 0.05) -> Result:
    """Pass iff the one-sided Wilson lower bound of measured at 1 - alpha reaches ref * (1 - rtol).

    `measured_threshold` is the same condition on the measured scale, so that a table showing
    measured next to a threshold agrees with the verdict.
    """
    # -z(alpha), not z(1 - alpha): 1 - 1e-17 is 1.0 in floating point, where the quantile is
    # infinite (inv_cdf raises), though any alpha in (0, 0.5) is a valid setting.
    z = -_NORMAL.inv_cdf(alpha)
    lower = wilson_lower_bound(measured, n, z)
    threshold = reference * (1 - rtol)
    passed = lower >= threshold - EPSILON
    measured_threshold = wilson_measured_threshold(threshold, n, z)
    m = f"{measured:.4f}"
    if measured_threshold is None:
        needed = (f"no measured accuracy passes at n = {n} (even 1.0 has lower bound "
                  f"{wilson_lower_bound(1.0, n, z):.4f}): evaluate more questions")
    else:
        m, mt = shown(measured, measured_threshold)
        needed = f"at n = {n} that takes measured >= {mt}"
    lo, t = shown(lower, threshold)
    text = (f"wilson: z(1-alpha) = -z(alpha={alpha:g}) = {z:.4f}; lower bound = (p + z^2/(2n) - z * sqrt(p(1-p)/n + "
            f"z^2/(4n^2))) / (1 + z^2/n) with p = {m}, n = {n} -> {lo}; threshold = reference * "
            f"(1 - rtol) = {reference:.4f} * (1 - {rtol:.4f}) = {t}; lower bound {lo} "
            f"{_cmp(passed)} {t} -> {_verdict(passed)}; {needed}")
    return passed, {"measured": measured, "n": n, "alpha": alpha, "z": z, "wilson_lower_bound": lower,
                    "reference": reference, "rtol": rtol, "threshold": threshold,
                    "measured_threshold": measured_threshold}, text


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly: the coefficients come from one exact
    integer recurrence, C(n, i+1) = C(n, i) * (n - i) / (i + 1), so the sum takes n - k steps
    (of big-integer arithmetic: about 0.1 s at n = 20,000, 10 s at 200,000)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    term = math.comb(n, k)
    total = term
    for i in range(k, n):
        term = term * (n - i) // (i + 1)
        total += term
    return total / 2**n


def paired(candidate: Mapping[str, bool], baseline: Mapping[str, bool], alpha: float = 0.05) -> Result:
    """Exact McNemar test on per-question results of the same questions.

    Only discordant pairs carry information: `losses` (baseline right, candidate wrong) and
    `wins` (the reverse). Under "no difference" losses ~ Binomial(losses + wins, 1/2); the
    candidate fails iff it is significantly worse: P(X >= losses) < alpha (one-sided).
    Different question sets are refused: the questions only one run answered would be dropped
    silently, and which ones they are (the hard tail of a killed run?) biases the test.
    """
    check_same_ids("paired", candidate, baseline)
    if not candidate:
        raise GateInputError("gate paired: the candidate and the baseline have no per-question results")
    common = list(candidate)
    losses = sum(1 for q in common if baseline[q] and not candidate[q])
    wins = sum(1 for q in common if candidate[q] and not baseline[q])
    both = sum(1 for q in common if candidate[q] and baseline[q])
    discordant = losses + wins
    p_worse = binomial_tail(losses, discordant)
    p_two_sided = min(1.0, 2 * min(binomial_tail(losses, discordant), binomial_tail(wins, discordant)))
    passed = not (p_worse < alpha)
    shown_p, shown_alpha = shown(p_worse, alpha, kind="g")
    text = (f"paired: exact McNemar on {len(common)} common questions; flips: {losses} right->wrong "
            f"(baseline right, candidate wrong), {wins} wrong->right; both right {both}; "
            f"one-sided p-value (candidate worse) = P(X >= {losses} | X ~ Binomial({discordant}, 0.5)) = {shown_p} "
            f"{'<' if not passed else '>='} alpha {shown_alpha} -> {_verdict(passed)} (two-sided p = {p_two_sided:.4g})")
    # Even every question turning wrong has p = 0.5^n: on few questions (a small --limit) none reaches alpha.
    can_fail = 0.5 ** len(common) < alpha
    if not can_fail:
        text += (f"; on {len(common)} questions even all of them turning wrong has p = 0.5^{len(common)} = "
                 f"{0.5 ** len(common):.4g} >= alpha, so this gate cannot fail: evaluate more questions")
    # only_candidate/only_baseline stay in result.json (its keys are only ever added); always 0 now.
    return passed, {"n_common": len(common), "flips_right_to_wrong": losses, "flips_wrong_to_right": wins,
                    "both_right": both, "both_wrong": len(common) - discordant - both, "discordant": discordant,
                    "p_value_worse": p_worse, "p_value_two_sided": p_two_sided, "alpha": alpha,
                    "only_candidate": 0, "only_baseline": 0, "can_fail": can_fail}, text


def recovery(measured: float, baseline_measured: float, minimum: float = 0.95, *, n: int, baseline_n: int) -> Result:
    """llm-compressor's recovery: measured / baseline_measured >= minimum, both on n questions."""
    if baseline_measured <= 0:  # what the baseline measured: running this config again cannot change it
        raise GateInputMismatch(f"gate recovery: the baseline scored {baseline_measured}; a ratio against it is "
                                "undefined")
    if n != baseline_n:
        raise GateInputMismatch(f"gate recovery: this run evaluated {n} questions and the baseline {baseline_n}: a ratio "
                                "of accuracies on different questions is no recovery; evaluate both with the same "
                                "num_questions and --limit")
    ratio = measured / baseline_measured
    passed = ratio >= minimum - EPSILON
    measured_threshold = baseline_measured * minimum
    r, least = shown(ratio, minimum)
    m, mt = shown(measured, measured_threshold)
    text = (f"recovery: ratio = measured / baseline = {m} / {baseline_measured:.4f} = {r} "
            f"(n = {n} both); {r} {_cmp(passed)} recovery {least} -> {_verdict(passed)}; "
            f"i.e. measured {m} {_cmp(passed)} baseline * recovery = {mt}")
    return passed, {"measured": measured, "baseline_measured": baseline_measured, "recovery_ratio": ratio,
                    "recovery": minimum, "measured_threshold": measured_threshold, "n": n,
                    "baseline_n": baseline_n}, text


# ---------------------------------------------------------------------------------------------


def distinct_places(value: float, other: float, places: int = 4, kind: str = "f") -> int:
    """How many places (decimals for kind "f", significant digits for "g") print `value` and
    `other` apart: `places`, or more where those print two numbers the gate told apart as equal
    (968/1319 < 0.95 * 1019/1319 printed "0.7339 < 0.7339"), so that a measured value and its
    threshold as printed never contradict the verdict. Numbers within EPSILON, which the gates
    take as equal, keep `places`."""
    if not (math.isfinite(value) and math.isfinite(other)) or abs(value - other) <= EPSILON:
        return places
    for more in range(places, 18):
        if f"{value:.{more}{kind}}" != f"{other:.{more}{kind}}":
            return more
    return 17


def shown(value: float, other: float, places: int = 4, kind: str = "f") -> tuple[str, str]:
    """`value` and `other` formatted alike, to `distinct_places` places: a comparison's two sides."""
    more = distinct_places(value, other, places, kind)
    return f"{value:.{more}{kind}}", f"{other:.{more}{kind}}"


def _cmp(passed: bool) -> str:
    return ">=" if passed else "<"


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _need(value: float | None, name: str) -> float:
    if value is None:  # load_config refuses such configs; reachable only with a hand-built EvalConfig
        raise GateInputError(f"the gate needs {name}")
    return value


def _reference(config: EvalConfig) -> float:
    return _need(config.reference.value if config.reference else None, "reference.value")


def _number(mapping: Mapping[str, Any], key: str, where: str) -> float:
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GateInputError(f"{where} has no numeric {key!r} (got {value!r})")
    return float(value)


def _n(metrics: Mapping[str, Any], where: str = "metrics") -> int:
    n = _number(metrics, "n", where)
    if n < 1 or n != int(n):
        raise GateInputError(f"{where} n must be a positive count, got {n}")
    return int(n)


def correct_by_id(samples: Sequence[Mapping[str, Any]], who: str) -> dict[str, bool]:
    """Per-question correctness by question id, from samples.jsonl rows. `who` names the rows'
    source in messages. A duplicate id or a `correct` that is not true/false is refused: either
    would be counted silently (the last copy wins; the string "false" is truthy)."""
    out: dict[str, bool] = {}
    for row_number, row in enumerate(samples, start=1):
        if "id" not in row or "correct" not in row:
            raise GateInputMismatch(f"{who}: row {row_number}: per-sample rows need 'id' and 'correct', "
                                    f"got keys {sorted(row)}")
        key, correct = str(row["id"]), row["correct"]
        if not isinstance(correct, bool):
            raise GateInputMismatch(f"{who}: row {row_number} (question id {key!r}): 'correct' must be true or false, "
                                    f"got {correct!r}; samples.jsonl as `quantgate run` writes it has booleans")
        if key in out:
            raise GateInputMismatch(f"{who}: row {row_number}: question id {key!r} appears twice; each question "
                                    "must be answered once (were two samples.jsonl files joined?)")
        out[key] = correct
    return out


def check_same_ids(mode: str, candidate: Mapping[str, Any], baseline: Mapping[str, Any]) -> None:
    """Refuse runs that answered different question ids (keys of `correct_by_id`)."""
    only_candidate = sum(1 for q in candidate if q not in baseline)
    only_baseline = sum(1 for q in baseline if q not in candidate)
    if only_candidate or only_baseline:
        raise GateInputMismatch(f"gate {mode}: the candidate and the baseline answered different questions: "
                                f"{only_candidate} only in the candidate, {only_baseline} only in the baseline, "
                                f"{len(candidate) - only_candidate} in both; evaluate both on the same data set with "
                                "the same num_questions and --limit")


def check_same_metric(metric: str, baseline: Baseline, mode: str) -> None:
    """Refuse a baseline that gated another metric (strict-match against flexible-extract): its
    value and its per-question `correct` are read under that metric, so neither a ratio nor the
    flips compare like with like. A baseline whose result names no metric is taken as it is."""
    theirs = baseline.metrics.get("metric")
    if isinstance(theirs, str) and theirs != metric:
        raise GateInputMismatch(f"gate {mode}: this run gates {metric} and baseline {baseline.name} gated {theirs}: "
                                "their results are not comparable; give both configs the same `metric:`")


def check_same_test_data(mode: str, dataset: Mapping[str, Any] | None, baseline: Baseline) -> None:
    """Without per-sample results to match, the test files' hashes (when both runs recorded one)
    say whether the two runs evaluated the same questions."""
    ours, theirs = (dataset or {}).get("test"), (baseline.dataset or {}).get("test")
    if isinstance(ours, str) and isinstance(theirs, str) and ours != theirs:
        raise GateInputMismatch(f"gate {mode}: this run and baseline {baseline.name} evaluated different test files "
                                f"(sha256 {ours[:12]}... and {theirs[:12]}...): evaluate both on the same dataset")


def check_same_targets(candidate: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]],
                       candidate_who: str, baseline_who: str) -> None:
    """Refuse to pair runs whose rows give one question id different gold answers (`target`):
    they evaluated different data sets, and matching them by id compares unrelated questions."""
    gold = {str(row["id"]): row["target"] for row in baseline if "id" in row and "target" in row}
    differ = [str(row["id"]) for row in candidate
              if "id" in row and "target" in row and str(row["id"]) in gold and gold[str(row["id"])] != row["target"]]
    if differ:
        raise GateInputMismatch(f"{candidate_who} and {baseline_who} have different targets for {len(differ)} question "
                                f"id(s) (first: {differ[0]!r}): they evaluated different data sets; evaluate both on "
                                "the same dataset")


def check_same_prompts(candidate: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]],
                       candidate_who: str, baseline_who: str, asker: str) -> None:
    """Refuse to compare runs that asked one question id with different prompts (`prompt_hash`,
    which samples.jsonl records per question): another num_fewshot, few-shot train file, gen_prefix,
    chat or completions, or task template. Same questions and targets are not the same evaluation:
    a candidate asked with more or other examples than its baseline scores differently for reasons
    that are not quantization, and the comparison would pass or fail on that. Rows without a
    prompt_hash (hand-made, older results) are not compared."""
    asked = {str(row["id"]): row["prompt_hash"] for row in baseline
             if "id" in row and isinstance(row.get("prompt_hash"), str)}
    differ = [str(row["id"]) for row in candidate
              if "id" in row and isinstance(row.get("prompt_hash"), str) and str(row["id"]) in asked
              and asked[str(row["id"])] != row["prompt_hash"]]
    if differ:
        raise GateInputMismatch(f"{asker}: {candidate_who} and {baseline_who} were sent different prompts for "
                                f"{len(differ)} of {len(asked)} question id(s) (first: {differ[0]!r}): they were not "
                                "evaluated the same way (num_fewshot, the few-shot train file, gen_prefix, "
                                "use_chat_completions or the lm-eval task differ), so their answers do not measure "
                                "what quantization cost; give both configs the same evaluation settings")
