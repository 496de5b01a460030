"""Weight-only FP8 GEMM (W8A16): FP8 weights packed in pairs, activations in bf16/fp16.

Runs on compute capability 8.0, which has no FP8 instructions: weights become bf16, fp16 or
float32 by moving bits, and products run on bf16/fp16 tensor cores, or as float32 FMAs for a
single row.

Packed layout ("k-pairs"), built once at load by `pack_weight`: int32 [N, ceil(K/128) * 32],
read by the kernel as int16 [N, ceil(K/128) * 64]. The int16 t*64 + i of row n holds the e4m3
bytes of w[n, t*128 + i] (low byte) and w[n, t*128 + 64 + i] (high byte), K zero-padded. A
[BLOCK_N, 64] int16 tile of one 128-wide K group thus yields the weights of the group's two
halves, each the operand of one K=64 dot whose activations are a contiguous load.

Bit conversion: an e4m3 byte's sign and 7 exponent/mantissa bits, moved into a 16-bit float,
give the same number times 2^-120 in bf16 (2^-8 in fp16); fp8 subnormals land on subnormals of
the wider type, so the conversion is exact. One int16 becomes its two halves' floats in 7
integer instructions for a register of two int16 (inline PTX; integer tensor ops under the
interpreter). The 2^120 goes back in with the scale; bf16 activations are pre-multiplied by
2^64 (exact) so that products of small activations and small weights stay far from float32
subnormals.

One row (batch-1 decode) has its own kernel, `_w8a16_gemv_kernel`: float32 FMAs on the same
layout (weights widened to float32 by the same bit moves), its first chunk loaded before its
PDL wait and the next chunk's load issued before the current one is converted. From two rows
up, the MMA kernel:

Swap-AB: the kernel computes out^T = W x^T. The weight tile is the MMA's A operand, which
wgmma (sm_90) and mma.sync (sm_80) take from registers, where it is converted after a
pipelined copy to shared memory; x^T is the B operand, whose width can be as small as 16. A
decode batch of 2 to 16 rows costs one 16-wide column block, and each weight byte is read once
(H200, 4096 x 14336 at M = 16: 21 us against 24 us for the k-planes kernel this replaced, which
converted the weights as the B operand through shared memory, and 30 us for bf16 cuBLAS). Small
M splits K across programs (gemm_epilogue); tiles, stages and splits are tuned per shape on
the GPU (tuning.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .gemm_epilogue import choose_split_k, split_k_buffers, store_tile, target_programs
from .pdl import await_inputs, launch_options
from .tuning import Autotuner, m_bucket

GROUP_K = 128  # K tile = scale group along K for block checkpoints
PAIRS = GROUP_K // 2  # int16 per K tile and row
# Scales are stored in the activation dtype; fp16 ones are kept as scale * 2^10 so that
# typical FP8 weight scales (1e-5 .. 1e-2) stay normal fp16 numbers.
SCALE_SHIFT = {torch.bfloat16: 0, torch.float16: 10}
_X_EXP = 64  # activation pre-scale exponent on the bf16 (MMA) and float32 (GEMV) paths
_K_TILE = tl.constexpr(GROUP_K)  # the same numbers inside kernels
_PAIRS = tl.constexpr(PAIRS)
# K tiles of its slice a program prefetches into L2 before its PDL wait (a decode GEMM's
# weights do not depend on the kernel before, which is still running).
_PDL_PREFETCH_TILES = tl.constexpr(4)


@dataclass(frozen=True)
class W8A16Config:
    block_m: int  # 1: the float32-FMA GEMV; else rows of x per program, the MMA's N (16 and up)
    block_n: int  # output columns per program (the MMA's M: 64 or 128)
    num_warps: int
    num_stages: int
    split_per_sm: int = 0  # split K until there are this many programs per SM (0: never split)
    tiles: int = 1  # GEMV: K tiles per load (the next load is in flight while one is converted)


# Candidates per M bucket (tuning.m_bucket), the default first: the tuner times them once per
# shape on the GPU. Split-K is a runtime argument, so configs differing only in it share a
# compilation. One row is the GEMV's: timed with PDL as the tuner times, the MMA kernel's
# 16-row tiles lost to it at every shape of run 7 (by 1-3 us at decode shapes, where the GEMV
# loads its first chunk before the wait and the MMA kernel's pipeline fills after it). The 16-row
# defaults are the H200's best of a sweep over 4096 x 4096, 4096 x 14336 and 14336 x 4096
# (benchmarks/results/h200-2026-11-29-run7). Tiles of 128 x 128 with three stages take 144 KB
# of shared memory, within sm_80's 164 KB.
CANDIDATES: dict[int, tuple[W8A16Config, ...]] = {
    1: (W8A16Config(1, 64, 4, 1, 5), W8A16Config(1, 64, 4, 1, 10), W8A16Config(1, 64, 4, 1, 4, tiles=2),
        W8A16Config(1, 64, 8, 1, 2, tiles=4), W8A16Config(1, 128, 8, 1, 2, tiles=2),
        W8A16Config(1, 16, 4, 1, 0, tiles=8)),
    16: (W8A16Config(16, 64, 4, 3, 4), W8A16Config(16, 64, 4, 3, 2), W8A16Config(16, 128, 8, 3, 2),
         W8A16Config(16, 64, 4, 3, 8), W8A16Config(16, 64, 4, 4, 4)),
    64: (W8A16Config(64, 64, 4, 3, 2), W8A16Config(64, 128, 8, 3, 1), W8A16Config(32, 64, 4, 3, 4)),
    256: (W8A16Config(128, 128, 8, 3), W8A16Config(64, 128, 4, 3), W8A16Config(64, 64, 4, 3)),
}
LARGE_M = (W8A16Config(128, 128, 8, 3), W8A16Config(64, 128, 4, 3))
# Split-K only while the output has one row tile; the workspace holds one counter per column tile.
MIN_BLOCK_N = 64


def candidates_for(m: int) -> tuple[W8A16Config, ...]:
    return CANDIDATES.get(m_bucket(m), LARGE_M)


def workspace_size(n: int) -> int:
    """int32 counters a layer with N outputs needs (zero-initialised, bound once)."""
    return triton.cdiv(n, MIN_BLOCK_N)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """FP8 [N, K] -> int32 [N, ceil(K/128) * 32] in the k-pairs layout (zero-padded K)."""
    n, k = weight.shape
    k_tiles = triton.cdiv(k, GROUP_K)
    padded = torch.zeros((n, k_tiles * GROUP_K), dtype=torch.uint8, device=weight.device)
    padded[:, :k] = weight.view(torch.uint8)
    # [n, tile, half, i] -> [n, tile, i, half]: little-endian, half 0 is the low byte of each int16.
    pairs = padded.view(n, k_tiles, 2, PAIRS).transpose(2, 3)
    return pairs.reshape(n, k_tiles * GROUP_K).view(torch.int32)


def unpack_weight(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of pack_weight (tests and debugging)."""
    n, words = packed.shape
    pairs = packed.contiguous().view(torch.uint8).view(n, words * 4 // GROUP_K, PAIRS, 2)
    return pairs.transpose(2, 3).reshape(n, -1)[:, :k].contiguous().view(torch.float8_e4m3fn)


# Per register of two int16 [lo0 hi0 lo1 hi1] (bytes, low first): $0 = (lo0, lo1), $1 = (hi0, hi1)
# as 16-bit floats. Sign bits go to bits 15 and 31; exponent+mantissa bits to MAG.. of each half.
# lop3 0xE4 = (a & c) | (b & ~c).
_HALVES_ASM = """
{{
.reg .b32 t, u, h;
shl.b32 t, $2, {mag};
shl.b32 u, $2, 8;
and.b32 t, t, {mask};
lop3.b32 $0, u, t, 0x80008000, 0xE4;
shr.u32 h, $2, {down};
and.b32 h, h, {mask};
lop3.b32 $1, $2, h, 0x80008000, 0xE4;
}}
"""
_BF16_ASM = tl.constexpr(_HALVES_ASM.format(mag=4, down=4, mask="0x07F007F0"))
_FP16_ASM = tl.constexpr(_HALVES_ASM.format(mag=7, down=1, mask="0x3F803F80"))


@triton.jit
def _halves(w, OUT: tl.constexpr, ASM: tl.constexpr):
    """int16 of two e4m3 bytes -> (low byte, high byte) as OUT: 1 bf16 (x 2^-120), 2 fp16 (x 2^-8)."""
    if ASM:
        if OUT == 1:
            return tl.inline_asm_elementwise(_BF16_ASM, "=r,=r,r", [w], dtype=(tl.bfloat16, tl.bfloat16),
                                             is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise(_FP16_ASM, "=r,=r,r", [w], dtype=(tl.float16, tl.float16),
                                             is_pure=True, pack=2)
    else:  # the same bits with tensor ops (the interpreter has no PTX), in int32 and truncated
        MAG: tl.constexpr = 4 if OUT == 1 else 7
        w32 = w.to(tl.int32)
        lo = ((w32 << 8) & 0x8000) | ((w32 << MAG) & (0x7F << MAG))
        hi = (w32 & 0x8000) | ((w32 >> (8 - MAG)) & (0x7F << MAG))
        if OUT == 1:
            return lo.to(tl.int16).to(tl.bfloat16, bitcast=True), hi.to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            return lo.to(tl.int16).to(tl.float16, bitcast=True), hi.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _pair_bits(words, ODD: tl.constexpr, MAG_SHIFT: tl.constexpr):
    """Bytes (1, 3) if ODD else (0, 2) of each int32 as two 16-bit floats side by side: sign to
    bit 15, exponent+mantissa to bits MAG_SHIFT.. (4: bf16 -> value * 2^-120, 7: fp16 -> * 2^-8)."""
    mag_mask: tl.constexpr = (0x7F << MAG_SHIFT) | (0x7F << (MAG_SHIFT + 16))
    if ODD:
        return (words & -2147450880) | ((words >> (8 - MAG_SHIFT)) & mag_mask)  # -2147450880 = 0x80008000
    else:
        return ((words << 8) & -2147450880) | ((words << MAG_SHIFT) & mag_mask)


@triton.jit
def _byte_f32(words, P: tl.constexpr):
    """Byte P of each int32 as a float32 holding its e4m3 value * 2^-120: the bf16 bits of
    `_pair_bits` (shared by bytes P and P + 2) in the top half."""
    pair = _pair_bits(words, P % 2 == 1, 4)
    if P >= 2:
        return (pair & -65536).to(tl.float32, bitcast=True)
    else:
        return (pair << 16).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["split_k"])
def _w8a16_gemv_kernel(
    x_ptr, w_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    N, K, split_k, stride_wn, stride_sg,
    X_MUL: tl.constexpr, S_MUL: tl.constexpr,
    GROUPWISE: tl.constexpr,  # scale row changes every 128 along K (block checkpoints)
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,  # K tiles per load: chunks of [BLOCK_N, TILES, 32] int32
    PDL: tl.constexpr,
):
    """One activation row: float32 FMAs into an accumulator shaped like a weight chunk, summed
    over K once at the end. The next chunk's load is issued before the current one is
    converted (Triton pipelines only the loads of loops it software-pipelines), and the first
    before the PDL wait. Word w of a K tile holds the bytes of k = 2w, 64 + 2w, 2w + 1, 65 + 2w."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rt = tl.arange(0, TILES)
    rw = tl.arange(0, 32)
    k_tiles = tl.cdiv(K, _K_TILE)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)

    w_ptrs = w_ptr + rn_in[:, None, None] * stride_wn + ((k_first + rt) * 32)[None, :, None] + rw[None, None, :]
    # Scales through pointers shaped like the chunk (repeated over its words): a [BLOCK_N] load
    # would get its own register layout and a shared-memory round trip.
    s_ptrs = s_ptr + (k_first + rt)[None, :, None] * stride_sg + rn_in[:, None, None]
    x_ptrs = x_ptr + (k_first + rt)[:, None] * _K_TILE + 2 * rw[None, :]
    acc = tl.zeros((BLOCK_N, TILES, 32), dtype=tl.float32)
    packed = tl.load(w_ptrs, mask=(k_first + rt < k_last)[None, :, None], other=0)
    # The first chunk is in flight while the kernel before (whose output is x) finishes.
    await_inputs(PDL)
    for kt in range(k_first, k_last, TILES):
        live = kt + rt < k_last
        following = tl.load(w_ptrs + TILES * 32, mask=(kt + TILES + rt < k_last)[None, :, None], other=0)
        if GROUPWISE:
            s = tl.load(s_ptrs, mask=live[None, :, None], other=0.0).to(tl.float32)
        # One FMA per weight into `t`; the block scales multiply the four bytes' sum once.
        t = tl.zeros((BLOCK_N, TILES, 32), dtype=tl.float32)
        for p in tl.static_range(4):
            if EVEN_K:
                x = tl.load(x_ptrs + (p % 2) * _PAIRS + p // 2, mask=live[:, None], other=0.0)
            else:
                k_of = (kt + rt)[:, None] * _K_TILE + 2 * rw[None, :] + (p % 2) * _PAIRS + p // 2
                x = tl.load(x_ptrs + (p % 2) * _PAIRS + p // 2, mask=live[:, None] & (k_of < K), other=0.0)
            t += (x.to(tl.float32) * X_MUL)[None, :, :] * _byte_f32(packed, p)
        if GROUPWISE:
            acc += t * s
        else:
            acc += t
        packed = following
        w_ptrs += TILES * 32
        s_ptrs += TILES * stride_sg
        x_ptrs += TILES * _K_TILE
    out = tl.sum(tl.sum(acc, axis=2), axis=1) * S_MUL
    if not GROUPWISE:
        out = out * tl.load(s_ptr + rn_in).to(tl.float32)
    store_tile(out[None, :], c_ptr, bias_ptr, partial_ptr, counter_ptr, tl.arange(0, 1), rn, 1, N, N, pid_k,
               split_k, pid_n, HAS_BIAS, SPLIT)


@triton.jit
def _prefetch_l2(ptrs):
    """Start loading the 128-byte lines at `ptrs` into L2 (no registers wait for them)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit(do_not_specialize=["M", "split_k"])
def _w8a16_gemm_kernel(
    x_ptr, w_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k, stride_xm, stride_wn, stride_cm, stride_sg,
    X_MUL: tl.constexpr, S_MUL: tl.constexpr,
    GROUPWISE: tl.constexpr,  # scale row changes every 128 along K (block checkpoints)
    OUT: tl.constexpr,        # weight operand type, see _halves: 1 bf16, 2 fp16
    ASM: tl.constexpr,        # inline PTX conversion (compiled) or tensor ops (interpreter)
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    # Row tiles vary fastest so programs sharing a weight tile run together (L2 reuse).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ri = tl.arange(0, _PAIRS)
    rm_in = rm % M  # wrapped: rows past M (a decode batch under 16) load row copies, never stored
    rn_in = rn % N

    k_tiles = tl.cdiv(K, _K_TILE)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)

    w_ptrs = w_ptr + rn_in[:, None] * stride_wn + (k_first * _PAIRS + ri)[None, :]
    x_ptrs = x_ptr + rm_in[None, :] * stride_xm + (k_first * _K_TILE + ri)[:, None]  # x^T, first half
    s_ptrs = s_ptr + k_first * stride_sg + rn_in
    if PDL and ASM:  # the first weight tiles head for L2 while the kernel before still runs
        for kt in range(k_first, tl.minimum(k_last, k_first + _PDL_PREFETCH_TILES)):
            _prefetch_l2(w_ptr + rn_in * stride_wn + kt * _PAIRS)
    await_inputs(PDL)
    # Block scales are read one K tile ahead: a load too small to pipeline would otherwise stall
    # every step for an L2 round trip.
    s_next = tl.load(s_ptrs, mask=k_first < k_last, other=0.0)  # unused (dropped) without GROUPWISE
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        w_lo, w_hi = _halves(tl.load(w_ptrs), OUT, ASM)  # K padded: always in bounds
        if EVEN_K:
            x_lo = tl.load(x_ptrs)
            x_hi = tl.load(x_ptrs + _PAIRS)
        else:
            k_lo = kt * _K_TILE + ri
            x_lo = tl.load(x_ptrs, mask=(k_lo < K)[:, None], other=0.0)
            x_hi = tl.load(x_ptrs + _PAIRS, mask=(k_lo + _PAIRS < K)[:, None], other=0.0)
        if OUT == 1:
            x_lo = (x_lo.to(tl.float32) * X_MUL).to(tl.bfloat16)
            x_hi = (x_hi.to(tl.float32) * X_MUL).to(tl.bfloat16)
        if GROUPWISE:  # block scales change every K tile: its two dots are scaled once
            s = s_next.to(tl.float32)
            s_ptrs += stride_sg
            s_next = tl.load(s_ptrs, mask=kt + 1 < k_last, other=0.0)
            part = tl.dot(w_lo, x_lo)
            part = tl.dot(w_hi, x_hi, part)
            acc += part * s[:, None]
        else:
            acc = tl.dot(w_lo, x_lo, acc)
            acc = tl.dot(w_hi, x_hi, acc)
        w_ptrs += _PAIRS
        x_ptrs += _K_TILE
    acc = acc * S_MUL
    if not GROUPWISE:
        acc = acc * tl.load(s_ptr + rn_in).to(tl.float32)[:, None]

    store_tile(tl.trans(acc), c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k,
               split_k, pid_m * num_pid_n + pid_n, HAS_BIAS, SPLIT)


_TUNER = Autotuner("w8a16_gemm")


def w8a16_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    *,
    groupwise: bool,
    bias: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    config: W8A16Config | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """x [M, K] bf16/fp16 (unit K stride) @ packed FP8 weight [N, ceil(K/128)*32] -> [M, N] in x.dtype.

    scale: [ceil(K/128), N] (groupwise) or [1, N], in x.dtype, holding scale * 2^SCALE_SHIFT[x.dtype].
    `workspace` (int32 zeros, `workspace_size(N)`) enables split-K for small M. Without `config`
    the tuner picks among `candidates_for(M)`; `config` and `split_k` pin a launch (tests, sweeps).
    """
    m, k = x.shape
    n, words = packed.shape
    k_tiles = triton.cdiv(k, GROUP_K)
    if x.dtype not in SCALE_SHIFT or scale.dtype != x.dtype:
        raise ValueError(f"w8a16_gemm: activations and scales must share a dtype in "
                         f"{tuple(SCALE_SHIFT)}, got {x.dtype} and {scale.dtype}")
    if words != k_tiles * PAIRS // 2 or x.stride(1) != 1 or not packed.is_contiguous():
        raise ValueError(f"w8a16_gemm: packed weight {tuple(packed.shape)} does not match K={k} "
                         f"(expects [N, {k_tiles * PAIRS // 2}], contiguous) or x has a non-unit K stride")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out

    def run(cfg: W8A16Config, split: int | None = None) -> None:
        _launch(x, packed, scale, out, bias, workspace, groupwise, cfg, split)

    if config is None:
        key = (m_bucket(m), n, k, x.dtype, groupwise)
        config = _TUNER.pick(key, candidates_for(m), run, x.device)
    elif config.block_m == 1 and m != 1:
        raise ValueError(f"w8a16_gemm: the GEMV config {config} computes one row, got M={m}")
    run(config, split_k)
    return out


def _launch(x, packed, scale, out, bias, workspace, groupwise: bool, cfg: W8A16Config, split_k: int | None) -> None:
    m, k = x.shape
    n = packed.shape[0]
    m_tiles, n_tiles = triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n)
    if split_k is None:
        split_k = 1
        if workspace is not None and m_tiles == 1 and cfg.split_per_sm:
            split_k = choose_split_k(n_tiles, triton.cdiv(k, GROUP_K),
                                     target_programs(x.device, cfg.split_per_sm), m, n)
    partial, counters = split_k_buffers(split_k, m, n, n_tiles, workspace, x.device)
    shift = SCALE_SHIFT[x.dtype]
    if cfg.block_m == 1:  # float32 weights, 2^-120
        _w8a16_gemv_kernel[(n_tiles, split_k)](
            x, packed, scale, out, bias if bias is not None else out, partial, counters,
            n, k, split_k, packed.stride(0), scale.stride(0) if groupwise else 0,
            X_MUL=float(2.0 ** _X_EXP), S_MUL=float(2.0 ** (120 - _X_EXP - shift)), GROUPWISE=groupwise,
            HAS_BIAS=bias is not None, SPLIT=split_k > 1, EVEN_K=k % GROUP_K == 0, BLOCK_N=cfg.block_n,
            TILES=cfg.tiles, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(x.device))
        return
    if x.dtype == torch.bfloat16:
        out_kind, w_exp, x_exp = 1, 120, _X_EXP
    else:
        out_kind, w_exp, x_exp = 2, 8, 0
    pairs = packed.view(torch.int16)
    _w8a16_gemm_kernel[(m_tiles, n_tiles, split_k)](
        x, pairs, scale, out, bias if bias is not None else out, partial, counters,
        m, n, k, split_k, x.stride(0), pairs.stride(0), out.stride(0), scale.stride(0),
        X_MUL=float(2.0 ** x_exp), S_MUL=float(2.0 ** (w_exp - x_exp - shift)),
        GROUPWISE=groupwise, OUT=out_kind, ASM=os.environ.get("TRITON_INTERPRET") != "1",
        HAS_BIAS=bias is not None, SPLIT=split_k > 1, EVEN_K=k % GROUP_K == 0, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, num_warps=cfg.num_warps, **launch_options(x.device))
