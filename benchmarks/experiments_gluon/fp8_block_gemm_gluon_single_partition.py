"""Block-scaled W8A8 FP8 GEMM for Hopper (sm_90) in Gluon, with the promotion off the MMA's path.

out[M, N] = sum_kt dot(a[:, kt], b[:, kt]^T) * a_scale[m, kt] * b_scale[n // 128, kt]: the same
math and summation order per K step as `_w8a8_tma_kernel` in fp8_block_gemm.py (1x128
activation groups, 128x128 weight blocks, one exact FP8 tensor-core dot per 128 of K, scaled
into a float32 accumulator).

Why Gluon: Triton 3.6 waits for each K step's wgmma to finish before `acc += dot * scale`, so
the tensor cores idle during every promotion (the Triton kernel runs at 0.67-0.78x of cuBLAS's
block-wise `scaled_mm` on the H200). Here each K block is two asynchronous wgmmas, one per
64-column half, into two raw register tiles started from zero (`use_acc=False`);
`warpgroup_mma_wait(1)` retires the first half, which is promoted while the second runs.
Operands arrive by TMA into a ring of NUM_STAGES shared-memory slots, each with a "ready"
mbarrier; a slot is refilled once every warpgroup has retired the wgmmas that read it.

What ptxas allows decided the shape (sm_90, ptxas of Triton 3.6): a wgmma still in flight
across the loop's back edge while another tile is read (the block k+1 / block k ping-pong)
makes it serialize every wgmma of the kernel (C7514/C7515), as did full-width raw tiles (3 x 64
floats per thread with the accumulator). So nothing is in flight across iterations, and only
half of each promotion can overlap a wgmma; ptxas may still move some of it past the wait.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_K = 128  # the scale group along K: one promotion per block
SCALE_BLOCK_N = gl.constexpr(128)  # weight rows sharing one scale row


@dataclass(frozen=True)
class GluonGemmConfig:
    block_m: int
    block_n: int
    num_stages: int
    num_warps: int
    group_m: int = 8


# One warpgroup per 64 rows (the wgmma M atom), the whole 128-column scale block per program:
# the weight scale is then one scalar per K step. Four stages of 128x128 operands are 128 KiB.
CANDIDATES: tuple[GluonGemmConfig, ...] = (
    GluonGemmConfig(128, 128, 4, 8),
    GluonGemmConfig(128, 128, 3, 8),
    GluonGemmConfig(64, 128, 4, 4),
    GluonGemmConfig(128, 128, 5, 8),
)


@gluon.jit
def _grouped_tile(pid, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """GROUP_M row tiles sweep the columns together so their B tiles stay in L2."""
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_rows
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_rows
    return pid_m, pid_n


@gluon.jit
def _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, blk, m0, n0, k_tiles, NUM_STAGES: gl.constexpr):
    """TMA loads of K block `blk` into its ring slot; nothing past the last block."""
    BLOCK_K_: gl.constexpr = a_desc.block_type.shape[1]
    slot = blk % NUM_STAGES
    live = blk < k_tiles
    bar = ready.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [m0, blk * BLOCK_K_], bar, a_bufs.index(slot), live)
    tma.async_copy_global_to_shared(b_desc, [n0, blk * BLOCK_K_], bar, b_bufs.index(slot), live)


@gluon.jit(do_not_specialize=["M", "stride_asg", "stride_bsn"])
def _w8a8_block_gluon_kernel(
    a_desc, b_desc, c_desc, a_scale_ptr, b_scale_ptr, bias_ptr,
    M, N, K, stride_asm, stride_asg, stride_bsn, stride_bsg,
    HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    """a_desc [M, K] fp8 in [BLOCK_M, 128] blocks, b_desc [N, K] in [BLOCK_N, 128], c_desc the
    output in [BLOCK_M, BLOCK_N / 2] (one per column half; its TMA store clips the edge tiles)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    HALF_N: gl.constexpr = BLOCK_N // 2
    BK: gl.constexpr = a_desc.block_type.shape[1]
    NUM_WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_M == 16 * NUM_WARPS, "one warp per 16 rows: warpgroups stack along M")
    gl.static_assert(SCALE_BLOCK_N % BLOCK_N == 0, "a column tile must lie in one weight scale block")
    gl.static_assert(c_desc.block_type.shape[1] == HALF_N, "the output is stored by column halves")

    pid_m, pid_n = _grouped_tile(gl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    k_tiles = gl.cdiv(K, BK)

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES, BLOCK_M, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES, BLOCK_N, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, i, m0, n0, k_tiles, NUM_STAGES)

    # Each K block is two wgmmas, one per column half, into two raw tiles that take turns: while
    # one half is promoted, the other (or the next block's first half) is on the tensor cores.
    # Half-width tiles keep acc + raw tiles at 2 x 2 x 32 floats per thread; full-width ones
    # (3 x 64 with the accumulator) left ptxas too few registers to keep the wgmmas in flight.
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                         instr_shape=[16, HALF_N, 32])
    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout))
    # Clamped rows read real scales; their A rows are TMA zero fill and the store clips them.
    a_scale_ptrs = a_scale_ptr + gl.minimum(rows, M - 1) * stride_asm
    b_scale_ptr = b_scale_ptr + (n0 // SCALE_BLOCK_N) * stride_bsn

    acc0 = gl.zeros([BLOCK_M, HALF_N], gl.float32, mma_layout)
    acc1 = gl.zeros([BLOCK_M, HALF_N], gl.float32, mma_layout)
    t0 = gl.zeros([BLOCK_M, HALF_N], gl.float32, mma_layout)
    t1 = gl.zeros([BLOCK_M, HALF_N], gl.float32, mma_layout)
    for kt in range(k_tiles):
        slot = kt % NUM_STAGES
        mbarrier.wait(ready.index(slot), (kt // NUM_STAGES) & 1)
        a_tile = a_bufs.index(slot)
        b_tile = b_bufs.index(slot)
        t0 = warpgroup_mma(a_tile, b_tile.slice(0, HALF_N).permute((1, 0)), t0, use_acc=False, is_async=True)
        t1 = warpgroup_mma(a_tile, b_tile.slice(HALF_N, HALF_N).permute((1, 0)), t1, use_acc=False,
                           is_async=True)
        s = gl.load(a_scale_ptrs + kt * stride_asg) * gl.load(b_scale_ptr + kt * stride_bsg)
        t0 = warpgroup_mma_wait(num_outstanding=1, deps=(t0, ))
        acc0 += t0 * s[:, None]
        # Nothing stays in flight across the loop's back edge: ptxas serializes every wgmma of a
        # kernel whose in-flight accumulators it cannot track, and an accumulator carried
        # through the back edge while another is read is one it cannot.
        t1, acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(t1, acc0))
        # The wait is per warpgroup, the TMA issue one thread's: every warpgroup must have
        # retired block kt before its slot is overwritten.
        gl.thread_barrier()
        _load_block(a_desc, b_desc, a_bufs, b_bufs, ready, kt + NUM_STAGES, m0, n0, k_tiles, NUM_STAGES)
        acc1 += t1 * s[:, None]
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))

    if HAS_BIAS:
        cols = n0 + gl.arange(0, HALF_N, layout=gl.SliceLayout(0, mma_layout))
        acc0 += gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
        cols += HALF_N
        acc1 += gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [2, BLOCK_M, HALF_N], c_desc.layout)
    c_smem.index(0).store(acc0.to(c_desc.dtype))
    c_smem.index(1).store(acc1.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [m0, n0], c_smem.index(0))
    tma.async_copy_shared_to_global(c_desc, [m0, n0 + HALF_N], c_smem.index(1))
    tma.store_wait(pendings=0)


_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@functools.cache
def _smem_layout(block: tuple[int, int], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])


def w8a8_block_gemm_gluon(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    bias: torch.Tensor | None = None,
    config: GluonGemmConfig | None = None,
) -> torch.Tensor:
    """a [M, K] fp8 contiguous, b [N, K] fp8 contiguous -> out [M, N] (bf16 or fp16), sm_90 only.

    a_scale [M, ceil(K/128)] float32 (any strides; column-major reads coalesce), b_scale
    [ceil(N/128), ceil(K/128)] float32 (any strides), bias [N] or None. K and N multiples of 16
    (TMA rows must be 16-byte aligned).
    """
    cfg = config or CANDIDATES[0]
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k or not a.is_contiguous() or not b.is_contiguous():
        raise ValueError(f"w8a8_block_gemm_gluon: contiguous a [M, K] and b [N, K] expected, got a {tuple(a.shape)} "
                         f"strides {a.stride()}, b {tuple(b.shape)} strides {b.stride()}")
    if k % 16 or n % 16:
        raise ValueError(f"w8a8_block_gemm_gluon: K and N must be multiples of 16, got K={k}, N={n}")
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"w8a8_block_gemm_gluon: bf16 or fp16 output, got {out_dtype}")
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, BLOCK_K], _smem_layout((cfg.block_m, BLOCK_K), a.dtype))
    b_desc = TensorDescriptor.from_tensor(b, [cfg.block_n, BLOCK_K], _smem_layout((cfg.block_n, BLOCK_K), b.dtype))
    c_desc = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.block_n // 2],
                                          _smem_layout((cfg.block_m, cfg.block_n // 2), out_dtype))
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), )
    _w8a8_block_gluon_kernel[grid](
        a_desc, b_desc, c_desc, a_scale, b_scale, bias if bias is not None else out,
        m, n, k, a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        HAS_BIAS=bias is not None, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    return out
