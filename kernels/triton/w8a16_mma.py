"""Small-M W8A16 GEMM on mma.sync, with the k-planes weights loaded straight into MMA fragments.

At M <= 16 the W8A16 GEMM streams the weights; what limits it is the work per weight byte
between the load and the multiply. The Triton kernels of w8a16_gemm.py pay for it twice: the
GEMV converts every weight to float32 for four scalar FMAs of its own, and the dot path moves
the converted weights through shared memory into the MMA operand layout.

This kernel (Gluon: the layouts are written out) has no shared memory. The K order inside a
dot is free as long as both operands follow it, so the logical k of each mma.sync m16n8k16 is
mapped to true K where the B fragment a thread must hold (k = 2q+e, 2q+8+e for q = lane % 4,
e in {0, 1}, column lane / 4) is exactly the four bytes of one k-planes int32:

    one 128-wide K tile, logical k = 16s + 8h + 2q + e  <->  packed row j = 8q + s, byte 2e + h,
    true K = 32(2e + h) + 8q + s

Each thread then converts its own int32 into its two bf16x2 fragment registers with bit moves
(w8a16_gemm._plane, value * 2^-120). The activations follow the same order: a thread's values
for one tile are 8 consecutive K per (row, byte), one 16-byte load each. Columns are permuted
too, so that a thread's four n8 sub-tiles are four adjacent columns (one 16-byte weight load);
the store un-permutes them.

Split-K and its deterministic reduction are those of gemm_epilogue.store_tile.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2


@gluon.constexpr_function
def _weight_layout(warps):
    # [32 packed rows j, 32 * warps columns n]: j = 8q + s, n = 32w + 4g + v; registers v (one
    # 16-byte load) then s, lanes q then g, warps w.
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
        lane_bases=[[8, 0], [16, 0], [0, 4], [0, 8], [0, 16]],
        warp_bases=[[0, 32 << i] for i in range(warps.bit_length() - 1)],
        block_bases=[], shape=[32, 32 * warps])


@gluon.constexpr_function
def _act_layout(warps):
    # [16 rows m, 2 e, 2 h, 4 q, 8 s], true K within the tile = 64e + 32h + 8q + s: registers s
    # (one 16-byte load), e, h, m + 8; lanes q then m % 8; every warp holds all of it.
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 0, 4], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0],
                   [8, 0, 0, 0, 0]],
        lane_bases=[[0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [1, 0, 0, 0, 0], [2, 0, 0, 0, 0], [4, 0, 0, 0, 0]],
        warp_bases=[[0, 0, 0, 0, 0] for _ in range(warps.bit_length() - 1)],
        block_bases=[], shape=[16, 2, 2, 4, 8])


@gluon.jit
def _halves(packed, ODD: gl.constexpr, DTYPE: gl.constexpr):
    """Bytes (1, 3) if ODD else (0, 2) of each int32 as two DTYPE (bf16: value * 2^-120, fp16:
    * 2^-8), out of one 32-bit bit move (w8a16_gemm._plane_pair_bits) that is also the
    two-element register the MMA reads."""
    MAG: gl.constexpr = 7 if DTYPE == gl.float16 else 4
    if ODD:
        pair = (packed & -2147450880) | ((packed >> (8 - MAG)) & ((0x7F << MAG) | (0x7F << (MAG + 16))))
    else:
        pair = ((packed << 8) & -2147450880) | ((packed << MAG) & ((0x7F << MAG) | (0x7F << (MAG + 16))))
    lo = pair.to(gl.int16).to(DTYPE, bitcast=True)
    hi = (pair >> 16).to(gl.int16).to(DTYPE, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _copy_act(smem, ptrs, row_ok, xk, kt, k_last, K, EVEN_K: gl.constexpr):
    """cp.async of one [16, 128] activation tile; rows past M, K past the end and tiles past
    the slice are zero-filled."""
    if EVEN_K:
        mask = row_ok & (kt < k_last)
    else:
        mask = row_ok & (kt < k_last) & (kt * 128 + xk[None, :] < K)
    gl.nvidia.ampere.async_copy.async_copy_global_to_shared(smem, ptrs, mask=mask)


@gluon.jit
def _await_inputs(PDL: gl.constexpr):
    """pdl.await_inputs for Gluon kernels."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit(do_not_specialize=["split_k"])
def _w8a16_mma_kernel(
    x_ptr, w_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k, stride_xm, stride_sg,
    X_MUL: gl.constexpr, S_MUL: gl.constexpr, GROUPWISE: gl.constexpr, HAS_BIAS: gl.constexpr,
    SPLIT: gl.constexpr, EVEN_K: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr,
    PDL: gl.constexpr,
):
    BLOCK_N: gl.constexpr = 32 * WARPS
    DTYPE: gl.constexpr = x_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_l: gl.constexpr = _weight_layout(WARPS)
    x_l: gl.constexpr = _act_layout(WARPS)

    # cp.async copies: 16 bytes per thread per row, coalesced.
    w_copy: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [WARPS, 1], [1, 0])
    x_copy: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])
    w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, 32, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x_smem = gl.allocate_shared_memory(DTYPE, [STAGES, 16, 128], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    k_tiles = gl.cdiv(K, 128)
    per_split = gl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = gl.minimum(k_first + per_split, k_tiles)

    # Weights: [32, BLOCK_N] int32 per K tile, columns in memory order.
    rj = gl.arange(0, 32, layout=gl.SliceLayout(1, w_copy))
    rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, w_copy))
    w_ptrs = w_ptr + (k_first * 32 + rj)[:, None] * N + (rn % N)[None, :]
    # Activations: [16, 128] per K tile in memory order; read back as [16, 2e, 2h, 4q, 8s].
    xm = gl.arange(0, 16, layout=gl.SliceLayout(1, x_copy))
    xk = gl.arange(0, 128, layout=gl.SliceLayout(0, x_copy))
    x_ptrs = x_ptr + xm[:, None] * stride_xm + k_first * 128 + xk[None, :]
    x_row_ok = xm[:, None] < M

    # Output columns: mma column n' = 32v + 8w + g holds true column 32w + 4g + v.
    cn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    cn = pid_n * BLOCK_N + (cn // 8 % WARPS) * 32 + (cn % 8) * 4 + cn // (8 * WARPS)
    cn_in = cn % N
    s_ptrs = s_ptr + k_first * stride_sg + cn_in

    # A ring of STAGES K tiles in shared memory, filled by cp.async STAGES - 1 tiles ahead: the
    # loads in flight do not hold registers, and no compiler reordering can shorten their lead.
    for p in gl.static_range(STAGES - 1):
        gl.nvidia.ampere.async_copy.async_copy_global_to_shared(
            w_smem.index(p), w_ptrs + p * 32 * N, mask=k_first + p < k_last)
    # The first tiles' weights are in flight while the kernel before (whose output is x) finishes.
    _await_inputs(PDL)
    for p in gl.static_range(STAGES - 1):
        _copy_act(x_smem.index(p), x_ptrs + p * 128, x_row_ok, xk, k_first + p, k_last, K, EVEN_K)
        gl.nvidia.ampere.async_copy.commit_group()
    if GROUPWISE:  # block scales: registers, two tiles ahead
        scale = gl.load(s_ptrs, mask=k_first < k_last, other=0.0)
        scale_next = gl.load(s_ptrs + stride_sg, mask=k_first + 1 < k_last, other=0.0)

    acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
    for kt in range(k_first, k_last):
        i = kt - k_first
        gl.nvidia.ampere.async_copy.wait_group(STAGES - 2)  # this thread's copies of tile kt landed
        gl.thread_barrier()  # everyone's: and the slot refilled below has been read by all
        ahead = kt + STAGES - 1
        slot = (i + STAGES - 1) % STAGES
        gl.nvidia.ampere.async_copy.async_copy_global_to_shared(
            w_smem.index(slot), w_ptrs + (STAGES - 1) * 32 * N, mask=ahead < k_last)
        _copy_act(x_smem.index(slot), x_ptrs + (STAGES - 1) * 128, x_row_ok, xk, ahead, k_last, K, EVEN_K)
        gl.nvidia.ampere.async_copy.commit_group()

        packed = w_smem.index(i % STAGES).load(w_l)
        x = x_smem.index(i % STAGES).reshape([16, 2, 2, 4, 8]).load(x_l)
        x = (x.to(gl.float32) * X_MUL).to(DTYPE)
        # [16, 2e, 2h, 4q, 8s] -> (m, s, h, q, e) -> [16, 128]
        a = gl.reshape(gl.permute(x, [0, 4, 2, 3, 1]), [16, 128])
        a = gl.convert_layout(a, a_op, assert_trivial=True)
        # [32, BLOCK_N] int32 -> [32, BLOCK_N, 2e, 2h] bf16 -> (q, s, w, g, v, e, h) -> (s, h, q, e, v, w, g)
        b = gl.join(_halves(packed, False, DTYPE), _halves(packed, True, DTYPE))
        b = gl.reshape(b, [4, 8, WARPS, 8, 4, 2, 2])
        b = gl.reshape(gl.permute(b, [1, 6, 0, 5, 4, 2, 3]), [128, BLOCK_N])
        b = gl.convert_layout(b, b_op, assert_trivial=True)
        if GROUPWISE:
            part = mma_v2(a, b, gl.zeros([16, BLOCK_N], gl.float32, mma))
            acc += part * scale.to(gl.float32)[None, :]
            scale = scale_next
            scale_next = gl.load(s_ptrs + 2 * stride_sg, mask=kt + 2 < k_last, other=0.0)
            s_ptrs += stride_sg
        else:
            acc = mma_v2(a, b, acc)
        w_ptrs += 32 * N
        x_ptrs += 128
    gl.nvidia.ampere.async_copy.wait_group(0)
    acc = acc * S_MUL
    if not GROUPWISE:
        acc = acc * gl.load(s_ptrs).to(gl.float32)[None, :]

    cm = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    if SPLIT:
        mask = (cm[:, None] < M) & (cn[None, :] < N)
        offs = cm[:, None] * N + cn[None, :]
        gl.store(partial_ptr + pid_k * M * N + offs, acc, mask=mask)
        gl.thread_barrier()  # every thread's partial precedes the counter update (release)
        arrived = gl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            total = gl.zeros([16, BLOCK_N], gl.float32, mma)
            for s in range(0, split_k):  # in slice order: the sum does not depend on arrival order
                total += gl.load(partial_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            _store(total, c_ptr, bias_ptr, cm, cn, M, N, HAS_BIAS)
            gl.store(counter_ptr + pid_n, 0)
    else:
        _store(acc, c_ptr, bias_ptr, cm, cn, M, N, HAS_BIAS)


@gluon.jit
def _store(acc, c_ptr, bias_ptr, cm, cn, M, N, HAS_BIAS: gl.constexpr):
    if HAS_BIAS:
        acc += gl.load(bias_ptr + cn % N).to(gl.float32)[None, :]
    gl.store(c_ptr + cm[:, None] * N + cn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(cm[:, None] < M) & (cn[None, :] < N))
