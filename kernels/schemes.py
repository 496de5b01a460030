"""Quantization schemes and the per-layer facts kernels decide on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


class Scheme(str, Enum):
    UNQUANTIZED = "unquantized"
    FP8_BLOCK = "fp8-block"  # 128x128 weight blocks, dynamic 1x128 activation groups
    FP8_CHANNEL = "fp8-channel"  # per-output-channel weights, dynamic per-token activations
    FP8_TENSOR = "fp8-tensor"  # per-tensor weights, static or dynamic per-tensor activations

    @property
    def is_fp8(self) -> bool:
        return self is not Scheme.UNQUANTIZED

    @classmethod
    def parse(cls, value: str) -> Scheme:
        try:
            return cls(value.lower().replace("_", "-"))
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown scheme {value!r}; known schemes: {known}") from None


SCALE_NAMES = ("weight_scale_inv", "weight_scale")  # native FP8, compressed-tensors


@dataclass(frozen=True)
class LinearLayerConfig:
    in_features: int  # K
    out_features: int  # N
    scheme: Scheme
    act_dtype: torch.dtype = torch.bfloat16
    block_size: tuple[int, int] | None = None  # (block_n, block_k) for FP8_BLOCK
    scale_name: str = "weight_scale"  # attribute the checkpoint's scale is stored under
    has_bias: bool = False
    static_input_scale: bool = False  # FP8_TENSOR checkpoints may carry `input_scale`

    def __post_init__(self) -> None:
        if self.scale_name not in SCALE_NAMES:
            raise ValueError(f"scale_name must be one of {SCALE_NAMES}, got {self.scale_name!r}")
        if self.scheme is Scheme.FP8_BLOCK and self.block_size is None:
            object.__setattr__(self, "block_size", (128, 128))


@dataclass(frozen=True)
class MoELayerConfig:
    num_experts: int
    top_k: int
    hidden_size: int  # H
    intermediate_size: int  # I, per expert
    scheme: Scheme
    act_dtype: torch.dtype = torch.bfloat16
    block_size: tuple[int, int] | None = None
    scale_name: str = "weight_scale"
    renormalize: bool = True  # Qwen3-MoE norm_topk_prob
    activation: str = "silu"
    static_input_scale: bool = False

    def __post_init__(self) -> None:
        if self.scale_name not in SCALE_NAMES:
            raise ValueError(f"scale_name must be one of {SCALE_NAMES}, got {self.scale_name!r}")
        if self.scheme is Scheme.FP8_BLOCK and self.block_size is None:
            object.__setattr__(self, "block_size", (128, 128))
