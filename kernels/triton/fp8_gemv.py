"""W8A8 FP8 GEMV: one activation row (batch-1 decode) against FP8 weights [N, K], block or channel scales.

At M = 1 a GEMM is a stream of the weights: N*K bytes read once for 2*N*K flops, so its time is
set by the bytes each SM keeps in flight and by fixed costs. The small-M kernel of fp8_block_gemm
pads the row to a 16-row MMA and splits K across programs, paying for float32 partials and a
counter reduction.

Here a program owns BLOCK_N output columns and all of K, in one launch with no workspace. It
loads a [BLOCK_N, BLOCK_K] weight tile per step, issuing the next tile's load before converting
the current one (Triton pipelines a dot-free loop only when asked, and then through shared
memory, which measured slower for the W8A16 GEMV), widens e4m3 to float32 and sums
exact products in float32. The activation row is quantized in every program with the bits of
act_quant.py (1x128 groups, or per token): a few KB read from L2, cheaper to redo than to share.

fp8_block_gemm's tuner times this against the small-M kernel per shape (in a CUDA graph, L2
evicted); on the H200 it won three of the four decode shapes of Qwen3-1.7B (5.3 vs 6.9 us at
2048 x 2048), the small-M kernel the widest (12.6 vs 18.1 us at N = 12288).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .act_quant import _scale_from_amax, _to_fp8
from .launch import cdiv
from .pdl import await_inputs, launch_options

_GROUP = tl.constexpr(128)  # activation quantization group along K; BLOCK_K is a multiple of it


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int


# The default first. The stream is latency-bound unless every SM has ~30 KB in flight: a tile of
# 8 x 2048 bytes is 16 KB, two in flight per program (the next tile is loaded ahead), and N = 2048
# at 8 columns gives two programs per SM on an H200 (132 SMs).
CANDIDATES = (
    GemvConfig(8, 1024, 4), GemvConfig(8, 2048, 8), GemvConfig(4, 2048, 4), GemvConfig(16, 1024, 8),
    GemvConfig(4, 1024, 4), GemvConfig(16, 512, 4),
)


@triton.jit(do_not_specialize=["stride_wsn"])
def _w8a8_gemv_kernel(
    x_ptr, w_ptr, ws_ptr, c_ptr, bias_ptr, N, K, stride_wn, stride_wsn, stride_wsg,
    SCALE_BLOCK_N: tl.constexpr,  # weight rows sharing one scale row: a multiple of BLOCK_N (blocks)
    GROUPWISE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # Tiles are [BLOCK_N, GROUPS, 128]: loaded in that shape, so the activations' 128-wide
    # groups line up with the weights' without any reshape (each reshape or layout change is a
    # round trip through shared memory). Products accumulate elementwise; K is summed once, after
    # the loop.
    GROUPS: tl.constexpr = BLOCK_K // _GROUP
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = rn % N  # wrapped: every weight load is in bounds without a column mask; the store masks
    rk = tl.arange(0, GROUPS)[:, None] * _GROUP + tl.arange(0, _GROUP)[None, :]  # [GROUPS, 128]
    steps = tl.cdiv(K, BLOCK_K)
    w_ptrs = w_ptr + rn_in[:, None, None] * stride_wn + rk[None, :, :]
    # The first tile is in flight while the kernel before (whose output is x) finishes.
    w_next = tl.load(w_ptrs, mask=(rk < K)[None, :, :], other=0.0)
    await_inputs(PDL)

    if GROUPWISE:
        ws_row = ws_ptr + (pid * BLOCK_N // SCALE_BLOCK_N) * stride_wsn  # the tile has one scale row
    else:  # a per-token scale needs the whole row's amax first
        amax = tl.max(tl.max(tl.zeros([GROUPS, _GROUP], tl.float32), axis=1), axis=0)
        for s in range(0, steps):
            x = tl.load(x_ptr + s * BLOCK_K + rk, mask=s * BLOCK_K + rk < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
        row_scale = _scale_from_amax(amax)

    acc = tl.zeros([BLOCK_N, GROUPS, _GROUP], tl.float32)
    for s in range(0, steps):
        k0 = s * BLOCK_K
        w = w_next
        w_next = tl.load(w_ptrs + k0 + BLOCK_K, mask=(k0 + BLOCK_K + rk < K)[None, :, :], other=0.0)
        x = tl.load(x_ptr + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
        if GROUPWISE:
            a_s = _scale_from_amax(tl.max(tl.abs(x), axis=1))
            g = s * GROUPS + tl.arange(0, GROUPS)
            w_s = tl.load(ws_row + g * stride_wsg, mask=g < tl.cdiv(K, _GROUP), other=0.0)
            # the block scales fold into the activations: a_s * w_s per 128 of K
            x_eff = _to_fp8(x, a_s[:, None]).to(tl.float32) * (a_s * w_s)[:, None]
        else:
            x_eff = _to_fp8(x, row_scale).to(tl.float32)
        acc += w.to(tl.float32) * x_eff[None, :, :]
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    if not GROUPWISE:
        out = out * tl.load(ws_ptr + rn_in * stride_wsn) * row_scale
    if HAS_BIAS:
        out += tl.load(bias_ptr + rn_in).to(tl.float32)
    tl.store(c_ptr + rn, out.to(c_ptr.dtype.element_ty), mask=rn < N)


def candidates(groupwise: bool, scale_block_n: int) -> tuple[GemvConfig, ...]:
    """The configurations whose column tile lies within one weight scale row (all, per channel)."""
    return tuple(c for c in CANDIDATES if not groupwise or scale_block_n % c.block_n == 0)


def w8a8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    groupwise: bool,
    scale_block_n: int = 128,
    bias: torch.Tensor | None = None,
    config: GemvConfig,
) -> torch.Tensor:
    """x [1, K] (unit stride) -> out [1, N]; the arguments and scale layouts of
    `fp8_block_gemm.w8a8_linear`, whose tuner chooses between this and its small-M kernel."""
    if x.shape[0] != 1:
        raise ValueError(f"w8a8_gemv takes one row, got {x.shape[0]}; use w8a8_linear")
    n, k = weight.shape
    out = torch.empty((1, n), dtype=out_dtype, device=x.device)
    if n == 0:
        return out
    stride_wsn, stride_wsg = (weight_scale.stride(0), weight_scale.stride(1)) if groupwise else (weight_scale.stride(0), 0)

    if groupwise and scale_block_n % config.block_n:
        raise ValueError(f"w8a8_gemv: a column tile of {config.block_n} does not lie within one of the "
                         f"{scale_block_n}-row weight scale blocks; use w8a8_linear")
    _w8a8_gemv_kernel[(cdiv(n, config.block_n),)](
        x, weight, weight_scale, out, bias if bias is not None else out, n, k, weight.stride(0), stride_wsn,
        stride_wsg, SCALE_BLOCK_N=scale_block_n if groupwise else 1, GROUPWISE=groupwise,
        HAS_BIAS=bias is not None, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        **launch_options(x.device))
    return out
