"""`quantgate serve`'s flags as the harness checks them (engine/serve_args.py): the server's own
parser and messages, with nothing started and torch not imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quantgate.engine.serve_args import normalize_flags, usage_problem


@pytest.mark.parametrize("args,expected", [
    (["--tokenizer-mode", "auto"], "unknown flag(s): --tokenizer-mode. Known flags: "),
    (["--max-model-length", "64"], "--max-model-length (did you mean --max-model-len?)"),
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2 is not supported"),
    (["--dtype", "int4"], "unknown dtype 'int4'"),
    (["--port", "abc"], "'abc' is not an integer"),
    (["--linear-backend", "marlinn"], "did you mean 'marlin'?"),
])
def test_refused_flags_get_the_servers_own_message(args: list[str], expected: str) -> None:
    problem = usage_problem(args)
    assert problem is not None and expected in problem, problem


def test_a_vllm_only_flag_points_at_engine_vllm() -> None:
    assert "needs `engine: vllm`" in usage_problem(["--gpu-memory-utilization", "0.9"])


@pytest.mark.parametrize("args", [
    [], ["--max-model-len", "512", "--seed", "1"], ["--max_model_len", "512"], ["--linear_backend=emulation"],
    ["--enforce-eager", "--device", "cpu", "--served-model-name", "a", "b", "--port", "0"],
])
def test_accepted_flags(args: list[str]) -> None:
    assert usage_problem(args) is None


def test_underscores_in_flag_names_only() -> None:
    assert normalize_flags(["--max_model_len=4_096", "--served_model_name", "my_model", "-tp", "1"]) == [
        "--max-model-len=4_096", "--served-model-name", "my_model", "-tp", "1"]


def test_checking_flags_does_not_import_torch() -> None:
    code = ("import sys; from quantgate.engine.serve_args import usage_problem; "
            "assert usage_problem(['--max-num-seqs', '8']) is None; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
