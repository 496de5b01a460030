"""The float64 reference every MoE backend is checked against, the layers it is checked on, and a
check of the reference itself against a per-token loop.

The reference sees the same quantized experts (FP8 values and float32 scales) and the same
routing as the kernel under test, dequantizes in float64, quantizes activations where the
W8A8 schemes do (kernels/quant.py: the one definition of the FP8 numerics) and multiplies
in float64.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from quantgate.kernels import quant
from quantgate.kernels.moe import experts
from quantgate.kernels.moe.routing import select_experts
from quantgate.kernels.schemes import MoELayerConfig, Scheme

FP8_SCHEMES = (Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR)
# Issue 4's bar: mean |out - ref| / mean |ref|. A float32 kernel sits near 1e-7, except where an
# intermediate activation lands on an FP8 rounding boundary and rounds the other way (one
# element off by one FP8 step: ~5e-4 on that token's row, seen in ~1% of 37-token runs).
TOLERANCE = 1e-3
# bf16 keeps 8 significant bits: rounding each top-k slot and then their sum costs ~3e-3 of
# the metric by itself (float16: ~3e-4), so bf16 outputs are held to this instead.
BF16_TOLERANCE = 6e-3


def moe_config(scheme: Scheme, *, experts_: int = 8, top_k: int = 2, hidden: int = 192, inter: int = 128,
               act_dtype: torch.dtype = torch.float32, scale_name: str = "weight_scale",
               static_input_scale: bool = False) -> MoELayerConfig:
    return MoELayerConfig(num_experts=experts_, top_k=top_k, hidden_size=hidden, intermediate_size=inter,
                          scheme=scheme, act_dtype=act_dtype, scale_name=scale_name,
                          static_input_scale=static_input_scale)


def moe_layer(config: MoELayerConfig, device: str = "cpu") -> torch.nn.Module:
    """A module holding random stacked experts in the checkpoint layout the loader produces."""
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    w13 = torch.randn(e, 2 * i, h) / h ** 0.5
    w2 = torch.randn(e, h, i) / i ** 0.5
    layer = torch.nn.Module()
    for name, tensor in experts.quantize_experts(w13, w2, config).items():
        layer.register_buffer(name, tensor.to(device), persistent=False)
    if config.static_input_scale:
        # Calibrated scales differ per expert; the kernels use the largest one.
        layer.register_buffer("w13_input_scale", (0.02 + 0.01 * torch.rand(e)).to(device), persistent=False)
        layer.register_buffer("w2_input_scale", (0.01 + 0.01 * torch.rand(e)).to(device), persistent=False)
    return layer


def raw_tensors(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the checkpoint tensors, taken before a kernel processes the layer."""
    return {name: t.clone() for name, t in layer.named_buffers()}


def routing(num_tokens: int, config: MoELayerConfig, device: str = "cpu",
            skip_experts: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(num_tokens, config.num_experts, device=device)
    logits[:, list(skip_experts)] = -torch.inf  # experts that receive no tokens
    return select_experts(logits, config.top_k, renormalize=True)


def _dequantize64(weight: torch.Tensor, scale: torch.Tensor | None, config: MoELayerConfig, proj: str) -> torch.Tensor:
    w = weight.double()
    if config.scheme is Scheme.UNQUANTIZED:
        return w
    s = scale.double()
    if config.scheme is Scheme.FP8_BLOCK:
        bn, bk = config.block_size
        full = s.repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)[:, : w.shape[1], : w.shape[2]]
        return w * full
    if config.scheme is Scheme.FP8_CHANNEL:
        return w * s
    if proj == "w13":
        i = config.intermediate_size
        return torch.cat([w[:, :i] * s[:, 0, None, None], w[:, i:] * s[:, 1, None, None]], dim=1)
    return w * s[:, None, None]


def _qdq64(a: torch.Tensor, config: MoELayerConfig, static_scale: torch.Tensor | None) -> torch.Tensor:
    if config.scheme is Scheme.FP8_BLOCK:
        q, s = quant.quantize_act_per_token_group(a.float(), config.block_size[1])
        return q.double() * s.double().repeat_interleave(config.block_size[1], dim=1)[:, : a.shape[1]]
    if config.scheme is Scheme.FP8_CHANNEL:
        q, s = quant.quantize_act_per_token(a.float())
        return q.double() * s.double()
    if config.scheme is Scheme.FP8_TENSOR:
        q, s = quant.quantize_act_per_tensor(a.float(), static_scale)
        return q.double() * s.double()
    return a.double()


def reference_moe(raw: dict[str, torch.Tensor], config: MoELayerConfig, x: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, weight_only: bool = False) -> torch.Tensor:
    """float64 [T, H] for the checkpoint tensors `raw` (see raw_tensors) and the given routing.

    weight_only: W8A16 as marlin computes it: activations are not quantized, and the weight
    scales are those marlin stores, rounded to the activation dtype (fp16 ones times 2^10)."""
    raw = dict(raw)
    act_config = config
    if weight_only:
        shift = 10 if config.act_dtype == torch.float16 else 0
        for p in ("w13", "w2"):
            name = experts.scale_attr(config, p)
            raw[name] = (raw[name].double() * 2.0**shift).to(config.act_dtype).double() / 2.0**shift
        act_config = dataclasses.replace(config, scheme=Scheme.UNQUANTIZED)
    w13, w2 = (_dequantize64(raw[f"{p}_weight"], raw.get(experts.scale_attr(config, p)), config, p)
               for p in ("w13", "w2"))
    static = {p: raw[f"{p}_input_scale"].float().max() if config.static_input_scale else None for p in ("w13", "w2")}
    top_k = topk_ids.shape[1]
    flat = topk_ids.flatten().long()
    # One expert at a time: gathering [T, k, 2I, H] weights would not fit for real layer shapes.
    by_expert = [(e, (flat == e).nonzero().squeeze(1)) for e in flat.unique().tolist()]
    x64 = _qdq64(x, act_config, static["w13"])
    inter = x64.new_zeros(flat.numel(), config.intermediate_size)
    for e, slots in by_expert:
        gate, up = (x64[slots // top_k] @ w13[e].t()).split(config.intermediate_size, dim=1)
        inter[slots] = F.silu(gate) * up
    inter = _qdq64(inter, act_config, static["w2"])
    out = x64.new_zeros(x.shape[0], config.hidden_size)
    for e, slots in by_expert:
        out.index_add_(0, slots // top_k, (inter[slots] @ w2[e].t()) * topk_weights.flatten()[slots, None].double())
    return out


def mean_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().mean() / ref.abs().mean())


def test_reference_matches_a_per_token_loop(seed: int) -> None:
    cfg = moe_config(Scheme.UNQUANTIZED, hidden=40, inter=24)
    layer = moe_layer(cfg)
    x = torch.randn(5, cfg.hidden_size)
    weights, ids = routing(5, cfg)
    expected = torch.zeros(5, cfg.hidden_size, dtype=torch.float64)
    for t in range(5):
        for j in range(cfg.top_k):
            e = int(ids[t, j])
            gate, up = (layer.w13_weight[e].double() @ x[t].double()).split(cfg.intermediate_size)
            expected[t] += float(weights[t, j]) * (layer.w2_weight[e].double() @ (F.silu(gate) * up))
    got = reference_moe(raw_tensors(layer), cfg, x, weights, ids)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_quantize_experts_round_trips(scheme: Scheme, seed: int) -> None:
    cfg = moe_config(scheme, hidden=200, inter=128)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    w13, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    tensors = experts.quantize_experts(w13, w2, cfg)
    for proj, w in (("w13", w13), ("w2", w2)):
        assert tensors[f"{proj}_weight"].dtype == quant.FP8_DTYPE
        assert tuple(tensors[experts.scale_attr(cfg, proj)].shape) == experts.scale_shape(cfg, proj)
        real = _dequantize64(tensors[f"{proj}_weight"], tensors[experts.scale_attr(cfg, proj)], cfg, proj)
        # e4m3 keeps 3 mantissa bits: at most half an ulp (1/16) of relative error per element.
        assert float((real - w.double()).abs().max() / w.abs().max()) < 1 / 16
