"""FP8 linear layers as the engine hands them to a kernel, and their float64 references.

A case keeps the checkpoint tensors (FP8 weight, float32 scale, optional static input scale)
so the reference is computed from exactly the quantized operands the kernel saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from quantgate.kernels import LinearLayerConfig, Scheme, quant

SCHEMES = (Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR)
# GPU tests share one layer shape so that they (and the benchmark after them, which runs K and N
# multiples of 128) reuse compilations: K a multiple of 128, N a multiple of 16 (TMA rows) but
# not of 128 (a partial scale block and column tile). K tails run in the CPU tests.
GPU_K, GPU_N = 1408, 1008
GPU_MS = (1, 16, 300)  # the GEMV / small-M, and the large-M (TMA on Hopper) paths


@dataclass
class Fp8LinearCase:
    layer: torch.nn.Module
    config: LinearLayerConfig
    weight: torch.Tensor  # fp8 [N, K] as loaded
    scale: torch.Tensor  # float32, checkpoint shape
    input_scale: torch.Tensor | None
    bias: torch.Tensor | None

    def dequantized_weight(self) -> torch.Tensor:
        block = self.config.block_size if self.config.scheme is Scheme.FP8_BLOCK else None
        return quant.dequantize_weight(self.weight, self.scale, block, torch.float64)


def quantized_weight(w: torch.Tensor, scheme: Scheme, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    if scheme is Scheme.FP8_BLOCK:
        return quant.quantize_weight_block(w, block)
    if scheme is Scheme.FP8_CHANNEL:
        return quant.quantize_weight_channel(w)
    return quant.quantize_weight_tensor(w)


def make_case(n: int, k: int, scheme: Scheme, *, act_dtype: torch.dtype = torch.float16,
              scale_name: str = "weight_scale", block: tuple[int, int] = (128, 128), bias: bool = False,
              static_input_scale: bool = False, device: str | torch.device = "cpu") -> Fp8LinearCase:
    config = LinearLayerConfig(k, n, scheme, act_dtype=act_dtype, block_size=block if scheme is Scheme.FP8_BLOCK else None,
                               scale_name=scale_name, has_bias=bias, static_input_scale=static_input_scale)
    empty = torch.empty(0, device=device)
    return reload(Fp8LinearCase(torch.nn.Module(), config, empty, empty, None, None))


def reload(case: Fp8LinearCase) -> Fp8LinearCase:
    """New checkpoint tensors of the same shapes on the same layer (a weight reload)."""
    layer, config = case.layer, case.config
    load_checkpoint(layer, config, case.weight.device)
    return Fp8LinearCase(layer, config, layer.weight.detach().clone(), getattr(layer, config.scale_name).detach().clone(),
                         layer.input_scale.detach().clone() if config.static_input_scale else None,
                         layer.bias.detach().clone() if config.has_bias else None)


def load_checkpoint(layer: torch.nn.Module, config: LinearLayerConfig, device: str | torch.device) -> None:
    """Fresh random checkpoint tensors on `layer`, as the engine's loader sets them (also a reload)."""
    n, k = config.out_features, config.in_features
    w = torch.randn(n, k, device=device) * 0.02
    wq, scale = quantized_weight(w, config.scheme, config.block_size)
    if config.scheme is Scheme.FP8_CHANNEL:
        scale = scale.reshape(n, 1)
    layer.weight = torch.nn.Parameter(wq, requires_grad=False)
    setattr(layer, config.scale_name, scale)
    if config.static_input_scale:
        layer.input_scale = torch.tensor(0.02, device=device)
    if config.has_bias:
        layer.bias = torch.nn.Parameter(torch.randn(n, device=device).to(config.act_dtype), requires_grad=False)


def reference_w8a8(case: Fp8LinearCase, x: torch.Tensor) -> torch.Tensor:
    """float64 x_q @ w_q^T with the scheme's activation quantization (what W8A8 kernels compute).

    The activations are quantized on the CPU: torch on CUDA divides by a Python scalar as a
    product with its rounded reciprocal, so quant.py's scales (amax / 448) there can be one
    float32 ulp off the IEEE quotient the kernels compute, and bf16 activations often sit exactly
    on an FP8 rounding tie that such a scale decides the other way."""
    x2 = x.reshape(-1, x.shape[-1]).cpu()
    scheme = case.config.scheme
    if scheme is Scheme.FP8_BLOCK:
        group = case.config.block_size[1]
        xq, xs = quant.quantize_act_per_token_group(x2, group)
        xd = xq.double() * xs.double().repeat_interleave(group, dim=1)[:, : x2.shape[1]]
    elif scheme is Scheme.FP8_CHANNEL:
        xq, xs = quant.quantize_act_per_token(x2)
        xd = xq.double() * xs.double()
    else:
        static = case.input_scale.cpu() if case.input_scale is not None else None
        xq, xs = quant.quantize_act_per_tensor(x2, static)
        xd = xq.double() * xs.double()
    return _finish(case, xd.to(x.device) @ case.dequantized_weight().t(), x)


def reference_w8a16(case: Fp8LinearCase, x: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """float64 x @ w_q^T with weight scales rounded to `scale_dtype` (marlin stores them so)."""
    x2 = x.reshape(-1, x.shape[-1]).double()
    shift = 10 if scale_dtype == torch.float16 else 0
    scale = (case.scale.double() * 2.0**shift).to(scale_dtype).double() / 2.0**shift
    block = case.config.block_size if case.config.scheme is Scheme.FP8_BLOCK else None
    w = quant.dequantize_weight(case.weight, scale, block, torch.float64)
    return _finish(case, x2 @ w.t(), x)


def _finish(case: Fp8LinearCase, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if case.bias is not None:
        out = out + case.bias.double()
    return out.reshape(*x.shape[:-1], out.shape[-1])


def rel_error(out: torch.Tensor, ref: torch.Tensor, *, round_ref: bool = False) -> float:
    """mean |out - ref| / mean |ref|. round_ref: round ref to out's dtype first, for bf16 outputs,
    whose rounding alone costs ~1.4e-3 of this metric; a correct kernel then differs only where
    its float32 sum lands on the other side of a rounding boundary."""
    target = ref.to(out.dtype).double() if round_ref else ref
    return ((out.double() - target).abs().mean() / ref.abs().mean()).item()


def processed_storage(layer: torch.nn.Module) -> dict[str, int]:
    from quantgate.kernels.base import processed_names

    return {name: getattr(layer, name).data_ptr() for name in processed_names(layer)}


@pytest.fixture
def untuned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default configs only: tests check numerics, which every candidate config shares."""
    from quantgate.kernels.triton.tuning import AUTOTUNE_ENV

    monkeypatch.setenv(AUTOTUNE_ENV, "0")

