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

from .config import EvalConfig

# Float rounding of threshold arithmetic (0.80 - 0.08 = 0.7200000000000001) is not a failure.
EPSILON = 1e-12
_NORMAL = NormalDist()


class GateInputError(ValueError):
    """A gate lacks a run-time input (per-sample results, a baseline result); the run is an ERROR."""


@dataclass(frozen=True)
class Baseline:
    """The run a paired or recovery gate compares against (its result.json and samples.jsonl)."""

    name: str
    metrics: Mapping[str, Any]  # result.json "metrics": at least "value" and "n"
    samples: Sequence[Mapping[str, Any]] | None = None  # samples.jsonl rows: "id", "correct"


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
                  baseline: Baseline | None = None) -> GateOutcome:
    """Gate `metrics` (result.json "metrics": "value", "n", "invalid_rate") by `config.gate`."""
    mode = config.gate.mode
    measured = _number(metrics, "value", "metrics")
    gate = config.gate
    if mode == "absolute":
        passed, numbers, text = absolute(measured, _need(config.accuracy_threshold, "accuracy_threshold"),
                                         config.tolerance)
    elif mode == "relative":
        passed, numbers, text = relative(measured, _reference(config), config.effective_rtol)
    elif mode == "hypothesis":
        passed, numbers, text = hypothesis(measured, _reference(config), _n(metrics), gate.alpha, gate.beta)
    elif mode == "wilson":
        passed, numbers, text = wilson(measured, _n(metrics), _reference(config), config.effective_rtol, gate.alpha)
    elif mode == "paired":
        if samples is None:
            raise GateInputError("gate paired needs the run's per-sample results (samples.jsonl)")
        if baseline is None or baseline.samples is None:
            raise GateInputError(f"gate paired needs the per-sample results of baseline {config.baseline!r}")
        passed, numbers, text = paired(_correct_by_id(samples, "candidate"),
                                       _correct_by_id(baseline.samples, f"baseline {baseline.name}"), gate.alpha)
    elif mode == "recovery":
        if baseline is None:
            raise GateInputError(f"gate recovery needs the result of baseline {config.baseline!r}")
        passed, numbers, text = recovery(measured, _number(baseline.metrics, "value", f"baseline {baseline.name}"),
                                         gate.recovery)
    else:  # pragma: no cover - GateSpec.mode is a Literal
        raise ValueError(f"unknown gate mode {mode!r}")
    numbers = {"metric": config.metric, **numbers}
    if gate.max_invalid_rate is not None:
        invalid = _number(metrics, "invalid_rate", "metrics")
        ok = invalid <= gate.max_invalid_rate + EPSILON
        numbers.update(invalid_rate=invalid, max_invalid_rate=gate.max_invalid_rate, invalid_rate_passed=ok)
        text += (f"\ninvalid answers: invalid_rate {invalid:.4f} {'<=' if ok else '>'} max_invalid_rate "
                 f"{gate.max_invalid_rate:.4f} -> {'PASS' if ok else 'FAIL'}")
        passed = passed and ok
    return GateOutcome(passed=passed, mode=mode, numbers=numbers, explanation=text)


# ---------------------------------------------------------------------------------------------
# The six modes, each (passed, numbers, explanation) from plain numbers.

Result = tuple[bool, dict[str, Any], str]


def absolute(measured: float, accuracy_threshold: float, tolerance: float) -> Result:
    """vLLM gen-2: measured >= accuracy_threshold - tolerance."""
    threshold = accuracy_threshold - tolerance
    passed = measured >= threshold - EPSILON
    text = (f"absolute: threshold = accuracy_threshold - tolerance = {accuracy_threshold:.4f} - {tolerance:.4f} "
            f"= {threshold:.4f}; measured {measured:.4f} {_cmp(passed)} {threshold:.4f} -> {_verdict(passed)}")
    return passed, {"measured": measured, "accuracy_threshold": accuracy_threshold, "tolerance": tolerance,
                    "threshold": threshold}, text


def relative(measured: float, reference: float, rtol: float) -> Result:
    """vLLM gen-1: measured >= reference * (1 - rtol)."""
    threshold = reference * (1 - rtol)
    passed = measured >= threshold - EPSILON
    text = (f"relative: threshold = reference * (1 - rtol) = {reference:.4f} * (1 - {rtol:.4f}) = {threshold:.4f}; "
            f"measured {measured:.4f} {_cmp(passed)} {threshold:.4f} -> {_verdict(passed)}")
    return passed, {"measured": measured, "reference": reference, "rtol": rtol, "threshold": threshold}, text


def hypothesis(measured: float, reference: float, n: int, alpha: float = 0.05, beta: float = 0.2) -> Result:
    """TensorRT-LLM's accuracy test: a one-sided two-sample z-test against the reference.

    sigma = sqrt(p (1 - p)) with p the reference; the threshold is ref + z(alpha) *
    sqrt(2 sigma^2 / n) (z(alpha) < 0), and theta = -(z(alpha) + z(beta)) * sqrt(2 sigma^2 / n)
    is the smallest true drop the test detects with power 1 - beta.
    """
    sigma = math.sqrt(reference * (1 - reference))
    scale = math.sqrt(2 * sigma**2 / n)
    z_alpha, z_beta = _NORMAL.inv_cdf(alpha), _NORMAL.inv_cdf(beta)
    threshold = reference + z_alpha * scale
    theta = -(z_alpha + z_beta) * scale
    passed = measured >= threshold - EPSILON
    text = (f"hypothesis: sigma = sqrt(p * (1 - p)) = sqrt({reference:.4f} * {1 - reference:.4f}) = {sigma:.4f}; "
            f"se = sqrt(2 * sigma^2 / n) = sqrt(2 * {sigma**2:.4f} / {n}) = {scale:.6f}; "
            f"z(alpha={alpha:g}) = {z_alpha:.4f}; threshold = reference + z(alpha) * se = {reference:.4f} + "
            f"({z_alpha:.4f} * {scale:.6f}) = {threshold:.4f} ({reference - threshold:.4f} below the reference); "
            f"measured {measured:.4f} {_cmp(passed)} {threshold:.4f} -> {_verdict(passed)}; "
            f"minimum detectable drop theta = -(z(alpha) + z(beta={beta:g})) * se = -({z_alpha:.4f} + {z_beta:.4f}) "
            f"* {scale:.6f} = {theta:.4f}")
    return passed, {"measured": measured, "reference": reference, "n": n, "alpha": alpha, "beta": beta,
                    "sigma": sigma, "standard_error": scale, "z_alpha": z_alpha, "z_beta": z_beta,
                    "threshold": threshold, "margin": reference - threshold, "theta": theta}, text


def wilson_lower_bound(p: float, n: int, z: float) -> float:
    """Lower end of the Wilson score interval for a proportion p observed on n samples."""
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (centre - spread) / (1 + z2 / n)


def wilson(measured: float, n: int, reference: float, rtol: float, alpha: float = 0.05) -> Result:
    """Pass iff the one-sided Wilson lower bound of measured at 1 - alpha reaches ref * (1 - rtol)."""
    z = _NORMAL.inv_cdf(1 - alpha)
    lower = wilson_lower_bound(measured, n, z)
    threshold = reference * (1 - rtol)
    passed = lower >= threshold - EPSILON
    text = (f"wilson: z(1-alpha={1 - alpha:g}) = {z:.4f}; lower bound = (p + z^2/(2n) - z * sqrt(p(1-p)/n + "
            f"z^2/(4n^2))) / (1 + z^2/n) with p = {measured:.4f}, n = {n} -> {lower:.4f}; threshold = reference * "
            f"(1 - rtol) = {reference:.4f} * (1 - {rtol:.4f}) = {threshold:.4f}; lower bound {lower:.4f} "
            f"{_cmp(passed)} {threshold:.4f} -> {_verdict(passed)}")
    return passed, {"measured": measured, "n": n, "alpha": alpha, "z": z, "wilson_lower_bound": lower,
                    "reference": reference, "rtol": rtol, "threshold": threshold}, text


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def paired(candidate: Mapping[str, bool], baseline: Mapping[str, bool], alpha: float = 0.05) -> Result:
    """Exact McNemar test on the questions both runs answered.

    Only discordant pairs carry information: `losses` (baseline right, candidate wrong) and
    `wins` (the reverse). Under "no difference" losses ~ Binomial(losses + wins, 1/2); the
    candidate fails iff it is significantly worse: P(X >= losses) < alpha (one-sided).
    """
    common = [q for q in candidate if q in baseline]
    if not common:
        raise GateInputError("gate paired: the candidate and the baseline share no question ids")
    losses = sum(1 for q in common if baseline[q] and not candidate[q])
    wins = sum(1 for q in common if candidate[q] and not baseline[q])
    both = sum(1 for q in common if candidate[q] and baseline[q])
    discordant = losses + wins
    p_worse = binomial_tail(losses, discordant)
    p_two_sided = min(1.0, 2 * min(binomial_tail(losses, discordant), binomial_tail(wins, discordant)))
    passed = not (p_worse < alpha)
    only_candidate, only_baseline = len(candidate) - len(common), len(baseline) - len(common)
    text = (f"paired: exact McNemar on {len(common)} common questions; flips: {losses} right->wrong "
            f"(baseline right, candidate wrong), {wins} wrong->right; both right {both}; "
            f"p(candidate worse) = P(X >= {losses} | X ~ Binomial({discordant}, 0.5)) = {p_worse:.4g} "
            f"{'<' if not passed else '>='} alpha {alpha:g} -> {_verdict(passed)} (two-sided p = {p_two_sided:.4g})")
    if only_candidate or only_baseline:
        text += f"; not compared: {only_candidate} questions only in the candidate, {only_baseline} only in the baseline"
    return passed, {"n_common": len(common), "flips_right_to_wrong": losses, "flips_wrong_to_right": wins,
                    "both_right": both, "both_wrong": len(common) - discordant - both, "discordant": discordant,
                    "p_value_worse": p_worse, "p_value_two_sided": p_two_sided, "alpha": alpha,
                    "only_candidate": only_candidate, "only_baseline": only_baseline}, text


def recovery(measured: float, baseline_measured: float, minimum: float = 0.95) -> Result:
    """llm-compressor's recovery: measured / baseline_measured >= minimum."""
    if baseline_measured <= 0:
        raise GateInputError(f"gate recovery: the baseline scored {baseline_measured}; a ratio against it is undefined")
    ratio = measured / baseline_measured
    passed = ratio >= minimum - EPSILON
    text = (f"recovery: ratio = measured / baseline = {measured:.4f} / {baseline_measured:.4f} = {ratio:.4f}; "
            f"{ratio:.4f} {_cmp(passed)} recovery {minimum:.4f} -> {_verdict(passed)}")
    return passed, {"measured": measured, "baseline_measured": baseline_measured, "recovery_ratio": ratio,
                    "recovery": minimum}, text


# ---------------------------------------------------------------------------------------------


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


def _n(metrics: Mapping[str, Any]) -> int:
    n = _number(metrics, "n", "metrics")
    if n < 1 or n != int(n):
        raise GateInputError(f"metrics n must be a positive count, got {n}")
    return int(n)


def _correct_by_id(samples: Sequence[Mapping[str, Any]], who: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for row in samples:
        if "id" not in row or "correct" not in row:
            raise GateInputError(f"{who}: per-sample rows need 'id' and 'correct', got keys {sorted(row)}")
        key = str(row["id"])
        if key in out:
            raise GateInputError(f"{who}: question id {key!r} appears twice")
        out[key] = bool(row["correct"])
    return out
