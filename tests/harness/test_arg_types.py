"""Bad flag values are usage errors (exit 3) naming the flag, before anything runs."""

from __future__ import annotations

import pytest

from quantgate.harness.cli import main as cli_main


@pytest.mark.parametrize("argv,message", [
    (["run", "c.yaml", "--server-url", "notaurl"], "--server-url: 'notaurl' is not an http(s) URL"),
    (["run", "c.yaml", "--server-url", "http://127.0.0.1:99999"], "has an invalid port"),
    (["calibrate", "c.yaml", "--runs", "2", "--server-url", "localhost:8000"], "is not an http(s) URL"),
    (["run", "c.yaml", "--limit", "0"], "--limit: must be at least 1, got 0"),
    (["repro", "c.yaml", "--limit", "-3"], "--limit: must be at least 1, got -3"),
    (["calibrate", "c.yaml", "--runs", "1"], "--runs: must be at least 2, got 1: one run has no run-to-run spread"),
    (["compare", "a", "b", "--alpha", "3"], "--alpha: must be above 0 and below 0.5"),
    (["compare", "a", "b", "--alpha", "0"], "--alpha: must be above 0 and below 0.5 (e.g. 0.05), got 0: it is the "
                                            "chance of failing a run as good as its baseline, which 0 or less never is"),
    (["compare", "a", "b", "--alpha", "nan"], "got nan: it is a probability"),
    (["compare", "a", "b", "--alpha", "0.9"], "--alpha: must be above 0 and below 0.5"),  # as gate.alpha
])
def test_bad_values_exit_3_naming_the_flag(capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    assert cli_main(argv) == 3
    assert message in capsys.readouterr().err


def test_good_urls_pass() -> None:
    from quantgate.harness.commands.arg_types import server_url

    for url in ("http://127.0.0.1:8000", "https://gpu-box.internal", "http://[::1]:8000"):
        assert server_url(url) == url
