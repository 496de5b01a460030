"""The commit a benchmark measured, and the rest of a results file's provenance.

QUANTGATE_COMMIT wins over `git rev-parse`: the device machine keeps a stale .git from earlier
calls (run 8's summary and call 2 of run 9 named an older commit than the tree they measured),
so the jobs pass the commit of the tree they copied (gpu_env.sh, which records
`unverified:<sha>` when it is not passed). Without it, git's HEAD is written with `-dirty` when
tracked files differ from it: a measurement of uncommitted code must not name a commit as if it
were that commit's.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=HERE).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def commit() -> str:
    """QUANTGATE_COMMIT, else this checkout's HEAD (short, `-dirty` when tracked files are
    modified), else 'unknown'."""
    if os.environ.get("QUANTGATE_COMMIT"):
        return os.environ["QUANTGATE_COMMIT"]
    sha = _git("rev-parse", "--short=12", "HEAD")
    if not sha:
        return "unknown"
    return f"{sha}-dirty" if _git("status", "--porcelain", "--untracked-files=no") else sha


def versions(packages: tuple[str, ...] = ("torch", "triton")) -> dict[str, str | None]:
    """__version__ of each package, None where it is not installed."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = getattr(importlib.import_module(name), "__version__", None)
        except ImportError:
            out[name] = None
    return out


def record(argv: list[str] | None = None, packages: tuple[str, ...] = ("torch", "triton")) -> dict:
    """commit, UTC date, the command line (sys.argv unless given), python, host, and the
    versions of `packages`: what a results file needs to say what it measured."""
    return {"commit": commit(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[:] if argv is None else list(argv), "python": platform.python_version(),
            "host": platform.node(), **versions(packages)}
