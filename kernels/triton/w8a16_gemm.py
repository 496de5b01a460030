"""Weight-only FP8 GEMM (W8A16): FP8 weights packed four to an int32, activations in bf16/fp16.

Runs on compute capability 8.0, which has no FP8 instructions: weights become bf16, fp16 or
float32 by moving bits, and products run on bf16/fp16 tensor cores, or as float32 FMAs for a
single row (decode at batch 1), where the GEMM is a GEMV that only has to stream the weights.

Packed layout ("k-planes"), built once at load by `pack_weight`: for K tile t (128 wide) and
row j < 32 of that tile, int32 [t * 32 + j, n] holds in byte p the weight w[n, t*128 + 32p + j].
A [32, BLOCK_N] load therefore yields four [32, BLOCK_N] planes, each the operand of one K=32
dot (or of 32 x BLOCK_N FMAs), with N contiguous for wide, coalesced loads. Programs that run
together then read neighbouring pieces of the same rows; storing each column tile's rows
contiguously instead put them a whole tile apart, on few DRAM channels: 3-4x slower (run 28).

Bit conversion: an e4m3 byte's sign and 7 exponent/mantissa bits, moved into the top of a
bf16 (or float32), give the same number times 2^-120 (2^-8 into fp16); fp8 subnormals land on
subnormals of the wider type, so the conversion is exact. The 2^120 goes back in with the
scale. Activations are pre-multiplied by 2^64 (exact) on those paths so that products of small
activations and small weights stay far from float32 subnormals.

On Hopper (sm_90) the dot kernel can take its weight tiles by TMA (a host tensor descriptor over
the packed weight): the copy engine fills the ring of shared-memory stages that Triton's pipeliner
sets up, where pointer loads cost every thread an address, a cp.async and a wait per tile. At
M = 16 that was 10-25% faster on the H200 (run 10). Its loads are issued after the PDL wait (the
pipeliner places them with the activation loads), so a config may first prefetch its first K
tiles into L2 while the kernel before still runs.

Small M streams the weights with K split across programs (gemm_epilogue); the GEMV loads one,
two or four K tiles at a time and issues the next load before converting the current chunk
(one tile ahead kept the H200 at 45-69% of its copy bandwidth at M=1: too few bytes in flight
per SM). Triton software-pipelines a loop without a dot only when asked (`tl.range(...,
num_stages=...)`), through shared memory: that GEMV measured 15-35% slower (run 7). Two chunks
in flight, or fewer registers so that more programs stay resident, did not help either: the loop
issues about 5 instructions per weight byte, 3 of them moving bits, and is bound by issue as much
as by memory latency (run 28). Column tiles, tiles per load and splits are tuned per shape on the
GPU (tuning.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .launch import DirectLaunch, aligned, cdiv, tma_device
from .pdl import await_inputs, launch_options, prefetch_l2
from .gemm_epilogue import automatic_split_k, bias_operand, split_k_buffers, store_tile
from .tuning import Autotuner, m_bucket

GROUP_K = 128  # K tile = scale group along K for block checkpoints
PLANE_K = GROUP_K // 4
# Scales are stored in the activation dtype; fp16 ones are kept as scale * 2^10 so that
# typical FP8 weight scales (1e-5 .. 1e-2) stay normal fp16 numbers.
SCALE_SHIFT = {torch.bfloat16: 0, torch.float16: 10}
_X_EXP = 64  # activation pre-scale exponent on the bf16 and float32 paths


@dataclass(frozen=True)
class W8A16Config:
    block_m: int  # 1: the float32-FMA GEMV, one row per program; else tensor-core dots
    block_n: int
    num_warps: int
    num_stages: int
    split_per_sm: int = 0  # split K until there are this many programs per SM (0: never split)
    tiles: int = 1  # GEMV: K tiles per load (the next load is in flight while one is converted)
    tma: bool = False  # dot kernel: weight tiles by TMA (sm_90, N a multiple of 4)
    prefetch: int = 0  # dot kernel: K tiles of weights prefetched into L2 before the PDL wait


# Candidates per M bucket (tuning.m_bucket), the default first: the tuner times them once per
# shape on the GPU. Split-K is a runtime argument, so configs differing only in it share a
# compilation; split_per_sm targets one or two waves of the programs an SM holds (GEMV 64
# columns, 4 warps: 5 per SM by registers, 4 with two tiles per load; four tiles per load
# need 8 warps: 2; dot 16x64: 6; 16x32: 9). The GEMV default is the H200's choice for every
# shape of run 2. More tiles per load keep more bytes in flight with fewer programs, so K is
# split less and the partials' reduction (a serial tail of two L2 round trips) shrinks or goes;
# 16 columns with 8 or 16 tiles per load read K = 2048 in one or two loads, unsplit.
# The 64x128 tile is the largest that does not spill on sm_80 (mma.sync keeps operands in
# registers).
CANDIDATES: dict[int, tuple[W8A16Config, ...]] = {
    1: (W8A16Config(1, 64, 4, 1, 5), W8A16Config(1, 64, 4, 1, 10), W8A16Config(1, 64, 4, 1, 4, tiles=2),
        W8A16Config(1, 64, 4, 1, 8, tiles=2), W8A16Config(1, 64, 8, 1, 2, tiles=4),
        W8A16Config(1, 64, 8, 1, 4, tiles=4), W8A16Config(1, 64, 8, 1, 0, tiles=4),
        W8A16Config(1, 128, 8, 1, 2, tiles=2), W8A16Config(1, 16, 8, 1, 0, tiles=16),
        W8A16Config(1, 16, 4, 1, 0, tiles=8)),
    16: (W8A16Config(16, 64, 4, 3, 6), W8A16Config(16, 32, 4, 3, 9), W8A16Config(16, 64, 4, 3, 12),
         W8A16Config(16, 128, 4, 4, 3), W8A16Config(16, 64, 4, 4, 6)),
    64: (W8A16Config(64, 64, 4, 3, 2), W8A16Config(32, 64, 4, 3, 3)),
    256: (W8A16Config(64, 128, 4, 3), W8A16Config(64, 64, 4, 3)),
}
LARGE_M = (W8A16Config(64, 128, 4, 3),)
# Hopper, 2-16 rows: the TMA dot kernel first (run 10, graph us at M = 16 against the pointer dot
# kernel: 4096x4096 9.2 vs 12.4, 4096x14336 22.1 vs 24.1, 14336x4096 21.7 vs 25.0). The split
# targets give the best splits measured: 4 at 4096x4096 and 4096x14336, 8 at 14336x4096. Not at
# one row: there it tied the GEMV (8.4-20.4 vs 8.3-21.1 us) and, picked under PDL by a 3% margin,
# was 20% slower than the GEMV without PDL (bench_linear, call 12).
SM90_CANDIDATES: dict[int, tuple[W8A16Config, ...]] = {
    16: (W8A16Config(16, 64, 4, 4, 2, tma=True, prefetch=2), W8A16Config(16, 64, 4, 3, 4, tma=True),
         W8A16Config(16, 64, 4, 3, 7, tma=True), W8A16Config(16, 64, 4, 3, 4, tma=True, prefetch=2))
    + CANDIDATES[16],
}
# Split-K only while the output has one row tile; the workspace holds one counter per column tile.
MIN_BLOCK_N = 32


def candidates_for(m: int, tma: bool = False) -> tuple[W8A16Config, ...]:
    """The tuner's candidates for M rows, the default first; `tma`: the GPU and layer take TMA
    weight loads (`tma_capable`)."""
    bucket = m_bucket(m)
    if tma and bucket in SM90_CANDIDATES:
        return SM90_CANDIDATES[bucket]
    return CANDIDATES.get(bucket, LARGE_M)


def tma_capable(device: torch.device, n: int) -> bool:
    """Whether the TMA configs can run: Hopper, and packed rows of N int32 16-byte aligned."""
    return n % 4 == 0 and tma_device(device)


def workspace_size(n: int) -> int:
    """int32 counters a layer with N outputs needs (zero-initialised, bound once)."""
    return cdiv(n, MIN_BLOCK_N)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """FP8 [N, K] -> int32 [ceil(K/128) * 32, N] in the k-planes layout (zero-padded K)."""
    n, k = weight.shape
    k_tiles = cdiv(k, GROUP_K)
    padded = torch.zeros((n, k_tiles * GROUP_K), dtype=torch.uint8, device=weight.device)
    padded[:, :k] = weight.view(torch.uint8)
    planes = padded.view(n, k_tiles, 4, PLANE_K).permute(1, 3, 0, 2)  # [tile, j, n, byte p]
    # Little-endian: byte p of each int32 is bits 8p..8p+7.
    return planes.contiguous().view(torch.int32).view(k_tiles * PLANE_K, n)


def unpack_weight(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of pack_weight (tests and debugging)."""
    rows, n = packed.shape
    planes = packed.contiguous().view(torch.uint8).view(rows // PLANE_K, PLANE_K, n, 4)
    return planes.permute(2, 0, 3, 1).reshape(n, -1)[:, :k].contiguous().view(torch.float8_e4m3fn)


@triton.jit
def _plane_pair_bits(packed, ODD: tl.constexpr, MAG_SHIFT: tl.constexpr):
    """Bytes (1, 3) if ODD else (0, 2) of each int32 as two 16-bit floats side by side: sign to
    bit 15, exponent+mantissa to bits MAG_SHIFT.. (4: bf16 -> value * 2^-120, 7: fp16 -> * 2^-8)."""
    mag_mask: tl.constexpr = (0x7F << MAG_SHIFT) | (0x7F << (MAG_SHIFT + 16))
    if ODD:
        return (packed & -2147450880) | ((packed >> (8 - MAG_SHIFT)) & mag_mask)  # -2147450880 = 0x80008000
    else:
        return ((packed << 8) & -2147450880) | ((packed << MAG_SHIFT) & mag_mask)


@triton.jit
def _plane(packed, P: tl.constexpr, OUT: tl.constexpr):
    """Byte P of each int32 as OUT: 0 -> float32 (x 2^-120), 1 -> bf16 (x 2^-120), 2 -> fp16 (x 2^-8)."""
    pair = _plane_pair_bits(packed, P % 2 == 1, 7 if OUT == 2 else 4)
    if OUT == 0:
        if P >= 2:
            return (pair & -65536).to(tl.float32, bitcast=True)
        else:
            return (pair << 16).to(tl.float32, bitcast=True)
    else:
        half = (pair >> 16) if P >= 2 else pair
        if OUT == 1:
            return half.to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            return half.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit(do_not_specialize=["split_k"])
def _w8a16_gemv_kernel(
    x_ptr, w_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    N, K, split_k, stride_sg,
    X_MUL: tl.constexpr, S_MUL: tl.constexpr,
    GROUPWISE: tl.constexpr,  # scale row changes every 128 along K (block checkpoints)
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,  # K tiles per load: chunks of [32 * TILES, BLOCK_N] int32
    PDL: tl.constexpr,
):
    """One activation row: float32 FMAs into a [32 * TILES, BLOCK_N] accumulator laid out like
    a weight chunk, reduced over its rows once at the end. The next chunk's load is issued
    before the current one is converted."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rj = tl.arange(0, 32 * TILES)
    tile = rj // 32  # the chunk's K tile that each row belongs to
    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)

    w_ptrs = w_ptr + (k_first * 32 + rj)[:, None] * N + rn_in[None, :]
    # Scales are read through pointers shaped like the weight chunk (repeated over each tile's
    # rows): a [BLOCK_N] load would get its own register layout and a shared-memory round trip.
    s_ptrs = s_ptr + (k_first + tile)[:, None] * stride_sg + rn_in[None, :]
    x_ptrs = x_ptr + (k_first + tile) * 128 + rj % 32
    acc = tl.zeros((32 * TILES, BLOCK_N), dtype=tl.float32)
    packed = tl.load(w_ptrs, mask=(k_first + tile < k_last)[:, None], other=0)
    # The first chunk is in flight while the kernel before (whose output is x) finishes.
    await_inputs(PDL)
    for kt in range(k_first, k_last, TILES):
        live = kt + tile < k_last
        following = tl.load(w_ptrs + 32 * TILES * N, mask=(kt + TILES + tile < k_last)[:, None], other=0)
        if GROUPWISE:
            s = tl.load(s_ptrs, mask=live[:, None], other=0.0).to(tl.float32)
        # One FMA per weight into `t`; the block scales multiply the four planes' sum once.
        t = tl.zeros((32 * TILES, BLOCK_N), dtype=tl.float32)
        for p in tl.static_range(4):
            if EVEN_K:
                x = tl.load(x_ptrs + p * 32, mask=live, other=0.0)
            else:
                x = tl.load(x_ptrs + p * 32, mask=live & ((kt + tile) * 128 + p * 32 + rj % 32 < K), other=0.0)
            t += (x.to(tl.float32) * X_MUL)[:, None] * _plane(packed, p, 0)
        if GROUPWISE:
            acc += t * s
        else:
            acc += t
        packed = following
        w_ptrs += 32 * TILES * N
        s_ptrs += TILES * stride_sg
        x_ptrs += 128 * TILES
    out = tl.sum(acc, axis=0) * S_MUL
    if not GROUPWISE:
        out = out * tl.load(s_ptr + rn_in).to(tl.float32)
    store_tile(out[None, :], c_ptr, bias_ptr, partial_ptr, counter_ptr, tl.arange(0, 1), rn, 1, N, N, pid_k,
               split_k, pid_n, HAS_BIAS, SPLIT)


@triton.jit(do_not_specialize=["M", "split_k"])
def _w8a16_gemm_kernel(
    x_ptr, w_ptr, w_desc, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k, stride_xm, stride_cm, stride_sg,
    X_MUL: tl.constexpr, S_MUL: tl.constexpr,
    GROUPWISE: tl.constexpr,  # scale row changes every 128 along K (block checkpoints)
    OUT: tl.constexpr,        # weight operand type, see _plane: 1 bf16, 2 fp16
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
    TMA: tl.constexpr,  # weight tiles from w_desc (the packed weight, blocks [32, BLOCK_N]), else w_ptr
    PREFETCH: tl.constexpr,  # K tiles of weights prefetched into L2 before the PDL wait
    STAGES: tl.constexpr,  # the launch's num_stages
):
    # Row tiles vary fastest so programs sharing a weight tile run together (L2 reuse).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rj = tl.arange(0, 32)
    rm_in = rm % M
    rn_in = rn % N

    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)
    if PREFETCH > 0:
        # One 128-byte line per address: PREFETCH * 32 rows of BLOCK_N int32, this slice's only.
        lines = tl.arange(0, PREFETCH * BLOCK_N)
        row = tl.minimum(k_first * 32 + lines // (BLOCK_N // 32), k_last * 32 - 1)
        col = tl.minimum(pid_n * BLOCK_N + (lines % (BLOCK_N // 32)) * 32, N - 1)
        prefetch_l2(w_ptr + row.to(tl.int64) * N + col)
    await_inputs(PDL)

    w_ptrs = w_ptr + (k_first * 32 + rj)[:, None] * N + rn_in[None, :]
    s_ptrs = s_ptr + rn_in
    x_ptrs = x_ptr + rm_in[:, None] * stride_xm + (k_first * 128 + rj)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Stages named here (not only as the launch option) so that the block scales' loads are
    # pipelined too, not just the dot operands': a scale load waited for in every K step cost
    # the TMA kernel ~25% at M = 16 (run 10).
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        if TMA:
            packed = w_desc.load([kt * 32, pid_n * BLOCK_N])  # zero past N
        else:
            packed = tl.load(w_ptrs)
        if GROUPWISE:
            s = tl.load(s_ptrs + kt * stride_sg).to(tl.float32)
        # Block scales change every K tile: its four dots go to `part`, scaled once.
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) if GROUPWISE else acc
        for p in tl.static_range(4):
            if EVEN_K:
                x = tl.load(x_ptrs + p * 32)
            else:
                x = tl.load(x_ptrs + p * 32, mask=(kt * 128 + p * 32 + rj < K)[None, :], other=0.0)
            if OUT == 1:
                x = (x.to(tl.float32) * X_MUL).to(tl.bfloat16)
            part = tl.dot(x, _plane(packed, p, OUT), part)
        if GROUPWISE:
            acc += part * s[None, :]
        else:
            acc = part
        w_ptrs += 32 * N
        x_ptrs += 128
    acc = acc * S_MUL
    if not GROUPWISE:
        acc = acc * tl.load(s_ptrs).to(tl.float32)[None, :]

    store_tile(acc, c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k,
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
    """x [M, K] bf16/fp16 (unit K stride) @ packed FP8 weight [ceil(K/128)*32, N] -> [M, N] in x.dtype.

    scale: [ceil(K/128), N] (groupwise) or [1, N], in x.dtype, holding scale * 2^SCALE_SHIFT[x.dtype].
    `workspace` (int32 zeros, `workspace_size(N)`) enables split-K for small M. Without `config`
    the tuner picks among `candidates_for(M)`; `config` and `split_k` pin a launch (tests, sweeps).
    """
    m, k = x.shape
    rows, n = packed.shape
    k_tiles = cdiv(k, GROUP_K)
    if x.dtype not in SCALE_SHIFT or scale.dtype != x.dtype:
        raise ValueError(f"w8a16_gemm: activations and scales must share a dtype in "
                         f"{tuple(SCALE_SHIFT)}, got {x.dtype} and {scale.dtype}")
    if rows != k_tiles * PLANE_K or x.stride(1) != 1 or not packed.is_contiguous():
        raise ValueError(f"w8a16_gemm: packed weight {tuple(packed.shape)} does not match K={k} "
                         f"(expects [{k_tiles * PLANE_K}, N], contiguous) or x has a non-unit K stride")
    bias = bias_operand(bias, n)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out

    def run(cfg: W8A16Config, split: int | None = None) -> None:
        _launch(x, packed, scale, out, bias, workspace, groupwise, cfg, split)

    if config is None:
        key = (m_bucket(m), n, k, x.dtype, groupwise)
        config = _TUNER.pick(key, candidates_for(m, tma_capable(x.device, n)), run, x.device)
    elif config.block_m == 1 and m != 1:
        raise ValueError(f"w8a16_gemm: the GEMV config {config} computes one row, got M={m}")
    elif config.tma and n % 4:
        raise ValueError(f"w8a16_gemm: the TMA config {config} needs N a multiple of 4 (16-byte rows), got N={n}")
    run(config, split_k)
    return out


def _launch(x, packed, scale, out, bias, workspace, groupwise: bool, cfg: W8A16Config, split_k: int | None) -> None:
    m, k = x.shape
    n = packed.shape[1]
    m_tiles, n_tiles = cdiv(m, cfg.block_m), cdiv(n, cfg.block_n)
    if split_k is None:
        split_k = automatic_split_k(m, n, cdiv(k, GROUP_K), cfg.block_m, n_tiles, cfg.split_per_sm, workspace,
                                    x.device)
    partial, counters = split_k_buffers(split_k, m, n, n_tiles, workspace, x.device)
    shift = SCALE_SHIFT[x.dtype]
    bias_arg = bias if bias is not None else out
    options = launch_options(x.device)
    # What the launch specializes on besides cfg and the constexprs below (launch.py); the output
    # is fresh, so aligned with N-element rows.
    pointers = tuple(aligned(t.data_ptr()) for t in (x, packed, scale, bias_arg, partial, counters))
    spec = (cfg, x.dtype, groupwise, bias is not None, split_k > 1, n, k, options["PDL"], *pointers)
    if cfg.block_m == 1:  # float32 weights, 2^-120
        stride_sg = scale.stride(0) if groupwise else 0
        _gemv_launch(
            (*spec, stride_sg), (n_tiles, split_k),
            (x, packed, scale, out, bias_arg, partial, counters, n, k, split_k, stride_sg),
            X_MUL=float(2.0 ** _X_EXP), S_MUL=float(2.0 ** (120 - _X_EXP - shift)), GROUPWISE=groupwise,
            HAS_BIAS=bias is not None, SPLIT=split_k > 1, EVEN_K=k % GROUP_K == 0, BLOCK_N=cfg.block_n,
            TILES=cfg.tiles, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **options)
        return
    if x.dtype == torch.bfloat16:
        out_kind, w_exp, x_exp = 1, 120, _X_EXP
    else:
        out_kind, w_exp, x_exp = 2, 8, 0
    strides = (x.stride(0), n, scale.stride(0))  # out: [M, N] contiguous
    w_desc = TensorDescriptor(packed, [packed.shape[0], n], [n, 1], [PLANE_K, cfg.block_n]) if cfg.tma else None
    _gemm_launch(
        (*spec, *strides), (m_tiles, n_tiles, split_k),
        (x, packed, w_desc, scale, out, bias_arg, partial, counters, m, n, k, split_k, *strides),
        X_MUL=float(2.0 ** x_exp), S_MUL=float(2.0 ** (w_exp - x_exp - shift)),
        GROUPWISE=groupwise, OUT=out_kind, HAS_BIAS=bias is not None, SPLIT=split_k > 1,
        EVEN_K=k % GROUP_K == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TMA=cfg.tma, PREFETCH=cfg.prefetch,
        STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **options)


# Eager calls (prefill, --enforce-eager decode) are bound by host time: by handle (launch.py).
_gemv_launch = DirectLaunch(_w8a16_gemv_kernel)
_gemm_launch = DirectLaunch(_w8a16_gemm_kernel)
