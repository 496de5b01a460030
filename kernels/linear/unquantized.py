"""Unquantized layers (bf16/fp16/fp32 checkpoints, lm_head): one dense matmul in the activation dtype."""

from __future__ import annotations

import torch

from ..base import OK, LinearKernel, Verdict, bind_processed
from ..platform import Platform
from ..schemes import LinearLayerConfig, Scheme


class UnquantizedLinearKernel(LinearKernel):
    backend = "torch"
    schemes = frozenset({Scheme.UNQUANTIZED})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return OK

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        return cls._scheme_verdict(config.scheme)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        bind_processed(layer, "weight", layer.weight.detach().to(self.config.act_dtype).contiguous())

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x, layer.weight, bias)
