"""Shared set-up for the runner's tests: GSM8K-format data, configs that launch the fake
server (tests/harness/fake_server.py) as a real process through `vllm_command:`, and a way
to run `quantgate` itself as a process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantgate.harness import server as server_mod
from quantgate.harness.server import LaunchedServer, ServerCommand

FAKE_SERVER = Path(__file__).with_name("fake_server.py")
REPO = Path(__file__).resolve().parents[2]
N_TEST, N_TRAIN = 40, 8


def _problem(rng: random.Random, tag: str) -> dict[str, str]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    return {"question": f"A shop sells {a} pens on Monday and {b} on Tuesday. How many pens in all? [{tag}]",
            "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}


@pytest.fixture
def gsm8k_dir(tmp_path: Path, seed: int) -> Path:
    """train.jsonl / test.jsonl in GSM8K's format, fresh per test."""
    rng = random.Random(seed)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        rows = [_problem(rng, f"{split}-{i}") for i in range(n)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def fake_args(data: Path, **flags: Any) -> list[str]:
    """server_args for the fake server: its data file plus behaviour flags (`die_after=3`...)."""
    args = ["--dataset", str(data / "test.jsonl")]
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def launch(command: ServerCommand, log_path: Path, startup_timeout_s: float) -> LaunchedServer:
    """A started, healthy server, as the runner starts one (`LaunchedServer.start`)."""
    server = LaunchedServer(command, log_path)
    server.start(startup_timeout_s)
    return server


@contextlib.contextmanager
def listener_on(port: int, data: Path, monkeypatch: pytest.MonkeyPatch, *, other_run: bool = False) -> Iterator[None]:
    """A fake server already listening on `port` when the server under test starts: another quantgate
    run's (it carries that run's RUNNER_ENV) or a listener outside any run (a container's proxy).
    The port reads as free, as it did when it was chosen, and the wait on a foreign listener is short."""
    env = {k: v for k, v in os.environ.items() if k != server_mod.RUNNER_ENV}
    if other_run:
        env[server_mod.RUNNER_ENV] = "1"
    listener = subprocess.Popen([sys.executable, str(FAKE_SERVER), "fake-model", *fake_args(data), "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not server_mod.listening_sockets(listener.pid, port) and time.monotonic() < deadline:
            time.sleep(0.1)
        monkeypatch.setattr(server_mod, "port_is_free", lambda p, host="127.0.0.1": True)
        monkeypatch.setattr(server_mod, "FOREIGN_LISTENER_WAIT_S", 0.5)
        yield
    finally:
        listener.kill()
        listener.wait()


def write_config(directory: Path, name: str, data: Path, server_flags: dict[str, Any] | None = None,
                 **fields: Any) -> Path:
    """An eval config (engine vllm, `vllm_command:` the fake server) with small defaults."""
    config: dict[str, Any] = {
        "name": name,
        "model_name": "fake-model",
        "engine": "vllm",
        "vllm_command": [sys.executable, str(FAKE_SERVER)],
        "server_args": fake_args(data, **(server_flags or {})),
        "dataset": {"train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")},
        "num_fewshot": 2,
        "num_questions": 12,
        "accuracy_threshold": 0.5,
        "startup_max_wait_seconds": 60,
        "request_timeout_seconds": 20,
        "max_concurrency": 4,
    }
    config.update(fields)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@dataclass
class CliRun:
    returncode: int
    output: str
    wall_s: float


def run_cli(*args: str | Path, timeout: float = 120, cwd: Path | None = None) -> CliRun:
    """`quantgate ARGS` as a separate process (the interpreter running the tests)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "quantgate.harness.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    return CliRun(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)


def run_in_process(paths: list[Path], out: Path, terminal: bool = False, **options: Any) -> tuple[int, str]:
    """`quantgate run` through `run_configs` in this process (servers are still processes);
    `terminal` draws the live progress display a person at a terminal gets."""
    from rich.console import Console

    from quantgate.harness.runner import Display, RunOptions, run_configs

    sink = io.StringIO()
    code = run_configs([str(p) for p in paths], RunOptions(output_dir=out, **options),
                       Display(Console(file=sink, width=200, force_terminal=terminal)))
    return code, sink.getvalue()


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def expected_accuracy(data: Path, accuracy: float, limit: int) -> float:
    """What the fake server scores on the first `limit` test questions (its choice is a hash)."""
    from tests.harness.fake_server import _share

    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()][:limit]
    return sum(_share(r["question"].strip()) < accuracy for r in rows) / len(rows)
