"""Tiny model folders shared by the engine tests (built once per session, float32)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from quantgate.engine import LLMEngine, load_model
from quantgate.kernels import Platform
from quantgate.kernels.moe.emulation import EmulationMoEKernel

from .tiny_models import write_model

logging.getLogger("quantgate.engine").setLevel(logging.WARNING)

MOE_KERNEL_READY, MOE_KERNEL_REASON = EmulationMoEKernel.is_supported(Platform.detect("cpu"))
needs_moe_kernel = pytest.mark.skipif(
    not MOE_KERNEL_READY, reason=f"the CPU MoE kernel is not available yet: {MOE_KERNEL_REASON}")


def mostly_equal(out: torch.Tensor, ref: torch.Tensor) -> None:
    """The same bits as `ref` but for rare one-ulp differences (float32 sums in another order): a
    missing or extra rounding to the dtype moves a fifth or more of the elements."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert (out != ref).float().mean() < 0.01, (out != ref).float().mean().item()
    torch.testing.assert_close(out, ref, rtol=torch.finfo(out.dtype).eps, atol=1e-5)


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("dense"), seed=1)


@pytest.fixture(scope="session")
def dense_tied_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("dense_tied"), seed=2, tie_word_embeddings=True, attention_bias=True)


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("moe"), moe=True, seed=3)


@pytest.fixture(scope="session")
def dense_engine(dense_dir) -> LLMEngine:
    """An fp32 engine on the dense model; tests must leave it with no request running."""
    return LLMEngine(load_model(dense_dir, device="cpu"), max_num_seqs=8, max_model_len=256)


def random_prompts(n: int, vocab: int, generator: torch.Generator, low: int = 2, high: int = 60) -> list[list[int]]:
    lengths = torch.randint(low, high, (n,), generator=generator).tolist()
    return [torch.randint(1, vocab, (length,), generator=generator).tolist() for length in lengths]


def run_to_completion(engine: LLMEngine) -> dict[str, list]:
    """request id -> every RequestOutput it produced, in order."""
    outputs: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs
