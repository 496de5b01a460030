"""argparse types the commands share: a bad value is a usage error (exit 3) naming the flag,
before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from urllib.parse import urlsplit


def int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An integer flag value of at least `minimum`; `why` says what a smaller one would mean."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {number}" + (f": {why}" if why else ""))
        return number

    return parse


positive_int = int_at_least(1)


def significance(value: str) -> float:
    """A one-sided test's significance level: above 0 and below 0.5, as a config's gate.alpha."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0.0 < number < 0.5:  # NaN too
        why = ("at 0.5 or above a run exactly as good as its baseline fails at least half the time" if number >= 0.5
               else "it is a probability" if number != number
               else "it is the chance of failing a run as good as its baseline, which 0 or less never is")
        raise argparse.ArgumentTypeError(f"must be above 0 and below 0.5 (e.g. 0.05), got {value}: {why}")
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
