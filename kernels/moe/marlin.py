"""Weight-only FP8 MoE (W8A16) for compute capability 8.0+, where FP8 tensor cores do not
exist: experts repacked once into the int32 k-planes layout (4 FP8 per int32), scales in the
activation dtype, activations never quantized (kernels/triton/fused_moe_w8a16.py)."""

from __future__ import annotations

import torch

from ..base import MoEKernel, Verdict, bind_processed
from ..platform import Platform
from ..schemes import MoELayerConfig, Scheme
from . import experts
from .experts import DOWN, GATE_UP
from .gpu import WORKSPACE, act_dtype_verdict, bind_workspace, block_size_verdict, first_refusal, triton_gpu_verdict


def kernel_scales(scale: torch.Tensor, config: MoELayerConfig, proj: str, where: str = "") -> torch.Tensor:
    """Checkpoint scales -> [E, ceil(K/128), N] (block) or [E, 1, N], times 2^SCALE_SHIFT, in the act dtype.

    Raises ValueError (naming `where`, the layer) when a scale does not fit the act dtype: fp16
    holds scale * 2^10 only up to 65504, and a cast would silently make it inf."""
    from ..triton.w8a16_gemm import SCALE_SHIFT

    _, n, _ = experts.weight_shape(config, proj)
    if config.scheme is Scheme.FP8_BLOCK:
        per_column = scale.double().repeat_interleave(config.block_size[0], dim=1)[:, :n, :].transpose(1, 2)
    else:
        per_column = experts.channel_scales(scale, config, proj).double()[:, None, :]
    stored = per_column * 2.0 ** SCALE_SHIFT[config.act_dtype]
    if stored.abs().max() > torch.finfo(config.act_dtype).max:  # the linear marlin kernel's check and message
        raise ValueError(
            f"{where or 'MoE layer'}.{experts.scale_attr(config, proj)}: weight scales up to "
            f"{per_column.abs().max().item():.3g} do not fit {config.act_dtype} marlin scales; serve this checkpoint "
            "with --dtype bfloat16"
        )
    return stored.to(config.act_dtype).contiguous()


class MarlinMoEKernel(MoEKernel):
    backend = "marlin"
    schemes = frozenset({Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return triton_gpu_verdict(platform, (8, 0), "bf16 tensor cores")

    @classmethod
    def can_implement(cls, config: MoELayerConfig) -> Verdict:
        return first_refusal(cls._scheme_verdict(config.scheme), experts.layout_verdict(config),
                             act_dtype_verdict(config), block_size_verdict(config))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from ..triton.fused_moe_w8a16 import pack_experts

        cfg = self.config
        experts.check_expert_tensors(layer, cfg)
        where = getattr(layer, "module_name", type(layer).__name__)
        # Every scale is converted (and checked) before anything is bound: a refused layer keeps its raw tensors.
        scales = {proj: kernel_scales(getattr(layer, experts.scale_attr(cfg, proj)), cfg, proj, where)
                  for proj in (GATE_UP, DOWN)}
        for proj in (GATE_UP, DOWN):
            bind_processed(layer, f"{proj}_weight", pack_experts(getattr(layer, f"{proj}_weight")))
            bind_processed(layer, experts.scale_attr(cfg, proj), scales[proj])
        bind_workspace(layer, cfg, layer.w13_weight.device)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        from ..triton.fused_moe_w8a16 import fused_moe_w8a16

        cfg = self.config
        return fused_moe_w8a16(
            x, topk_weights.float().contiguous(), topk_ids.to(torch.int32).contiguous(),
            layer.w13_weight, getattr(layer, experts.scale_attr(cfg, GATE_UP)),
            layer.w2_weight, getattr(layer, experts.scale_attr(cfg, DOWN)),
            hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, cursor=getattr(layer, WORKSPACE),
        )
