"""From configs to verdicts: one server per config, lm-eval against it, gate, artifacts.

`run_configs` is `quantgate run`: it loads every config first (any problem: exit 3 before a
server starts), orders baselines before the configs that compare against them, then runs
each config in turn. Whatever happens in a config's run (the server exits during start-up
or mid-evaluation, a request fails or hangs, SIGINT/SIGTERM arrives), its server is torn
down, process group and all, and its result.json is written with the verdict and the cause.

Verdicts: PASS (gate and `expect:` hold), FAIL (a gate or `expect:` failed; exit 1), ERROR
(no verdict could be reached: exit 2, the retryable class). Exit 3 is for configs and usage.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

from quantgate.engine.serve_args import EXIT_USAGE as SERVE_EXIT_USAGE

from . import evaluate as evaluate_mod
from . import expect as expect_mod
from .backends import FLAGS as BACKEND_FLAGS
from .config import (ConfigError, EvalConfig, builtin_flags_problem, check_unique_names, expand_paths, inspect_config,
                     load_config, count_test_questions, parse_capability, resolve_model)
from .evaluate import (DatasetUnreachable, EvalOutcome, EvalSettings, EvalSetupError, dataset_hashes, run_eval,
                       sha256_file)
from .gates import (Baseline, GateInputError, GateInputMismatch, GateOutcome, check_same_metric, evaluate_gate,
                    shown)
from .legacy import LEGACY_VARS, legacy_names
from .results import (EXIT_ERROR, EXIT_FAIL, EXIT_PASS, EXIT_USAGE, ERROR, FAIL, PASS, RESULT_FILE, SAMPLES_FILE, SERVER_LOG,
                      ArtifactsUnwritable,
                      RunRecord, Skipped, artifact_path_problems,
                      checkout_commit, harness_versions, is_finite_number, load_result, load_samples, now_iso,
                      summary_frame, write_junit, write_result, write_samples, write_summary)
from .server import (INTERRUPTED_GRACE_S, TEARDOWN_GRACE_S, AttachedServer, LaunchedServer, Server, ServerCommand,
                     ServerCommandError, ServerStartError,
                     api_key_of, attach, auth_headers, build_command, redact_api_key, redact_env)

DEFAULT_OUTPUT_DIR = Path("results")
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_REQUEST_TIMEOUT_S = 300.0  # lm-eval's own default
_STALE_ARTIFACTS = ("result.json", "samples.jsonl", SERVER_LOG, "lm_eval.log")


LOCK_FILE = ".quantgate-run.lock"
# How vLLM and quantgate serve refuse a request longer than --max-model-len (the code, the words).
_CONTEXT_TOO_SHORT = ("context_length_exceeded", "maximum context length")


class OutputDirUnwritable(Exception):
    """The output directory cannot be made or locked (a full disk): exit 2, may pass next time."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the runner. A KeyboardInterrupt so that asyncio, tenacity and
    lm-eval let it through untouched, exactly as they do Ctrl-C."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class InterruptGuard:
    """SIGINT/SIGTERM become one RunInterrupted, raised where the main thread is, except inside
    `shield()` (teardown, writing results), where it is held until the shielded work is done.
    Signals after the first are ignored: the teardown they would cut short is bounded anyway."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._raised = False
        self._shielded = 0

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.signal_name is not None:
            return
        self.signal_name = signal.Signals(signum).name
        if not self._shielded:
            self._raise()

    def _raise(self) -> None:
        assert self.signal_name is not None
        self._raised = True
        raise RunInterrupted(self.signal_name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[InterruptGuard]:
        previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    @contextlib.contextmanager
    def shield(self) -> Iterator[None]:
        self._shielded += 1
        try:
            yield
        finally:
            self._shielded -= 1
        if not self._shielded and self.signal_name is not None and not self._raised:
            self._raise()


@dataclass(frozen=True)
class RunOptions:
    output_dir: Path = DEFAULT_OUTPUT_DIR
    engine: str | None = None
    limit: int | None = None
    server_url: str | None = None
    junit: Path | None = None
    markdown: Path | None = None
    # False: plan commands for another machine (`quantgate repro` prints them), so this one's
    # GPUs and executables are not checked.
    check_machine: bool = True
    # A config whose `requires:` this machine does not meet is skipped (and reported so) instead
    # of failing the plan. Opt-in: on CI a misrouted GPU config must fail, never pass by skipping.
    skip_unmet: bool = False


@dataclass
class PlannedConfig:
    """A config ready to run: its server command, its model, what its gate compares against."""

    config: EvalConfig
    model: str
    command: ServerCommand | None  # None with --server-url
    baseline_name: str | None = None
    # A result to compare against when the baseline is not run here, read at plan time: another
    # job writing the same output directory later cannot change what was checked.
    baseline_cached: Baseline | None = None
    records: dict[str, RunRecord] = field(default_factory=dict)  # shared: records of this run by name


# ---------------------------------------------------------------------------- display


class Display:
    """Progress for a person at a terminal (a live rich progress bar), plain lines for a CI log;
    both on stderr, so stdout stays clean for tools."""

    def __init__(self, console: Console | None = None) -> None:
        # The stream itself, not "whatever sys.stderr is": lm-eval's output is redirected meanwhile.
        self.console = console or Console(file=sys.stderr, highlight=False)
        if console is None and not self.console.is_terminal and "COLUMNS" not in os.environ:
            # CI logs have no width; rich's 80-column default wraps names and numbers mid-word.
            self.console.width = 160
        self._live: Progress | None = None
        self._task: TaskID | None = None
        self._description = ""
        self._last_share = -1.0

    def note(self, text: str) -> None:
        # One line per message, however long: a CI log or the terminal wraps it, so a path or a
        # flag is never cut in two.
        self.console.print(text, markup=False, soft_wrap=True)

    def refused(self, exc: PlanError) -> int:
        """A plan's problems, one `error:` line each; the exit status they mean (3: fix the config)."""
        for message in exc.messages:
            self.note(f"error: {message}")
        return EXIT_USAGE

    def config_start(self, index: int, total: int, config: EvalConfig) -> None:
        self.console.rule(escape(f"[{index}/{total}] {config.name} ({config.engine})"), style="dim")

    def _bar(self, description: str, total: float | None) -> None:
        if not self.console.is_terminal:
            return
        if self._live is None:
            self._live = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
            self._live.start()
        if self._task is None or self._description != description:
            if self._task is not None:
                self._live.remove_task(self._task)
            self._task, self._description = self._live.add_task(description, total=total), description

    def waiting(self, elapsed_s: float) -> None:
        self._bar("starting server", None)

    def eval_start(self) -> None:
        self._last_share = -1.0
        self._bar("preparing the evaluation", None)

    def progress(self, answered: int, requested: int) -> None:
        if requested <= 0:
            return
        if self.console.is_terminal:
            self._bar("evaluating", requested)
            assert self._live is not None and self._task is not None
            self._live.update(self._task, completed=answered, total=requested)
            return
        share = answered / requested
        if share >= self._last_share + 0.25 or answered == requested:
            self._last_share = share
            self.note(f"  evaluating: {answered}/{requested} answered")

    def stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live, self._task = None, None

    def verdict(self, record: RunRecord) -> None:
        self.stop_live()
        style = {PASS: "green", FAIL: "red", ERROR: "yellow"}.get(record.verdict, "")
        total = record.timings.get("total_s") or 0.0
        self.console.print(f"  [bold {style}]{record.verdict}[/] {escape(record.name)} ({total:.1f} s): ", end="")
        self.console.print(record.reason, markup=False, soft_wrap=True)
        if record.gate and record.gate.get("explanation"):
            self.console.print("  " + record.gate["explanation"].replace("\n", "\n  "), markup=False, style="dim")
        if record.verdict == ERROR and record.log_tail:
            self.console.print("  server log tail:", style="dim")
            self.console.print("    " + record.log_tail.replace("\n", "\n    "), markup=False, style="dim")

    def summary(self, records: Sequence[RunRecord]) -> None:
        self.stop_live()
        frame = summary_frame(records).drop(columns=["metric", "reason"])  # in summary.md; too wide here
        frame = frame.astype(object).where(frame.notna(), None)  # pandas' missing values (NA, NaN) read "-"
        table = Table(title="quantgate summary", show_lines=False)
        for column in frame.columns:
            table.add_column(column, overflow="fold")
        colors = {PASS: "green", FAIL: "red", ERROR: "yellow"}
        columns = list(frame.columns)
        for row in frame.itertuples(index=False):
            cells = [escape(_cell(v)) for v in row]  # a config named qwen3[fp8] is not markup
            cells[1] = f"[{colors.get(row.verdict, '')}]{row.verdict}[/]"
            # A FAIL never reads 0.7339 vs 0.7339.
            if is_finite_number(row.measured) and is_finite_number(row.threshold):
                cells[columns.index("measured")], cells[columns.index("threshold")] = shown(row.measured, row.threshold)
            table.add_row(*cells)
        self.console.print(table)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


# ---------------------------------------------------------------------------- planning


class PlanError(Exception):
    """Problems found before anything runs (exit 3): every message is located and says the fix."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


def plan(paths: Sequence[str | Path], options: RunOptions, skipped: list[Skipped] | None = None,
         warnings: list[str] | None = None) -> list[PlannedConfig]:
    """Load and check every config; add or reuse baselines; order baselines first. With
    `options.skip_unmet`, configs this machine cannot run go to `skipped` instead; `warnings`
    gets lint's warnings (an unknown key is kept, not used: a typo must not pass unsaid)."""
    problems: list[str] = []
    skipped = [] if skipped is None else skipped
    warnings = [] if warnings is None else warnings
    try:
        files = expand_paths(paths)
    except ConfigError as exc:
        raise PlanError([str(exc)]) from None
    if not files:
        raise PlanError([f"no config files in {', '.join(map(str, paths))}"])
    configs: list[EvalConfig] = []
    for path in files:
        inspection = inspect_config(path, options.engine)  # type: ignore[arg-type]
        problems += [str(e) for e in inspection.errors]
        warnings += [str(w) for w in inspection.warnings]
        if not inspection.errors:
            configs.append(inspection.config)
    problems += [str(e) for e in check_unique_names(configs)]
    if problems:
        raise PlanError(problems)
    by_source = {c.source: c for c in configs}
    planned: dict[str, PlannedConfig] = {}
    shared: dict[str, RunRecord] = {}
    order: list[str] = []

    def add(config: EvalConfig, chain: tuple[str, ...] = ()) -> None:
        if config.name in planned:
            return
        if config.name in chain:
            problems.append(f"{config.source}: baseline: cycle {' -> '.join((*chain, config.name))}")
            return
        item = _plan_one(config, options, problems, shared, skipped)
        if item is None:
            return
        if config.baseline_path is not None and config.gate.mode in ("paired", "recovery"):
            _plan_baseline(item, config, options, by_source, problems, lambda c: add(c, (*chain, config.name)))
            base_skip = next((s for s in skipped if s.name == item.baseline_name), None)
            if base_skip is not None and item.baseline_cached is None:  # its baseline cannot run here
                skipped.append(Skipped(config.name, str(config.source), config.engine,
                                       f"its baseline {base_skip.name} is skipped ({base_skip.reason})"))
                return
        planned[config.name] = item
        order.append(config.name)

    for config in configs:
        add(config)
    if problems:
        raise PlanError(problems)
    return [planned[name] for name in order]


_NO_GPU = {"", "-1", "none", "void", "nodevfiles"}


@dataclass(frozen=True)
class GpuScan:
    gpus: list[tuple[str, str | None]]  # (name, compute capability; None where nvidia-smi says `[N/A]`)
    note: str | None = None  # why the list is what it is: nvidia-smi's error, the variable that narrowed it


def local_gpus() -> GpuScan:
    """The GPUs this process may use. Asked of the driver, not of torch: this venv's torch may be
    a CPU build next to vLLM's CUDA one. CUDA_VISIBLE_DEVICES narrows nvidia-smi's list as CUDA
    does, by index or GPU UUID. (NVIDIA_VISIBLE_DEVICES is the container runtime's: inside the
    container nvidia-smi already lists only those GPUs, renumbered from 0. MIG instances are not
    in nvidia-smi's GPU list, so a list naming them leaves it as it is.)"""
    import re
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuScan([], None if isinstance(exc, FileNotFoundError) else f"nvidia-smi did not answer ({exc})")
    if out.returncode != 0:
        said = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[0].rstrip(".")
        return GpuScan([], f"nvidia-smi failed (exit {out.returncode}): {said}")
    rows = []  # (index, uuid, name, capability)
    for parts in (line.split(",") for line in out.stdout.splitlines()):
        if len(parts) >= 4:
            cap = parts[-1].strip()
            rows.append((parts[0].strip(), parts[1].strip(), ",".join(parts[2:-1]).strip(),
                         cap if re.fullmatch(r"\d+\.\d+", cap) else None))
    variable = "CUDA_VISIBLE_DEVICES"
    setting = os.environ.get(variable, "all").strip()
    if setting.lower() == "all" or "MIG-" in setting:
        return GpuScan([(name, cap) for _, _, name, cap in rows],
                       f"{variable}={setting!r} names MIG instances: counted as the GPUs nvidia-smi lists"
                       if "MIG-" in setting else None)
    visible = []
    for token in [] if setting.lower() in _NO_GPU else [t.strip() for t in setting.split(",")]:
        match = next((r for r in rows if token == r[0] or (token.startswith("GPU-") and r[1].startswith(token))),
                     None)
        if match is None:  # CUDA ignores the rest of the list from the first device it does not know
            break
        if match not in visible:
            visible.append(match)
    return GpuScan([(name, cap) for _, _, name, cap in visible],
                   f"{variable}={setting!r} leaves {len(visible)} of the {len(rows)} nvidia-smi lists")


def unmet_requirements(config: EvalConfig, scan: GpuScan) -> str | None:
    """Why `config.requires` does not hold with the GPUs `scan` found, or None."""
    req = config.requires
    if req.gpus == 0 and req.device is None and req.min_compute_capability is None:
        return None
    gpus = scan.gpus
    listed = ", ".join(f"{name} {cap or 'capability unknown'}" for name, cap in gpus)
    found = f"this machine has {len(gpus)} GPU(s)" + (f" ({listed})" if gpus else "") + (
        f"; {scan.note}" if scan.note else "")
    if len(gpus) < max(req.gpus, 1):
        return f"requires {max(req.gpus, 1)} GPU(s); {found}"
    if req.device and not all(req.device.lower() in name.lower() for name, _ in gpus):
        return f"requires device {req.device}; {found}"
    if req.min_compute_capability:
        need = parse_capability(req.min_compute_capability)
        if any(cap is None or parse_capability(cap) < need for _, cap in gpus):
            unknown = sum(cap is None for _, cap in gpus)
            return f"requires compute capability >= {req.min_compute_capability}; {found}" + (
                f"; nvidia-smi reports no compute capability for {unknown} of them, so it cannot be checked: "
                "update the NVIDIA driver, or run where nvidia-smi reports it" if unknown else "")
    return None


def _plan_one(config: EvalConfig, options: RunOptions, problems: list[str],
              shared: dict[str, RunRecord], skipped: list[Skipped]) -> PlannedConfig | None:
    model = resolve_model(config)
    command = None
    req = config.requires
    if options.check_machine and options.server_url is None and (req.gpus or req.device or req.min_compute_capability):
        unmet = unmet_requirements(config, local_gpus())
        if unmet and options.skip_unmet:
            skipped.append(Skipped(config.name, str(config.source), config.engine, unmet))
            return None
        if unmet:
            problems.append(f"{config.source}: this config {unmet}. Run it on a machine that has them "
                            "(`quantgate pipeline` routes it), evaluate a server running there with --server-url, "
                            "or pass --skip-unmet-requires to run only the configs this machine can")
            return None
    if options.server_url is None:
        refused = builtin_flags_problem(config)
        if refused:
            problems.append(f"{config.source}: server_args: {refused}")
            return None
        inherited = inherited_legacy_vars(config) if options.check_machine else []
        if inherited:
            problems += [f"{config.source}: the environment of this run sets {name}={os.environ[name]!r}, a legacy "
                         f"kernel switch ({LEGACY_VARS[name].meaning}) the server would inherit; refused in a config's "
                         "env, it is refused from the shell or CI agent too: unset it, and choose backends with "
                         "--linear-backend / --moe-backend in server_args" for name in inherited]
            return None
        if options.check_machine and config.engine == "builtin" and not (Path(model) / "config.json").is_file():
            problems.append(f"{config.source}: model_name: {config.model_name} is not a model folder (no config.json "
                            "next to the config, in a folder above it, or in the current directory). The builtin "
                            "engine serves local Hugging Face folders: fix the path, or set `engine: vllm` for a hub id")
            return None
        if options.check_machine and config.engine == "builtin" and not (Path(model) / "tokenizer.json").is_file():
            # The engine serves such a folder token ids only; lm-eval sends text: every request is a 400.
            problems.append(f"{config.source}: model_name: {model} has no tokenizer.json, so the builtin engine cannot "
                            "read the evaluation's text prompts: copy tokenizer.json (and tokenizer_config.json) from "
                            "the model's source into the folder")
            return None
        try:
            command = build_command(config.engine, model, config.server_args,
                                    {**config.env, **expect_mod.proof_env(config)}, config.vllm_command,
                                    require_executable=options.check_machine)
        except ServerCommandError as exc:
            problems.append(f"{config.source}: {exc}")
            return None
    return PlannedConfig(config=config, model=model, command=command, records=shared)


def inherited_legacy_vars(config: EvalConfig) -> list[str]:
    """Legacy kernel switches (harness/legacy.py) in this process's environment that the config's
    server would inherit (LaunchedServer.start passes the environment on) and read: refused in a
    config's `env`, they would otherwise choose kernels unseen by the config and by result.json's
    env_diff. VLLM_* ones reach `vllm serve`, QUANTGATE_DISABLED_KERNELS `quantgate serve`."""
    prefix = "VLLM_" if config.engine == "vllm" else "QUANTGATE_"
    return [name for name in legacy_names(os.environ) if name.startswith(prefix)]


def _plan_baseline(item: PlannedConfig, config: EvalConfig, options: RunOptions, by_source: dict[Path, EvalConfig],
                   problems: list[str], run_first: Any) -> None:
    """A results file is used as is; a baseline config reuses its cached result in the output
    directory when that result is of the same config file, else it runs first, in this run."""
    path = config.baseline_path
    assert path is not None
    if path.suffix == ".json":
        item.baseline_name = path.parent.name
        try:
            data = load_result(path)
            item.baseline_cached = Baseline(item.baseline_name, data.get("metrics") or {}, load_samples(path),
                                            _dataset_of(data), _origin(data, path))
        except (OSError, ValueError) as exc:
            problems.append(f"{config.source}: baseline {path}: {exc}")
            return
        # As an in-run baseline must have measured (`_baseline_for`) and a cached one reached a verdict
        # (`_usable_cache`): an ERROR's value, if it has one, is of a run that did not finish or whose
        # answers cannot be trusted.
        verdict = data.get("verdict")
        if verdict not in (PASS, FAIL):
            problems.append(f"{config.source}: baseline {path}: that run's verdict is {verdict} "
                            f"({data.get('reason') or 'no reason given'}), so it measured nothing to compare against; "
                            "use the result of a run that reached PASS or FAIL")
            return
        # Known before any server starts: a baseline of another question count cannot be compared.
        wanted = options.limit if options.limit is not None else config.num_questions
        available = count_test_questions(config)  # a test set shorter than the limit is evaluated whole
        if available is not None:
            wanted = available if wanted is None else min(wanted, available)
        measured = (data.get("metrics") or {}).get("n")
        if wanted is not None and isinstance(measured, int) and measured != wanted:
            problems.append(f"{config.source}: baseline {path} evaluated {measured} questions, this run would evaluate "
                            f"{wanted}: gate {config.gate.mode} compares the same questions; evaluate both with the "
                            "same num_questions and --limit")
        # The rest the gate would refuse only after the whole evaluation, and the same way every time.
        try:
            check_same_metric(config.metric, item.baseline_cached, config.gate.mode)
        except GateInputMismatch as exc:
            problems.append(f"{config.source}: baseline {path}: {exc}")
        if config.gate.mode == "paired" and item.baseline_cached.samples is None:
            problems.append(f"{config.source}: baseline {path} has no {SAMPLES_FILE} beside it: gate paired needs "
                            f"the per-sample results of both runs; put the baseline run's {SAMPLES_FILE} next to its "
                            "result.json")
        value = (data.get("metrics") or {}).get("value")
        if config.gate.mode == "recovery" and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                   and math.isfinite(value) and value > 0):
            problems.append(f"{config.source}: baseline {path} scored {value!r}: a recovery ratio against it is "
                            "undefined; use a baseline that measured a positive accuracy, or gate against a "
                            "`reference:` instead")
        return
    base = by_source.get(path)
    if base is None:
        try:
            base = load_config(path, options.engine)  # type: ignore[arg-type]
        except ConfigError as exc:
            problems.append(f"{config.source}: baseline {config.baseline!r}: {exc}")
            return
    item.baseline_name = base.name
    if base.metric != config.metric:  # known now: the gate would refuse the pair after both evals
        problems.append(f"{config.source}: baseline {base.name!r} gates {base.metric}, this config {config.metric}: "
                        f"gate {config.gate.mode} compares one metric; give both the same `metric:`")
        return
    differ = [key for key in _PROMPT_SETTINGS if _prompt_setting(base, key) != _prompt_setting(config, key)]
    if differ:  # the gate refuses other prompts (check_same_prompts) only after both evaluations
        problems.append(f"{config.source}: baseline {base.name!r} is asked with other prompts: "
                        + ", ".join(f"{key} {_prompt_setting(base, key)!r} there, {_prompt_setting(config, key)!r} here"
                                    for key in differ)
                        + f"; gate {config.gate.mode} compares answers to the same prompts: give both the same settings")
        return
    cached = options.output_dir / base.name / "result.json"
    limit = options.limit if options.limit is not None else base.num_questions
    usable = _usable_cache(cached, base, config.gate.mode, limit, attached=options.server_url is not None) \
        if base.source not in by_source else None
    if usable is not None:
        item.baseline_cached = usable
        return
    if options.server_url is not None:
        problems.append(f"{config.source}: baseline {base.name!r} has no usable result in {cached.parent} and "
                        "--server-url evaluates one server only: run the baseline first with its own server")
        return
    run_first(base)


# What makes the prompt of a question (besides the question): the few-shot examples and how they
# are sent. A baseline asked otherwise answers other prompts.
_PROMPT_SETTINGS = ("task", "num_fewshot", "few-shot train file", "gen_prefix", "use_chat_completions")


def _prompt_setting(config: EvalConfig, key: str) -> Any:
    if key != "few-shot train file":
        return getattr(config, key)
    train = config.dataset.train if config.dataset is not None and config.num_fewshot else None
    try:  # by content: two copies of one file give the same prompts
        return f"sha256 {sha256_file(train)[:12]}" if train is not None else None
    except OSError:  # missing: the config check names it
        return str(train)


def _usable_cache(path: Path, base: EvalConfig, mode: str, limit: int | None, *, attached: bool) -> Baseline | None:
    """A cached baseline counts when it is of this very config file, served by the same engine
    (`--engine` changes it, not the file), from the same model files (rebuilt at the same path,
    they are another model), launched here or attached (--server-url) as this run is, on the
    same questions of the same data files (whose bytes the config's sha256 does not cover)."""
    try:
        data = load_result(path)
        samples = load_samples(path)
    except (OSError, ValueError):
        return None
    recorded = data.get("config") or {}
    fresh = recorded.get("sha256") == base.sha256 and recorded.get("engine") == base.engine and \
        (data.get("evaluation") or {}).get("limit", "missing") == limit and \
        recorded.get("model_files") == model_fingerprint(resolve_model(base)) and \
        bool((data.get("server") or {}).get("attached")) == attached
    measured = data.get("verdict") in (PASS, FAIL) and (data.get("metrics") or {}).get("value") is not None
    same_data = base.dataset is None or ((data.get("dataset") or {}).get("sha256") or {}) == dataset_hashes(
        base.dataset.test, base.dataset.train)
    usable = fresh and measured and same_data and (mode != "paired" or samples is not None)
    return Baseline(base.name, data.get("metrics") or {}, samples, _dataset_of(data), _origin(data, path)) \
        if usable else None


def _origin(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Which earlier run a baseline result is, as the gate records it."""
    return {"result": str(path.resolve()), "engine": (data.get("config") or {}).get("engine"),
            "started_at": data.get("started_at"), "reused": True}


def _dataset_of(data: dict[str, Any]) -> dict[str, Any] | None:
    """A result's data file hashes (result.json "dataset"."sha256"), None when it has none."""
    hashes = (data.get("dataset") or {}).get("sha256")
    return hashes if isinstance(hashes, dict) else None


def _baseline_for(item: PlannedConfig) -> Baseline | None:
    if item.baseline_name is None:
        return None
    record = item.records.get(item.baseline_name)
    if record is not None:
        if record.verdict == ERROR or not record.metrics or record.metrics.get("value") is None:
            raise GateInputError(f"baseline {item.baseline_name!r} has no measurement in this run "
                                 f"({record.verdict}: {record.reason})")
        run_dir = Path(record.config["run_dir"])
        origin = {"result": str((run_dir / RESULT_FILE).resolve()), "engine": record.config.get("engine"),
                  "started_at": record.started_at, "reused": False}
        return Baseline(item.baseline_name, record.metrics, load_samples(run_dir), (record.dataset or {}).get("sha256"),
                        origin)
    assert item.baseline_cached is not None
    return item.baseline_cached


# ---------------------------------------------------------------------------- one config


def model_fingerprint(model: str) -> str | None:
    """The files of a local model folder (names, sizes, modification times), as a sha256; None
    for a hub id. Cheap (no weight is read) and conservative: a folder rebuilt with the same bytes
    counts as another model."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        try:
            info = path.stat()
        except OSError:  # gone meanwhile, a broken link, unreadable: as if absent
            continue
        if stat.S_ISREG(info.st_mode):
            digest.update(f"{path.relative_to(folder)}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _config_summary(config: EvalConfig, model: str, run_dir: Path) -> dict[str, Any]:
    """The config as result.json records it: secrets (--api-key, secret-looking env) redacted,
    since results are shared; the config's sha256 still identifies the file."""
    server_args = redact_api_key(config.server_args)
    data = config.model_dump(mode="json", exclude={"source", "sha256"})
    data["server_args"] = server_args
    data["env"] = redact_env(config.env)
    return {"path": str(config.source), "sha256": config.sha256,
            "commit": checkout_commit(config.source.parent, config.source), "engine": config.engine,
            "model_name": config.model_name, "model": model, "model_files": model_fingerprint(model),
            "server_args": server_args,
            "task": config.task, "metric": config.metric, "tags": config.tags, "run_dir": str(run_dir), "data": data}


def eval_settings(config: EvalConfig, base_url: str, served_model: str, run_dir: Path, limit: int | None,
                  api_key: str | None = None, model_aliases: tuple[str, ...] = ()) -> EvalSettings:
    """How `config` is evaluated against the server at `base_url`. Without `dataset:` the task
    loads its own (from the Hugging Face hub: that needs network)."""
    return EvalSettings(
        base_url=base_url,
        model=served_model,
        task=config.task,
        test_file=config.dataset.test if config.dataset else None,
        train_file=config.dataset.train if config.dataset else None,
        num_fewshot=config.num_fewshot,
        limit=limit if limit is not None else config.num_questions,
        max_tokens=config.max_tokens,
        max_concurrency=config.max_concurrency or DEFAULT_MAX_CONCURRENCY,
        request_timeout_s=config.request_timeout_seconds or DEFAULT_REQUEST_TIMEOUT_S,
        seed=config.seed,
        temperature=config.temperature,
        metric=config.metric,
        work_dir=run_dir,
        use_chat_completions=config.use_chat_completions,
        gen_prefix=config.gen_prefix,
        api_key=api_key,
        model_aliases=model_aliases,
    )


# A snapshot folder of the Hugging Face cache (`vllm serve $(huggingface-cli download ORG/NAME)`).
_HF_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def _model_name_of(text: str) -> str:
    """A model folder or hub id as a name that reads the same on every machine: a cache snapshot's
    hub id, a hub id whole, a folder by its last part ("" for `.`)."""
    text = text.replace("\\", "/")
    snapshot = _HF_SNAPSHOT.search(text)
    if snapshot:
        return f"{snapshot['org']}/{snapshot['name']}"
    if _HUB_ID.fullmatch(text) and not Path(text).exists():
        return text
    return PurePosixPath(text.rstrip("/")).name if text.rstrip("/") not in ("", ".") else ""


def other_model_served(config: EvalConfig, server: AttachedServer) -> str | None:
    """Why an attached server serves another model than the config's, or None. Evaluating another
    model measured it under this config's name, and a paired candidate later attached to the same
    server was compared with itself as its own baseline. /v1/models gives, as `root`, the path or
    hub id the server was started with (vLLM: as typed; quantgate serve: resolved). Both folders
    here: the same folder once links are resolved. Otherwise by name (a remote server's path to
    the same folder differs): hub ids whole, a folder by its last part; a root that names nothing
    (`.`) is taken at its word, as is a server whose served name is the config's model_name."""
    root = server.served_root
    if root is None or server.served_model == config.model_name:
        return None
    wanted = resolve_model(config)
    if Path(root).is_absolute() and Path(root).exists() and Path(wanted).exists():
        if Path(root).resolve() == Path(wanted).resolve():
            return None
    else:
        served, asked = _model_name_of(root), _model_name_of(wanted)
        both_hub_ids = "/" in served and "/" in asked
        if not served or not asked or (served == asked if both_hub_ids else
                                       served.rsplit("/", 1)[-1] == asked.rsplit("/", 1)[-1]):
            return None
    return (f"--server-url {server.base_url} serves {root}, not this config's model {config.model_name} "
            f"({wanted}): attach to a server started with the config's model (`quantgate repro` prints its "
            f"command), or run without --server-url; if it is that model under another path, start it with "
            f"--served-model-name {config.model_name}")


def model_aliases(server: Server) -> tuple[str, ...]:
    """The other names the server's /v1/models lists for the model it serves as `served_model`
    (cards with the same `root`, as vLLM and quantgate serve give): both answer every request with
    their first --served-model-name, whichever one was asked for. Empty when it says nothing."""
    import httpx

    try:
        response = httpx.get(server.base_url + "/v1/models", timeout=5.0, headers=auth_headers(server.api_key))
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return ()
    cards = [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)] if isinstance(cards, list) \
        else []
    roots = {c.get("root") for c in cards if c["id"] == server.served_model and isinstance(c.get("root"), str)}
    return tuple(c["id"] for c in cards if c["id"] != server.served_model and c.get("root") in roots - {""})


def _engine_version(server: Server, config: EvalConfig) -> str | None:
    """vLLM answers GET /version; the built-in engine is this quantgate."""
    import httpx

    try:
        response = httpx.get(server.base_url + "/version", timeout=5.0, headers=auth_headers(server.api_key))
        if response.status_code == 200:
            return str(response.json().get("version"))
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return harness_versions()["quantgate"] if config.engine == "builtin" else None


def _kernel_report(config: EvalConfig, server: Server,
                   attempts: int = expect_mod.REPORT_ATTEMPTS) -> tuple[dict | None, str]:
    """The kernel report and where it was looked for (for messages when there is none)."""
    if isinstance(server, AttachedServer) or config.engine == "builtin":
        return (expect_mod.report_from_server(server.base_url, api_key=server.api_key, attempts=attempts),
                f"GET {server.base_url}/v1/kernels")
    return expect_mod.report_from_vllm_log(server.log_lines()), "`Selected <Kernel> for <module>` / " \
        "`Using <X> <format> MoE backend` lines in server.log"


def _read_kernel_report(config: EvalConfig, server: Server,
                        attempts: int = expect_mod.REPORT_ATTEMPTS) -> tuple[dict | None, str, str | None]:
    """`_kernel_report`, and why the server's report could not be read (a 5xx, a timeout) when it
    could not: unknown, which is not the same as absent."""
    try:
        return (*_kernel_report(config, server, attempts), None)
    except expect_mod.KernelReportUnavailable as exc:
        return None, f"GET {server.base_url}/v1/kernels", str(exc)


def run_one(item: PlannedConfig, options: RunOptions, display: Display, guard: InterruptGuard) -> RunRecord:
    """Run one config and write its artifacts. The record is always written; RunInterrupted is
    re-raised after the server is torn down and the record saying so is on disk."""
    config = item.config
    run_dir = options.output_dir / config.name
    record = RunRecord(name=config.name, verdict=ERROR, reason="", config=_config_summary(config, item.model, run_dir),
                       versions=harness_versions(), started_at=now_iso(),
                       # Known before the server starts: `repro` of a run that never evaluated needs it too.
                       evaluation=_planned_evaluation(config, options))
    started = time.monotonic()
    server: Server | None = None
    outcome: EvalOutcome | None = None
    try:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            _remove_stale_artifacts(run_dir)
        except OSError as exc:  # e.g. a full disk: this config is an ERROR, the others still run
            raise ArtifactsUnwritable.of(run_dir, exc) from None
        evaluate_mod.preload()  # overlaps lm-eval's import with the server's start-up
        cached = item.baseline_cached.origin if item.baseline_cached is not None else None
        if cached is not None:  # not measured in this run: say which run it was (result.json gate.baseline)
            display.note(f"  gate {config.gate.mode} against baseline {item.baseline_name}'s earlier run: "
                         f"{cached['result']} (engine {cached['engine']}, started {cached['started_at']})")
        if item.command is None:
            assert options.server_url is not None
            # The config's own key if it sets one, else lm-eval's convention for OpenAI-style servers.
            server = attach(options.server_url, config.model_name,
                            api_key=api_key_of(config.server_args, config.env) or os.environ.get("OPENAI_API_KEY"))
            display.note(f"  evaluating the running server at {server.base_url} ({server.served_model})")
            for layer, name in _implied_expectations(config, server).items():
                display.note(f"  note: server_args' {BACKEND_FLAGS[layer]} {name} cannot be applied to a running "
                             f"server: checked as expect.{layer}_kernel against the kernels it reports instead")
            other = other_model_served(config, server)
            if other is not None:
                raise ServerStartError(other, exit_status=None, log_tail="", startup_s=0.0, refused_config=True)
            if server.served_root is None and server.served_model != config.model_name:  # the one model it serves
                display.note(f"  note: the config names {config.model_name!r}, the server serves only "
                             f"{server.served_model!r}, and does not say from which folder: evaluating that "
                             "(result.json server.served_model)")
        else:
            display.note(f"  server: {item.command.shell(redact=True)}")  # CI logs are shared
            server = LaunchedServer(item.command, run_dir / SERVER_LOG)
            server.start(config.startup_max_wait_seconds, on_wait=display.waiting)
            wanted = item.command.preferred_port
            moved = f" (server_args' --port {wanted} was in use)" if wanted is not None and server.port != wanted else ""
            display.note(f"  server ready on port {server.port} after {server.startup_s:.1f} s{moved}")
            if server.foreign_listener:
                display.note(f"  warning: port {server.port} is answered by a process outside the server's process "
                             "tree (a container's proxy?); if not, another job's server may be answering")
        record.timings["server_start_s"] = round(server.startup_s, 3)
        record.versions["engine"] = _engine_version(server, config)
        # vLLM logs some choices at the first request: its log is read once the evaluation is over.
        from_log = config.engine == "vllm" and isinstance(server, LaunchedServer)
        # One try now: a report a transient error keeps back is asked for again after the evaluation.
        report, where, report_error = (None, "", None) if from_log else _read_kernel_report(config, server, 1)
        display.eval_start()
        settings = eval_settings(config, server.base_url, server.served_model, run_dir, options.limit,
                                 api_key=server.api_key, model_aliases=model_aliases(server))
        record.evaluation = {"limit": settings.limit}
        outcome = run_eval(settings, on_progress=display.progress)
        # vLLM's log, read now; a report a transient error kept back, with retries.
        if from_log or (report_error is not None and server.poll() is None):
            report, where, report_error = _read_kernel_report(config, server)
        _judge(record, item, config, server, outcome, report, where, report_error)
    except ServerStartError as exc:
        # A --server-url server is the user's and running: it did not start here, it was not usable.
        record.reason = f"{'server not usable' if options.server_url else 'server did not start'}: {exc}"
        record.log_tail = exc.log_tail
        # quantgate serve exits 3 for what the config asks that cannot work here (the model
        # folder's contents, a backend that cannot serve a layer): fixing the config, not a retry.
        record.usage_error = exc.refused_config or (config.engine == "builtin" and exc.exit_status == SERVE_EXIT_USAGE)
        if record.usage_error:
            record.reason += " (the server refused the config: fix it; exit 3, not retried)"
        record.timings["server_start_s"] = round(exc.startup_s, 3)
    except (EvalSetupError, GateInputError, ArtifactsUnwritable) as exc:
        record.reason = str(exc)
        # A task that cannot be built or inputs that mismatch would fail the same way again; the
        # hub may answer the next time.
        record.usage_error = (isinstance(exc, (EvalSetupError, GateInputMismatch))
                              and not isinstance(exc, DatasetUnreachable))
    except RunInterrupted as exc:
        record.interrupted = exc.signal_name
        outcome = getattr(exc, "outcome", None) or outcome  # the answers received so far are kept
        torn_down = "the attached server was left running" if isinstance(server, AttachedServer) else \
            "the server was torn down"
        record.reason = f"interrupted by {exc.signal_name}: {torn_down}; no verdict"
        raise
    except Exception as exc:  # a bug here must not cost the other configs their runs, nor leak a server
        if isinstance(exc, OSError) and _run_file_error(exc, options.output_dir):  # a full disk, not a bug
            record.reason = str(ArtifactsUnwritable.of(exc.filename or run_dir, exc))
        else:
            record.reason = f"quantgate internal error: {type(exc).__name__}: {exc} (please report it, with the " \
                            "traceback above)"
            display.console.print_exception()
    finally:
        with guard.shield():
            _finish(record, item, server, outcome, run_dir, started, hurry=lambda: guard.signal_name is not None)
    return record


_UNWRITABLE = "artifacts cannot be written to"  # how ArtifactsUnwritable's message starts
_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _run_file_error(exc: OSError, output_dir: Path) -> bool:
    """Whether `exc` is the file system refusing a write of this run (not a bug to report): a full
    disk or quota anywhere, a permission or I/O error on a path under the output directory."""
    if exc.errno in _DISK_ERRORS:
        return True
    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EIO) or not exc.filename:
        return False
    with contextlib.suppress(OSError, ValueError):
        return Path(os.fsdecode(exc.filename)).resolve().is_relative_to(output_dir.resolve())
    return False


def _remove_stale_artifacts(run_dir: Path) -> None:
    """Remove what an earlier run of this config left in `run_dir`: beside this run's record (or
    in place of none, for a skipped config) it would speak for this run."""
    for stale in _STALE_ARTIFACTS:
        (run_dir / stale).unlink(missing_ok=True)


def _finish(record: RunRecord, item: PlannedConfig, server: Server | None, outcome: EvalOutcome | None,
            run_dir: Path, started: float, hurry: Callable[[], bool] | None = None) -> None:
    """Teardown and artifacts, whatever happened before. `hurry()`: whether an interrupt came
    meanwhile (held while this runs): a teardown it finds under way is cut to the interrupted grace,
    or a CI cancel's SIGKILL would come before this config's result.json is written."""
    if server is not None:
        server.stop(INTERRUPTED_GRACE_S if record.interrupted else TEARDOWN_GRACE_S, hurry=hurry)
        record.server = server.to_dict()
        if record.verdict == ERROR and not record.log_tail:
            record.log_tail = server.log_tail() or None
    if outcome is not None:
        _record_outcome(record, outcome, record.interrupted is not None)
    record.timings["total_s"] = round(time.monotonic() - started, 3)
    record.finished_at = now_iso()
    item.records[record.name] = record
    try:
        write_samples(run_dir, outcome.samples if outcome is not None else [])
        write_result(run_dir, record)
    except OSError as exc:  # e.g. a full disk: the verdict still reaches the console, junit and summary
        record.verdict = ERROR
        # result.json is the record that matters: samples.jsonl, written or not, gives up its space.
        with contextlib.suppress(OSError):
            (run_dir / SAMPLES_FILE).unlink(missing_ok=True)
        dropped = f"{SAMPLES_FILE} could not be kept (removed to leave room for {RESULT_FILE}); " if (
            outcome is not None and outcome.samples) else ""
        if record.reason.startswith(_UNWRITABLE):  # the run's own error already says so and how to fix it
            record.reason += f"; {dropped}{RESULT_FILE} could not be written either"
        else:
            record.reason = f"{_UNWRITABLE} {run_dir} ({exc}); {dropped}free space or pass another --output-dir and " \
                            f"run again; the run itself said: {record.reason}"
        with contextlib.suppress(OSError):
            write_result(run_dir, record)


def _record_outcome(record: RunRecord, outcome: EvalOutcome, interrupted: bool) -> None:
    record.metrics = outcome.metrics
    record.evaluation = {**(record.evaluation or {}), "requested": outcome.requested, "answered": outcome.answered,
                         "error": outcome.error, "complete": outcome.error is None and not interrupted,
                         # of the evaluated answers: those cut at max_tokens, and every finish_reason's count
                         "truncated": outcome.truncated, "finish_reasons": outcome.finish_reasons}
    record.task = {"file": str(outcome.task_file), "sha256": outcome.task_sha256}
    record.dataset = {"sha256": outcome.dataset_sha256}
    record.timings["eval_s"] = round(outcome.eval_s, 3)
    record.timings["server_busy_s"] = round(outcome.server_busy_s, 3)


def _judge(record: RunRecord, item: PlannedConfig, config: EvalConfig, server: Server, outcome: EvalOutcome,
           report: dict | None, where: str, report_error: str | None = None) -> None:
    """Verdict and reason, most fundamental problem first. `report_error`: why the server's kernel
    report could not be read (it has one, but a request for it failed)."""
    record.kernels = report
    if outcome.error is not None:
        answered = f"{outcome.answered} of {outcome.requested} questions answered (kept in samples.jsonl)"
        status = server.poll()
        if status is not None:
            record.reason = f"server exited with status {status} during evaluation; {answered}; {outcome.error}"
        else:
            record.reason = f"evaluation incomplete: {outcome.error}; {answered}; a failed request is never " \
                            "scored as a wrong answer"
            if outcome.config_error:  # the same server answers the same way again
                record.usage_error = True
                record.reason += "; exit 3, not retried"
            if any(marker in outcome.error for marker in _CONTEXT_TOO_SHORT):  # the same prompts fail again
                record.usage_error = True
                record.reason += ("; a prompt and max_tokens exceed the server's context: raise --max-model-len in "
                                  "server_args, or lower max_tokens or num_fewshot")
        return
    status = server.poll()
    if status is not None:  # what answered after that was not this server: another on its port?
        record.reason = f"server exited with status {status} during evaluation, though every request was " \
                        "answered: the answers cannot be trusted to be its own; see server.log"
        return
    if not outcome.metrics.get("n") or outcome.metrics.get("value") is None:
        record.reason = "no question was evaluated (empty test set or limit 0)"
        return
    implied = _implied_expectations(config, server)
    checked = bool(config.expect.linear_kernel or config.expect.moe_kernel or implied)
    if report_error is not None and checked:  # unknown is not "no report": no verdict, and a retry may read it
        wanted = ", ".join(f"{layer}={name}" for layer, name in {**implied, **_explicit(config)}.items())
        record.reason = (f"the kernel report could not be read: {report_error}; the kernel check ({wanted}) needs it, "
                         "so there is no verdict; run again once the server answers /v1/kernels")
        return
    check = expect_mod.verify(config.expect, report, where, implied,
                              "attached" if isinstance(server, AttachedServer) else config.engine) if checked else None
    baseline = _baseline_for(item)
    gate: GateOutcome = evaluate_gate(config, outcome.metrics, outcome.samples, baseline,
                                      dataset=outcome.dataset_sha256)
    record.gate = gate.to_dict()
    if baseline is not None and baseline.origin is not None:
        record.gate["baseline"] = {"name": baseline.name, **baseline.origin}
    record.expect = check.to_dict() if check is not None else None
    failed = []
    if not gate.passed:
        failed.append(f"gate {gate.mode} failed: {gate_line(gate)}")
    if check is not None and not check.passed:
        failed.append(f"kernel check failed: {check.message}")
    if failed:
        record.verdict, record.reason = FAIL, "; ".join(failed)
        if check is not None and not check.passed and gate.passed:
            record.reason += (" (accuracy passed, but the backend under test did not run)" if check.mismatches
                              else " (accuracy passed, but nothing proves which kernel ran)")
    else:
        record.verdict, record.reason = PASS, f"gate {gate.mode} passed: {gate_line(gate)}" + (
            f"; kernels as expected ({', '.join(_expected_text(check))})" if check else "") + "".join(
            f"; note: {note}" for note in (check.notes if check else []))
    if report_error is not None:  # nothing was checked against it; result.json's kernels stays empty
        record.reason += f"; note: the kernel report could not be read ({report_error})"
    if gate.passed and gate.numbers.get("can_fail") is False:  # a small --limit: read it where PASS is read
        record.reason += (f"; warning: on {gate.numbers.get('n', gate.numbers.get('n_common'))} question(s) this gate "
                          "could not fail, so this PASS says nothing about accuracy; evaluate more questions")
    cut = _truncation_note(outcome, config)
    if cut:
        record.reason += f"; note: {cut}"


TRUNCATED_NOTE_SHARE = 0.10  # above this share of answers cut at max_tokens, the verdict says so


def _truncation_note(outcome: EvalOutcome, config: EvalConfig) -> str | None:
    """What to say when many answers stopped at max_tokens (finish_reason "length"): they score
    wrong (no final answer to extract) for a reason that is not the model's accuracy."""
    given = sum(outcome.finish_reasons.values())
    if not outcome.truncated or not given or outcome.truncated / given <= TRUNCATED_NOTE_SHARE:
        return None
    return (f"{outcome.truncated} of {given} answers ({outcome.truncated / given:.0%}) stopped at max_tokens "
            f"({config.max_tokens}; finish_reason \"length\"), so they may lack a final answer and score wrong for a "
            "reason that is not accuracy; raise max_tokens in the config (lm-eval's max_gen_toks) if the answers "
            "need more")


def _explicit(config: EvalConfig) -> dict[str, str]:
    """The kernels `expect:` names, by layer."""
    return {layer: name for layer, name in (("linear", config.expect.linear_kernel),
                                            ("moe", config.expect.moe_kernel)) if name}


def _expected_text(check: expect_mod.ExpectCheck) -> list[str]:
    return [f"{layer}={name}" + (" from server_args" if layer in check.from_server_args else "")
            for layer, name in check.expected.items()]


def _implied_expectations(config: EvalConfig, server: Server) -> dict[str, str]:
    """The backends server_args ask for, by layer, that the server must prove it ran: an attached
    server (--server-url) was started by someone else, so the flags were never applied to it, and
    vLLM falls back to automatic selection for a layer type the backend has no kernel for. Not
    the built-in engine this run started: it refuses to start instead (strict selection)."""
    if not isinstance(server, AttachedServer) and config.engine == "builtin":
        return {}
    return expect_mod.implied_by_server_args(config.expect, config.backend_flags())


def _comparison(mode: str, numbers: dict[str, Any], metric: Any) -> str:
    """One metric's comparison, each side to as many places as tell them apart: "0.7339 vs
    0.7339" on a FAIL would contradict it."""
    if mode == "wilson":
        needed = numbers.get("measured_threshold")
        measured, needed_text = shown(numbers["measured"], needed) if needed is not None else \
            (f"{numbers['measured']:.4f}", None)
        lower, threshold = shown(numbers["wilson_lower_bound"], numbers["threshold"])
        return (f"{metric} {measured} (Wilson lower bound {lower}) vs threshold {threshold}; " + (
            f"measured accuracy needed {needed_text}" if needed_text is not None else "no accuracy passes at this n"))
    if mode == "recovery":
        ratio, minimum = shown(numbers["recovery_ratio"], numbers["recovery"])
        measured = shown(numbers["measured"], numbers["measured_threshold"])[0]
        return (f"{metric} ratio {ratio} ({measured} / baseline {numbers['baseline_measured']:.4f}) vs recovery "
                f"minimum {minimum}")
    if mode == "paired":
        p_value, alpha = shown(numbers["p_value_worse"], numbers["alpha"], kind="g")
        return (f"{metric} flips {numbers['flips_right_to_wrong']} right->wrong, {numbers['flips_wrong_to_right']} "
                f"wrong->right; one-sided p-value {p_value} vs alpha {alpha}")
    measured, threshold = shown(numbers["measured"], numbers["threshold"])
    return f"{metric} {measured} vs threshold {threshold}"


def gate_line(gate: GateOutcome) -> str:
    """What the gate actually compared, in one line (the whole arithmetic is in the explanation):
    a line naming a number the verdict did not rest on would contradict it. For a gen-1 file it
    names the listed metrics that failed (`failed_metrics`)."""
    numbers = gate.numbers
    failed = numbers.get("failed_metrics") or []
    others = [_comparison(gate.mode, other, other["metric"]) for other in numbers.get("other_metrics", [])
              if other["metric"] in failed]
    # The gated metric's comparison unless it passed and another listed metric failed.
    primary = [] if others and numbers.get("metric") not in failed else [_comparison(gate.mode, numbers, numbers.get("metric"))]
    line = "; ".join(primary + others)
    if numbers.get("invalid_rate_passed") is False:
        rate, most = shown(numbers["invalid_rate"], numbers["max_invalid_rate"])
        invalid = f"invalid_rate {rate} > max_invalid_rate {most}"
        return f"{invalid} (accuracy passed: {line})" if numbers.get("accuracy_passed") else f"{line}; {invalid}"
    return line


# ---------------------------------------------------------------------------- many configs


def exit_code(records: Sequence[RunRecord]) -> int:
    """SPEC section 4: an error the config causes (3: a retry cannot help) wins, then any other
    error (2, retryable), then any failed gate (1), else 0."""
    codes = {r.exit_code for r in records}
    return next((code for code in (EXIT_USAGE, EXIT_ERROR, EXIT_FAIL) if code in codes), EXIT_PASS)


def output_problems(options: RunOptions) -> list[str]:
    """Why the artifacts could not be written where the options say, checked before anything
    runs (a finished run must never be lost to a bad --markdown path)."""
    return artifact_path_problems([("--output-dir", options.output_dir, True), ("--junit", options.junit, False),
                                   ("--markdown", options.markdown, False)])


def _run_folder_problems(items: Sequence[PlannedConfig], options: RunOptions) -> list[str]:
    """A config whose run folder (`<output-dir>/<name>`) is the path of a file the run writes
    beside the folders would take its place: that file, or the run folder, could not be written."""
    run_files = {(options.junit or options.output_dir / "junit.xml").resolve(): "junit report (--junit)",
                 (options.markdown or options.output_dir / "summary.md").resolve(): "summary (--markdown)",
                 (options.output_dir / LOCK_FILE).resolve(): "lock file"}
    # Compared ignoring case too: on a case-insensitive file system (macOS, Windows) `JUNIT.XML` is junit.xml.
    by_folded = {str(path).casefold(): path for path in run_files}
    problems = []
    for item in items:
        try:  # the output directory exists (it is locked): a name it cannot hold says so now
            os.lstat(options.output_dir / item.config.name)
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                problems.append(str(ConfigError(
                    item.config.source, 0, "name", f"{item.config.name[:40]!r}... ({len(item.config.name.encode())} "
                    f"bytes) names its run folder under {options.output_dir}, which the file system cannot create "
                    f"({exc.strerror}): no run of it could write its results; give the config a shorter name")))
                continue
        run_dir = (options.output_dir / item.config.name).resolve()
        path = by_folded.get(str(run_dir).casefold())
        if path is not None:
            case = "" if path == run_dir else " (ignoring case, as macOS and Windows file systems do)"
            problems.append(str(ConfigError(
                item.config.source, 0, "name", f"{item.config.name!r} names its run folder {run_dir}, which is the "
                f"path of this run's {run_files[path]}{case}: one of the two could not be written; give the config "
                "another name")))
    return problems


def run_configs(paths: Sequence[str | Path], options: RunOptions, display: Display | None = None) -> int:
    display = display or Display()
    guard = InterruptGuard()
    records: list[RunRecord] = []
    skipped: list[Skipped] = []
    warnings: list[str] = []
    with guard.installed(), contextlib.ExitStack() as held:
        try:
            unwritable = output_problems(options)
            if unwritable:
                raise PlanError(unwritable)
            held.enter_context(output_dir_lock(options, clear_summaries=True))
            items = plan(paths, options, skipped, warnings)
            for skip in skipped:  # it gets no result.json (a <skipped> junit testcase): an earlier run's must go
                with contextlib.suppress(OSError):
                    _remove_stale_artifacts(options.output_dir / skip.name)
            clashes = _run_folder_problems(items, options)
            if clashes:
                raise PlanError(clashes)
            if skipped and not items:
                raise PlanError([f"every config was skipped, so nothing was evaluated: {s.name}: {s.reason}"
                                 for s in skipped])
        except PlanError as exc:
            return display.refused(exc)
        except RunInterrupted as exc:
            display.note(f"interrupted by {exc.signal_name} before any server started")
            return EXIT_ERROR
        except OutputDirUnwritable as exc:  # e.g. a full disk: may pass on the next try
            display.note(f"error: {exc}")
            return EXIT_ERROR
        finally:
            for warning in warnings:  # also when the plan fails: a typo'd key may be why
                display.note(f"warning: {warning}")
        for skip in skipped:
            display.note(f"  SKIPPED {skip.name}: {skip.reason} (--skip-unmet-requires)")
        try:
            for index, item in enumerate(items, start=1):
                display.config_start(index, len(items), item.config)
                try:
                    run_one(item, options, display, guard)
                finally:
                    if item.config.name in item.records:
                        records.append(item.records[item.config.name])
                        display.verdict(records[-1])
        except RunInterrupted as exc:
            with guard.shield():
                records += [_not_started(item, options, exc.signal_name) for item in items[len(records):]]
        unwritten = []
        try:
            with guard.shield():
                for writer, path in ((write_junit, options.junit or options.output_dir / "junit.xml"),
                                     (write_summary, options.markdown or options.output_dir / "summary.md")):
                    try:
                        writer(records, path, skipped=skipped)
                    except OSError as exc:
                        unwritten.append(f"{path} ({exc})")
        except RunInterrupted:  # held until both were written: the run ends below as an interrupted one
            pass
    display.summary(records)
    display.note(f"artifacts: {options.output_dir}/<config>/, {options.junit or options.output_dir / 'junit.xml'}, "
                 f"{options.markdown or options.output_dir / 'summary.md'}")
    for problem in unwritten:
        display.note(f"error: could not write {problem}; free space or pass another path and run again")
    if guard.signal_name is not None:
        display.note(f"interrupted by {guard.signal_name}: " + ("an attached server (--server-url) is left running"
                                                              if options.server_url else "every server was torn down"))
    code = exit_code(records)
    # CI reads the artifacts; and a run asked to stop never says "passed" (0) or "a gate failed" (1),
    # even when the signal came after the last verdict.
    interrupted = guard.signal_name is not None
    return EXIT_ERROR if (unwritten or interrupted) and code in (EXIT_PASS, EXIT_FAIL) else code


_TRANSIENT_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


@contextlib.contextmanager
def output_dir_lock(options: RunOptions, clear_summaries: bool = False) -> Iterator[None]:
    """One run at a time per output directory (two CI jobs on one agent): the other's junit.xml,
    summary.md, server logs and cached baselines would be overwritten under it. `clear_summaries`
    (a run, which writes them): held, the directory's run-wide summaries of an earlier run are
    removed, so a run that stops at its plan (exit 3) leaves none that speak for it."""
    import fcntl

    try:
        options.output_dir.mkdir(parents=True, exist_ok=True)
        # Unbuffered: a "pid N" that a full disk refused must not stay in a buffer that closing
        # the file writes again (an OSError out of `with lock:`, a traceback and exit 1).
        lock = open(options.output_dir / LOCK_FILE, "a+b", buffering=0)
    except OSError as exc:
        if exc.errno in _TRANSIENT_WRITE_ERRORS:  # may pass on the next try: retryable
            raise OutputDirUnwritable(f"--output-dir {options.output_dir}: {exc.strerror or exc}; free space or pass "
                                      "another --output-dir") from None
        # The path itself (missing parent on a read-only or virtual file system, no permission): a
        # retry fails the same way.
        raise PlanError([f"--output-dir {options.output_dir}: cannot be created or written ({exc.strerror or exc}); "
                         "pass a directory this user can create and write"]) from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().decode(errors="replace").strip() or "another process"
            raise PlanError([f"--output-dir {options.output_dir}: another quantgate run ({holder}) is writing to it; "
                             "pass another --output-dir, or wait for that run to end"]) from None
        except OSError as exc:  # a file system without locks (some network ones): run unlocked
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL):
                raise OutputDirUnwritable(f"--output-dir {options.output_dir}: cannot lock it ({exc})") from None
        with contextlib.suppress(OSError):
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()}\n".encode())
        for stale in (options.junit or options.output_dir / "junit.xml",
                      options.markdown or options.output_dir / "summary.md") if clear_summaries else ():
            if stale.is_file():
                with contextlib.suppress(OSError):
                    stale.unlink()
        yield


def _planned_evaluation(config: EvalConfig, options: RunOptions) -> dict[str, Any]:
    """What a run would evaluate, recorded before it does (`repro` reads it from a run that never got there)."""
    return {"limit": options.limit if options.limit is not None else config.num_questions}


def _not_started(item: PlannedConfig, options: RunOptions, signal_name: str) -> RunRecord:
    run_dir = options.output_dir / item.config.name
    record = RunRecord(name=item.config.name, verdict=ERROR, reason=f"not started: the run was interrupted by "
                       f"{signal_name}", config=_config_summary(item.config, item.model, run_dir),
                       versions=harness_versions(), interrupted=signal_name, started_at=now_iso(),
                       finished_at=now_iso(), timings={"total_s": 0.0}, evaluation=_planned_evaluation(item.config, options))
    with contextlib.suppress(OSError):  # an earlier run's samples and logs are not this record's
        _remove_stale_artifacts(run_dir)
    with contextlib.suppress(OSError):  # junit.xml and summary.md still carry it
        write_result(run_dir, record)
    return record

