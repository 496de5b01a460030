"""`is_supported` / `can_implement` verdicts shared by the FP8 linear backends, worded so a user
reading `quantgate kernels` learns what is missing and what they have."""

from __future__ import annotations

import torch

from ..base import OK, Verdict
from ..platform import Platform
from ..schemes import LinearLayerConfig

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def cuda_verdict(platform: Platform, minimum: tuple[int, int], feature: str, *, triton: bool = False,
                 maximum_major: int | None = None) -> Verdict:
    """OK on CUDA with capability >= minimum (and major <= maximum_major), plus triton if asked."""
    need = f"{minimum[0]}.{minimum[1]}"
    if not platform.is_cuda:
        return False, f"requires CUDA (compute capability >= {need}, {feature}); this is {platform.device}"
    have = platform.capability_str
    if not platform.has_capability(minimum):
        return False, f"requires CUDA compute capability >= {need} ({feature}); this GPU is {have}"
    if maximum_major is not None and platform.capability[0] > maximum_major:
        return False, f"requires compute capability {maximum_major}.x ({feature}); this GPU is {have}"
    if triton and "triton" not in platform.libraries:
        return False, "triton is not installed (pip install triton)"
    return OK


def dtype_verdict(config: LinearLayerConfig, allowed: tuple[torch.dtype, ...], why: str) -> Verdict:
    if config.act_dtype in allowed:
        return OK
    names = ", ".join(_DTYPE_NAMES.get(d, str(d)) for d in allowed)
    return False, f"activation dtype {_DTYPE_NAMES.get(config.act_dtype, config.act_dtype)} not handled ({why}: {names})"


def first_failure(*verdicts: Verdict) -> Verdict:
    return next((v for v in verdicts if not v[0]), OK)
