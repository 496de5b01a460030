"""Block-scaled W8A8 FP8 GEMM for Hopper (sm_90) in Gluon, warp-specialized: the float32
promotion of one warpgroup runs while another warpgroup's wgmma keeps the tensor cores busy.

out[M, N] = sum_kt dot(a[:, kt], b[:, kt]^T) * a_scale[m, kt] * b_scale[n // 128, kt]: the same
math and summation order per K step as `_w8a8_tma_kernel` in fp8_block_gemm.py (1x128
activation groups, 128x128 weight blocks, one exact FP8 tensor-core dot per 128 of K, scaled
into a float32 accumulator).

Why this shape (the DeepGEMM design). A promotion `acc += t * scale` needs the K step's wgmma to
be finished, so within one warpgroup the tensor cores idle during it. Keeping the next wgmma in
flight across the loop's back edge instead makes ptxas (C7514/C7515) serialize every wgmma of
the kernel. So the overlap comes from independent warpgroups instead:

* a producer warp issues the TMA loads of A [128, 128] and B [BLOCK_N, 128] into a ring of
  NUM_STAGES slots ("ready" mbarrier per slot, armed with the byte count) and refills a slot
  once both consumers have released it ("empty" mbarrier, count 2);
* two consumer warpgroups own rows 0-63 and 64-127 of the 128-row tile. Per K step each waits
  for the slot, runs its 64 x 128 x 128 wgmma into a raw tile (use_acc=False), waits for it,
  releases the slot and promotes. Nothing is in flight across an iteration, and the two never
  wait on each other: while one promotes, the other's wgmma runs.

The grid is persistent (one program per SM, tiles in GROUP_M order), so the producer fetches
the next tile's operands during the consumers' epilogue. Each consumer stores its own 64 rows
by TMA (the store clips the edge tiles; TMA loads zero-fill them).

Registers: the kernel has 4 (consumer 0, the default partition) + 4 (consumer 1) + 1 (producer)
warps, padded to 3 warpgroups. The producer asks for 40 registers, consumer 1 for 232, and the
default partition gets what is left: 168 x 3 - 232 - 40 = 232. At BLOCK_N = 128 a consumer holds
64 accumulator + 64 raw floats per thread. BLOCK_N = 256 (two scale blocks, promoted through one
shared raw tile in two 128-column wgmmas) spilled ~400 bytes per consumer at 232 registers, so
the tile is 128 x 128 and the weight scale one scalar per K step.
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
CONSUMER_ROWS = 64  # rows of a tile per consumer warpgroup: the wgmma M atom
PRODUCER_REGS = gl.constexpr(40)
CONSUMER_REGS = gl.constexpr(232)


@dataclass(frozen=True)
class GluonGemmConfig:
    block_m: int  # 128: two consumer warpgroups of 64 rows
    block_n: int  # 128: one weight scale block
    num_stages: int
    num_warps: int  # 4: the default partition is consumer 0
    group_m: int = 8


def smem_bytes(cfg: GluonGemmConfig, out_bytes: int = 2) -> int:
    """Operand ring, the output staging of both consumers and the mbarriers (H200: 227 KiB per CTA)."""
    ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * BLOCK_K
    return ring + cfg.block_m * cfg.block_n * out_bytes + 2 * 8 * cfg.num_stages


# A stage is 32 KiB and the output staging 32 KiB: 6 stages (224 KiB) is the most that fits.
CANDIDATES: tuple[GluonGemmConfig, ...] = (
    GluonGemmConfig(128, 128, 5, 4),
    GluonGemmConfig(128, 128, 4, 4),
    GluonGemmConfig(128, 128, 6, 4),
    GluonGemmConfig(128, 128, 5, 4, group_m=16),
)


@gluon.jit
def _grouped_tile(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """GROUP_M row tiles sweep the columns together so their B tiles stay in L2."""
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    group = tile // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % (GROUP_M * num_pid_n)) % group_rows
    pid_n = (tile % (GROUP_M * num_pid_n)) // group_rows
    return pid_m, pid_n


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr,
              NUM_STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        for kt in range(k_tiles):
            slot = it % NUM_STAGES
            # A fresh mbarrier counts as having completed the phase before phase 0, so the
            # first pass over the ring does not wait.
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [m0, kt * BK], bar, a_bufs.index(slot))
            tma.async_copy_global_to_shared(b_desc, [n0, kt * BK], bar, b_bufs.index(slot))
            it += 1


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_desc, c_smem, a_scale_ptr, b_scale_ptr, bias_ptr,
              M, N, K, stride_asm, stride_asg, stride_bsn, stride_bsg,
              HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr, HALF: gl.constexpr):
    """Rows HALF*64 .. HALF*64+63 of every tile of this program; 4 warps."""
    BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
    BK: gl.constexpr = a_bufs.type.shape[2]
    ROWS: gl.constexpr = c_desc.block_type.shape[0]
    gl.static_assert(BLOCK_N == SCALE_BLOCK_N, "one weight scale per tile and K step")
    gl.static_assert(c_desc.block_type.shape[1] == BLOCK_N, "each consumer stores its rows in one piece")
    gl.static_assert(ROWS * 2 == BLOCK_M, "two consumers split the tile's rows")
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                         instr_shape=[16, BLOCK_N, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)

    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BK)
    t = gl.zeros([ROWS, BLOCK_N], gl.float32, mma_layout)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        r0 = pid_m * BLOCK_M + HALF * ROWS
        n0 = pid_n * BLOCK_N
        rows = r0 + gl.arange(0, ROWS, layout=row_layout)
        # Clamped rows read real scales; their A rows are TMA zero fill and the store clips them.
        a_scale_ptrs = a_scale_ptr + gl.minimum(rows, M - 1) * stride_asm
        bs_ptr = b_scale_ptr + (n0 // SCALE_BLOCK_N) * stride_bsn
        # The scales are global loads with L2 latency; each is fetched one K step early so the
        # promotion never waits for it.
        sa_next = gl.load(a_scale_ptrs)
        sb_next = gl.load(bs_ptr)
        acc = gl.zeros([ROWS, BLOCK_N], gl.float32, mma_layout)
        for kt in range(k_tiles):
            sa = sa_next
            sb = sb_next
            more = kt + 1 < k_tiles
            sa_next = gl.load(a_scale_ptrs + (kt + 1) * stride_asg, mask=more, other=0.0)
            sb_next = gl.load(bs_ptr + (kt + 1) * stride_bsg, mask=more, other=0.0)

            slot = it % NUM_STAGES
            mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
            a_tile = a_bufs.index(slot).slice(HALF * ROWS, ROWS)
            t = warpgroup_mma(a_tile, b_bufs.index(slot).permute((1, 0)), t, use_acc=False, is_async=True)
            t = warpgroup_mma_wait(num_outstanding=0, deps=(t, ))
            # The wgmma has read the slot: hand it back before promoting, which the other
            # consumer's wgmma covers on the tensor cores.
            mbarrier.arrive(empty.index(slot), count=1)
            acc += t * (sa * sb)[:, None]
            it += 1

        if HAS_BIAS:
            cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout))
            acc += gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
        # The previous tile's TMA store must have read the staging buffer before it is rewritten.
        tma.store_wait(pendings=0)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        # Consumer 1's rows of the last row tile can lie wholly past M; TMA clips partial boxes,
        # but no store is issued for an empty one.
        if r0 < M:
            tma.async_copy_shared_to_global(c_desc, [r0, n0], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["M", "stride_asg", "stride_bsn"])
def _w8a8_block_gluon_kernel(
    a_desc, b_desc, c_desc, a_scale_ptr, b_scale_ptr, bias_ptr,
    M, N, K, stride_asm, stride_asg, stride_bsn, stride_bsg,
    HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    """a_desc [M, K] fp8 in [128, 128] blocks, b_desc [N, K] in [128, 128], c_desc the output in
    [64, 128] blocks (one per consumer). Persistent: grid <= number of tiles."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES, BLOCK_M, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES, BLOCK_N, BK], b_desc.layout)
    c0_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c1_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer

    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c0_smem, a_scale_ptr, b_scale_ptr, bias_ptr, M, N, K,
                     stride_asm, stride_asg, stride_bsn, stride_bsg, HAS_BIAS, GROUP_M, NUM_STAGES, gl.constexpr(0))),
        (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c1_smem, a_scale_ptr, b_scale_ptr, bias_ptr, M, N, K,
                     stride_asm, stride_asg, stride_bsn, stride_bsg, HAS_BIAS, GROUP_M, NUM_STAGES, gl.constexpr(1))),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@functools.cache
def _smem_layout(block: tuple[int, int], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


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
    if cfg.block_m != 2 * CONSUMER_ROWS or cfg.block_n != int(SCALE_BLOCK_N) or cfg.num_warps != 4:
        raise ValueError(f"w8a8_block_gemm_gluon: block_m 128, block_n 128, num_warps 4 expected, got {cfg}")
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
    if k == 0:
        out.zero_()
        if bias is not None:
            out += bias.to(out_dtype)
        return out
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, BLOCK_K], _smem_layout((cfg.block_m, BLOCK_K), a.dtype))
    b_desc = TensorDescriptor.from_tensor(b, [cfg.block_n, BLOCK_K], _smem_layout((cfg.block_n, BLOCK_K), b.dtype))
    c_block = (CONSUMER_ROWS, cfg.block_n)
    c_desc = TensorDescriptor.from_tensor(out, list(c_block), _smem_layout(c_block, out_dtype))
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    grid = (min(tiles, _num_sms(a.device.index if a.device.index is not None else torch.cuda.current_device())), )
    _w8a8_block_gluon_kernel[grid](
        a_desc, b_desc, c_desc, a_scale, b_scale, bias if bias is not None else out,
        m, n, k, a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        HAS_BIAS=bias is not None, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    return out
