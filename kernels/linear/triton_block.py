"""`triton` backend: W8A8 FP8 GEMM in Triton (kernels/triton/fp8_block_gemm.py).

Block checkpoints: activations quantized per token in 1x128 groups, weights in 128 x bn blocks.
Channel checkpoints: per-token activations, per-channel weights. Needs FP8 tensor cores
(compute capability 8.9+). Up to 16 rows the activations are quantized inside the GEMM (one
launch per call); above, by a Triton kernel before it. A small per-layer workspace (split-K
tile counters, all zero between calls) is bound once so small-M calls can spread K over the
whole GPU.
"""

from __future__ import annotations

import torch

from ..base import LinearKernel, Verdict, bind_processed
from ..platform import Platform
from ..schemes import LinearLayerConfig, Scheme
from .fp8_checkpoint import fp8_weight, weight_scale
from .support import cuda_verdict, dtype_verdict, first_failure

_GROUP_K = 128  # the GEMM's K step; block checkpoints must use it as their K block


class TritonBlockFp8LinearKernel(LinearKernel):
    backend = "triton"
    schemes = frozenset({Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return cuda_verdict(platform, (8, 9), "FP8 tensor cores", triton=True)

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        verdict = first_failure(cls._scheme_verdict(config.scheme),
                                dtype_verdict(config, (torch.bfloat16, torch.float16, torch.float32), "outputs"))
        if verdict[0] and config.scheme is Scheme.FP8_BLOCK and config.block_size[1] != _GROUP_K:
            return False, f"weight blocks must be {_GROUP_K} wide along K; this checkpoint has {list(config.block_size)}"
        return verdict

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from ..triton.fp8_block_gemm import workspace_size

        cfg = self.config
        weight = fp8_weight(layer, cfg).contiguous()
        scale = weight_scale(layer, cfg)
        bind_processed(layer, "weight", weight)
        bind_processed(layer, cfg.scale_name, scale)
        bind_processed(layer, "workspace",
                       torch.zeros(workspace_size(cfg.out_features), dtype=torch.int32, device=weight.device))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from ..triton.fp8_block_gemm import w8a8_linear

        cfg = self.config
        x2 = x.reshape(-1, cfg.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        groupwise = cfg.scheme is Scheme.FP8_BLOCK
        out = w8a8_linear(x2, layer.weight, getattr(layer, cfg.scale_name), x.dtype, groupwise=groupwise,
                          scale_block_n=cfg.block_size[0] if groupwise else 1, bias=bias, workspace=layer.workspace)
        return out.reshape(*x.shape[:-1], cfg.out_features)
