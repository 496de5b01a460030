"""A server's watchdog: tears the server's process group down if the runner dies without doing so.

The runner stops its servers itself (`LaunchedServer.stop`: SIGTERM, a grace, SIGKILL), and the
server's leader gets SIGTERM when the runner dies (PR_SET_PDEATHSIG). A runner that is SIGKILLed
(the OOM killer, a CI agent's hard kill) runs no code, so a server that ignores SIGTERM, or that
is slow to honour it, would outlive the job and keep the GPU and port from the next one. This
process, in a session of its own, outlives the runner: once the runner is gone it does the
runner's teardown (SIGTERM to the group, the grace, SIGKILL). It exits when the group is empty.

    python -m quantgate.harness.watchdog RUNNER_PID RUNNER_START_TIME PGID GRACE_S

Standard library only: one is started with every server.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5


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


def watch(runner_pid: int, runner_start: str, pgid: int, grace_s: float) -> int:
    while _group_has_members(pgid):
        if _start_time(runner_pid) != runner_start:  # the runner is gone (or its pid reused)
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    return 0
                deadline = time.monotonic() + wait_s
                while time.monotonic() < deadline and _group_has_members(pgid):
                    time.sleep(0.05)
            return 0
        time.sleep(POLL_S)
    return 0


def main(argv: list[str]) -> int:
    runner_pid, runner_start, pgid, grace_s = int(argv[0]), argv[1], int(argv[2]), float(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the runner's to handle
    return watch(runner_pid, runner_start, pgid, grace_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
