"""`quantgate repro CONFIG [--run]`: the exact server and eval commands of a config, for a
developer reproducing a CI result by hand, outside quantgate's runner.

The eval command is lm-eval's own CLI with the same model arguments and the same task file
`quantgate run` uses (written next to the printed commands). `--run` executes exactly what is
printed: the server in its own process group, then `lm_eval`, then teardown.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..backends import ENGINES
from ..config import LIST_SUFFIX, EvalConfig
from ..evaluate import lm_eval_command, sha256_file, write_task_yaml
from ..results import EXIT_ERROR, EXIT_PASS, EXIT_USAGE, RESULT_FILE, SAMPLES_FILE, SERVER_LOG, load_result
from ..expect import implied_by_server_args
from ..pipeline import baseline_config
from ..runner import (DEFAULT_OUTPUT_DIR, OutputDirUnwritable, PlanError, PlannedConfig, RunOptions, eval_settings,
                      local_gpus, output_dir_lock, plan, unmet_requirements)
from ..server import LaunchedServer, ServerStartError, http_url, quantgate_executable, redact_env
from .arg_types import positive_int

DEFAULT_PORT = 8000
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="an eval config file, or a run's result.json or run folder (reproduces "
                        "that run's config with the engine and question count the run used)")
    parser.add_argument("--run", action="store_true", help="run the printed commands (server, lm_eval, teardown)")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="override the config's `engine:` (or the run's)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="evaluate only the first N questions (default: the run's, for a result.json)")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR / "repro",
                        help="where the task file, lm-eval's output and the server log go (default results/repro)")


def main(args: argparse.Namespace) -> int:
    found = _config_of_run(Path(args.config))
    if found is None:
        return EXIT_USAGE
    config_path, ran = found
    if config_path.is_dir() or config_path.suffix == LIST_SUFFIX:
        print(f"error: repro takes one config file (or a run's result.json or run folder); {config_path} is a "
              f"{'folder' if config_path.is_dir() else 'list file'}: repro its configs one at a time",
              file=sys.stderr)
        return EXIT_USAGE
    # What the run was given on its command line (the result records them), unless given here.
    engine = args.engine or ran.get("engine")
    limit = args.limit if args.limit is not None else ran.get("limit")
    overridden = []  # the header above said how that run ran: say what replaces it
    if args.engine and ran.get("engine") not in (None, args.engine):
        overridden.append(f"--engine {args.engine} (that run: {ran['engine']})")
    if args.limit is not None and ran.get("limit") not in (None, args.limit):
        overridden.append(f"--limit {args.limit} (that run: {ran['limit']} questions)")
    if overridden:
        print(f"# given here instead: {', '.join(overridden)}")
    # Printed commands are often for another machine (the GPU box of a failing nightly config):
    # only --run needs this one to have the config's GPUs and executables.
    options = RunOptions(output_dir=args.output_dir, engine=engine, limit=limit, check_machine=args.run)
    try:
        *baselines, item = plan([config_path], options)  # its gate's baseline, if any, comes first
    except PlanError as exc:
        for message in exc.messages:
            print(f"error: {message}", file=sys.stderr)
        return EXIT_USAGE
    assert item.command is not None
    if args.limit is None and _own_limit(limit, [item, *baselines], engine):
        limit = None  # the run was given no --limit (or one changing nothing): repro gives none either
        options = dataclasses.replace(options, limit=None)
    port = item.command.preferred_port or DEFAULT_PORT
    item.command = dataclasses.replace(item.command, preferred_port=port)  # --run uses it when it is free
    run_dir = (args.output_dir / item.config.name).resolve()
    settings = eval_settings(item.config, http_url(item.command.host, port), item.command.served_model,
                             run_dir, limit)
    task_file = write_task_yaml(settings)
    eval_cmd = lm_eval_command(settings, task_file, run_dir / "lm_eval")
    unmet = None if args.run else unmet_requirements(item.config, local_gpus())
    if unmet:
        print(f"# note: this machine does not meet the config's requires: ({unmet}); run these where it does")
    baseline = next((b for b in baselines if b.config.name == item.baseline_name), None)
    print(_script(item, port, eval_cmd, task_file, options, baseline))
    if not args.run:
        return EXIT_PASS
    try:
        with output_dir_lock(options):
            return _run(item, run_dir, eval_cmd)
    except (PlanError, OutputDirUnwritable) as exc:
        for message in getattr(exc, "messages", [str(exc)]):
            print(f"error: {message}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, PlanError) else EXIT_ERROR


def _config_of_run(given: Path) -> tuple[Path, dict[str, Any]] | None:
    """`given`, or, for a run's result.json (or its run folder), the config that run evaluated
    and the engine and question limit it ran with; None (after saying why) when that config is
    not here."""
    result = given / RESULT_FILE if given.is_dir() else given
    if given.is_dir() and not result.is_file() and any((given / name).exists() for name in (SERVER_LOG, SAMPLES_FILE)):
        print(f"error: {given} is a run folder without its result.json (a skipped or not-started config's): nothing "
              "says which config it ran; repro the config file", file=sys.stderr)
        return None
    if given.suffix in (".yaml", ".yml", LIST_SUFFIX) or not result.is_file():
        return given, {}
    try:
        data = load_result(result)
    except (OSError, ValueError):
        return given, {}  # not a result: the config loader names what is wrong with it
    config = data.get("config") or {}
    path = Path(str(config.get("path") or ""))
    ran = {"engine": config.get("engine"), "limit": (data.get("evaluation") or {}).get("limit")}
    if not path.is_file():
        print(f"error: {result} is the result of a run ({data.get('verdict')}) of {path}, which is not on this "
              "machine: run `quantgate repro` on that file in your checkout"
              + (f" with --engine {ran['engine']}" if ran["engine"] else "")
              + (f" --limit {ran['limit']}" if ran["limit"] is not None else ""), file=sys.stderr)
        return None
    changed = "" if config.get("sha256") == sha256_file(path) else \
        " (the file has changed since that run: its sha256 differs)"
    how = [f"engine {ran['engine']}"] if ran["engine"] else []
    how += [f"{ran['limit']} questions"] if ran["limit"] is not None else []
    print(f"# reproducing {path}, the config of the run in {result.parent}{changed}"
          + (f", as that run ran it: {', '.join(how)}" if how else ""))
    return path, {k: v for k, v in ran.items() if v is not None}


def _own_limit(limit: int | None, planned: list[PlannedConfig], engine: str | None) -> bool:
    """Whether a run's recorded question limit is what the configs repro plans evaluate without
    --limit: result.json records a config's num_questions as the limit of a run given none, so
    `--limit N` would only repeat it. Every config counts, a gate's baseline config too (--limit
    applies to it, and decides whether its cached result is reused); a baseline results file
    does not. Only an equal count is left out: another is what the run was given."""
    if limit is None:
        return False
    configs = [item.config for item in planned]
    configs += [baseline_config(item.config, engine) for item in planned if item.baseline_cached is not None]
    return all(config.num_questions == limit for config in configs if config is not None)


def _eval_env(config: EvalConfig, api_key: str | None) -> dict[str, str]:
    """With local data nothing may reach for the hub; without, the task downloads its dataset.
    lm-eval's local-completions send OPENAI_API_KEY as the bearer token."""
    return {**(OFFLINE_ENV if config.dataset is not None else {}), **({"OPENAI_API_KEY": api_key} if api_key else {})}


def _script(item: PlannedConfig, port: int, eval_cmd: list[str], task_file: Path, options: RunOptions,
            baseline: PlannedConfig | None) -> str:
    config, command = item.config, item.command
    assert command is not None
    url = http_url(command.host, port)
    # Printed commands get pasted into issues and chats: secrets stay in the config file.
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(_eval_env(config, command.api_key)).items())
    server = command.shell(port, redact=True)
    secrets = [] if server == command.shell(port) and not command.api_key else [
        "# secrets are shown as <redacted>: put the real values there (the config's, or your "
        "environment's for a key it does not set), or run this with --run"]
    return "\n".join([
        f"# quantgate repro: {config.name} ({config.source}), engine {config.engine}",
        *secrets,
        "# 1. start the server:",
        server,
        "# 2. wait until it is healthy:",
        f"curl -sf --retry 600 --retry-connrefused --retry-delay 1 {url}/health",
        f"# 3. evaluate with lm-eval (the task file {task_file} is the installed {config.task} task",
        "#    with the config's local dataset; offline):" if config.dataset else "#    as installed):",
        f"{env} {shlex.join(eval_cmd)}".strip(),
        *_through_quantgate(config, url, options, baseline),
    ])


def _through_quantgate(config: EvalConfig, url: str, options: RunOptions,
                       baseline: PlannedConfig | None) -> list[str]:
    # The same evaluation: without them, quantgate would evaluate every question, or start the
    # config's own engine.
    def quantgate_run(source: Path) -> list[str]:
        return [*quantgate_executable(), "run", str(source), *(["--engine", options.engine] if options.engine else []),
                *(["--limit", str(options.limit)] if options.limit is not None else []),
                *(["--output-dir", str(options.output_dir.resolve())] if baseline is not None else [])]

    run = shlex.join(quantgate_run(config.source))
    if baseline is not None:
        # A cached baseline is reused only by a run whose server is of the same kind (launched or
        # attached), so both are launched: quantgate starts each server.
        return [f"# the {config.gate.mode} gate compares with {baseline.config.name}'s answers: stop the server of "
                "step 1 (its GPU memory and port), then measure the baseline first (quantgate starts its server), "
                "into the output directory the run below reads:",
                shlex.join(quantgate_run(baseline.config.source)),
                "# then the same evaluation, gate and kernel check through quantgate, quantgate starting this "
                "config's server too (a baseline measured on a launched server is not reused by a run against "
                "--server-url):",
                run]
    if _log_proof(config):
        return ["# or through quantgate; but against that running vLLM server the kernel check (expect:, or the",
                "# backends server_args name) cannot be",
                "# made (vLLM has no /v1/kernels, and quantgate reads the kernel choices only from the log of a",
                "# server it starts itself). The same evaluation, gate and kernel check, quantgate starting the server:",
                run]
    return ["# or the same evaluation, gate and kernel check through quantgate, against that server:",
            f"{run} --server-url {url}"]


def _run(item: PlannedConfig, run_dir: Path, eval_cmd: list[str]) -> int:
    assert item.command is not None
    server = LaunchedServer(item.command, run_dir / SERVER_LOG)
    try:
        server.start(item.config.startup_max_wait_seconds)
        # The port the server got: the printed one, unless it was in use.
        eval_cmd = [a.replace(f":{item.command.preferred_port}/", f":{server.port}/") for a in eval_cmd]
        print(f"# server ready on port {server.port}; log: {server.log_path}", flush=True)
        status = subprocess.run(eval_cmd, env={**os.environ, **_eval_env(item.config, item.command.api_key)}).returncode
    except ServerStartError as exc:
        print(f"error: server did not start: {exc}\n{exc.log_tail}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        server.stop()
    return EXIT_PASS if status == 0 else EXIT_ERROR


def _log_proof(config: EvalConfig) -> bool:
    """Its kernel check (`expect:`, or server_args' backends) reads the log of a vLLM server
    quantgate started: an attached one has no log here."""
    return config.engine == "vllm" and bool(config.expect.linear_kernel or config.expect.moe_kernel
                                            or implied_by_server_args(config.expect, config.backend_flags()))
