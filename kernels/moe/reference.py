"""The float64 reference of a MoE layer, which every MoE backend is checked against (tests/kernels,
benchmarks/bench_moe.py).

It reads the checkpoint tensors (FP8 values and float32 scales, or unquantized weights) and a
routing, dequantizes in float64, and quantizes activations where the W8A8 backends do: the layer
input, and the SiLU(gate) * up intermediate entering the down projection. The quantization is
kernels/quant.py's, the one definition the kernels follow (act_quant.py, fused_moe.py):

  scale = float32(amax / 448), one correctly rounded division (never a product with a rounded
          1/448), at least 1e-12; amax over a 1x128 group (block), a row (channel) or the whole
          tensor (tensor; a static input scale replaces it);
  value = e4m3 round-to-nearest-even of float32(a / scale), after clamping to +-448;
  a     = the layer input, or the float32 SiLU(gate) * up (never rounded to the activation dtype).

Why so strict: the intermediate is quantized to FP8, so a backend has to reproduce the gate/up
result before that quantization to about 1e-5. A relative difference d there moves about d / ulp
of the FP8 roundings by one step (ulp is 6-12% of the value) and costs about sqrt(d * ulp) of the
output's mean relative error: d = 2e-3 costs 1e-2. Scales must therefore agree bit for bit: bf16
activations often land exactly on an FP8 rounding tie, which a scale one float32 ulp away
decides the other way. torch on CUDA divides by a Python scalar as a multiplication by its
rounded reciprocal, so this reference quantizes on the CPU, whose division is IEEE, whatever
device the layer is on.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .. import quant
from ..schemes import MoELayerConfig, Scheme
from . import experts
from .experts import DOWN, GATE_UP


def dequantize64(weight: torch.Tensor, scale: torch.Tensor | None, config: MoELayerConfig, proj: str) -> torch.Tensor:
    """Stacked checkpoint weight (+ scale) -> float64 [E, N, K]."""
    w = weight.double()
    if config.scheme is Scheme.UNQUANTIZED:
        return w
    s = scale.double()
    if config.scheme is Scheme.FP8_BLOCK:
        bn, bk = config.block_size
        return w * s.repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)[:, : w.shape[1], : w.shape[2]]
    if config.scheme is Scheme.FP8_CHANNEL:
        return w * s.reshape(s.shape[0], -1, 1)
    if proj == GATE_UP:
        i = config.intermediate_size
        return torch.cat([w[:, :i] * s[:, 0, None, None], w[:, i:] * s[:, 1, None, None]], dim=1)
    return w * s.reshape(-1, 1, 1)


def qdq_activation64(a: torch.Tensor, config: MoELayerConfig, static_scale: torch.Tensor | None) -> torch.Tensor:
    """[M, K] -> float64 values after the scheme's FP8 activation quantization, on a's device."""
    if config.scheme is Scheme.UNQUANTIZED:
        return a.double()
    cpu = a.float().cpu()  # IEEE scale arithmetic (module docstring)
    if config.scheme is Scheme.FP8_BLOCK:
        group = config.block_size[1]
        q, s = quant.quantize_act_per_token_group(cpu, group)
        deq = q.double() * s.double().repeat_interleave(group, dim=1)[:, : a.shape[1]]
    elif config.scheme is Scheme.FP8_CHANNEL:
        q, s = quant.quantize_act_per_token(cpu)
        deq = q.double() * s.double()
    else:
        q, s = quant.quantize_act_per_tensor(cpu, None if static_scale is None else static_scale.cpu())
        deq = q.double() * s.double()
    return deq.to(a.device)


def _weight_only_scales(tensors: dict[str, torch.Tensor], config: MoELayerConfig) -> dict[str, torch.Tensor]:
    """The weight scales as marlin stores them: in the activation dtype, fp16 ones times 2^SCALE_SHIFT."""
    from ..triton.w8a16_gemm import SCALE_SHIFT  # only weight-only references need triton

    shift = 2.0 ** SCALE_SHIFT[config.act_dtype]
    tensors = dict(tensors)
    for proj in (GATE_UP, DOWN):
        name = experts.scale_attr(config, proj)
        tensors[name] = (tensors[name].double() * shift).to(config.act_dtype).double() / shift
    return tensors


def _dequantized(tensors: dict[str, torch.Tensor], config: MoELayerConfig, proj: str) -> torch.Tensor:
    return dequantize64(tensors[f"{proj}_weight"], tensors.get(experts.scale_attr(config, proj)), config, proj)


def _static_scale(tensors: dict[str, torch.Tensor], config: MoELayerConfig, proj: str) -> torch.Tensor | None:
    return tensors[f"{proj}_input_scale"].float().max() if config.static_input_scale else None


def _by_expert(topk_ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(expert, its slots) for the experts that got tokens; slot = token * top_k + choice."""
    flat = topk_ids.flatten().long()
    return [(e, (flat == e).nonzero().squeeze(1)) for e in flat.unique().tolist()]


def intermediate64(tensors: dict[str, torch.Tensor], config: MoELayerConfig, x: torch.Tensor,
                   topk_ids: torch.Tensor, *, weight_only: bool = False) -> torch.Tensor:
    """float64 SiLU(gate) * up per slot [T * top_k, I], before the down projection's quantization."""
    act_config = dataclasses.replace(config, scheme=Scheme.UNQUANTIZED) if weight_only else config
    w13 = _dequantized(_weight_only_scales(tensors, config) if weight_only else tensors, config, GATE_UP)
    x64 = qdq_activation64(x, act_config, _static_scale(tensors, config, GATE_UP))
    top_k = topk_ids.shape[1]
    inter = x64.new_zeros(topk_ids.numel(), config.intermediate_size)
    # One expert at a time: gathering [T, k, 2I, H] weights would not fit for real layer shapes.
    for e, slots in _by_expert(topk_ids):
        gate, up = (x64[slots // top_k] @ w13[e].t()).split(config.intermediate_size, dim=1)
        inter[slots] = F.silu(gate) * up
    return inter


def reference_moe(tensors: dict[str, torch.Tensor], config: MoELayerConfig, x: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, weight_only: bool = False) -> torch.Tensor:
    """float64 [T, H] of the layer whose checkpoint tensors are `tensors` (`w13_weight`, `w2_weight`,
    their scales, optional `*_input_scale`) for input x [T, H] and the given routing.

    weight_only: W8A16 as marlin computes it: activations are not quantized, and the weight scales
    are rounded as marlin stores them."""
    inter = intermediate64(tensors, config, x, topk_ids, weight_only=weight_only)
    if weight_only:
        tensors = _weight_only_scales(tensors, config)
    else:
        inter = qdq_activation64(inter, config, _static_scale(tensors, config, DOWN))
    w2 = _dequantized(tensors, config, DOWN)
    top_k = topk_ids.shape[1]
    out = inter.new_zeros(x.shape[0], config.hidden_size)
    for e, slots in _by_expert(topk_ids):
        out.index_add_(0, slots // top_k, (inter[slots] @ w2[e].t()) * topk_weights.flatten()[slots, None].double())
    return out


def near_fp8_tie(a: torch.Tensor, config: MoELayerConfig, static_scale: torch.Tensor | None,
                 margin: float) -> torch.Tensor:
    """bool [M]: rows of a [M, K] holding a value whose FP8 rounding (under the scheme's
    activation scales) changes when a / scale moves by a relative `margin`."""
    cpu = a.float().cpu()
    if config.scheme is Scheme.FP8_BLOCK:
        group = config.block_size[1]
        scale = quant.quantize_act_per_token_group(cpu, group)[1].repeat_interleave(group, dim=1)[:, : a.shape[1]]
    elif config.scheme is Scheme.FP8_CHANNEL:
        scale = quant.quantize_act_per_token(cpu)[1]
    else:
        scale = quant.quantize_act_per_tensor(cpu, None if static_scale is None else static_scale.cpu())[1]
    q = cpu.double() / scale.double()
    flips = quant.to_fp8(q * (1 + margin)).float() != quant.to_fp8(q * (1 - margin)).float()
    return flips.any(dim=1).to(a.device)


def mean_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Issue 4's metric: mean |out - ref| / mean |ref|."""
    return float((out.double() - ref).abs().mean() / ref.abs().mean())
