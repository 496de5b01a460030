"""Run 10, call 1: marlin (W8A16) weights streamed by TMA through a shared-memory ring.

Triton 3.6 pipelines descriptor loads in a `tl.range(..., num_stages=S)` loop as TMA copies into
S buffers: the copy engine keeps S-1 tiles in flight per program with no registers and one
issuing thread, where today's kernels hold their in-flight loads in registers (the GEMV one
tile ahead, the dot kernel through cp.async). Same math as kernels/triton/w8a16_gemm.py; only
the weight loads differ. Graph times (tuning.graph_time_ms: cold L2, predecessor, PDL) against
the tuner's pick of today's kernels and bf16 cuBLAS, in us; errors against float64.
    QUANTGATE_COMMIT=... bash -c "source benchmarks/gpu_env.sh; python <this file> call1|call2|call3|call7 [out.json]"
Shapes, peers and the timing loop: cases.py.
Call 1 (commit 1dc4d43): the GEMV and the dot kernel with TMA weights. Call 2 (b568441): the dot
kernel at M = 1, 16, 64, 256, with and without an L2 prefetch of its first K tiles before the PDL
wait. Call 3: the dot kernel on today's layout and on a column-tile-major copy of it (each
program's weight slice contiguous), deeper rings, splits up to 16. Call 7: swap-AB (weights the
wgmma A operand from registers, x^T the B operand in shared memory) against the dot kernel.
"""
import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from quantgate.kernels.triton.gemm_epilogue import split_k_buffers, store_tile
from quantgate.kernels.triton.pdl import await_inputs, launch_options, prefetch_l2
from quantgate.kernels.triton.w8a16_gemm import _X_EXP, _plane


@triton.jit
def _k_slice(K, split_k, pid_k, TILES: tl.constexpr):
    """(K tiles, first, end) of slice pid_k. Slices are whole chunks of TILES tiles, so a chunk never
    reads the next slice's rows (past the weight's end TMA fills zeros)."""
    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(tl.cdiv(k_tiles, split_k), TILES) * TILES
    k_first = pid_k * per_split
    return k_tiles, k_first, tl.minimum(k_first + per_split, k_tiles)


@triton.jit
def _prefetch_rows(w_ptr, k_first, n0, N, PREFETCH: tl.constexpr, BLOCK_N: tl.constexpr):
    """The first PREFETCH K tiles of a k-planes column tile into L2, before the PDL wait: the
    pipelined TMA loads can only be issued after it, as they sit with the activation loads."""
    lines = tl.arange(0, PREFETCH * BLOCK_N)
    row = k_first * 32 + lines // (BLOCK_N // 32)
    prefetch_l2(w_ptr + row.to(tl.int64) * N + n0 + (lines % (BLOCK_N // 32)) * 32)


@triton.jit(do_not_specialize=["split_k"])
def _gemv_tma(x_ptr, w_desc, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr, N, K, split_k, stride_sg,
              X_MUL: tl.constexpr, S_MUL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
              TILES: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    rn = n0 + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rj = tl.arange(0, 32 * TILES)
    tile = rj // 32
    k_tiles, k_first, k_last = _k_slice(K, split_k, pid_k, TILES)
    await_inputs(PDL)
    acc = tl.zeros((32 * TILES, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, TILES, num_stages=STAGES):
        packed = w_desc.load([kt * 32, n0])
        live = kt + tile < k_last
        s = tl.load(s_ptr + (kt + tile)[:, None] * stride_sg + rn_in[None, :], mask=live[:, None], other=0.0)
        t = tl.zeros((32 * TILES, BLOCK_N), dtype=tl.float32)
        for p in tl.static_range(4):
            x = tl.load(x_ptr + (kt + tile) * 128 + p * 32 + rj % 32,
                        mask=live & ((kt + tile) * 128 + p * 32 + rj % 32 < K), other=0.0)
            t += (x.to(tl.float32) * X_MUL)[:, None] * _plane(packed, p, 0)
        acc += t * s.to(tl.float32)
    out = tl.sum(acc, axis=0) * S_MUL
    store_tile(out[None, :], c_ptr, bias_ptr, partial_ptr, counter_ptr, tl.arange(0, 1), rn, 1, N, N, pid_k,
               split_k, pid_n, False, SPLIT)


@triton.jit(do_not_specialize=["M", "split_k"])
def _dot_tma(x_ptr, w_desc, w_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr, M, N, K, split_k, stride_xm, stride_sg,
             X_MUL: tl.constexpr, S_MUL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr = 0,
             TILED: tl.constexpr = False):
    pid_m = tl.program_id(2)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rj = tl.arange(0, 32)
    k_tiles, k_first, k_last = _k_slice(K, split_k, pid_k, 1)
    if PREFETCH > 0:
        if TILED:  # the slice is contiguous
            prefetch_l2(w_ptr + (pid_n * k_tiles + k_first).to(tl.int64) * 32 * BLOCK_N
                        + tl.arange(0, PREFETCH * BLOCK_N) * 32)
        else:
            _prefetch_rows(w_ptr, k_first, n0, N, PREFETCH, BLOCK_N)
    await_inputs(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        if TILED:  # weight [n tiles * K tiles * 32, BLOCK_N]: each program's slice is contiguous
            packed = w_desc.load([(pid_n * k_tiles + kt) * 32, 0])
        else:
            packed = w_desc.load([kt * 32, n0])
        s = tl.load(s_ptr + kt * stride_sg + rn_in).to(tl.float32)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for p in tl.static_range(4):
            x = tl.load(x_ptr + (rm % M)[:, None] * stride_xm + (kt * 128 + p * 32 + rj)[None, :])
            x = (x.to(tl.float32) * X_MUL).to(tl.bfloat16)
            part = tl.dot(x, _plane(packed, p, 1), part)
        acc += part * s[None, :]
    store_tile(acc * S_MUL, c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, N, pid_k,
               split_k, pid_m * tl.num_programs(0) + pid_n, False, SPLIT)


@triton.jit(do_not_specialize=["M", "split_k"])
def _swap_tma(x_ptr, w_desc, w_ptr, s_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr, M, N, K, split_k, stride_xm,
              stride_sg, X_MUL: tl.constexpr, S_MUL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr = 0):
    """Swap-AB: out^T [BLOCK_N, BLOCK_M] = W_tile (converted in registers: the wgmma A operand) x
    x^T (the B operand from shared memory, written once per program, not once per warp)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    rm = tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rj = tl.arange(0, 32)
    _, k_first, k_last = _k_slice(K, split_k, pid_k, 1)
    if PREFETCH > 0:
        _prefetch_rows(w_ptr, k_first, n0, N, PREFETCH, BLOCK_N)
    await_inputs(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        packed = w_desc.load([kt * 32, n0])
        s = tl.load(s_ptr + kt * stride_sg + rn_in).to(tl.float32)
        part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for p in tl.static_range(4):
            x = tl.load(x_ptr + (rm % M)[:, None] * stride_xm + (kt * 128 + p * 32 + rj)[None, :])
            x = (x.to(tl.float32) * X_MUL).to(tl.bfloat16)
            part = tl.dot(tl.trans(_plane(packed, p, 1)), tl.trans(x), part)
        acc += part * s[:, None]
    store_tile(tl.trans(acc * S_MUL), c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, N, pid_k,
               split_k, pid_n, False, SPLIT)


def tile_contiguous(packed: torch.Tensor, bn: int) -> torch.Tensor:
    """k-planes [K tiles * 32, N] -> [N / bn * K tiles * 32, bn]: column tile major."""
    rows, n = packed.shape
    return packed.view(rows, n // bn, bn).permute(1, 0, 2).contiguous().view(-1, bn)


def run_tma(x, packed, scale, ws, kind, bn, tiles, stages, warps, split, block_m=16, prefetch=0, tiled=None):
    m, k = x.shape
    n = packed.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    n_tiles, m_tiles = triton.cdiv(n, bn), triton.cdiv(m, block_m)
    partial, counters = split_k_buffers(split, m, n, n_tiles, ws, x.device)
    rows = 32 * tiles if kind == "gemv" else 32
    w = packed if tiled is None else tiled
    desc = TensorDescriptor(w, list(w.shape), [w.shape[1], 1], [rows, bn])
    opts = launch_options(x.device)
    if kind == "gemv":
        _gemv_tma[(n_tiles, split)](x, desc, scale, out, out, partial, counters, n, k, split, scale.stride(0),
                                    X_MUL=float(2.0 ** _X_EXP), S_MUL=float(2.0 ** (120 - _X_EXP)), SPLIT=split > 1,
                                    BLOCK_N=bn, TILES=tiles, STAGES=stages, num_warps=warps, **opts)
    elif kind == "swap":
        _swap_tma[(n_tiles, split)](x, desc, w, scale, out, out, partial, counters, m, n, k, split, x.stride(0),
                                    scale.stride(0), X_MUL=float(2.0 ** _X_EXP), S_MUL=float(2.0 ** (120 - _X_EXP)),
                                    SPLIT=split > 1, BLOCK_M=block_m, BLOCK_N=bn, STAGES=stages, PREFETCH=prefetch,
                                    num_warps=warps, **opts)
    else:
        _dot_tma[(n_tiles, split, m_tiles)](x, desc, w, scale, out, out, partial, counters, m, n, k, split,
                                            x.stride(0), scale.stride(0), X_MUL=float(2.0 ** _X_EXP),
                                            S_MUL=float(2.0 ** (120 - _X_EXP)), SPLIT=split > 1, BLOCK_M=block_m,
                                            BLOCK_N=bn, STAGES=stages, PREFETCH=prefetch, TILED=tiled is not None,
                                            num_warps=warps, **opts)
    return out


# Call 1: (block_n, tiles per load, stages, warps) for the GEMV at M = 1 and the dot kernel at M = 16.
GEMV = [(64, 1, 4, 4), (64, 2, 3, 4), (128, 1, 4, 4), (128, 2, 3, 8), (256, 1, 3, 8), (64, 4, 3, 8), (32, 4, 4, 4)]
DOT = [(64, 1, 3, 4), (64, 1, 5, 4), (128, 1, 3, 4), (128, 1, 4, 8)]
SPLITS = (1, 2, 3, 4, 6, 8)
# Call 2: the dot kernel only, (M, block_m, block_n, stages, warps, L2-prefetched K tiles).
DOT2 = [(m, 16, bn, st, w, pf) for m in (1, 16) for bn, st, w in
        ((32, 3, 2), (32, 4, 4), (64, 2, 4), (64, 3, 4), (64, 4, 4), (64, 3, 2), (128, 3, 4), (128, 3, 8))
        for pf in (0, 2)] + [
    (64, bm, bn, st, w, 0) for bm, bn, st, w in ((32, 64, 3, 4), (64, 64, 3, 4), (64, 128, 3, 4), (32, 128, 3, 4))] + [
    (256, bm, bn, st, w, 0) for bm, bn, st, w in ((64, 64, 3, 4), (64, 128, 3, 4), (64, 128, 4, 8), (128, 128, 3, 8))]


def plan(call: str) -> dict[int, list[tuple]]:
    """M -> (kind, block_n, tiles, stages, warps, block_m, prefetch, layout) for each call."""
    if call == "call1":
        return {1: [("gemv", bn, t, st, wa, 16, 0, "rows") for bn, t, st, wa in GEMV],
                16: [("dot", bn, t, st, wa, 16, 0, "rows") for bn, t, st, wa in DOT]}
    if call == "call7":
        return {m: [(kind, bn, 1, st, wa, 16, pf, "rows") for kind, bn, st, wa, pf in (
            ("dot", 64, 4, 4, 2), ("dot", 64, 3, 4, 0), ("swap", 64, 3, 4, 0), ("swap", 64, 4, 4, 2),
            ("swap", 128, 3, 4, 0), ("swap", 128, 3, 8, 0), ("swap", 128, 4, 4, 2))] for m in (1, 16)}
    if call == "call3":
        return {m: [("dot", 64, 1, st, 4, 16, pf, lay) for st in (3, 4, 6) for pf in (0, 2)
                    for lay in ("rows", "tiles")] for m in (1, 16)}
    out: dict[int, list[tuple]] = {}
    for m, bm, bn, st, wa, pf in DOT2:
        out.setdefault(m, []).append(("dot", bn, 1, st, wa, bm, pf, "rows"))
    return out


def main() -> None:
    from cases import cases, report, time_candidates

    call = sys.argv[1] if len(sys.argv) > 1 else "call2"
    configs_by_m = plan(call)
    splits = SPLITS if call not in ("call3", "call7") else (2, 3, 4, 6, 8, 12, 16)
    rows = []
    for case in cases(configs_by_m):
        tiled = tile_contiguous(case.packed, 64) if call == "call3" else None
        candidates = []
        for kind, bn, tiles, stages, warps, bm, pf, layout in configs_by_m[case.m]:
            for split in splits if case.m <= bm else (1,):
                args = (case.x, case.packed, case.scale, case.workspace, kind, bn, tiles, stages, warps, split, bm, pf,
                        tiled if layout == "tiles" else None)
                fields = dict(kind=kind, bm=bm, bn=bn, tiles=tiles, stages=stages, warps=warps, prefetch=pf,
                              layout=layout, split=split)
                candidates.append((fields, lambda args=args: run_tma(*args)))
        found = time_candidates(case, candidates)
        rows += found
        report(case, found, "TMA", ("kind", "bm", "bn", "tiles", "stages", "warps", "prefetch", "layout", "split"))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
