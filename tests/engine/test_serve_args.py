"""`quantgate serve`'s flags as the harness checks them (engine/serve_args.py): the server's own
parser and messages, with nothing started and torch not imported."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from quantgate.engine.serve_args import normalize_flags, register, usage_problem


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="quantgate serve")
    register(parser)
    return parser.parse_args(["MODEL", *normalize_flags(list(flags))])


@pytest.mark.parametrize("args,expected", [
    (["--tokenizer-mode", "auto"], "unknown flag(s): --tokenizer-mode. Known flags: "),
    (["--max-model-length", "64"], "--max-model-length (did you mean --max-model-len?)"),
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2 is not supported"),
    (["--dtype", "int4"], "unknown dtype 'int4' (known: auto, bfloat16, float16, float32)"),
    (["--port", "65536"], "65536 is out of range for --port (0..65535)"),
    (["--max-num-seqs", "0"], "0 is out of range for --max-num-seqs (1..65536)"),
    (["-tp", "2"], "--tensor-parallel-size 2 is not supported"),  # vLLM's short form
    (["--moe-backend", "torch"], "unknown --moe-backend 'torch' (known: auto, emulation, triton, marlin)"),
    # No abbreviations: the harness reads --api-key, --port... from server_args by their full names.
    (["--api-k", "x"], "unknown flag(s): --api-k (did you mean --api-key?)"),
    (["--tokenizer-mode=auto"], "unknown flag(s): --tokenizer-mode. Known flags: "),  # named without its value
    (["--port", "abc"], "'abc' is not an integer"),
    (["--linear-backend", "marlinn"], "did you mean 'marlin'?"),
    (["--max-model-len", "4kb"], "argument --max-model-len: '4kb' is not a token count; give an integer (4096), "
                                 "k/m/g thousands (4k = 4000, 25.6k = 25600), K/M/G 1024s (4K = 4096) or auto"),
    (["--max-model-len", "2.5K"], "'2.5K' is not a token count (decimals take a lowercase suffix: 2.5k)"),
    (["--max-model-len", "0"], "'0' is 0 tokens, out of range for --max-model-len (1..2147483647); or give auto"),
    (["--max-model-len", "3g"], "'3g' is 3000000000 tokens, out of range for --max-model-len"),
])
def test_refused_flags_get_the_servers_own_message(args: list[str], expected: str) -> None:
    problem = usage_problem(args)
    assert problem is not None and expected in problem, problem


@pytest.mark.parametrize("flag", ["--kv-cache-dtype", "--bogus"])
def test_a_did_you_mean_is_not_matched_on_the_dashes(flag: str) -> None:
    # --kv-cache-dtype was "close" to --dtype (a change of results) by the shared leading "--".
    problem = usage_problem([flag, "fp8"])
    assert problem is not None and f"unknown flag(s): {flag}. Known" in problem, problem


def test_a_vllm_only_flag_points_at_engine_vllm() -> None:
    assert "needs `engine: vllm`" in usage_problem(["--gpu-memory-utilization", "0.9"])


@pytest.mark.parametrize("args", [
    [], ["--max-model-len", "512", "--seed", "1"], ["--max_model_len", "512"], ["--linear_backend=emulation"],
    ["--enforce-eager", "--device", "cpu", "--served-model-name", "a", "b", "--port", "0"],
    ["--max-model-len", "4k"], ["--max_model_len=auto"], ["--no-enforce-eager"], ["--no_enforce_eager"],
    ["--port", "65535"], ["--linear-backend", "torch"], ["--log-level", "DEBUG"],
])
def test_accepted_flags(args: list[str]) -> None:
    assert usage_problem(args) is None


@pytest.mark.parametrize("value,tokens", [
    # vLLM's human_readable_int_or_auto: k/m/g decimal, K/M/G binary, auto or -1 the model's own
    ("4096", 4096), ("1k", 1000), ("1K", 1024), ("4k", 4000), ("4K", 4096), ("25.6k", 25600), ("1m", 10**6),
    ("1M", 2**20), (" 8k ", 8000), ("4_096", 4096), ("auto", None), ("AUTO", None), ("-1", None),
])
def test_max_model_len_takes_vllms_forms(value: str, tokens: int | None) -> None:
    assert parse("--max-model-len", value).max_model_len == tokens
    assert parse(f"--max-model-len={value}").max_model_len == tokens


def test_defaults_are_the_documented_ones() -> None:
    # SPEC section 6 and the flags' help: a local server, vLLM's port, the checkpoint's dtype.
    args = parse()
    assert (args.host, args.port, args.device, args.dtype, args.seed) == ("127.0.0.1", 8000, "auto", "auto", 0)
    assert (args.linear_backend, args.moe_backend, args.max_model_len, args.tensor_parallel_size) == (
        "auto", "auto", None, 1)


@pytest.mark.parametrize("value,dtype", [("BF16", "bfloat16"), ("half", "float16"), ("Float32", "float32")])
def test_dtype_takes_vllms_aliases_in_any_case(value: str, dtype: str) -> None:
    assert parse("--dtype", value).dtype == dtype


def test_the_api_key_is_kept_as_given() -> None:
    assert parse("--api-key", "Se_Cret").api_key == "Se_Cret"


def test_enforce_eager_is_a_switch_both_ways_as_in_vllm() -> None:
    assert parse().enforce_eager is False
    assert parse("--enforce-eager").enforce_eager is True
    assert parse("--enforce-eager", "--no-enforce-eager").enforce_eager is False


def test_underscores_in_flag_names_only() -> None:
    assert normalize_flags(["--max_model_len=4_096", "--served_model_name", "my_model", "-tp", "1"]) == [
        "--max-model-len=4_096", "--served-model-name", "my_model", "-tp", "1"]


def test_checking_flags_does_not_import_torch() -> None:
    code = ("import sys; from quantgate.engine.serve_args import usage_problem; "
            "assert usage_problem(['--max-num-seqs', '8']) is None; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
