"""Weight-only FP8 GEMM (W8A16) on FP8 tensor cores: the weights as stored, activations split exactly.

On Hopper, marlin's wide layers (`split_layer`) take this path instead of w8a16_gemm.py's. There the weights are
widened to 16 bits in registers, ~5 instructions per weight byte, which holds a decode GEMV
below the memory bandwidth (run 14). Here no weight byte is converted: the FP8 tensor cores
take the weights as stored, and the activations are made FP8 instead, without rounding them.

The split: per row and 128-wide K group, a power of two s brings the group's values into
e4m3's range (|v| <= 256). A bf16 value has 8 significant bits and e4m3 4, so v = hi + lo
exactly, with hi = fp8(v) and lo = fp8(v - hi): the remainder of a round to nearest has at most
4 significant bits. An fp16 value (11 bits) takes four terms. Only values below e4m3's
subnormal step (|v| < 1/4 for bf16, < 2 for fp16) lose bits, at most 2^-10, which is 2^-18 of
the group's largest value. So x W^T = sum over the terms of s * (term W^T), every product and
sum in float32: W8A16's numbers (run 15: output error 1.40e-3 against float64 in bf16, its
rounding floor; 2.3e-4 in fp16), not an FP8 activation quantization's.

The GEMM runs transposed, out^T = W xs^T: a weight tile is the MMA's wide side and the split
rows its narrow one (`columns` = terms x rows, at least 16). Both arrive by TMA. A row's terms
are adjacent columns; their partial products are summed once, after the K loop. K is split
across programs when there is one row tile, as in the other dense GEMMs (gemm_epilogue).

Layout ("rows"), built once at load by `pack_weight_rows`: int32 [N, ceil(K/128) * 32], each
row's FP8 bytes in K order, zero-padded to a multiple of 128 (TMA reads it as FP8 [N, K_pad]).
Scales are marlin's values (per column, in the activation dtype, fp16 ones times 2^10) stored
[N, K groups or 1]: a column's scales contiguous along K, so that a tile's scale for the next K
steps is the next word. Strided along K (marlin's [K groups, N]) that one scalar load per K step
cost 7-32% of a decode GEMM on the H200 (run 15).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .act_quant import _to_fp8
from .gemm_epilogue import bias_operand, choose_split_k, split_k_buffers, store_tile, target_programs
from .launch import DirectLaunch, aligned, cdiv, next_power_of_2, tma_device
from .pdl import await_inputs, launch_options
from .scratch import device_buffer
from .tuning import Autotuner, m_bucket
from .w8a16_gemm import GROUP_K, SCALE_SHIFT

TERMS = {torch.bfloat16: 2, torch.float16: 4}
SPLIT_ROWS = 16  # activation rows per program of the split kernel (fewer for fewer rows)


@dataclass(frozen=True)
class SplitConfig:
    columns: int  # the MMA's narrow side: split rows (terms x activation rows) per program
    block_n: int
    num_warps: int
    num_stages: int
    split_per_sm: int = 0  # split K until there are this many programs per SM (0: never split)


# Candidates per M bucket (tuning.m_bucket), the default first: the H200's best of run 15's sweep
# (64-wide weight tiles, 6 stages, one or two programs per SM) and its neighbours.
CANDIDATES: dict[int, tuple[SplitConfig, ...]] = {
    1: (SplitConfig(16, 64, 4, 6, 2), SplitConfig(16, 128, 4, 4, 8), SplitConfig(16, 64, 4, 4, 4),
        SplitConfig(16, 64, 4, 4, 8), SplitConfig(16, 32, 4, 4, 4)),
    16: (SplitConfig(32, 64, 4, 6, 2), SplitConfig(32, 64, 4, 4, 4), SplitConfig(32, 128, 4, 4, 8),
         SplitConfig(32, 64, 4, 6, 4), SplitConfig(64, 64, 4, 6, 2)),
    64: (SplitConfig(64, 64, 4, 4, 2), SplitConfig(128, 64, 4, 4, 2), SplitConfig(128, 128, 4, 4, 1)),
    256: (SplitConfig(128, 128, 4, 4), SplitConfig(128, 64, 4, 4), SplitConfig(64, 128, 4, 4)),
}
LARGE_M = (SplitConfig(128, 128, 8, 4), SplitConfig(128, 128, 4, 3), SplitConfig(64, 128, 4, 4))
MIN_BLOCK_N = 32  # split-K counters: one per column tile of the narrowest candidate


def candidates_for(m: int) -> tuple[SplitConfig, ...]:
    return CANDIDATES.get(m_bucket(m), LARGE_M)


# The split is a kernel of its own before each GEMM, ~1-2 us in a CUDA graph, while the GEMM
# gains in proportion to the weight: on the H200 (run 15) a layer with N >= 3K gained more than
# that (4096 x 14336: 21.7 -> 19.4 us at one row; 2048 x 12288: 10.7 -> 9.1 us of GEMM), the
# others did not (4096 x 4096: 8.7 -> 9.8 us; 14336 x 4096 at 16 rows: 21.3 -> 23.2 us), and with
# every layer split the batch-1 decode of a 1.7B-shaped model was 7% slower.
MIN_N_OVER_K = 3


def split_layer(device: torch.device, n: int, k: int) -> bool:
    """Whether marlin's layer of N outputs and K inputs on `device` takes this path: Hopper (FP8
    tensor cores and TMA), and a layer wide enough to gain more than the split costs. Decided
    once, at load: the weight layout is the kernel family's."""
    return tma_device(device) and n >= MIN_N_OVER_K * k


def pack_weight_rows(weight: torch.Tensor) -> torch.Tensor:
    """FP8 [N, K] -> int32 [N, ceil(K/128) * 32]: each row's bytes in K order, zero-padded."""
    n, k = weight.shape
    padded = torch.zeros((n, cdiv(k, GROUP_K) * GROUP_K), dtype=torch.uint8, device=weight.device)
    padded[:, :k] = weight.view(torch.uint8)
    return padded.view(torch.int32)


def unpack_weight_rows(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of pack_weight_rows (tests and debugging)."""
    return packed.view(torch.uint8)[:, :k].contiguous().view(torch.float8_e4m3fn)


# Not specialized: what varies with the batch or the caller's view of x, so that the key of a
# launch by handle (launch.py) is the dtype and the pointers' alignment alone.
@triton.jit(do_not_specialize=["M", "K", "stride_xm", "stride_xs", "stride_xsc"])
def _split_kernel(x_ptr, xs_ptr, xsc_ptr, M, K, stride_xm, stride_xs, stride_xsc,
                  TERMS: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    """Rows [ROWS x program 0] of x, K group program 1 -> the terms' FP8 rows m*TERMS + t of xs
    and their scale in xsc[group, m*TERMS + t]."""
    await_inputs(PDL)
    rm = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    rk = g * 128 + tl.arange(0, 128)
    live = rm < M
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=live[:, None] & (rk < K)[None, :],
                other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-30)
    # The power of two at or above amax (the exponent of amax, its mantissa rounded up), 2^8 below
    # it: |v| <= 256 < 448, and every division by it is exact.
    scale = (((amax.to(tl.int32, bitcast=True) + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
             * (1.0 / 256.0))
    rest = x
    for t in tl.static_range(TERMS):
        q = _to_fp8(rest, scale[:, None])
        tl.store(xs_ptr + (rm * TERMS + t)[:, None] * stride_xs + rk[None, :], q, mask=live[:, None])
        rest = rest - q.to(tl.float32) * scale[:, None]  # exact: what q did not hold
        tl.store(xsc_ptr + g * stride_xsc + rm * TERMS + t, scale, mask=live)


@triton.jit(do_not_specialize=["M", "split_k", "stride_xsc"])
def _split_gemm_kernel(
    w_desc, xs_desc, xsc_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k, stride_cm, stride_sn, stride_xsc,
    S_MUL: tl.constexpr, GROUPWISE: tl.constexpr,
    TILE_SCALE: tl.constexpr,  # GROUPWISE, and the column tile lies in one weight scale block: one scale per K step
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    TERMS: tl.constexpr, COLUMNS: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """acc^T [BLOCK_N, COLUMNS] = W_tile @ xs_tile^T over this program's K slice."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    n0 = pid_n * BLOCK_N
    rn = n0 + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rc = pid_m * COLUMNS + tl.arange(0, COLUMNS)
    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)
    await_inputs(PDL)
    acc = tl.zeros((BLOCK_N, COLUMNS), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        w = w_desc.load([n0, kt * 128])  # rows past N read as zeros
        xs = xs_desc.load([pid_m * COLUMNS, kt * 128])
        part = tl.dot(w, xs.T)  # exact FP8 products, one K group: no promotion is due inside it
        # Columns past the split rows are zeros; their scale must not be a NaN from the scratch.
        xsc = tl.load(xsc_ptr + kt * stride_xsc + rc, mask=rc < M * TERMS, other=0.0)
        if TILE_SCALE:
            acc += part * (xsc * tl.load(s_ptr + n0 * stride_sn + kt).to(tl.float32))[None, :]
        elif GROUPWISE:
            # A [BLOCK_N] vector in another layout than the MMA's: a shared-memory round trip per
            # K step, ~45% of the time at large M (run 15), hence TILE_SCALE where it applies.
            s = tl.load(s_ptr + rn_in * stride_sn + kt).to(tl.float32)
            acc += part * s[:, None] * xsc[None, :]
        else:
            acc += part * xsc[None, :]
    out = tl.sum(tl.reshape(acc, (BLOCK_N, COLUMNS // TERMS, TERMS)), axis=2) * S_MUL  # a row's terms
    if not GROUPWISE:
        out = out * tl.load(s_ptr + rn_in * stride_sn).to(tl.float32)[:, None]
    rm = pid_m * (COLUMNS // TERMS) + tl.arange(0, COLUMNS // TERMS)
    store_tile(tl.trans(out), c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k,
               split_k, pid_m * num_pid_n + pid_n, HAS_BIAS, SPLIT)


_TUNER = Autotuner("w8a16_split")
_split_launch = DirectLaunch(_split_kernel)
_gemm_launch = DirectLaunch(_split_gemm_kernel)


def w8a16_split_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    *,
    groupwise: bool,
    scale_block_n: int = 1,
    bias: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    config: SplitConfig | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """x [M, K] bf16/fp16 (unit K stride) @ packed FP8 weight [N, ceil(K/128)*32] -> [M, N] in x.dtype.

    scale: [N, ceil(K/128)] (groupwise) or [N, 1], in x.dtype, holding scale * 2^SCALE_SHIFT[x.dtype]
    (w8a16_gemm's values, transposed); workspace as for w8a16_gemm (int32 zeros, its
    `workspace_size(N)`); `scale_block_n`: the weight rows that share each groupwise scale (a block
    checkpoint's block rows), which lets a column tile inside one block read one scale per K step.
    Without `config` the tuner picks among `candidates_for(M)`.
    """
    m, k = x.shape
    n, words = packed.shape
    k_pad = cdiv(k, GROUP_K) * GROUP_K
    if x.dtype not in TERMS or scale.dtype != x.dtype:
        raise ValueError(f"w8a16_split_gemm: activations and scales must share a dtype in {tuple(TERMS)}, "
                         f"got {x.dtype} and {scale.dtype}")
    if tuple(scale.shape) != (n, k_pad // GROUP_K if groupwise else 1) or (groupwise and scale.stride(1) != 1):
        raise ValueError(f"w8a16_split_gemm: scales {tuple(scale.shape)} (strides {scale.stride()}) for {n} columns "
                         f"and K={k}: expects [N, {k_pad // GROUP_K if groupwise else 1}], each row contiguous")
    if words * 4 != k_pad or x.stride(1) != 1 or not packed.is_contiguous():
        raise ValueError(f"w8a16_split_gemm: packed weight {tuple(packed.shape)} does not match K={k} "
                         f"(expects [N, {k_pad // 4}], contiguous) or x has a non-unit K stride")
    bias = bias_operand(bias, n)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    terms = TERMS[x.dtype]
    xs = device_buffer(x.device, "w8a16_split_x", terms * m * k_pad, torch.uint8)[:terms * m * k_pad]
    xs = xs.view(torch.float8_e4m3fn).view(terms * m, k_pad)
    xsc = device_buffer(x.device, "w8a16_split_scales", (k_pad // GROUP_K) * terms * m, torch.float32)
    options = launch_options(x.device)
    spec = (x.dtype, terms, options["PDL"], aligned(x.data_ptr()), aligned(xs.data_ptr()), aligned(xsc.data_ptr()))
    rows = min(SPLIT_ROWS, next_power_of_2(m))  # a decode row is one program of one warp
    _split_launch((*spec, rows), (cdiv(m, rows), k_pad // GROUP_K),
                  (x, xs, xsc, m, k, x.stride(0), k_pad, terms * m),
                  TERMS=terms, ROWS=rows, num_warps=max(1, rows // 4), **options)

    def run(cfg: SplitConfig, split: int | None = None) -> None:
        _launch(x, packed, xs, xsc, scale, out, bias, workspace, groupwise, scale_block_n, cfg, split, options)

    if config is None:
        config = _TUNER.pick((m_bucket(m), n, k, x.dtype, groupwise, scale_block_n), candidates_for(m), run, x.device)
    run(config, split_k)
    return out


def _launch(x, packed, xs, xsc, scale, out, bias, workspace, groupwise: bool, scale_block_n: int, cfg: SplitConfig,
            split_k: int | None, options: dict) -> None:
    m, k = x.shape
    n = packed.shape[0]
    terms = TERMS[x.dtype]
    m_tiles, n_tiles = cdiv(terms * m, cfg.columns), cdiv(n, cfg.block_n)
    k_tiles = cdiv(k, GROUP_K)
    if split_k is None:
        split_k = 1
        if workspace is not None and m_tiles == 1 and cfg.split_per_sm:
            split_k = choose_split_k(n_tiles, k_tiles, target_programs(x.device, cfg.split_per_sm), m, n)
    partial, counters = split_k_buffers(split_k, m, n, n_tiles, workspace, x.device)
    weights = packed.view(torch.float8_e4m3fn)
    w_desc = TensorDescriptor(weights, list(weights.shape), [weights.shape[1], 1], [cfg.block_n, GROUP_K])
    xs_desc = TensorDescriptor(xs, list(xs.shape), [xs.shape[1], 1], [cfg.columns, GROUP_K])
    bias_arg = bias if bias is not None else out
    stride_sn = scale.stride(0)
    pointers = tuple(aligned(t.data_ptr()) for t in (xsc, scale, bias_arg, partial, counters))
    tile_scale = groupwise and scale_block_n % cfg.block_n == 0
    spec = (cfg, x.dtype, groupwise, tile_scale, bias is not None, split_k > 1, n, k, options["PDL"], stride_sn,
            *pointers)
    _gemm_launch(
        spec, (n_tiles, m_tiles, split_k),
        (w_desc, xs_desc, xsc, scale, out, bias_arg, partial, counters, m, n, k, split_k, n, stride_sn, terms * m),
        S_MUL=float(2.0 ** -SCALE_SHIFT[x.dtype]), GROUPWISE=groupwise, TILE_SCALE=tile_scale, HAS_BIAS=bias is not None,
        SPLIT=split_k > 1, TERMS=terms, COLUMNS=cfg.columns, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **options)
