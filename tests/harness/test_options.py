"""Server argument lists are read as the engines' parsers read them, by every reader alike."""

from __future__ import annotations

from quantgate.harness.config import backend_flags_of, parallel_gpus
from quantgate.harness.options import OptionUse, flag_of, option_uses
from quantgate.harness.server import redact_api_key, split_option


def test_both_forms_and_both_spellings_are_one_flag() -> None:
    args = ["--linear_backend", "marlin", "--moe-backend=triton", "-tp=2", "--max-model-len", "1280"]
    assert option_uses(args, {"--linear-backend", "--moe-backend", "-tp"}) == [
        OptionUse("--linear-backend", "marlin", 0, inline=False),
        OptionUse("--moe-backend", "triton", 2, inline=True),
        OptionUse("-tp", "2", 3, inline=True),
    ]
    assert [flag_of(a) for a in ("--api_key=x", "-dp", "-tp=4", "value")] == ["--api-key", "-dp", "-tp", "value"]


def test_a_flag_is_never_another_flags_value_nor_a_value_a_flag() -> None:
    # `--port --host h`: --port has no value (the server refuses it), --host keeps its own.
    assert option_uses(["--port", "--host", "h"], {"--port", "--host"}) == [
        OptionUse("--port", None, 0, inline=False), OptionUse("--host", "h", 1, inline=False)]
    # A value taken by a watched flag is not read again as a flag of its own (split_option always did so).
    assert option_uses(["--served-model-name", "-tp", "-tp", "2"], {"--served-model-name", "-tp"}) == [
        OptionUse("--served-model-name", "-tp", 0, inline=False), OptionUse("-tp", "2", 2, inline=False)]
    assert option_uses(["--port="], {"--port"}) == [OptionUse("--port", "", 0, inline=True)]


def test_items_are_what_a_use_takes_from_the_list() -> None:
    uses = option_uses(["--port", "8000", "--host=h", "--api-key"], {"--port", "--host", "--api-key"})
    assert [list(u.items) for u in uses] == [[0, 1], [2], [3]]


def test_the_readers_agree() -> None:
    args = ["--port", "8000", "--port=9000", "--api_key", "k", "--linear_backend=marlin", "-tp", "2",
            "--pipeline_parallel_size", "3", "--host"]
    assert split_option(args, "--port") == ("9000", args[3:])  # the last wins, as argparse
    assert split_option(args, "--host") == (None, args)  # no value: kept for the server to refuse
    assert redact_api_key(args)[4] == "<redacted>" and "k" not in redact_api_key(args)
    assert backend_flags_of(args) == {"--linear-backend": "marlin"}
    assert parallel_gpus(args) == 6
