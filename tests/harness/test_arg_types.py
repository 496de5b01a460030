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
    (["compare", "a", "b", "--alpha", "0.5"], "--alpha: must be above 0 and below 0.5 (e.g. 0.05), got 0.5: at 0.5 "
                                              "or above a run exactly as good as its baseline fails at least half "
                                              "the time"),
    (["compare", "a", "b", "--alpha", "5%"], "--alpha: '5%' is not a number"),
    (["run", "c.yaml", "--limit", "ten"], "--limit: 'ten' is not an integer"),
    (["run", "c.yaml", "--server-url", "http://:8000"], "--server-url: 'http://:8000' is not an http(s) URL"),
])
def test_bad_values_exit_3_naming_the_flag(capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    assert cli_main(argv) == 3
    assert message in capsys.readouterr().err


def test_good_urls_pass() -> None:
    from quantgate.harness.commands.arg_types import server_url

    for url in ("http://127.0.0.1:8000", "https://gpu-box.internal", "http://[::1]:8000"):
        assert server_url(url) == url


def test_good_values_parse_to_their_number() -> None:
    from quantgate.harness.commands.arg_types import int_at_least, positive_int, significance

    assert [positive_int("1"), positive_int("250"), int_at_least(2)("2")] == [1, 250, 2]  # the minimum itself passes
    assert [significance("0.05"), significance("0.4999")] == [0.05, 0.4999]
