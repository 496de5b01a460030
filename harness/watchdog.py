"""A server's watchdog: tears the server's process group down if the runner dies without doing so.

The runner stops its servers itself (`LaunchedServer.stop`: SIGTERM, a grace, SIGKILL), and the
server's leader gets SIGTERM when the runner dies (PR_SET_PDEATHSIG). A runner that is SIGKILLed
(the OOM killer, a CI agent's hard kill) runs no code, so a server that ignores SIGTERM, or that
is slow to honour it, would outlive the job and keep the GPU and port from the next one. This
process, in a session of its own, outlives the runner: once the runner is gone it does the
runner's teardown (SIGTERM to the group, the grace, SIGKILL), of the processes the server started
outside its group too (a worker that called setsid(), a daemon that double-forked): they carry
SERVER_ENV naming this launch of the server in their environment. It exits when none of them is
left.

    python -m quantgate.harness.watchdog RUNNER_PID RUNNER_START_TIME PGID GRACE_S SERVER_ID

Standard library only: one is started with every server.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5
# Set in every launched server's environment (harness/server.py), and so inherited by whatever it
# starts, in its group or not: the runner's pid, and an id of this launch, unique among the
# servers of one run (a watchdog must not wait for, or kill, the next config's server).
RUNNER_ENV = "QUANTGATE_RUNNER_PID"
SERVER_ENV = "QUANTGATE_SERVER_ID"


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (the start time), None once the process is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists; signals will tell
        return True
    return True


def _group_has_members(pgid: int) -> bool:
    """Non-zombie members of the group (a zombie leader awaits its parent's wait, not a signal)."""
    if not _group_alive(pgid):
        return False
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


def _strays(server_id: str) -> list[int]:
    """Live processes whose environment names `server_id` as SERVER_ENV: the server's, and what it
    started, setsid() or not."""
    marker = f"{SERVER_ENV}={server_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and _start_time(int(entry.name)) is not None:
                found.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    return found


def _teardown(server_id: str, pgid: int, grace_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        for pid in _strays(server_id):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (_group_has_members(pgid) or _strays(server_id)):
            time.sleep(0.05)


def watch(runner_pid: int, runner_start: str, pgid: int, grace_s: float, server_id: str) -> int:
    # Also once the group is empty, while processes the server started elsewhere are up: the
    # runner's death SIGTERMs the leader (PR_SET_PDEATHSIG), which may exit before this notices.
    while _group_has_members(pgid) or _strays(server_id):
        if _start_time(runner_pid) != runner_start:  # the runner is gone (or its pid reused)
            _teardown(server_id, pgid, grace_s)
            return 0
        time.sleep(POLL_S)
    return 0


def main(argv: list[str]) -> int:
    runner_pid, runner_start, pgid, grace_s, server_id = int(argv[0]), argv[1], int(argv[2]), float(argv[3]), argv[4]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the runner's to handle
    return watch(runner_pid, runner_start, pgid, grace_s, server_id)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
