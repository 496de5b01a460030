"""`quantgate compare BASE CAND`: paired per-question comparison of two results.

Both runs' per-question results (samples.jsonl beside each result.json) are matched by
question id, read as the paired gate reads them (the same questions, targets and prompts); the
gates module's exact McNemar test says whether the candidate is significantly worse, and
every flip is listed both ways. Exit 0 when it is not significantly worse, 1 when it is, 3
when an input is missing or the two cannot be paired.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..gates import GateInputError, check_same_prompts, check_same_targets, correct_by_id, paired
from ..results import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, SAMPLES_FILE, load_result, load_samples
from .arg_types import significance

_SHOWN = 10


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", type=Path, help="the baseline's result.json or run directory")
    parser.add_argument("cand", type=Path, help="the candidate's result.json or run directory")
    parser.add_argument("--alpha", type=significance, default=0.05, help="significance level (default 0.05)")
    parser.epilog = ("exit status: 0 the candidate is not significantly worse, 1 it is, 3 an input is missing or "
                     "the two runs cannot be paired (different questions, targets or prompts)")


def _load(path: Path, role: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        result = load_result(path)
    except (OSError, ValueError) as exc:
        raise GateInputError(f"{role} {path}: {exc}") from None
    if result["verdict"] == "ERROR":
        raise GateInputError(f"{role} {path}: that run ended in ERROR ({result.get('reason')}), so it has no answers "
                             "to compare; compare runs that reached a verdict")
    try:
        samples = load_samples(path)
    except OSError as exc:  # unreadable (permissions, I/O): not a file of the wrong shape
        raise GateInputError(f"{role} {_samples_file(path)}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a torn line: json's error names line and column
        raise GateInputError(f"{role} {_samples_file(path)}: not JSON lines ({exc})") from None
    if samples is None:
        raise GateInputError(f"{role} {path}: no samples.jsonl beside the result; per-question results are "
                             "written by `quantgate run`")
    if not samples:
        raise GateInputError(f"{role} {path}: samples.jsonl has no rows: that run answered no question; compare "
                             "runs that evaluated questions")
    if not all(isinstance(row, dict) for row in samples):
        raise GateInputError(f"{role} {_samples_file(path)}: every line must be a JSON object (one question)")
    return result, samples


def main(args: argparse.Namespace) -> int:
    try:
        base, base_samples = _load(args.base, "base")
        cand, cand_samples = _load(args.cand, "candidate")
        metrics = [(r.get("metrics") or {}).get("metric") for r in (base, cand)]
        if None not in metrics and metrics[0] != metrics[1]:  # `correct` is read under each run's own metric
            raise GateInputError(f"base {args.base} gated {metrics[0]} and candidate {args.cand} {metrics[1]}: their "
                                 "per-question results are not comparable; compare runs of the same metric")
        base_who, cand_who = f"base {_samples_file(args.base)}", f"candidate {_samples_file(args.cand)}"
        base_ok, cand_ok = correct_by_id(base_samples, base_who), correct_by_id(cand_samples, cand_who)
        check_same_targets(cand_samples, base_samples, cand_who, base_who)
        check_same_prompts(cand_samples, base_samples, cand_who, base_who, "compare")
        passed, numbers, explanation = paired(cand_ok, base_ok, args.alpha)
    except GateInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for role, result in (("base", base), ("cand", cand)):
        metrics = result.get("metrics") or {}
        value = metrics.get("value")
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "-"
        print(f"{role}: {result['name']} ({result['verdict']}): {metrics.get('metric')} {shown} "
              f"(n {metrics.get('n')})")
    print(explanation)
    by_id = {str(row["id"]): row for row in cand_samples}
    for title, ids in (("right -> wrong", [q for q in cand_ok if base_ok[q] and not cand_ok[q]]),
                       ("wrong -> right", [q for q in cand_ok if cand_ok[q] and not base_ok[q]])):
        print(f"{title} ({len(ids)}):")
        for q in ids[:_SHOWN]:
            row = by_id[q]
            print(f"  question {q}: candidate answered {row.get('extracted')!r} (target {_gold(row)!r})")
        if len(ids) > _SHOWN:
            print(f"  ... and {len(ids) - _SHOWN} more")
    return EXIT_PASS if passed else EXIT_FAIL


def _samples_file(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / SAMPLES_FILE


def _gold(row: dict[str, Any]) -> str:
    return str(row.get("target", "")).rsplit("#### ", 1)[-1].strip()
