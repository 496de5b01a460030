"""The stacked expert tensors every MoE backend reads, and the facts all backends share.

Layout (DESIGN.md, set by the engine loader): `w13_weight` [E, 2I, H] (gate rows, then up
rows), `w2_weight` [E, H, I], scales `w13_<scale_name>` / `w2_<scale_name>` (block
[E, 2I/bn, ceil(H/bk)] / [E, ceil(H/bn), ceil(I/bk)]; channel [E, 2I, 1] / [E, H, 1];
tensor [E, 2] (gate, up) / [E]) and optional static `w13_input_scale` / `w2_input_scale` [E].

A static activation scale is one number per GEMM for all experts: the largest of the
experts' calibrated scales (no expert's activations clip), as vLLM does, so that the
activations are quantized once per GEMM and every backend agrees on the numbers.
"""

from __future__ import annotations

import math

import torch

from .. import quant
from ..base import OK, Verdict, processed_names
from ..schemes import MoELayerConfig, Scheme

GATE_UP, DOWN = "w13", "w2"


def weight_shape(config: MoELayerConfig, proj: str) -> tuple[int, int, int]:
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    return (e, 2 * i, h) if proj == GATE_UP else (e, h, i)


def scale_attr(config: MoELayerConfig, proj: str) -> str:
    return f"{proj}_{config.scale_name}"


def scale_shape(config: MoELayerConfig, proj: str) -> tuple[int, ...]:
    e, n, k = weight_shape(config, proj)
    if config.scheme is Scheme.FP8_BLOCK:
        bn, bk = config.block_size
        return (e, math.ceil(n / bn), math.ceil(k / bk))
    if config.scheme is Scheme.FP8_CHANNEL:
        return (e, n, 1)
    if config.scheme is Scheme.FP8_TENSOR:
        return (e, 2) if proj == GATE_UP else (e,)
    raise ValueError(f"scheme {config.scheme.value} has no weight scales")


def layout_verdict(config: MoELayerConfig) -> Verdict:
    """Can the stacked layout hold this layer at all? Shared by every backend's can_implement."""
    if min(config.num_experts, config.top_k, config.hidden_size, config.intermediate_size) < 1:
        return False, f"sizes must be positive: {config}"
    if config.top_k > config.num_experts:
        return False, f"top_k {config.top_k} exceeds the number of experts {config.num_experts}"
    if config.activation != "silu":
        return False, f"activation {config.activation!r} not handled (handles: silu)"
    if config.scheme is Scheme.FP8_BLOCK and config.intermediate_size % config.block_size[0]:
        # gate and up rows are stacked into one [2I, H] weight: with a partial last block the
        # up half's scale blocks would straddle the gate/up boundary.
        return False, (f"fp8-block needs the expert intermediate size ({config.intermediate_size}) to be a "
                       f"multiple of the block height {config.block_size[0]}")
    return OK


def check_expert_tensors(layer: torch.nn.Module, config: MoELayerConfig) -> None:
    """Raise one ValueError naming every stacked tensor whose shape or dtype does not fit `config`."""
    problems = []
    weight_dtype = quant.FP8_DTYPE if config.scheme.is_fp8 else config.act_dtype
    for proj in (GATE_UP, DOWN):
        expected = [(f"{proj}_weight", weight_shape(config, proj), weight_dtype)]
        if config.scheme.is_fp8:
            expected.append((scale_attr(config, proj), scale_shape(config, proj), None))
        for name, shape, dtype in expected:
            tensor = getattr(layer, name, None)
            if tensor is None:
                problems.append(f"{name} is missing")
            elif tuple(tensor.shape) != shape or (dtype is not None and tensor.dtype != dtype):
                want = f"{shape}" + (f" {dtype}" if dtype is not None else "")
                problems.append(f"{name} is {tuple(tensor.shape)} {tensor.dtype}, expected {want}")
    if problems:
        # A layer a kernel processed already holds that kernel's layout (dequantized, repacked): then
        # the fix is to load the checkpoint tensors again, not to change how the loader stacks them.
        stacking = ("the loader must stack per-expert gate_proj/up_proj into w13 and down_proj into w2 "
                    "(see kernels/moe/experts.py)")
        fix = (f"This layer was processed already: load the checkpoint tensors again before processing it "
               f"again (otherwise {stacking})" if processed_names(layer) else stacking[0].upper() + stacking[1:])
        raise ValueError(
            f"MoE layer tensors do not match its config ({config.scheme.value}, experts={config.num_experts}, "
            f"hidden={config.hidden_size}, intermediate={config.intermediate_size}): " + "; ".join(problems)
            + f". {fix}"
        )


def dequantize_experts(weight: torch.Tensor, scale: torch.Tensor | None, config: MoELayerConfig,
                       proj: str) -> torch.Tensor:
    """Stacked weight (+ scale) -> float32 [E, N, K] real values."""
    if config.scheme is Scheme.UNQUANTIZED:
        return weight.float()
    if config.scheme is Scheme.FP8_BLOCK:
        return torch.stack([quant.dequantize_weight(w, s, config.block_size) for w, s in zip(weight, scale.float())])
    return weight.float() * channel_scales(scale, config, proj)[:, :, None]


def channel_scales(scale: torch.Tensor, config: MoELayerConfig, proj: str) -> torch.Tensor:
    """Channel or tensor scales -> one float32 scale per output row, [E, N] (tensor: gate and up rows apart)."""
    e, n, _ = weight_shape(config, proj)
    scale = scale.float()
    if config.scheme is Scheme.FP8_CHANNEL:
        return scale.reshape(e, n)
    if proj == GATE_UP:
        return scale.repeat_interleave(config.intermediate_size, dim=1)
    return scale.reshape(e, 1).expand(e, n)


def static_input_scale(layer: torch.nn.Module, config: MoELayerConfig, proj: str) -> torch.Tensor | None:
    """The static per-tensor activation scale of one GEMM (0-d float32), or None for dynamic scaling."""
    if config.scheme is not Scheme.FP8_TENSOR or not config.static_input_scale:
        return None
    scale = getattr(layer, f"{proj}_input_scale", None)
    if scale is None:
        raise ValueError(f"the config says static input scales but the layer has no {proj}_input_scale; "
                         "load it from the checkpoint's input_scale tensors or set static_input_scale=False")
    return scale.float().max().reshape(())


def quantize_experts(w13: torch.Tensor, w2: torch.Tensor, config: MoELayerConfig) -> dict[str, torch.Tensor]:
    """Float expert weights [E, 2I, H] and [E, H, I] -> the stacked checkpoint tensors of `config.scheme`,
    quantizing gate, up and down of each expert on their own as a per-expert checkpoint does."""
    if config.scheme is Scheme.UNQUANTIZED:
        return {"w13_weight": w13.to(config.act_dtype), "w2_weight": w2.to(config.act_dtype)}
    quantize = {
        Scheme.FP8_BLOCK: lambda w: quant.quantize_weight_block(w, config.block_size),
        Scheme.FP8_CHANNEL: quant.quantize_weight_channel,
        Scheme.FP8_TENSOR: quant.quantize_weight_tensor,
    }[config.scheme]
    tensors = {}
    for proj, stacked in ((GATE_UP, w13), (DOWN, w2)):
        parts = stacked.split(config.intermediate_size, dim=1) if proj == GATE_UP else (stacked,)
        weights, scales = [], []
        for expert in range(stacked.shape[0]):
            qs = [quantize(part[expert]) for part in parts]
            weights.append(torch.cat([q for q, _ in qs]))
            scales.append(torch.stack([s for _, s in qs]) if config.scheme is Scheme.FP8_TENSOR
                          else torch.cat([s for _, s in qs]))
        tensors[f"{proj}_weight"] = torch.stack(weights)
        tensors[scale_attr(config, proj)] = torch.stack(scales).reshape(scale_shape(config, proj))
    return tensors
