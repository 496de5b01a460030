"""What the GPU MoE backends share: platform and layer checks, and the alignment workspace."""

from __future__ import annotations

import torch

from ..base import OK, Verdict, bind_processed
from ..platform import Platform
from ..schemes import MoELayerConfig, Scheme

WORKSPACE = "moe_workspace"  # int32 per-expert cursors of the token alignment, bound once
_ACT_DTYPES = (torch.bfloat16, torch.float16)


def triton_gpu_verdict(platform: Platform, minimum: tuple[int, int], why: str) -> Verdict:
    if not platform.is_cuda:
        return False, (f"requires CUDA (compute capability >= {minimum[0]}.{minimum[1]}, {why}); this is "
                       f"{platform.device}, where MoE layers run with --moe-backend emulation (what auto picks)")
    if "triton" not in platform.libraries:
        return False, "triton is not installed (pip install triton)"
    if not platform.has_capability(minimum):
        return False, (f"requires compute capability >= {minimum[0]}.{minimum[1]} ({why}); "
                       f"this GPU is {platform.capability_str}")
    return OK


def act_dtype_verdict(config: MoELayerConfig) -> Verdict:
    if config.act_dtype not in _ACT_DTYPES:
        return False, f"activations must be bfloat16 or float16, not {config.act_dtype} (use --dtype bfloat16)"
    return OK


def block_size_verdict(config: MoELayerConfig) -> Verdict:
    if config.scheme is Scheme.FP8_BLOCK and tuple(config.block_size) != (128, 128):
        return False, f"block size {tuple(config.block_size)} not handled (handles: 128x128)"
    return OK


def first_refusal(*verdicts: Verdict) -> Verdict:
    return next((v for v in verdicts if not v[0]), OK)


def bind_workspace(layer: torch.nn.Module, config: MoELayerConfig, device: torch.device) -> None:
    bind_processed(layer, WORKSPACE, torch.zeros(config.num_experts, dtype=torch.int32, device=device))
