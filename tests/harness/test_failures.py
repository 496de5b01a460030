"""Every failure a run can meet, each against a real server process (and, for start-up and
signals, a real `quantgate run` process): the verdict, the exit code, how fast it comes, what
result.json keeps, and that no process is left behind."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantgate.harness.server import group_members
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import load_json, pid_alive, run_cli, run_in_process, write_config

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture


def _samples(run_dir: Path) -> list[str]:
    return (run_dir / "samples.jsonl").read_text().splitlines()


def test_server_exiting_during_startup_is_an_error_within_seconds(tmp_path: Path,
                                                                  gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "crash", gsm8k_dir, {"exit_during_startup": 1.0}, startup_max_wait_seconds=600)
    run = run_cli("run", config, "--output-dir", tmp_path / "out")
    result = load_json(tmp_path / "out" / "crash" / "result.json")
    assert run.returncode == 2, run.output
    assert result["verdict"] == "ERROR" and "exited with status 1 during start-up" in result["reason"]
    assert result["timings"]["server_start_s"] < 1.0 + 3.0  # noticed within 3 s of the exit, not at 600 s
    assert run.wall_s < 30
    assert "failed to load the model" in result["log_tail"] and "failed to load the model" in run.output


def test_server_dying_mid_evaluation_keeps_the_samples_so_far(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "dies", gsm8k_dir, {"die_after": 4}, max_concurrency=1)
    code, output = run_in_process([config], tmp_path / "out")
    run_dir = tmp_path / "out" / "dies"
    result = load_json(run_dir / "result.json")
    assert code == 2, output
    assert result["verdict"] == "ERROR" and "exited with status 3 during evaluation" in result["reason"]
    assert result["evaluation"] == {"limit": 12, "requested": 12, "answered": 4,
                                    "error": result["evaluation"]["error"], "complete": False,
                                    "truncated": 0, "finish_reasons": {"stop": 4}}
    assert len(_samples(run_dir)) == 4
    assert "dying mid-evaluation" in result["log_tail"]


def test_a_server_that_exits_after_answering_everything_is_an_error_not_a_verdict(tmp_path: Path,
                                                                                   gsm8k_dir: Path) -> None:
    """Every request was answered, yet the server was gone by the time the evaluation ended: the
    answers cannot be trusted to be its own (another process on its port?). Guards against
    judging such a run PASS/FAIL on its complete-looking scores."""
    config = write_config(tmp_path, "exits", gsm8k_dir, {"exit_after_answers": 4}, max_concurrency=1,
                          num_questions=4)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "exits" / "result.json")
    assert code == 2 and result["verdict"] == "ERROR", output
    assert "server exited with status 4 during evaluation, though every request was answered" in result["reason"]
    assert result["evaluation"]["answered"] == result["evaluation"]["requested"] == 4
    assert result["evaluation"]["complete"] is True  # lm-eval finished: only the server's exit makes it an ERROR


def test_hanging_server_errors_within_the_request_timeout(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "hangs", gsm8k_dir, {"hang_after": 3}, request_timeout_seconds=2)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "hangs" / "result.json")
    assert code == 2, output
    assert result["verdict"] == "ERROR" and "timed out" in result["reason"]
    assert result["timings"]["eval_s"] < 2 + 3
    assert not pid_alive(result["server"]["pid"])


def test_request_errors_are_an_error_never_wrong_answers(tmp_path: Path, gsm8k_dir: Path) -> None:
    # A gate that would fail on 5/12 right: the run must still be ERROR, not FAIL.
    config = write_config(tmp_path, "errs", gsm8k_dir, {"error_after": 5}, max_concurrency=1,
                          accuracy_threshold=0.9, tolerance=0.0)
    code, output = run_in_process([config], tmp_path / "out")
    run_dir = tmp_path / "out" / "errs"
    result = load_json(run_dir / "result.json")
    assert code == 2, output
    assert result["verdict"] == "ERROR" and result["gate"]["passed"] is None
    assert "never scored as a wrong answer" in result["reason"] and "500" in result["reason"]
    assert len(_samples(run_dir)) == 5


def test_port_in_use_moves_to_another_port(tmp_path: Path, gsm8k_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        config = write_config(tmp_path, "port", gsm8k_dir, {"port": taken})
        code, output = run_in_process([config], tmp_path / "out")
    server = load_json(tmp_path / "out" / "port" / "result.json")["server"]
    assert code == 0, output
    assert server["port"] != taken and server["ports_tried"][0] == taken
    assert f"(server_args' --port {taken} was in use)" in output  # said where the run is watched


def test_a_fixed_port_answered_by_a_proxy_is_evaluated_with_a_warning_where_the_run_is_watched(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener outside the server's process tree that stays up (a container's proxy) is taken
    as the server's: the console says so, not only server.log and result.json."""
    from quantgate.harness import server as server_mod

    port = server_mod.free_port("127.0.0.1")
    with runner_fixtures.listener_on(port, gsm8k_dir, monkeypatch):
        config = write_config(tmp_path, "proxied", gsm8k_dir, {"port": port, "startup_delay": 30}, num_questions=4)
        code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "proxied" / "result.json")
    assert code == 0 and result["server"]["foreign_listener"] is True and result["server"]["port"] == port, output
    assert (f"warning: port {port} is answered by a process outside the server's process tree (a container's "
            "proxy?)") in output


def _start_run(tmp_path: Path, *configs: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "quantgate.harness.cli", "run", *map(str, configs),
                             "--output-dir", str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"quantgate run exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.parametrize(("sig", "phase"), [(signal.SIGINT, "evaluation"), (signal.SIGTERM, "start-up")])
def test_signals_tear_down_servers_and_write_an_interrupted_result(tmp_path: Path, gsm8k_dir: Path,
                                                                   sig: signal.Signals, phase: str) -> None:
    flags = {"spawn_child": True, "latency": 0.3} if phase == "evaluation" else {"spawn_child": True,
                                                                                 "startup_delay": 60}
    first = write_config(tmp_path, "first", gsm8k_dir, flags, max_concurrency=1, num_questions=40)
    second = write_config(tmp_path, "second", gsm8k_dir)
    proc = _start_run(tmp_path, first, second)
    log = tmp_path / "out" / "first" / "server.log"
    _wait_for(log, "POST /v1/completions" if phase == "evaluation" else "fake server: starting", proc)
    pid = int(log.read_text().split("# quantgate: pid ")[1].split()[0])
    assert len(group_members(pid)) >= 2  # the server and its child
    if phase == "evaluation":
        time.sleep(1.0)  # a few answers (0.3 s each) arrive first
    sent = time.monotonic()
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert time.monotonic() - sent < 15
    assert group_members(pid) == [] and not pid_alive(pid)
    result = load_json(tmp_path / "out" / "first" / "result.json")
    assert result["verdict"] == "ERROR" and result["interrupted"] == sig.name
    assert f"interrupted by {sig.name}" in result["reason"] and result["server"]["exit_status"] is not None
    if phase == "evaluation":  # the answers received before the signal are kept, not scored as a run
        answered = _samples(tmp_path / "out" / "first")
        assert len(answered) >= 1 and result["evaluation"]["answered"] == len(answered)
        assert result["evaluation"]["complete"] is False
    later = load_json(tmp_path / "out" / "second" / "result.json")
    assert later["verdict"] == "ERROR" and later["reason"].startswith("not started")
    assert (tmp_path / "out" / "junit.xml").is_file()
    assert not re.search(r"^Traceback", output, re.MULTILINE), output  # (the server log's tail is indented)
    assert os.path.exists(tmp_path / "out" / "summary.md")


def test_an_interrupt_during_start_up_kills_a_server_ignoring_sigterm_within_the_interrupted_grace(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    """A CI cancel SIGKILLs the runner some seconds after its SIGTERM (Buildkite: 9 s): a server
    that ignores SIGTERM while it loads must be SIGKILLed before that, and result.json written."""
    from quantgate.harness.server import INTERRUPTED_GRACE_S, TEARDOWN_GRACE_S

    config = write_config(tmp_path, "stubborn", gsm8k_dir, {"ignore_sigterm": True, "startup_delay": 60})
    proc = _start_run(tmp_path, config)
    log = tmp_path / "out" / "stubborn" / "server.log"
    _wait_for(log, "fake server: ignoring SIGTERM", proc)
    pid = int(log.read_text().split("# quantgate: pid ")[1].split()[0])
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    while pid_alive(pid) and time.monotonic() - sent < 30:
        time.sleep(0.05)
    killed_after = time.monotonic() - sent
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert killed_after < min(INTERRUPTED_GRACE_S + 3, TEARDOWN_GRACE_S), \
        f"the server outlived the runner's SIGTERM by {killed_after:.1f} s"
    assert group_members(pid) == [] and not pid_alive(pid)
    result = load_json(tmp_path / "out" / "stubborn" / "result.json")
    assert result["interrupted"] == "SIGTERM" and result["server"]["exit_status"] == -signal.SIGKILL


@pytest.mark.parametrize("accuracy, verdict", [(1.0, "PASS"), (0.0, "FAIL")])
def test_a_signal_while_the_run_files_are_written_ends_as_an_interrupted_run_not_a_traceback(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        accuracy: float, verdict: str) -> None:
    """The signal is held until junit.xml and summary.md are written, then ends the run as any
    interrupt does (exit 2, the summary printed): not as an uncaught RunInterrupted (exit 1,
    which says a gate failed). A run whose every verdict is FAIL exits 2 too, never 1: a run
    asked to stop does not say "a gate failed"."""
    from quantgate.harness import cli, runner

    real_write_junit = runner.write_junit

    def cancelled_meanwhile(*args, **kwargs) -> Path:
        os.kill(os.getpid(), signal.SIGTERM)
        return real_write_junit(*args, **kwargs)

    monkeypatch.setattr(runner, "write_junit", cancelled_meanwhile)
    config = write_config(tmp_path, "done", gsm8k_dir, {"accuracy": accuracy}, num_questions=4,
                          accuracy_threshold=0.9, tolerance=0.0)
    try:
        code = cli.main(["run", str(config), "--output-dir", str(tmp_path / "out")])
    except KeyboardInterrupt as exc:  # left to the interpreter: a traceback and exit 1
        pytest.fail(f"quantgate run let {exc!r} out")
    output = capsys.readouterr().err
    assert code == 2, output
    assert load_json(tmp_path / "out" / "done" / "result.json")["verdict"] == verdict
    assert (tmp_path / "out" / "junit.xml").is_file() and (tmp_path / "out" / "summary.md").is_file()
    assert "quantgate summary" in output and "interrupted by SIGTERM" in output


def test_a_config_an_interrupt_kept_from_starting_keeps_no_artifact_of_an_earlier_run(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness import runner

    def interrupted(*args, **kwargs) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises RunInterrupted here

    monkeypatch.setattr(runner, "run_eval", interrupted)
    first, second = (write_config(tmp_path, name, gsm8k_dir, num_questions=4) for name in ("first", "second"))
    earlier = tmp_path / "out" / "second"
    earlier.mkdir(parents=True)
    for name in ("samples.jsonl", "server.log", "lm_eval.log"):
        (earlier / name).write_text("an earlier run's\n")
    code, output = run_in_process([first, second], tmp_path / "out")
    assert code == 2 and "interrupted by SIGTERM: every server was torn down" in output, output
    not_started = load_json(earlier / "result.json")
    assert not_started["reason"].startswith("not started")
    assert not_started["evaluation"] == {"limit": 4}  # what `repro` of it reproduces
    assert sorted(p.name for p in earlier.iterdir()) == ["result.json"]


def test_an_interrupt_while_the_configs_are_planned_exits_2_before_any_server_starts(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retryable as any interrupted run: not exit 3, which says to fix the config."""
    from quantgate.harness import runner

    real_plan = runner.plan

    def interrupted_plan(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(runner, "plan", interrupted_plan)
    config = write_config(tmp_path, "cfg", gsm8k_dir)
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 2 and "interrupted by SIGTERM before any server started" in output, output
    assert not (tmp_path / "out" / "cfg").exists()


def test_a_full_disk_is_an_error_that_loses_no_verdict_and_stops_no_other_config(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness import runner

    real_write_samples = runner.write_samples

    def samples_fill_the_disk(run_dir: Path, samples: list) -> Path:
        if run_dir.name == "first":
            raise OSError(28, "No space left on device")
        return real_write_samples(run_dir, samples)

    def junit_fills_the_disk(*args, **kwargs) -> Path:
        raise OSError(28, "No space left on device")

    real_mkdir = Path.mkdir

    def no_room_for_third(path: Path, *args, **kwargs) -> None:
        if path.name == "third":
            raise OSError(28, "No space left on device")
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(runner, "write_samples", samples_fill_the_disk)
    monkeypatch.setattr(runner, "write_junit", junit_fills_the_disk)
    configs = [write_config(tmp_path, name, gsm8k_dir, num_questions=4) for name in ("first", "third", "second")]
    monkeypatch.setattr(Path, "mkdir", no_room_for_third)
    code, output = run_in_process(configs, tmp_path / "out")
    first = load_json(tmp_path / "out" / "first" / "result.json")  # written once the samples were dropped
    assert code == 2, output
    assert first["verdict"] == "ERROR" and "No space left on device" in first["reason"]
    assert "gate absolute passed" in first["reason"]  # what the run measured is not lost
    assert load_json(tmp_path / "out" / "second" / "result.json")["verdict"] == "PASS"
    assert "ERROR third" in output and "artifacts cannot be written to" in output
    third = next(line for line in output.splitlines() if "ERROR third" in line)  # its own error, said once
    assert third.count("artifacts cannot be written to") == 1 and "result.json could not be written either" in third
    assert (tmp_path / "out" / "summary.md").is_file()
    assert f"could not write {tmp_path / 'out' / 'junit.xml'}" in output.replace("\n", "")
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_result_json_is_kept_when_the_samples_took_the_last_space(tmp_path: Path, gsm8k_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """samples.jsonl fit, result.json then did not: the retry of result.json freed nothing, and
    the run's record was lost. Modelled: result.json fits only while samples.jsonl is absent."""
    from quantgate.harness import runner

    real_write_result = runner.write_result

    def no_room_beside_the_samples(run_dir: Path, record) -> Path:
        if (run_dir / "samples.jsonl").is_file() and (run_dir / "samples.jsonl").stat().st_size:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_result(run_dir, record)

    monkeypatch.setattr(runner, "write_result", no_room_beside_the_samples)
    config = write_config(tmp_path, "tight", gsm8k_dir, num_questions=4)
    code, output = run_in_process([config], tmp_path / "out")
    run_dir = tmp_path / "out" / "tight"
    result = load_json(run_dir / "result.json")
    assert code == 2 and result["verdict"] == "ERROR", output
    assert "samples.jsonl could not be kept (removed to leave room for result.json)" in result["reason"]
    assert "gate absolute passed" in result["reason"]  # what the run measured is not lost
    assert result["metrics"]["n"] == 4 and not (run_dir / "samples.jsonl").exists()


@pytest.mark.parametrize("failing, error, says", [
    ("task yaml", errno.ENOSPC, "No space left on device"),
    ("lm_eval.log", errno.ENOSPC, "No space left on device"),
    ("server.log", errno.EPERM, "Operation not permitted"),
])
def test_a_run_file_that_cannot_be_written_while_the_evaluation_is_set_up_is_exit_2_not_an_internal_error(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, failing: str, error: int, says: str) -> None:
    """It was "quantgate internal error ... please report it" with a traceback."""
    import builtins

    from quantgate.harness import evaluate, server

    def refuse(*args, **kwargs):
        raise OSError(error, os.strerror(error))

    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if os.path.basename(str(file)) == failing:
            raise OSError(error, os.strerror(error), str(file))
        return real_open(file, *args, **kwargs)

    if failing == "task yaml":
        monkeypatch.setattr(evaluate, "write_task_yaml", refuse)
    else:
        monkeypatch.setattr(evaluate if failing == "lm_eval.log" else server, "open", refusing_open, raising=False)
    config = write_config(tmp_path, "setup", gsm8k_dir, num_questions=4)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "setup" / "result.json")
    assert code == 2 and result["verdict"] == "ERROR" and result["usage_error"] is False, output
    assert "internal error" not in result["reason"] and "Traceback" not in output, result["reason"]
    path = {"task yaml": "setup/task/gsm8k.yaml", "lm_eval.log": "setup/lm_eval.log",
            "server.log": "setup/server.log"}[failing]
    assert f"artifacts cannot be written to {tmp_path / 'out'}/{path} ([Errno {error}] {says})" in result["reason"]
    fix = "make it writable or pass another --output-dir" if error == errno.EPERM else "free space or pass another"
    assert fix in result["reason"]


@pytest.mark.parametrize("error, under_run_dir", [(errno.ENOSPC, False), (errno.EACCES, True)])
def test_a_run_file_refused_during_the_evaluation_is_exit_2_not_an_internal_error(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, error: int, under_run_dir: bool) -> None:
    """An OSError lm-eval lets out (a log or cache write): a full disk wherever it is, a permission
    on a file of this run; the file, the OS's words and the fix, never "please report it"."""
    from quantgate.harness import runner

    path = (tmp_path / "out" / "evaluated" / "lm_eval.log") if under_run_dir else (tmp_path / "cache" / "x.arrow")

    def refused(*args: object, **kwargs: object) -> None:
        raise OSError(error, os.strerror(error), str(path))

    monkeypatch.setattr(runner, "run_eval", refused)
    config = write_config(tmp_path, "evaluated", gsm8k_dir, num_questions=4)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "evaluated" / "result.json")
    assert code == 2 and result["verdict"] == "ERROR" and "Traceback" not in output, output
    assert result["reason"].startswith(f"artifacts cannot be written to {path} ([Errno {error}] {os.strerror(error)})")


def test_a_permission_error_outside_the_output_dir_is_not_taken_for_a_run_file() -> None:
    """Its fix is not "pass another --output-dir"."""
    from quantgate.harness.runner import _run_file_error

    out = Path("/tmp/quantgate-out")
    assert _run_file_error(OSError(errno.EACCES, "Permission denied", str(out / "cfg" / "server.log")), out)
    assert not _run_file_error(OSError(errno.EACCES, "Permission denied", "/etc/quantgate/x"), out)
    assert not _run_file_error(OSError(errno.EACCES, "Permission denied"), out)  # no file named: a bug to report
    assert _run_file_error(OSError(errno.ENOSPC, "No space left on device", "/var/cache/x"), out)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs filled to its last block (mounting one needs root and the mount tool)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                 capture_output=True).returncode == 0
    except OSError:  # no mount tool in this image
        mounted = False
    if not mounted:
        pytest.skip("mounting a tmpfs needs root and the mount tool")
    try:
        free_kb = int(subprocess.run(["df", "-k", "--output=avail", str(mount)], capture_output=True,
                                     text=True).stdout.split()[-1])
        (mount / "filler").write_bytes(b"\0" * (free_kb * 1024))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def test_a_disk_full_from_the_start_exits_2_with_the_summary_not_1_with_a_traceback(
        tmp_path: Path, gsm8k_dir: Path, full_disk: Path) -> None:
    """The lock file's "pid N", refused by the full disk, stayed buffered and was written again when
    the file closed: an OSError out of the run, exit 1 ("a gate failed")."""
    config = write_config(tmp_path, "full", gsm8k_dir, num_questions=4)
    run = run_cli("run", config, "--output-dir", full_disk / "out")
    assert run.returncode == 2, run.output[-2000:]
    assert "Traceback" not in run.output and "internal error" not in run.output, run.output[-2000:]
    assert "ERROR full" in run.output and "No space left on device" in run.output
    assert "quantgate summary" in run.output
    assert f"could not write {full_disk / 'out' / 'junit.xml'}" in run.output.replace("\n", "")


@pytest.mark.parametrize("accuracy, verdict", [(1.0, "PASS"), (0.0, "FAIL")])
@pytest.mark.parametrize("unwritable", ["junit", "summary"])
def test_a_run_whose_junit_or_summary_cannot_be_written_exits_2_whatever_its_verdicts(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, accuracy: float, verdict: str,
        unwritable: str) -> None:
    """CI reads junit.xml and summary.md: a run that could not write one is retryable (2), also
    when every config passed (not 0) or failed its gate (not 1). Guards against the final exit
    code ignoring the unwritten run files for a FAIL run, which the full-disk test (whose
    records include ERRORs) cannot see."""
    from quantgate.harness import runner

    def fills_the_disk(*args, **kwargs) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner, f"write_{unwritable}", fills_the_disk)
    config = write_config(tmp_path, "only", gsm8k_dir, {"accuracy": accuracy}, num_questions=4,
                          accuracy_threshold=0.9, tolerance=0.0)
    code, output = run_in_process([config], tmp_path / "out")
    assert load_json(tmp_path / "out" / "only" / "result.json")["verdict"] == verdict, output
    assert code == 2, output
    assert "could not write" in output and "No space left on device" in output


@pytest.mark.parametrize("kind, chat, concurrency", [("null_text", False, 1), ("null_text", True, 4),
                                                     ("no_choices", False, 4), ("error_body", True, 1)])
def test_a_200_without_an_answer_is_an_error_never_a_wrong_answer(tmp_path: Path, gsm8k_dir: Path, kind: str,
                                                                   chat: bool, concurrency: int) -> None:
    # lm-eval alone stores such a body as "" and scores it wrong: FAIL where the truth is ERROR.
    config = write_config(tmp_path, "broken", gsm8k_dir, {"error_after": 5, "malformed": kind},
                          max_concurrency=concurrency, accuracy_threshold=0.9, tolerance=0.0,
                          use_chat_completions=chat)
    code, output = run_in_process([config], tmp_path / "out")
    run_dir = tmp_path / "out" / "broken"
    result = load_json(run_dir / "result.json")
    assert code == 2 and result["verdict"] == "ERROR", output
    assert "answered 200" in result["reason"] and "never scored as a wrong answer" in result["reason"]
    assert len(_samples(run_dir)) == 5 if concurrency == 1 else 5 <= len(_samples(run_dir)) < 12


@pytest.mark.parametrize("broken", ["invalid_json", "html", "extra_choice"])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_200_that_is_no_completion_response_says_so_on_either_request_path(
        tmp_path: Path, gsm8k_dir: Path, broken: str, concurrency: int) -> None:
    """lm-eval's asynchronous path stopped with "JSONDecodeError" or "zip() argument 2 is longer"
    (blamed on lm-eval, not the server); its synchronous one scored the first of two choices."""
    config = write_config(tmp_path, "broken", gsm8k_dir, {"error_after": 5, "broken": broken},
                          max_concurrency=concurrency)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "broken" / "result.json")
    assert code == 2 and result["verdict"] == "ERROR", output
    assert "the server's answer was not a valid OpenAI completion response" in result["reason"], result["reason"]
    assert "lm-eval stopped" not in result["reason"] and "never scored as a wrong answer" in result["reason"]
    what = {"invalid_json": ["not valid JSON"], "html": ["JSON", "html"], "extra_choice": ["2 choices for 1 prompt"]}
    assert all(words in result["reason"] for words in what[broken])  # the body's page, or its text/html type


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_server_answering_as_another_model_is_exit_3_naming_both(tmp_path: Path, gsm8k_dir: Path,
                                                                   concurrency: int) -> None:
    """A proxy in front of the server (or a wrapper in vllm_command) answering from another model:
    its answers are not the model under test's, whatever they score; and a retry gets the same."""
    config = write_config(tmp_path, "proxied", gsm8k_dir, {"answer_as": "other-model"}, max_concurrency=concurrency,
                          num_questions=4)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "proxied" / "result.json")
    assert code == 3 and result["verdict"] == "ERROR" and result["usage_error"] is True, output
    assert "answered as model 'other-model', but the requests asked for 'fake-model'" in result["reason"]
    assert result["evaluation"]["answered"] == 0 and result["timings"]["eval_s"] < 10  # not retried


def test_retry_after_is_honoured_before_a_retry(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "limited", gsm8k_dir, {"error_after": 0, "error_status": 429, "retry_after": 1.5},
                          max_concurrency=1, num_questions=1)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "limited" / "result.json")
    assert code == 2 and "429" in result["reason"], output
    # three attempts, each 429 waits its 1.5 s Retry-After (lm-eval's own backoff alone waits 2 s in all)
    assert result["timings"]["eval_s"] >= 3 * 1.5


def test_a_prompt_longer_than_the_servers_context_is_exit_3_not_a_retry(tmp_path: Path, gsm8k_dir: Path) -> None:
    message = "This model's maximum context length is 512 tokens. However, you requested 940 tokens"
    config = write_config(tmp_path, "short", gsm8k_dir, {"error_after": 0, "error_status": 400,
                                                         "error_message": message}, max_concurrency=1, num_questions=2)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "short" / "result.json")
    assert code == 3 and result["verdict"] == "ERROR" and result["usage_error"] is True, output
    assert "raise --max-model-len in server_args" in result["reason"]


@pytest.mark.parametrize("error, code", [("setup", 3), ("hub", 2)])
def test_an_evaluation_that_cannot_be_built_is_exit_3_but_an_unreachable_hub_is_retried(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, error: str, code: int) -> None:
    from quantgate.harness import evaluate, runner

    exc = (evaluate.EvalSetupError("task x cannot be rebuilt") if error == "setup"
           else evaluate.DatasetUnreachable("task x: its dataset could not be loaded from the Hugging Face hub"))

    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(runner, "run_eval", fail)
    config = write_config(tmp_path, "built", gsm8k_dir, {}, num_questions=1)
    status, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "built" / "result.json")
    assert status == code and result["verdict"] == "ERROR" and result["usage_error"] is (code == 3), output


def test_a_signal_during_a_finished_configs_teardown_cuts_its_grace_so_the_result_is_written_first(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    """A CI cancel that lands while a config that reached its verdict is torn down (a server
    slow to honour SIGTERM gets TEARDOWN_GRACE_S) must not wait that grace out: the agent's
    SIGKILL follows within seconds (Buildkite: 9 s), and would take the verdict's result.json,
    junit.xml and summary.md with it, and leave the server to outlive the job."""
    from quantgate.harness.server import INTERRUPTED_GRACE_S, TEARDOWN_GRACE_S

    config = write_config(tmp_path, "done", gsm8k_dir, {"note_sigterm": True}, num_questions=4)
    after = write_config(tmp_path, "after", gsm8k_dir, num_questions=4)
    proc = _start_run(tmp_path, config, after)
    log = tmp_path / "out" / "done" / "server.log"
    _wait_for(log, "fake server: SIGTERM received", proc)  # the runner's teardown has begun
    pid = int(log.read_text().split("# quantgate: pid ")[1].split()[0])
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert took < INTERRUPTED_GRACE_S + 3 < TEARDOWN_GRACE_S, f"the runner took {took:.1f} s after SIGTERM\n{output}"
    assert proc.returncode == 2, output
    assert not pid_alive(pid) and group_members(pid) == []
    result = load_json(tmp_path / "out" / "done" / "result.json")
    assert result["verdict"] == "PASS" and result["server"]["exit_status"] == -signal.SIGKILL
    # the signal held while the result was written still ends the run: the next config never starts
    after_result = load_json(tmp_path / "out" / "after" / "result.json")
    assert after_result["reason"] == "not started: the run was interrupted by SIGTERM"
    assert (tmp_path / "out" / "junit.xml").is_file() and (tmp_path / "out" / "summary.md").is_file()
