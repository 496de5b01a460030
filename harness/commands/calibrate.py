"""`quantgate calibrate CONFIG --runs K`: measure a config K times and propose its `reference:`.

Each run is a full `quantgate run` of the config (its own server, its own artifacts under
OUTPUT_DIR/run-<i>/); a paired or recovery gate's baseline is measured once before them, under
OUTPUT_DIR/baseline/ (or its cached result there is reused, as `quantgate run` does). The
proposal is the mean with its provenance (run-to-run stdev, runs, questions per run, where and
when, at which commit), and the threshold each gate mode would derive from it under the
config's own gate settings, so a reviewer can see how much room the gate leaves above the noise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from datetime import date
from pathlib import Path
from typing import Any

from ..backends import ENGINES
from ..config import LIST_SUFFIX, REPORTED_METRICS, ConfigError, EvalConfig, Reference, count_test_questions, load_config
from ..gates import absolute, evaluate_gate, hypothesis, relative, wilson
from ..results import ERROR, EXIT_ERROR, EXIT_FAIL, EXIT_PASS, EXIT_USAGE, RunRecord, checkout_commit
from ..runner import (DEFAULT_OUTPUT_DIR, Display, InterruptGuard, OutputDirUnwritable, PlanError, PlannedConfig,
                      RunInterrupted, RunOptions, gate_line, output_dir_lock, plan, run_one)
from .arg_types import int_at_least, positive_int, server_url


_runs = int_at_least(2, "one run has no run-to-run spread")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="an eval config file")
    parser.add_argument("--runs", type=_runs, required=True, metavar="K", help="how many runs (at least 2)")
    parser.add_argument("--engine", choices=ENGINES, default=None, help="override the config's `engine:`")
    parser.add_argument("--limit", type=positive_int, default=None, help="evaluate only the first N questions")
    parser.add_argument("--server-url", type=server_url, default=None, metavar="URL", help="measure this running server")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="runs go to OUTPUT_DIR/run-<i>/<config>/, the proposal to OUTPUT_DIR/calibration.json "
                             "(default results/calibrate/<config name>)")


def main(args: argparse.Namespace) -> int:
    display = Display()
    given = Path(args.config)
    if given.is_dir() or given.suffix == LIST_SUFFIX:
        display.note(f"error: calibrate takes one config file; {given} is a {'folder' if given.is_dir() else 'list file'}"
                     ": calibrate its configs one at a time (a reference belongs to one config)")
        return EXIT_USAGE
    if args.output_dir is None:  # one folder per config: a second config's proposal replaced the first's
        args.output_dir = DEFAULT_OUTPUT_DIR / "calibrate" / _config_name(given, args.engine)
    # plan() puts a paired or recovery gate's baseline first, unless a usable result of it is
    # already in OUTPUT_DIR/baseline/; the runs' gates find it in the records the items share.
    base_options = RunOptions(output_dir=args.output_dir / "baseline", engine=args.engine, limit=args.limit,
                              server_url=args.server_url)
    try:
        *baselines, item = plan([args.config], base_options)
    except PlanError as exc:
        return display.refused(exc)
    try:
        with output_dir_lock(RunOptions(output_dir=args.output_dir)):
            return _calibrate(args, display, baselines, item, base_options)
    except PlanError as exc:  # another calibrate (or run) writes there, or it cannot be written
        return display.refused(exc)
    except OutputDirUnwritable as exc:
        display.note(f"error: {exc}")
        return EXIT_ERROR


def _config_name(path: Path, engine: str | None) -> str:
    """The config's name, for its default output folder; the file's stem when it does not load
    (plan() then reports why, before anything is written)."""
    try:
        return load_config(path, engine).name  # type: ignore[arg-type]
    except (ConfigError, OSError):
        return path.stem


def _calibrate(args: argparse.Namespace, display: Display, baselines: list[PlannedConfig], item: PlannedConfig,
               base_options: RunOptions) -> int:
    """The runs, under the output directory's lock, and the proposal."""
    path = args.output_dir / "calibration.json"
    path.unlink(missing_ok=True)  # an earlier calibration's proposal must not sit beside this one's runs
    records: list[RunRecord] = []
    guard = InterruptGuard()
    with guard.installed():
        try:
            for index, base in enumerate(baselines, start=1):
                display.config_start(index, len(baselines), base.config)
                display.note(f"  baseline of {item.config.name} (gate {item.config.gate.mode}), measured once")
                baseline = run_one(base, base_options, display, guard)
                display.verdict(baseline)
                if baseline.verdict == ERROR:
                    display.note(f"error: baseline {base.config.name} measured nothing ({baseline.reason}); every "
                                 f"run of {item.config.name} is gated against it: fix the cause and calibrate again")
                    return baseline.exit_code
            for index in range(1, args.runs + 1):
                display.config_start(index, args.runs, item.config)
                options = RunOptions(output_dir=args.output_dir / f"run-{index}", engine=args.engine,
                                     limit=args.limit, server_url=args.server_url)
                records.append(run_one(item, options, display, guard))
                display.verdict(records[-1])
                if records[-1].exit_code == EXIT_USAGE:  # the config's own error: every later run repeats it
                    break
        except RunInterrupted as exc:
            display.note(f"interrupted by {exc.signal_name} after {len(records)} run(s); nothing proposed")
            return EXIT_ERROR
    errors = [r for r in records if r.metrics is None or r.metrics.get("value") is None or r.verdict == "ERROR"]
    if errors:
        display.note(f"error: {len(errors)} of {len(records)} runs measured nothing ({errors[0].reason}); "
                     "a reference needs every run: fix the cause and calibrate again")
        # As `quantgate run` exits: 3 for what the config causes (a retry repeats it), else 2.
        return max(r.exit_code for r in errors)
    unproven = [r for r in records if r.expect is not None and not r.expect.get("passed")]
    if unproven:
        display.note(f"error: {len(unproven)} of {len(records)} runs did not run the kernels `expect:` names "
                     f"({unproven[0].expect.get('message')}); a reference must be measured on the kernels under "
                     "test: fix the backend or the config, then calibrate again")
        return EXIT_FAIL
    proposal = propose(item.config, records, args.limit)
    path.write_text(json.dumps(proposal, indent=2) + "\n")
    print(format_proposal(proposal))
    display.note(f"written to {path}")
    return EXIT_PASS


def _measured_on(record: RunRecord, config: EvalConfig) -> str:
    platform = (record.kernels or {}).get("platform") or {}
    parts = (platform.get("device"), platform.get("name"), platform.get("capability"))
    device = " ".join(dict.fromkeys(str(v) for v in parts if v))  # a CPU's name is "cpu" too
    # As the engines parse them (`--flag=value`, `_` for `-`), not as written.
    backends = [f"{flag} {value}" for flag, value in config.backend_flags().items()]
    return ", ".join([device or "unknown device", f"engine {record.config.get('engine')}", *backends])


def propose(config: EvalConfig, records: list[RunRecord], limit: int | None = None) -> dict[str, Any]:
    """Statistics over the runs, the `reference:` block they support, and the thresholds it gives
    under the config's gate settings; `limit`: calibrate's --limit (a proposal measured on fewer
    questions than the config's gate evaluates says so)."""
    values = [float(r.metrics["value"]) for r in records if r.metrics]
    ns = sorted({int(r.metrics["n"]) for r in records if r.metrics})
    mean, stdev = statistics.fmean(values), statistics.stdev(values)
    n = ns[0]
    # What is pasted is the rounded mean, so the thresholds and warnings are of that value: from the
    # unrounded one, a run just above its threshold could FAIL the gate with the pasted reference.
    value = round(mean, 4)
    reference = {"value": value, "stdev": round(stdev, 4), "runs": len(values), "n": n,
                 "measured_on": _measured_on(records[0], config), "date": date.today().isoformat(),
                 "commit": checkout_commit(config.source.parent, config.source)}
    gate, rtol = config.gate, config.effective_rtol
    thresholds = {
        "relative": relative(value, value, rtol)[1]["threshold"],
        "hypothesis": hypothesis(value, value, n, gate.alpha, gate.beta, n)[1],
        # The measured accuracy whose Wilson lower bound at n reaches the threshold: None when none does.
        "wilson": wilson(value, n, value, rtol, gate.alpha)[1]["measured_threshold"],
    }
    # The threshold of the config's own gate, on the measured scale; paired and recovery have none.
    own = {"relative": thresholds["relative"], "hypothesis": thresholds["hypothesis"]["threshold"],
           "wilson": thresholds["wilson"]}
    if gate.mode == "absolute" and config.accuracy_threshold is not None:  # always set for absolute (load_config)
        own["absolute"] = absolute(value, config.accuracy_threshold, config.tolerance)[1]["threshold"]
    # Each run gated by the config with the proposed reference pasted, through `quantgate run`'s own
    # gate (a gen-1 file's other listed metrics and max_invalid_rate included): the warning says
    # exactly which runs, and why, that config would fail. Paired and recovery read no reference.
    pasted = config.model_copy(update={"reference": Reference(value=value, n=n)})
    failing, why = [], []
    for record in records if gate.mode not in ("paired", "recovery") else []:
        outcome = evaluate_gate(pasted, record.metrics)
        if not outcome.passed:
            failing.append(float(record.metrics["value"]))
            why.append(gate_line(outcome))
    # The reference as a run of its own: wilson's lower bound at a small n fails even the mean.
    mean_fails = gate.mode == "wilson" and not wilson(value, n, value, rtol, gate.alpha)[0]
    others = {name: statistics.fmean(float(r.metrics[REPORTED_METRICS[name]]) for r in records)
              for name in config.other_references if all(REPORTED_METRICS[name] in r.metrics for r in records)}
    return {"config": str(config.source), "values": values, "mean": mean, "stdev": stdev, "min": min(values),
            "max": max(values), "n_per_run": ns, "reference": reference, "rtol": rtol, "alpha": gate.alpha,
            "beta": gate.beta, "thresholds": thresholds, "gate_mode": gate.mode,
            "accuracy_threshold": config.accuracy_threshold, "tolerance": config.tolerance,
            "gate_threshold": own.get(gate.mode), "failing_runs": failing, "failing_because": why,
            "reference_fails": mean_fails, "other_listed": {name: {"listed": config.other_references[name],
                                                                   "mean": round(mean, 4)}
                                                            for name, mean in others.items()},
            "config_num_questions": config.num_questions, "limit": limit, "test_questions": count_test_questions(config)}


def format_proposal(p: dict[str, Any]) -> str:
    ref = p["reference"]
    hyp = p["thresholds"]["hypothesis"]
    wilson_needed = p["thresholds"]["wilson"]
    lines = [
        f"runs: {', '.join(f'{v:.4f}' for v in p['values'])}",
        f"mean {p['mean']:.4f}, sample stdev {p['stdev']:.4f}, min {p['min']:.4f}, max {p['max']:.4f}, "
        f"n per run {', '.join(map(str, p['n_per_run']))}",
        "",
        "# paste into the config:",
        "reference: " + json.dumps(ref),
        "",
        f"# thresholds this reference gives under the config's gate settings (its gate: {p['gate_mode']}):",
        f"#   relative (rtol {p['rtol']:g}): {p['thresholds']['relative']:.4f}",
        f"#   hypothesis (alpha {p['alpha']:g}, beta {p['beta']:g}, n {ref['n']}): {hyp['threshold']:.4f}, minimum "
        f"detectable drop {hyp['theta']:.4f}",
        f"#   wilson (alpha {p['alpha']:g}, rtol {p['rtol']:g}, n {ref['n']}): "
        + (f"measured >= {wilson_needed:.4f}" if wilson_needed is not None else "no measured accuracy passes at this n"),
        f"#   run-to-run spread: 3 * stdev = {3 * p['stdev']:.4f} (a gate tighter than this below the mean flakes)",
    ]
    mode, threshold = p["gate_mode"], p["gate_threshold"]
    if mode == "absolute":  # its threshold is the config's own two numbers; `reference:` is provenance there
        lines += [f"#   absolute (the config's gate): accuracy_threshold {p['accuracy_threshold']:g} - tolerance "
                  f"{p['tolerance']:g} = {threshold:.4f}; this gate does not read `reference:`. To gate on this "
                  f"measurement: accuracy_threshold: {ref['value']}, and a tolerance above the run-to-run spread "
                  f"and other machines' rounding (one standard error at n {ref['n']}: "
                  f"{math.sqrt(p['mean'] * (1 - p['mean']) / ref['n']):.4f})"]
    if mode in ("paired", "recovery"):
        lines.append(f"# note: gate {mode} compares each run with its baseline, not with a reference, so the runs "
                     "are not checked against a threshold here (each run's verdict above is that gate's)")
    elif threshold is None:
        lines.append(f"# WARNING: at n {ref['n']} no measured accuracy passes the wilson gate with this reference: "
                     "evaluate more questions")
    elif p.get("reference_fails"):
        lines.append(f"# WARNING: at n {ref['n']} the reference itself ({ref['value']}) fails the wilson gate (rtol "
                     f"{p['rtol']:g}, alpha {p['alpha']:g}): its Wilson lower bound is below reference * (1 - rtol); "
                     "evaluate more questions or raise rtol")
    elif p["failing_runs"]:
        lines.append(f"# WARNING: with this reference the config would fail {len(p['failing_runs'])} of "
                     f"{len(p['values'])} runs: " + "; ".join(
                         f"{v:.4f} ({because})" for v, because in zip(p["failing_runs"], p.get("failing_because") or
                                                                       [f"below the {mode} threshold {threshold}"] * 99)))
    for name, other in (p.get("other_listed") or {}).items():
        lines.append(f"# {name}, also listed and gated: measured mean {other['mean']:.4f} against its listed value "
                     f"{other['listed']}: update that value in tasks[0].metrics too")
    if mode == "hypothesis" and 3 * p["stdev"] > hyp["margin"]:
        lines.append(f"# WARNING: 3 * stdev = {3 * p['stdev']:.4f} exceeds the hypothesis margin (reference - "
                     f"threshold = {hyp['margin']:.4f}): run-to-run noise alone can fail the gate")
    if len(p["n_per_run"]) > 1:
        lines.append("# WARNING: runs evaluated different numbers of questions")
    full, size = p.get("config_num_questions"), p.get("test_questions")
    evaluated = full if full is None or size is None else min(full, size)  # what a run of the config evaluates
    if evaluated is not None and ref["n"] < evaluated:
        lines.append(f"# WARNING: measured on {ref['n']} of the {evaluated} questions the config's gate evaluates "
                     "(--limit); calibrate without --limit before pasting this reference")
    elif full is None and p.get("limit") is not None and (size is None or ref["n"] < size):
        measured = f"on {ref['n']} of the {size} test questions" if size is not None else f"with --limit {p['limit']}"
        lines.append(f"# WARNING: measured {measured}, but the config sets no num_questions, so its gate evaluates "
                     "the whole test set: calibrate without --limit before pasting this reference")
    if str(ref.get("commit") or "").endswith("-dirty"):
        lines.append("# WARNING: measured on a checkout with uncommitted changes")
    return "\n".join(lines)
