"""The `quantgate` command itself (SPEC section 4): commands, help, exit codes."""

from __future__ import annotations

import errno
from importlib.metadata import version

import pytest

from quantgate.harness.cli import COMMANDS, main


def test_no_command_prints_the_commands_and_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 3
    out = capsys.readouterr().out
    assert out.startswith("usage: quantgate [-h] [--version] COMMAND ...\n")
    assert all(f"\n    {name}" in out for name in COMMANDS)


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "migrate   rewrite legacy env hacks into server_args" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"quantgate {version('quantgate')}\n"


def test_an_unknown_command_is_a_usage_error_naming_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernel"]) == 3  # not argparse's 2: SPEC keeps 2 for retryable errors
    err = capsys.readouterr().err
    assert "quantgate: error: argument COMMAND: invalid choice: 'kernel' (choose from 'run', " in err


def test_a_command_names_itself_in_its_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: quantgate kernels [-h] [--json]")
    assert main(["migrate"]) == 3
    assert capsys.readouterr().err.endswith("quantgate migrate: error: the following arguments are required: PATH\n")


def test_vllm_style_underscore_flags_reach_serve(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM takes `--max_model_len` for `--max-model-len`: the value is checked, not the spelling refused
    assert main(["serve", "/nonexistent-model", "--max_model_len", "abc"]) == 3
    assert "quantgate serve: error: argument --max-model-len: 'abc' is not a token count" in capsys.readouterr().err


def test_only_a_broken_pipe_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any other OSError out of a command is a bug to see, not exit 141 with nothing said."""
    from quantgate.harness.commands import kernels

    def full_disk(args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(kernels, "main", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        main(["kernels"])
