"""Programmatic dependent launch: when it is on, and that a captured chain of PDL launches, each
reading the output of the one before, computes what the same chain computes eagerly (dense
linears of every backend and path, and MoE layers)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from quantgate.kernels import Scheme
from quantgate.kernels.linear.marlin import MarlinFp8LinearKernel
from quantgate.kernels.linear.torch_scaled_mm import TorchBlockScaledMMLinearKernel, TorchScaledMMLinearKernel
from quantgate.kernels.linear.triton_block import TritonBlockFp8LinearKernel
from quantgate.kernels.moe.marlin import MarlinMoEKernel
from quantgate.kernels.moe.triton import TritonFusedMoEKernel, TritonUnquantizedMoEKernel
from quantgate.kernels.triton import pdl

from .linear_cases import make_case


def test_off_outside_graph_capture_on_cpu_and_when_switched_off(monkeypatch):
    assert not pdl.enabled(torch.device("cpu"))
    with pdl.for_graph_capture():
        assert not pdl.enabled(torch.device("cpu"))
        assert pdl.launch_options(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    if torch.cuda.is_available():
        device = torch.device("cuda")
        assert not pdl.enabled(device)
        monkeypatch.setenv(pdl.PDL_ENV, "0")
        with pdl.for_graph_capture():
            assert not pdl.enabled(device)


def test_capture_flag_nests_and_resets_after_an_error():
    with pytest.raises(RuntimeError):
        with pdl.for_graph_capture():
            with pdl.for_graph_capture():
                pass
            raise RuntimeError("capture failed")
    assert pdl._capturing == 0


# (kernel, scheme, rows): the marlin GEMV; W8A8 batches above 16 rows, where the activations are
# quantized by their own launch before the GEMM (pointer tiles, TMA tiles, cuBLAS), and dynamic
# per-tensor scales (a scale launch, then the quantization).
def assert_captured_chain_equals_eager(chain: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """`chain` captured in a CUDA graph with PDL gives the bits it gives eagerly, on x and on a fresh input."""
    expected = chain(x)
    static = x.clone()
    with pdl.for_graph_capture():
        assert pdl.enabled(static.device)
        chain(static)  # compiles the PDL variants outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(static)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    static.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, chain(static))


CHAINS = [(MarlinFp8LinearKernel, Scheme.FP8_BLOCK, 1), (TritonBlockFp8LinearKernel, Scheme.FP8_BLOCK, 32),
          (TritonBlockFp8LinearKernel, Scheme.FP8_CHANNEL, 300), (TorchBlockScaledMMLinearKernel, Scheme.FP8_BLOCK, 32),
          (TorchScaledMMLinearKernel, Scheme.FP8_TENSOR, 32)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="PDL needs sm_90")
@pytest.mark.parametrize("kernel_cls, scheme, m", CHAINS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_captured_pdl_chain_equals_eager_chain(seed, kernel_cls, scheme, m):
    # Square layers so each layer reads the previous one's output: a wait placed after an
    # activation load, or a store before the wait, would read stale or racing data.
    from quantgate.engine.triton_ops import rms_norm

    kernels, layers = [], []
    for _ in range(3):
        case = make_case(2048, 2048, scheme, act_dtype=torch.bfloat16, device="cuda")
        kernel = kernel_cls(case.config)
        kernel.process_weights_after_loading(case.layer)
        kernels.append(kernel)
        layers.append(case.layer)
    norm_weight = torch.rand(2048, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)

    def chain(inp: torch.Tensor) -> torch.Tensor:
        h = inp
        for kernel, layer in zip(kernels, layers):
            h = kernel.apply(layer, rms_norm(h, norm_weight, 1e-6), None)
        return h

    assert_captured_chain_equals_eager(chain, x)


MOE_CHAINS = [(TritonFusedMoEKernel, Scheme.FP8_BLOCK), (TritonFusedMoEKernel, Scheme.FP8_TENSOR),
              (MarlinMoEKernel, Scheme.FP8_BLOCK), (TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="PDL needs sm_90")
@pytest.mark.parametrize("kernel_cls, scheme", MOE_CHAINS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_captured_pdl_moe_chain_equals_eager_chain(seed, kernel_cls, scheme):
    """Three MoE layers, each routed on and fed the previous one's output (alignment, activation
    quantization, gate/up and down launches): captured with PDL, the same bits as run eagerly."""
    from quantgate.kernels.moe.routing import select_experts

    from .test_moe_reference import moe_config, moe_layer

    cfg = moe_config(scheme, experts_=16, top_k=4, hidden=256, inter=256, act_dtype=torch.bfloat16)
    kernels, layers, routers = [], [], []
    for _ in range(3):
        layer = moe_layer(cfg, "cuda")
        kernel = kernel_cls(cfg)
        kernel.process_weights_after_loading(layer)
        kernels.append(kernel)
        layers.append(layer)
        routers.append(torch.randn(cfg.hidden_size, cfg.num_experts, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(24, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)

    def chain(inp: torch.Tensor) -> torch.Tensor:
        h = inp
        for kernel, layer, router in zip(kernels, layers, routers):
            weights, ids = select_experts(h @ router, cfg.top_k, renormalize=True)
            h = kernel.apply(layer, h, weights, ids)
        return h

    assert_captured_chain_equals_eager(chain, x)
