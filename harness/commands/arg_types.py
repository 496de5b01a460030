"""argparse types the commands share: a bad value is a usage error (exit 3) naming the flag,
before anything runs."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def probability(value: str) -> float:
    """A significance level: strictly between 0 and 1."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0.0 < number < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (e.g. 0.05), got {value}")
    return number


def server_url(value: str) -> str:
    """An OpenAI-compatible server's base URL: http(s)://host[:port], no /v1 needed."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} has an invalid port; pass e.g. http://127.0.0.1:8000") from None
    return value
