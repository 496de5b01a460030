"""Read and validate the checkpoint tensors an FP8 linear kernel starts from.

Every FP8 backend's `process_weights_after_loading` begins here, so a wrong dtype or scale
shape (or processing twice without reloading the checkpoint tensors) fails with one clear
message naming the layer attribute, instead of deep inside a GEMM.
"""

from __future__ import annotations

import torch

from .. import quant
from ..schemes import LinearLayerConfig, Scheme


def fp8_weight(layer: torch.nn.Module, config: LinearLayerConfig) -> torch.Tensor:
    """layer.weight as the checkpoint's contiguous float8_e4m3fn [N, K]."""
    w = layer.weight.detach()
    expected = (config.out_features, config.in_features)
    # Contiguous too: a processed weight may be a transposed view whose shape matches when N == K.
    if w.dtype != quant.FP8_DTYPE or tuple(w.shape) != expected or not w.is_contiguous():
        raise ValueError(
            f"{type(layer).__name__}.weight must be the checkpoint's {quant.FP8_DTYPE} tensor of shape {list(expected)}, "
            f"got {w.dtype} {list(w.shape)}; if this layer was processed already, load the checkpoint tensors "
            "again before processing it again"
        )
    return w


def weight_scale(layer: torch.nn.Module, config: LinearLayerConfig) -> torch.Tensor:
    """The checkpoint scale (under config.scale_name) as float32: block [ceil(N/bn), ceil(K/bk)],
    channel [N], tensor 0-d."""
    name = config.scale_name
    if not hasattr(layer, name):
        raise ValueError(f"{type(layer).__name__} has no `{name}`: an {config.scheme.value} checkpoint stores its "
                         f"weight scale there (native FP8: weight_scale_inv, compressed-tensors: weight_scale)")
    scale = getattr(layer, name).detach().float()
    n, k = config.out_features, config.in_features
    if config.scheme is Scheme.FP8_BLOCK:
        expected = quant.block_scale_shape(n, k, config.block_size)
        if tuple(scale.shape) != expected:
            raise ValueError(f"{type(layer).__name__}.{name}: block {list(config.block_size)} scales of a [{n}, {k}] "
                             f"weight have shape {list(expected)}, got {list(scale.shape)}")
        return scale.contiguous()
    if config.scheme is Scheme.FP8_CHANNEL:
        if scale.numel() != n:
            raise ValueError(f"{type(layer).__name__}.{name}: per-channel scales need {n} values ([N, 1]), "
                             f"got shape {list(scale.shape)}")
        return scale.reshape(n).contiguous()
    if scale.numel() != 1:
        raise ValueError(f"{type(layer).__name__}.{name}: a per-tensor scale is one value, got shape {list(scale.shape)}")
    return scale.reshape(())


def static_input_scale(layer: torch.nn.Module, config: LinearLayerConfig) -> torch.Tensor | None:
    """The static per-tensor activation scale (0-d float32), if the checkpoint has one."""
    if not config.static_input_scale:
        return None
    scale = getattr(layer, "input_scale", None)
    if scale is None or scale.numel() != 1:
        raise ValueError(f"{type(layer).__name__}.input_scale: the checkpoint declares a static activation scale, "
                         f"expected one value, got {None if scale is None else list(scale.shape)}")
    return scale.detach().float().reshape(())
