"""`marlin` backend: weight-only FP8 (W8A16) in Triton.

Serves FP8 checkpoints on GPUs without FP8 hardware (compute capability 8.0+) and small-M
calls anywhere: activations stay bf16/fp16 (never rounded to FP8) and weights are read as one
byte each. Two kernel families, by GPU:
- wide layers on Hopper (N >= 3K, kernels/triton/w8a16_split.py): the FP8 tensor cores take
  the weights as stored and the activations split exactly into FP8 terms; weights packed once
  into the int32 "rows" layout (each row's bytes in K order). The split is a kernel of its own,
  which only wide layers gain back (run 15).
- every other layer and GPU (kernels/triton/w8a16_gemm.py): weights widened in registers,
  bf16/fp16 tensor cores or a float32 GEMV; packed once into the int32 "k-planes" layout.
Either way scales become per-column values in the activation dtype (fp16 ones pre-multiplied by
2^10), [K groups, N] for the k-planes kernels and [N, K groups] for the split ones, and a split-K
workspace is bound. Every scheme reduces to that: block scales are expanded over their bn rows,
a channel or tensor scale is one group.
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
        from ..triton.w8a16_split import pack_weight_rows, split_layer

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
        self.split = split_layer(weight.device, n, cfg.in_features)  # fixed at load: the layout is the family's
        bind_processed(layer, "weight", pack_weight_rows(weight) if self.split else pack_weight(weight))
        # The split kernels read a column's scales along K ([N, K groups]), the others along N.
        bind_processed(layer, cfg.scale_name, (stored.t() if self.split else stored).to(cfg.act_dtype).contiguous())
        bind_processed(layer, "workspace", torch.zeros(workspace_size(n), dtype=torch.int32, device=weight.device))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from ..triton.w8a16_gemm import w8a16_gemm
        from ..triton.w8a16_split import w8a16_split_gemm

        cfg = self.config
        x2 = x.reshape(-1, cfg.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        groupwise = cfg.scheme is Scheme.FP8_BLOCK
        scale = getattr(layer, cfg.scale_name)
        if self.split:
            out = w8a16_split_gemm(x2, layer.weight, scale, groupwise=groupwise,
                                   scale_block_n=cfg.block_size[0] if groupwise else 1, bias=bias,
                                   workspace=layer.workspace)
        else:
            out = w8a16_gemm(x2, layer.weight, scale, groupwise=groupwise, bias=bias, workspace=layer.workspace)
        return out.reshape(*x.shape[:-1], cfg.out_features)
