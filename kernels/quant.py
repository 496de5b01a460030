"""FP8 (e4m3fn) quantization in plain torch: the reference every kernel is checked against.

Scales are float32 and multiply: real = fp8 * scale. Casts clamp first because a cast of an
out-of-range value is NaN on CUDA (it saturates only on CPU).
"""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_SCALE = 1e-12  # floor of dynamic scales, so an all-zero group quantizes to zeros


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


# Every e4m3fn code's value. On CPU torch converts fp8 element by element (about 3x slower
# than this lookup), and the emulation backend dequantizes every activation of the CPU demo.
_FP8_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float()


def fp8_to_float(q: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3fn -> float32, exactly."""
    if q.device.type != "cpu":
        return q.float()
    codes = q.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return _FP8_VALUES.index_select(0, codes).view(q.shape)


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """float32 amax / FP8_MAX by one correctly rounded division on every device, at least MIN_SCALE."""
    # A tensor divisor: CUDA divides by a Python scalar through a rounded reciprocal, whose
    # quotient can be one ulp off the IEEE one the kernels (and the CPU) compute. Filled on the
    # device, not copied from the host: a copy cannot be captured in a CUDA graph.
    fp8_max = torch.full((), FP8_MAX, dtype=torch.float32, device=amax.device)
    return (amax.float() / fp8_max).clamp(min=MIN_SCALE)


def block_scale_shape(n: int, k: int, block: tuple[int, int]) -> tuple[int, int]:
    return (math.ceil(n / block[0]), math.ceil(k / block[1]))


def _pad_to_blocks(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    n, k = w.shape
    bn, bk = block_scale_shape(n, k, block)
    return torch.nn.functional.pad(w, (0, bk * block[1] - k, 0, bn * block[0] - n))


def quantize_weight_block(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (fp8 [N, K], scale [ceil(N/bn), ceil(K/bk)]). Partial edge blocks are allowed."""
    n, k = w.shape
    gn, gk = block_scale_shape(n, k, block)
    padded = _pad_to_blocks(w.float(), block).view(gn, block[0], gk, block[1])
    scale = scale_from_amax(padded.abs().amax(dim=(1, 3)))
    q = to_fp8(padded / scale[:, None, :, None]).view(gn * block[0], gk * block[1])[:n, :k]
    return q.contiguous(), scale


def quantize_weight_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (fp8 [N, K], scale [N, 1])."""
    scale = scale_from_amax(w.abs().amax(dim=1, keepdim=True))
    return to_fp8(w.float() / scale), scale


def quantize_weight_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (fp8 [N, K], scale []) ."""
    scale = scale_from_amax(w.abs().amax())
    return to_fp8(w.float() / scale), scale


def expand_block_scale(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    """Block scale [gn, gk] -> elementwise scale [N, K]."""
    return scale.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)[:n, :k]


def dequantize_weight(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of the quantize_weight_* functions; the scale's shape says which scheme."""
    n, k = q.shape
    if block is not None:
        full = expand_block_scale(scale.float(), n, k, block)
    else:
        full = scale.float().reshape(-1, 1) if scale.numel() == n and scale.numel() > 1 else scale.float()
    return (fp8_to_float(q) * full).to(dtype)


def quantize_act_per_token_group(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (fp8 [M, K], scale [M, ceil(K/group)]): dynamic 1 x group activation scales."""
    m, k = x.shape
    groups = math.ceil(k / group)
    padded = x.float()
    if k % group:
        padded = torch.nn.functional.pad(padded, (0, groups * group - k))
    padded = padded.view(m, groups, group)
    low, high = torch.aminmax(padded, dim=2)  # one pass instead of abs() then amax()
    scale = scale_from_amax(torch.maximum(-low, high))
    q = to_fp8(padded / scale[:, :, None]).view(m, groups * group)
    return (q[:, :k].contiguous() if k % group else q), scale


def quantize_act_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (fp8 [M, K], scale [M, 1])."""
    scale = scale_from_amax(x.abs().amax(dim=1, keepdim=True))
    return to_fp8(x.float() / scale), scale


def quantize_act_per_tensor(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Static (given `scale`) or dynamic per-tensor activation quantization; scale is 0-d."""
    if scale is None:  # an empty batch has no maximum: its scale is never used
        scale = scale_from_amax(x.abs().amax() if x.numel() else x.new_zeros(()))
    scale = scale.float().reshape(())
    return to_fp8(x.float() / scale), scale


def dequantize_act(q: torch.Tensor, scale: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """Inverse of the quantize_act_* functions, in float32."""
    values = fp8_to_float(q)
    if group is None:
        return values * scale
    m, k = q.shape
    if k % group:
        return values * scale.repeat_interleave(group, dim=1)[:, :k]
    return (values.view(m, k // group, group) * scale[:, :, None]).view(m, k)
