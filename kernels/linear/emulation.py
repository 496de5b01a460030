"""Reference linear: dequantize, quantize-dequantize activations as the scheme does, matmul in float32.

Runs anywhere. It is the numerical reference for the fast W8A8 backends, so activations
follow the scheme's quantization (1x128 groups for block, per token for channel, per
tensor for tensor) before the float32 product.
"""

from __future__ import annotations

import torch

from .. import quant
from ..base import OK, LinearKernel, Verdict, bind_processed
from ..platform import Platform
from ..schemes import LinearLayerConfig, MoELayerConfig, Scheme
from .fp8_checkpoint import fp8_weight, static_input_scale, weight_scale


def qdq_activation(
    x: torch.Tensor, config: LinearLayerConfig | MoELayerConfig, input_scale: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] -> float32 values after the scheme's dynamic (or static) FP8 activation quantization."""
    if config.scheme is Scheme.FP8_BLOCK:
        group = config.block_size[1]
        return quant.dequantize_act(*quant.quantize_act_per_token_group(x, group), group=group)
    if config.scheme is Scheme.FP8_CHANNEL:
        return quant.dequantize_act(*quant.quantize_act_per_token(x))
    if config.scheme is Scheme.FP8_TENSOR:
        return quant.dequantize_act(*quant.quantize_act_per_tensor(x, input_scale))
    return x.float()


class EmulationLinearKernel(LinearKernel):
    backend = "emulation"
    schemes = frozenset(Scheme)

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return OK

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        return cls._scheme_verdict(config.scheme)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        cfg = self.config
        if cfg.scheme is Scheme.UNQUANTIZED:
            bind_processed(layer, "weight", layer.weight.detach().float())
            return
        # Validated: a second run on already dequantized weights would scale them twice.
        weight, scale = fp8_weight(layer, cfg), weight_scale(layer, cfg)
        block = cfg.block_size if cfg.scheme is Scheme.FP8_BLOCK else None
        # Kept dequantized in float32: the product is then exactly fp8 values times scales.
        bind_processed(layer, "weight", quant.dequantize_weight(weight, scale, block))
        bind_processed(layer, cfg.scale_name, scale)
        static_input_scale(layer, cfg)  # a static scale the config declares must be there

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq = qdq_activation(x2, self.config, layer.input_scale if self.config.static_input_scale else None)
        out = xq @ layer.weight.t()
        if bias is not None:
            out = out + bias.float()
        return out.to(x.dtype).reshape(*shape[:-1], out.shape[-1])
