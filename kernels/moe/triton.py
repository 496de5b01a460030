"""Fused MoE on Triton (kernels/triton/fused_moe.py): W8A8 FP8 on compute capability 8.9+
(FP8 tensor cores), and the unquantized bf16/fp16 path from 8.0. Two classes because the
capability depends on the scheme and each check sees only one of platform and layer."""

from __future__ import annotations

import torch

from ..base import MoEKernel, Verdict, bind_processed
from ..platform import Platform
from ..schemes import MoELayerConfig, Scheme
from . import experts
from .experts import DOWN, GATE_UP
from .gpu import WORKSPACE, act_dtype_verdict, bind_workspace, block_size_verdict, first_refusal, triton_gpu_verdict

_ACTIVATION_QUANT = {Scheme.FP8_BLOCK: "group", Scheme.FP8_CHANNEL: "token", Scheme.FP8_TENSOR: "tensor"}


class TritonFusedMoEKernel(MoEKernel):
    """W8A8: block (1x128 activation groups, quantization fused into gate/up), channel
    (per-token activations) and tensor (static or dynamic per-tensor activations)."""

    backend = "triton"
    schemes = frozenset({Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return triton_gpu_verdict(platform, (8, 9), "FP8 tensor cores")

    @classmethod
    def can_implement(cls, config: MoELayerConfig) -> Verdict:
        return first_refusal(cls._scheme_verdict(config.scheme), experts.layout_verdict(config),
                             act_dtype_verdict(config), block_size_verdict(config))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        cfg = self.config
        experts.check_expert_tensors(layer, cfg)
        for proj in (GATE_UP, DOWN):
            weight = getattr(layer, f"{proj}_weight")
            bind_processed(layer, f"{proj}_weight", weight.contiguous())
            name = experts.scale_attr(cfg, proj)
            bind_processed(layer, name, getattr(layer, name).float().contiguous())
            input_scale = experts.static_input_scale(layer, cfg, proj)
            if input_scale is not None:
                bind_processed(layer, f"{proj}_input_scale", input_scale)
        bind_workspace(layer, cfg, layer.w13_weight.device)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        from ..triton import fused_moe

        cfg = self.config
        w13_scale = getattr(layer, experts.scale_attr(cfg, GATE_UP))
        w2_scale = getattr(layer, experts.scale_attr(cfg, DOWN))
        if cfg.scheme is Scheme.FP8_TENSOR:
            w13_scales, w2_scales = fused_moe.tensor_scales(w13_scale), fused_moe.tensor_scales(w2_scale)
        else:
            per_rows = fused_moe.block_scales if cfg.scheme is Scheme.FP8_BLOCK else fused_moe.channel_scales
            w13_scales, w2_scales = per_rows(w13_scale, cfg.intermediate_size), per_rows(w2_scale)
        static = cfg.static_input_scale and cfg.scheme is Scheme.FP8_TENSOR
        return fused_moe.fused_moe_fp8(
            x, topk_weights.float().contiguous(), topk_ids.to(torch.int32).contiguous(),
            layer.w13_weight, w13_scales, layer.w2_weight, w2_scales,
            activation=_ACTIVATION_QUANT[cfg.scheme],
            input_scales=(layer.w13_input_scale, layer.w2_input_scale) if static else (None, None),
            cursor=getattr(layer, WORKSPACE),
        )


class TritonUnquantizedMoEKernel(MoEKernel):
    """bf16/fp16 experts on bf16/fp16 tensor cores (bf16 checkpoints, or MoE layers an FP8
    checkpoint leaves unquantized)."""

    backend = "triton"
    schemes = frozenset({Scheme.UNQUANTIZED})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return triton_gpu_verdict(platform, (8, 0), "bf16 tensor cores")

    @classmethod
    def can_implement(cls, config: MoELayerConfig) -> Verdict:
        return first_refusal(cls._scheme_verdict(config.scheme), experts.layout_verdict(config),
                             act_dtype_verdict(config))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        cfg = self.config
        experts.check_expert_tensors(layer, cfg)
        for proj in (GATE_UP, DOWN):
            bind_processed(layer, f"{proj}_weight", getattr(layer, f"{proj}_weight").contiguous())
        bind_workspace(layer, cfg, layer.w13_weight.device)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        from ..triton import fused_moe

        return fused_moe.fused_moe_unquantized(
            x, topk_weights.float().contiguous(), topk_ids.to(torch.int32).contiguous(),
            layer.w13_weight, layer.w2_weight, cursor=getattr(layer, WORKSPACE),
        )
