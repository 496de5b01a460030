"""The server watchdog (harness/watchdog.py) run in-process against real processes: a "runner"
and a "server" group of `python -c` children, and strays carrying SERVER_ENV outside the group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantgate.harness import watchdog
from quantgate.harness.watchdog import SERVER_ENV

REPO = Path(__file__).resolve().parents[2]

# Prints "ready" once its SIGTERM handling is in place; a TERM it receives is written to argv[1].
_SERVER = """
import signal, sys, time
mode = sys.argv[2]
def on_term(*_):
    with open(sys.argv[1], "a") as f:
        f.write("TERM\\n")
    if mode == "exit":
        sys.exit(0)
    if mode == "slow":  # a clean shutdown that takes a while
        time.sleep(0.5)
        with open(sys.argv[1], "a") as f:
            f.write("DONE\\n")
        sys.exit(0)
if mode != "default":
    signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(float(sys.argv[3]))
"""


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "POLL_S", 0.05)


def _spawn(procs: list[subprocess.Popen], tmp_path: Path, mode: str = "default", sleep_s: float = 60.0,
           server_id: str | None = None, name: str = "server") -> subprocess.Popen:
    """A process in a session (and group) of its own, started once it says it is ready."""
    env = {k: v for k, v in os.environ.items() if k != SERVER_ENV}
    if server_id is not None:
        env[SERVER_ENV] = server_id
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(tmp_path / f"{name}.terms"), mode, str(sleep_s)],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _runner(procs: list[subprocess.Popen], tmp_path: Path) -> tuple[subprocess.Popen, str]:
    runner = _spawn(procs, tmp_path, name="runner")
    start = watchdog._start_time(runner.pid)
    assert start is not None
    return runner, start


def _terms(tmp_path: Path, name: str = "server") -> list[str]:
    path = tmp_path / f"{name}.terms"
    return path.read_text().split() if path.exists() else []


def _watch_in_thread(*args) -> tuple[threading.Thread, list[int]]:
    returned: list[int] = []
    thread = threading.Thread(target=lambda: returned.append(watchdog.watch(*args)), daemon=True)
    thread.start()
    return thread, returned


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait_zombie(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _state(pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(pid) == "Z"


# ---------------------------------------------------------------------------- /proc readers


def test_start_time_is_field_22_of_proc_stat_even_when_the_name_holds_a_parenthesis(tmp_path: Path,
                                                                                     procs: list) -> None:
    code = ("import time; open('/proc/self/comm', 'w').write('a) 7 8 9 Z'); print('ready', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    assert "(a) 7 8 9 Z)" in stat
    after_name = stat[stat.rindex(")") + 2:].split(" ")
    assert watchdog._start_time(proc.pid) == after_name[19]  # field 22; fields 1 and 2 are pid and (comm)
    assert watchdog._start_time(proc.pid) == watchdog._start_time(proc.pid)
    assert watchdog._start_time(os.getpid()) != watchdog._start_time(proc.pid)


def test_start_time_is_none_for_a_zombie_and_for_a_process_that_is_gone(tmp_path: Path, procs: list) -> None:
    proc = _spawn(procs, tmp_path)
    assert watchdog._start_time(proc.pid) is not None
    proc.kill()
    _wait_zombie(proc.pid)
    assert watchdog._start_time(proc.pid) is None
    proc.wait()
    assert watchdog._start_time(proc.pid) is None


def test_a_group_whose_only_member_is_a_zombie_has_no_members(tmp_path: Path, procs: list) -> None:
    server = _spawn(procs, tmp_path)
    assert watchdog._group_alive(server.pid) and watchdog._group_has_members(server.pid)
    server.kill()
    _wait_zombie(server.pid)
    assert watchdog._group_alive(server.pid)  # the zombie leader still holds the group id
    assert not watchdog._group_has_members(server.pid)
    server.wait()
    assert not watchdog._group_alive(server.pid) and not watchdog._group_has_members(server.pid)


def test_a_group_it_may_not_signal_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """EPERM (another user's group: not as root, so simulated) says the group exists."""
    def refuse(pgid: int, sig: int) -> None:
        assert sig == 0
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(watchdog.os, "killpg", refuse)
    assert watchdog._group_alive(4242) is True


def test_a_group_whose_leader_exited_still_has_its_other_members(tmp_path: Path, procs: list) -> None:
    """The leader a zombie, its child (same group, re-parented away from it) still up."""
    code = ("import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', 'import time; "
            "print(\"ready\", flush=True); time.sleep(60)'], stdout=sys.stdout); print(child.pid, flush=True)")
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs.append(leader)
    assert leader.stdout is not None
    lines = [leader.stdout.readline().strip(), leader.stdout.readline().strip()]
    child = int(next(line for line in lines if line != "ready"))
    try:
        _wait_zombie(leader.pid)
        assert watchdog._group_has_members(leader.pid)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while watchdog._group_has_members(leader.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not watchdog._group_has_members(leader.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_strays_are_the_live_processes_naming_exactly_this_server_id(tmp_path: Path, procs: list) -> None:
    mine = _spawn(procs, tmp_path, server_id="run-1", name="mine")
    other = _spawn(procs, tmp_path, server_id="run-10", name="other")  # the next config's server
    assert watchdog._strays("run-1") == [mine.pid]
    assert watchdog._strays("run-10") == [other.pid]
    assert watchdog._strays("run-") == []
    mine.kill()
    _wait_zombie(mine.pid)
    assert watchdog._strays("run-1") == []  # a zombie awaits its parent's wait, not a signal


def test_the_watchdog_is_never_its_own_stray() -> None:
    """It inherits the runner's environment, which may carry the server's id."""
    env = {**os.environ, SERVER_ENV: "run-self"}
    code = "from quantgate.harness import watchdog; print(watchdog._strays('run-self'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- watch / main


def test_nothing_left_to_watch_returns_at_once_and_signals_nobody(tmp_path: Path, procs: list) -> None:
    runner, start = _runner(procs, tmp_path)
    gone = _spawn(procs, tmp_path)
    gone.kill()
    gone.wait()
    began = time.monotonic()
    assert watchdog.watch(runner.pid, "not-its-start-time", gone.pid, 5.0, "nobody-has-this-id") == 0
    assert time.monotonic() - began < 3.0  # well under the 5 s grace it would otherwise wait
    assert runner.poll() is None and _terms(tmp_path, "runner") == []


def test_while_the_runner_lives_the_server_is_left_alone_until_it_exits(tmp_path: Path, procs: list) -> None:
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path, mode="record", sleep_s=3.0)
    thread, returned = _watch_in_thread(runner.pid, start, server.pid, 0.2, "srv-a")
    time.sleep(0.5)
    assert thread.is_alive() and returned == []
    assert server.wait(timeout=10) == 0  # exited by itself, never signalled
    thread.join(timeout=5)
    assert not thread.is_alive() and returned == [0]
    assert _terms(tmp_path) == [] and runner.poll() is None


def test_a_dead_runners_server_gets_sigterm_and_is_not_waited_for_longer_than_it_takes(tmp_path: Path,
                                                                                      procs: list) -> None:
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path, mode="exit")
    thread, returned = _watch_in_thread(runner.pid, start, server.pid, 30.0, "srv-b")
    time.sleep(0.3)
    assert thread.is_alive() and server.poll() is None
    runner.kill()
    runner.wait()
    began = time.monotonic()
    thread.join(timeout=10)
    assert not thread.is_alive() and returned == [0]
    assert time.monotonic() - began < 5.0  # not the 30 s grace: the group was empty
    assert _terms(tmp_path) == ["TERM"] and server.wait(timeout=5) == 0


def test_a_server_ignoring_sigterm_is_sigkilled_after_the_grace(tmp_path: Path, procs: list) -> None:
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path, mode="record")
    runner.kill()
    runner.wait()
    began = time.monotonic()
    assert watchdog.watch(runner.pid, start, server.pid, 1.0, "srv-c") == 0
    took = time.monotonic() - began
    assert server.wait(timeout=5) == -signal.SIGKILL
    assert _terms(tmp_path) == ["TERM"]  # SIGTERM first, once
    assert 1.0 <= took < 5.0


def test_the_pid_of_a_runner_reused_by_another_process_counts_as_its_death(tmp_path: Path, procs: list) -> None:
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path)
    assert watchdog.watch(runner.pid, str(int(start) - 1), server.pid, 1.0, "srv-d") == 0
    assert server.wait(timeout=5) == -signal.SIGTERM
    assert runner.poll() is None  # the process now holding the pid is not the watchdog's


def test_what_the_server_started_outside_its_group_is_torn_down_and_nothing_else(tmp_path: Path,
                                                                                procs: list) -> None:
    """A setsid() worker (a session of its own, SERVER_ENV inherited) keeps the watchdog watching
    after the group is empty; the next config's server (another id) is not touched."""
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path, server_id="srv-e", sleep_s=0.5)
    stray = _spawn(procs, tmp_path, mode="record", server_id="srv-e", name="stray")
    next_server = _spawn(procs, tmp_path, mode="record", server_id="srv-e2", name="next")
    thread, returned = _watch_in_thread(runner.pid, start, server.pid, 0.5, "srv-e")
    assert server.wait(timeout=10) == 0
    time.sleep(0.3)
    assert thread.is_alive() and stray.poll() is None  # the group is gone, its stray is not
    runner.kill()
    runner.wait()
    thread.join(timeout=10)
    assert not thread.is_alive() and returned == [0]
    assert stray.wait(timeout=5) == -signal.SIGKILL and _terms(tmp_path, "stray") == ["TERM"]
    assert next_server.poll() is None and _terms(tmp_path, "next") == []


def test_main_parses_its_arguments_and_ignores_sigint(tmp_path: Path, procs: list) -> None:
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path, mode="record")
    stray = _spawn(procs, tmp_path, server_id="srv-f", name="stray")
    runner.kill()
    runner.wait()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's process has it
    try:
        began = time.monotonic()
        assert watchdog.main([str(runner.pid), start, str(server.pid), "0.5", "srv-f"]) == 0
        took = time.monotonic() - began
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # a terminal's Ctrl-C is the runner's
    finally:
        signal.signal(signal.SIGINT, before)
    assert server.wait(timeout=5) == -signal.SIGKILL and _terms(tmp_path) == ["TERM"]
    assert stray.wait(timeout=5) == -signal.SIGTERM
    assert 0.5 <= took < 4.0


def test_the_module_runs_as_a_command(tmp_path: Path, procs: list) -> None:
    """How harness/server.py starts it: `python -m quantgate.harness.watchdog RUNNER_PID
    RUNNER_START PGID GRACE_S SERVER_ID`; its exit status is main's."""
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path)
    runner.kill()
    runner.wait()
    done = subprocess.run([sys.executable, "-m", "quantgate.harness.watchdog", str(runner.pid), start,
                           str(server.pid), "1.0", "srv-g"], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert server.wait(timeout=5) == -signal.SIGTERM


def test_a_stray_gets_the_grace_to_exit_cleanly_too(tmp_path: Path, procs: list) -> None:
    """The grace is waited out for the strays as for the group: a worker that takes a moment to
    shut down after SIGTERM is not SIGKILLed once the group itself is empty."""
    runner, start = _runner(procs, tmp_path)
    server = _spawn(procs, tmp_path, server_id="srv-h")
    stray = _spawn(procs, tmp_path, mode="slow", server_id="srv-h", name="stray")
    runner.kill()
    runner.wait()
    assert watchdog.watch(runner.pid, start, server.pid, 10.0, "srv-h") == 0
    assert server.wait(timeout=5) == -signal.SIGTERM
    assert stray.wait(timeout=5) == 0 and _terms(tmp_path, "stray") == ["TERM", "DONE"]
