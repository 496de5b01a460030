"""W8A8 FP8 GEMV: one activation row (batch-1 decode) against FP8 weights [N, K], block or channel scales.

At M = 1 a GEMM is a stream of the weights: N*K bytes read once for 2*N*K flops, so its time is
set by the bytes each SM keeps in flight and by what a launch costs. The small-M kernel of
fp8_block_gemm pads the row to a 16-row MMA and splits K across programs, paying for float32
partials and a counter reduction; at decode shapes (4 to 25 MB of weights) those fixed costs
were as large as the stream (H200 run 3: 11.4 us at 4096 x 4096, whose bytes take about 4).

Here a program owns BLOCK_N output columns and all of K, in one launch with no workspace. It
loads a [BLOCK_N, BLOCK_K] weight tile per step, issuing the next tile's load before converting
the current one (Triton pipelines only loads that feed a dot), widens e4m3 to float32 and sums
exact products in float32. (A first version reshaped each tile into 128-wide groups to apply
the block scales per group: 8.4 us per call at the decode shapes of Qwen3-1.7B on the H200,
slower than bf16 cuBLAS; the layout conversions cost more than the stream.) The activation row is quantized in every program with the bits of
act_quant.py (1x128 groups, or per token): a few KB read from L2, cheaper to redo than to share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .act_quant import _scale_from_amax, _to_fp8
from .tuning import Autotuner

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
    GemvConfig(8, 2048, 8), GemvConfig(16, 2048, 8), GemvConfig(4, 2048, 4), GemvConfig(8, 1024, 4),
    GemvConfig(16, 1024, 4), GemvConfig(32, 1024, 8),
)


@triton.jit(do_not_specialize=["stride_wsn"])
def _w8a8_gemv_kernel(
    x_ptr, w_ptr, ws_ptr, c_ptr, bias_ptr, N, K, stride_wn, stride_wsn, stride_wsg,
    SCALE_BLOCK_N: tl.constexpr,  # weight rows sharing one scale row: a multiple of BLOCK_N (blocks)
    GROUPWISE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    GROUPS: tl.constexpr = BLOCK_K // _GROUP
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = rn % N  # wrapped: every weight load is in bounds without a column mask; the store masks
    rk = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(K, BLOCK_K)
    w_ptrs = w_ptr + rn_in[:, None] * stride_wn + rk[None, :]

    if GROUPWISE:
        ws_row = ws_ptr + (pid * BLOCK_N // SCALE_BLOCK_N) * stride_wsn  # the tile has one scale row
    else:  # a per-token scale needs the whole row's amax first
        amax = tl.max(tl.zeros([BLOCK_K], tl.float32), axis=0)
        for s in range(0, steps):
            x = tl.load(x_ptr + s * BLOCK_K + rk, mask=s * BLOCK_K + rk < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
        row_scale = _scale_from_amax(amax)

    # Block scales fold into the activation row (a_s * w_s per 128 of K: the tile has one scale
    # row), so the weight tile is only widened, multiplied and summed, never reshaped.
    acc = tl.zeros([BLOCK_N], tl.float32)
    w_next = tl.load(w_ptrs, mask=(rk < K)[None, :], other=0.0)
    for s in range(0, steps):
        k0 = s * BLOCK_K
        w = w_next
        w_next = tl.load(w_ptrs + k0 + BLOCK_K, mask=(k0 + BLOCK_K + rk < K)[None, :], other=0.0)
        x = tl.load(x_ptr + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
        if GROUPWISE:
            xg = tl.reshape(x, [GROUPS, _GROUP])
            a_s = _scale_from_amax(tl.max(tl.abs(xg), axis=1))
            g = s * GROUPS + tl.arange(0, GROUPS)
            w_s = tl.load(ws_row + g * stride_wsg, mask=g < tl.cdiv(K, _GROUP), other=0.0)
            x_eff = tl.reshape(_to_fp8(xg, a_s[:, None]).to(tl.float32) * (a_s * w_s)[:, None], [BLOCK_K])
        else:
            x_eff = _to_fp8(x, row_scale).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * x_eff[None, :], axis=1)
    out = acc
    if not GROUPWISE:
        out = out * tl.load(ws_ptr + rn_in * stride_wsn) * row_scale
    if HAS_BIAS:
        out += tl.load(bias_ptr + rn_in).to(tl.float32)
    tl.store(c_ptr + rn, out.to(c_ptr.dtype.element_ty), mask=rn < N)


def supports(groupwise: bool, scale_block_n: int) -> bool:
    """Whether some GEMV tile lies within one weight scale row (always, per channel)."""
    return bool(_candidates(groupwise, scale_block_n))


def _candidates(groupwise: bool, scale_block_n: int) -> tuple[GemvConfig, ...]:
    return tuple(c for c in CANDIDATES if not groupwise or scale_block_n % c.block_n == 0)


_TUNER = Autotuner("w8a8_gemv")


def w8a8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    groupwise: bool,
    scale_block_n: int = 128,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """x [1, K] (unit stride) -> out [1, N]; the arguments and scale layouts of
    `fp8_block_gemm.w8a8_linear`, whose M = 1 path this is."""
    if x.shape[0] != 1:
        raise ValueError(f"w8a8_gemv takes one row, got {x.shape[0]}; use w8a8_linear")
    n, k = weight.shape
    out = torch.empty((1, n), dtype=out_dtype, device=x.device)
    if n == 0:
        return out
    stride_wsn, stride_wsg = (weight_scale.stride(0), weight_scale.stride(1)) if groupwise else (weight_scale.stride(0), 0)

    def run(cfg: GemvConfig) -> None:
        _w8a8_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
            x, weight, weight_scale, out, bias if bias is not None else out, n, k, weight.stride(0), stride_wsn,
            stride_wsg, SCALE_BLOCK_N=scale_block_n if groupwise else 1, GROUPWISE=groupwise,
            HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps)

    if groupwise and (scale_block_n % config.block_n if config else not supports(groupwise, scale_block_n)):
        raise ValueError(f"w8a8_gemv: a column tile must lie within one of the {scale_block_n}-row weight scale "
                         "blocks; use w8a8_linear")
    if config is None:
        key = (1, n, k, x.dtype, out_dtype, groupwise, scale_block_n)  # (M bucket, ...) as the GEMMs key
        config = _TUNER.pick(key, _candidates(groupwise, scale_block_n), run, x.device)
    run(config)
    return out
