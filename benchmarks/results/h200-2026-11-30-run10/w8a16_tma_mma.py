"""Run 10, calls 10+: the run-9 fragment kernel (Gluon, mma.sync, k-planes int32 read straight
into B fragments: 2810cb8:kernels/triton/w8a16_mma.py) fed by a TMA ring instead of registers.

Run 9 found that kernel short of loads in flight (its next tile's loads were sunk below half the
MMAs) and, at M = 16, paying for every warp's own copy of the activations out of L2 (as many
bytes as the weights). Here both come by TMA into a ring of STAGES shared-memory slots with one
mbarrier each: the weight tile [32, BLOCK_N] int32 and the activation tile [16, 128], read by all
warps of the program from shared memory. The weight tiles of the first STAGES - 1 slots are
requested before the PDL wait. Layouts and the logical-K permutation are run 9's.

    QUANTGATE_COMMIT=... bash -c "source benchmarks/gpu_env.sh; python <this file> [out.json]"
Shapes, peers and the timing loop: cases.py.
"""

from __future__ import annotations

import json
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


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
    # [16 rows m, 128 true K]: K = 64e + 32h + 8q + s; registers s (16 bytes), e, h, m + 8; lanes q
    # then m % 8; every warp holds all of it.
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 64], [0, 32], [8, 0]],
        lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[0, 0] for _ in range(warps.bit_length() - 1)],
        block_bases=[], shape=[16, 128])


@gluon.jit
def _halves(packed, ODD: gl.constexpr, DTYPE: gl.constexpr):
    """Bytes (1, 3) if ODD else (0, 2) of each int32 as two DTYPE (bf16: value * 2^-120, fp16:
    * 2^-8), out of one 32-bit bit move that is also the two-element register the MMA reads."""
    MAG: gl.constexpr = 7 if DTYPE == gl.float16 else 4
    if ODD:
        pair = (packed & -2147450880) | ((packed >> (8 - MAG)) & ((0x7F << MAG) | (0x7F << (MAG + 16))))
    else:
        pair = ((packed << 8) & -2147450880) | ((packed << MAG) & ((0x7F << MAG) | (0x7F << (MAG + 16))))
    lo = pair.to(gl.int16).to(DTYPE, bitcast=True)
    hi = (pair >> 16).to(gl.int16).to(DTYPE, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _pdl_wait(PDL: gl.constexpr):
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _request(w_desc, x_desc, w_bufs, x_bufs, ready, tile, slot, n0, live, WEIGHTS: gl.constexpr,
             ACTS: gl.constexpr):
    bar = ready.index(slot)
    if WEIGHTS:
        mbarrier.expect(bar, w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(w_desc, [tile * 32, n0], bar, w_bufs.index(slot), live)
    if ACTS:
        tma.async_copy_global_to_shared(x_desc, [0, tile * 128], bar, x_bufs.index(slot), live)


@gluon.jit(do_not_specialize=["split_k"])
def _w8a16_tma_mma_kernel(
    x_desc, w_desc, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k, stride_sg,
    X_MUL: gl.constexpr, S_MUL: gl.constexpr, GROUPWISE: gl.constexpr, HAS_BIAS: gl.constexpr,
    SPLIT: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr,
):
    BLOCK_N: gl.constexpr = 32 * WARPS
    DTYPE: gl.constexpr = x_desc.dtype
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_l: gl.constexpr = _weight_layout(WARPS)
    x_l: gl.constexpr = _act_layout(WARPS)

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = pid_n * BLOCK_N
    k_tiles = gl.cdiv(K, 128)
    per_split = gl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    n_k = gl.minimum(k_first + per_split, k_tiles) - k_first

    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, 32, BLOCK_N], w_desc.layout)
    x_bufs = gl.allocate_shared_memory(DTYPE, [STAGES, 16, 128], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    # Weights (no earlier kernel writes them) before the PDL wait, activations after it.
    for i in gl.static_range(STAGES - 1):
        _request(w_desc, x_desc, w_bufs, x_bufs, ready, k_first + i, i, n0, i < n_k, True, False)
    _pdl_wait(PDL)
    for i in gl.static_range(STAGES - 1):
        _request(w_desc, x_desc, w_bufs, x_bufs, ready, k_first + i, i, n0, i < n_k, False, True)

    # Output columns: mma column n' = 32v + 8w + g holds true column 32w + 4g + v.
    cn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    cn = n0 + (cn // 8 % WARPS) * 32 + (cn % 8) * 4 + cn // (8 * WARPS)
    cn_in = cn % N
    s_ptrs = s_ptr + k_first * stride_sg + cn_in
    if GROUPWISE:
        scale = gl.load(s_ptrs, mask=n_k > 0, other=0.0)

    acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
    for it in range(0, n_k):
        # Slot (it - 1) % STAGES was read by every warp in the last iteration (barrier below).
        nxt = it + STAGES - 1
        _request(w_desc, x_desc, w_bufs, x_bufs, ready, k_first + nxt, nxt % STAGES, n0, nxt < n_k, True, True)
        if GROUPWISE:
            scale_following = gl.load(s_ptrs + stride_sg, mask=it + 1 < n_k, other=0.0)
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        packed = w_bufs.index(slot).load(w_l)
        x = x_bufs.index(slot).load(x_l)
        gl.thread_barrier()  # every warp has its registers: the slot may be refilled
        x = (x.to(gl.float32) * X_MUL).to(DTYPE)
        # [16, 128 true K] -> (m, e, h, q, s) -> (m, s, h, q, e) -> [16, 128 logical k]
        a = gl.reshape(x, [16, 2, 2, 4, 8])
        a = gl.reshape(gl.permute(a, [0, 4, 2, 3, 1]), [16, 128])
        a = gl.convert_layout(a, a_op, assert_trivial=True)
        # [32, BLOCK_N] int32 -> [32, BLOCK_N, 2e, 2h] bf16 -> (q, s, w, g, v, e, h) -> (s, h, q, e, v, w, g)
        b = gl.join(_halves(packed, False, DTYPE), _halves(packed, True, DTYPE))
        b = gl.reshape(b, [4, 8, WARPS, 8, 4, 2, 2])
        b = gl.reshape(gl.permute(b, [1, 6, 0, 5, 4, 2, 3]), [128, BLOCK_N])
        b = gl.convert_layout(b, b_op, assert_trivial=True)
        if GROUPWISE:
            part = mma_v2(a, b, gl.zeros([16, BLOCK_N], gl.float32, mma))
            acc += part * scale.to(gl.float32)[None, :]
            scale = scale_following
            s_ptrs += stride_sg
        else:
            acc = mma_v2(a, b, acc)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
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


def run(x, packed, scale, workspace, warps, stages, split):
    """x [M <= 16, K] bf16 (K % 8 == 0), packed [K tiles * 32, N] int32, scale [K tiles, N] bf16."""
    from quantgate.kernels.triton.gemm_epilogue import split_k_buffers
    from quantgate.kernels.triton.pdl import launch_options
    from quantgate.kernels.triton.w8a16_gemm import _X_EXP

    m, k = x.shape
    n = packed.shape[1]
    block_n = 32 * warps
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    n_tiles = triton.cdiv(n, block_n)
    partial, counters = split_k_buffers(split, m, n, n_tiles, workspace, x.device)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [16, 128], gl.NVMMASharedLayout(0, 16, 2))
    w_desc = TensorDescriptor(packed, list(packed.shape), [n, 1], [32, block_n], gl.NVMMASharedLayout(0, 32, 2))
    opts = launch_options(x.device)
    _w8a16_tma_mma_kernel[(n_tiles, split)](
        x_desc, w_desc, scale, out, out, partial, counters, m, n, k, split, scale.stride(0),
        X_MUL=float(2.0 ** _X_EXP), S_MUL=float(2.0 ** (120 - _X_EXP)), GROUPWISE=True, HAS_BIAS=False,
        SPLIT=split > 1, WARPS=warps, STAGES=stages, PDL=opts["PDL"], num_warps=warps, launch_pdl=opts["launch_pdl"])
    return out


CONFIGS = [(4, 3), (4, 4), (4, 6), (2, 4), (2, 6)]  # (warps, stages)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def main() -> None:
    from cases import cases, report, time_candidates

    rows = []
    for case in cases((1, 16)):
        candidates = [(dict(warps=warps, stages=stages, split=split),
                       lambda warps=warps, stages=stages, split=split: run(case.x, case.packed, case.scale,
                                                                          case.workspace, warps, stages, split))
                      for warps, stages in CONFIGS for split in SPLITS if split <= case.k // 256]
        found = time_candidates(case, candidates)
        rows += found
        report(case, found, "TMA fragments", ("warps", "stages", "split"))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
