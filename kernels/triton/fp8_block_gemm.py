"""W8A8 FP8 GEMM with per-block (1x128 activations, 128x128 weights) or per-channel scales.

out[M, N] = (a [M, K] fp8 * a_scale) @ (b [N, K] fp8 * b_scale)^T, float32 accumulation.
Block scheme: BLOCK_K equals the 128-wide scale group, so each K step is one tensor-core dot
whose result is scaled by a_scale[:, k] x b_scale[n // 128, k] before it joins the float32
accumulator (the promotion DeepGEMM does; it also bounds Hopper's reduced-precision FP8
accumulation to 128 products). Channel scheme: the same loop, scales applied once at the end.
Small M splits K across programs (see gemm_epilogue) so the weight stream uses every SM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .gemm_epilogue import choose_split_k, split_k_buffers, store_tile

BLOCK_K = 128


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8


# (largest M, config): the first row with M <= largest applies. Tile shapes follow the H200
# runs of benchmarks/bench_linear.py (results in benchmarks/results/).
CONFIGS: tuple[tuple[int, GemmConfig], ...] = (
    (16, GemmConfig(16, 64, num_warps=4, num_stages=4, group_m=1)),
    (64, GemmConfig(64, 64, num_warps=4, num_stages=4, group_m=1)),
    (1024, GemmConfig(64, 128, num_warps=4, num_stages=4)),
    (1 << 62, GemmConfig(128, 128, num_warps=8, num_stages=3)),
)
# Split-K only while the M tiles are this few; the workspace holds one counter per such tile.
SPLIT_K_MAX_M_TILES = 1
MIN_BLOCK_N = 32


def config_for(m: int) -> GemmConfig:
    return next(cfg for largest, cfg in CONFIGS if m <= largest)


def workspace_size(n: int) -> int:
    """int32 counters a layer with N outputs needs (zero-initialised, bound once)."""
    return SPLIT_K_MAX_M_TILES * triton.cdiv(n, MIN_BLOCK_N)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _target_programs(device: torch.device) -> int:
    # Four programs per SM keep enough weight loads in flight; the interpreter has no SMs.
    return 4 * _sm_count(device.index or 0) if device.type == "cuda" else 8


@triton.jit(do_not_specialize=["split_k"])
def _w8a8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k,
    stride_am, stride_bn, stride_cm, stride_asm, stride_asg, stride_bsn, stride_bsg,
    SCALE_BLOCK_N: tl.constexpr,  # weight rows sharing one scale row (128 for blocks, 1 per channel)
    GROUPWISE: tl.constexpr,      # scales change every BLOCK_K along K (block scheme)
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles sweep the columns together so their B tiles stay in L2.
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_rows
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Wrapped indices keep every load in bounds without masks; the store masks the tail.
    rm_in = rm % M
    rn_in = rn % N

    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)

    a_ptrs = a_ptr + rm_in[:, None] * stride_am + (k_first * BLOCK_K + rk)[None, :]
    b_ptrs = b_ptr + rn_in[None, :] * stride_bn + (k_first * BLOCK_K + rk)[:, None]
    a_scale_ptrs = a_scale_ptr + rm_in * stride_asm
    if SCALE_BLOCK_N % BLOCK_N == 0:
        # The tile lies in one weight scale block: one scale per K step, not one per column.
        b_scale_ptrs = b_scale_ptr + (pid_n * BLOCK_N // SCALE_BLOCK_N) * stride_bsn
    else:
        b_scale_ptrs = b_scale_ptr + (rn_in // SCALE_BLOCK_N) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_first, k_last):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            in_k = rk < K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=in_k[:, None], other=0.0)
        if GROUPWISE:
            a_s = tl.load(a_scale_ptrs + kt * stride_asg)
            b_s = tl.load(b_scale_ptrs + kt * stride_bsg)
            if SCALE_BLOCK_N % BLOCK_N == 0:
                acc += tl.dot(a, b) * (a_s * b_s)[:, None]
            else:
                acc += tl.dot(a, b) * (a_s[:, None] * b_s[None, :])
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if not GROUPWISE:
        acc = acc * tl.load(a_scale_ptrs)[:, None] * tl.load(b_scale_ptrs)[None, :]

    store_tile(acc, c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k,
               split_k, pid_m * num_pid_n + pid_n, HAS_BIAS, SPLIT)


def w8a8_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    groupwise: bool,
    scale_block_n: int = 128,
    bias: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """a [M, K] fp8 (unit K stride), b [N, K] fp8 contiguous -> out [M, N] in out_dtype.

    groupwise: a_scale [M, ceil(K/128)] (any strides; column-major reads coalesced),
    b_scale [ceil(N/scale_block_n), ceil(K/128)].
    per channel: a_scale [M, 1] (or [M]), b_scale [N] (or [N, 1]).
    `workspace` (int32 zeros, `workspace_size(N)`) enables split-K for small M; `config` and
    `split_k` override the table (benchmarks use them to sweep).
    """
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k or a.stride(1) != 1 or not b.is_contiguous():
        raise ValueError(f"w8a8_gemm: a {tuple(a.shape)} (unit K stride) and contiguous b [N, {k}] expected, "
                         f"got b {tuple(b.shape)}")
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    cfg = config or config_for(m)
    m_tiles, n_tiles = triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, BLOCK_K)
    if split_k is None:
        split_k = 1
        if workspace is not None and m_tiles <= SPLIT_K_MAX_M_TILES:
            split_k = choose_split_k(m_tiles * n_tiles, k_tiles, m, n, _target_programs(a.device))
    partial, counters = split_k_buffers(split_k, m, n, m_tiles * n_tiles, workspace, a.device)
    if groupwise:
        stride_asm, stride_asg = a_scale.stride(0), a_scale.stride(1)
        stride_bsn, stride_bsg = b_scale.stride(0), b_scale.stride(1)
    else:
        stride_asm, stride_asg = a_scale.stride(0), 0
        stride_bsn, stride_bsg = b_scale.stride(0), 0
        scale_block_n = 1
    _w8a8_gemm_kernel[(m_tiles * n_tiles, split_k)](
        a, b, out, a_scale, b_scale, bias if bias is not None else out, partial, counters,
        m, n, k, split_k,
        a.stride(0), b.stride(0), out.stride(0), stride_asm, stride_asg, stride_bsn, stride_bsg,
        SCALE_BLOCK_N=scale_block_n, GROUPWISE=groupwise, HAS_BIAS=bias is not None, SPLIT=split_k > 1,
        EVEN_K=k % BLOCK_K == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K,
        GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
