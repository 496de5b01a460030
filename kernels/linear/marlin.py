"""`marlin` backend: weight-only FP8 (W8A16) in Triton (kernels/triton/w8a16_gemm.py).

Serves FP8 checkpoints on GPUs without FP8 hardware (compute capability 8.0+) and small-M
calls anywhere: activations stay bf16/fp16, weights are read as one byte each and widened in
registers. At load, weights are repacked once into the int32 "k-planes" layout, scales become
per-column rows in the activation dtype ([K groups, N]; fp16 ones pre-multiplied by 2^10),
and a split-K workspace is bound. Every scheme reduces to that scale layout: block scales are
expanded over their bn rows, a channel or tensor scale is one row.
"""

from __future__ import annotations

import torch

from ..base import LinearKernel, Verdict, bind_processed
from ..platform import Platform
from ..schemes import LinearLayerConfig, Scheme
from .fp8_checkpoint import fp8_weight, weight_scale
from .support import cuda_verdict, dtype_verdict, first_failure

_GROUP_K = 128


class MarlinFp8LinearKernel(LinearKernel):
    backend = "marlin"
    schemes = frozenset({Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return cuda_verdict(platform, (8, 0), "bf16 tensor cores", triton=True)

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        verdict = first_failure(cls._scheme_verdict(config.scheme),
                                dtype_verdict(config, (torch.bfloat16, torch.float16), "W8A16 computes in"))
        if verdict[0] and config.scheme is Scheme.FP8_BLOCK and config.block_size[1] != _GROUP_K:
            return False, f"weight blocks must be {_GROUP_K} wide along K; this checkpoint has {list(config.block_size)}"
        return verdict

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from ..triton.w8a16_gemm import SCALE_SHIFT, pack_weight, workspace_size

        cfg = self.config
        weight = fp8_weight(layer, cfg)
        scale = weight_scale(layer, cfg)
        n = cfg.out_features
        if cfg.scheme is Scheme.FP8_BLOCK:
            columns = scale.repeat_interleave(cfg.block_size[0], dim=0)[:n].t()  # [K groups, N]
        else:
            columns = scale.expand(n).reshape(1, n)
        stored = columns.to(torch.float64) * 2.0 ** SCALE_SHIFT[cfg.act_dtype]
        limit = torch.finfo(cfg.act_dtype).max
        if stored.abs().max() > limit:
            raise ValueError(
                f"{type(layer).__name__}.{cfg.scale_name}: weight scales up to {columns.abs().max().item():.3g} do not fit "
                f"{cfg.act_dtype} marlin scales; serve this checkpoint with --dtype bfloat16"
            )
        bind_processed(layer, "weight", pack_weight(weight))
        bind_processed(layer, cfg.scale_name, stored.to(cfg.act_dtype).contiguous())
        bind_processed(layer, "workspace", torch.zeros(workspace_size(n), dtype=torch.int32, device=weight.device))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from ..triton.w8a16_gemm import w8a16_gemm

        cfg = self.config
        x2 = x.reshape(-1, cfg.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = w8a16_gemm(x2, layer.weight, getattr(layer, cfg.scale_name), groupwise=cfg.scheme is Scheme.FP8_BLOCK,
                         bias=bias, workspace=layer.workspace)
        return out.reshape(*x.shape[:-1], cfg.out_features)
