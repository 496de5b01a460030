"""The commit a benchmark measured, for its results file.

QUANTGATE_COMMIT wins over `git rev-parse`: the device machine keeps a stale .git from earlier
calls (run 8's summary and call 2 of run 9 named an older commit than the tree they measured),
so the jobs pass the commit of the tree they copied (gpu_env.sh).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit() -> str:
    """QUANTGATE_COMMIT, else this checkout's HEAD (short), else 'unknown'."""
    if os.environ.get("QUANTGATE_COMMIT"):
        return os.environ["QUANTGATE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
