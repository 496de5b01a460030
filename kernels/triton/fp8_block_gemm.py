"""W8A8 FP8 GEMMs with per-block (1x128 activations, 128x128 weights) or per-channel scales.

out[M, N] = (a [M, K] fp8 * a_scale) @ (b [N, K] fp8 * b_scale)^T: exact FP8 products, float32
sums. The block scheme's K step is the 128-wide scale group, so each K step is one tensor-core
dot whose result is scaled by a_scale[:, k] x b_scale[n // 128, k] before it joins the float32
accumulator (the promotion DeepGEMM does). The channel scheme applies its scales once at the
end, and its dots promote to the float32 accumulator every 128 of K as well
(`max_num_imprecise_acc`): Hopper's FP8 tensor cores accumulate with fewer bits than float32,
and Triton lets them carry the whole K sum by default on sm_90, which cost the channel GEMMs
~1e-3 relative error over K = 4096 (5x the block scheme's) on the H200.

Four kernels, by M:
- one row (batch-1 decode): the GEMV of fp8_gemv.py (one launch, no workspace) or the small-M
  kernel below, whichever the tuner measures faster for the shape.
- small M (<= 16, decode): one launch per call. The bf16/fp16 activations are quantized in the
  kernel (the same bits as act_quant.py, 1x128 groups or per token), and the GEMM runs
  transposed, out^T = W x^T, so the weight tile fills the wide side of the MMA and the padded
  16-row activation block its narrow side. K is split across programs so the weight stream
  uses every SM.
- large M on Hopper (sm_90): activations quantized by act_quant.py, then a tiled GEMM whose
  operands arrive by TMA (host tensor descriptors): no address arithmetic or masks in the K
  loop, zero fill at the edges.
- everything else (medium M, sm_89, shapes TMA cannot describe): the same tiled GEMM with
  pointer loads, split-K when there is one row tile.
Configurations are chosen per shape on the GPU (tuning.py), the heuristic default first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .act_quant import _scale_from_amax, _to_fp8, quantize_per_token, quantize_per_token_group
from . import fp8_gemv
from .fp8_gemv import GemvConfig, w8a8_gemv
from .launch import DirectLaunch, aligned, cdiv, tma_device
from .pdl import await_inputs, launch_options
from .gemm_epilogue import _bias_cast_store, automatic_split_k, bias_operand, split_k_buffers, store_tile
from .tuning import Autotuner, m_bucket

BLOCK_K = 128
SMALL_M = 16  # fused activation quantization up to here: larger M would quantize each row too often


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_per_sm: int = 0  # split K until this many programs per SM (0: never); one row tile only


# split_per_sm targets one or two waves of the programs an SM holds (16x128, 4 warps, 3 stages:
# 3 by shared memory; 16x64: 4; 16x256, 8 warps: 2).
SMALL_M_CANDIDATES = (
    GemmConfig(SMALL_M, 128, 4, 3, split_per_sm=3), GemmConfig(SMALL_M, 128, 4, 3, split_per_sm=6),
    GemmConfig(SMALL_M, 64, 4, 4, split_per_sm=4), GemmConfig(SMALL_M, 64, 4, 4, split_per_sm=8),
    GemmConfig(SMALL_M, 256, 8, 3, split_per_sm=2),
)
# 17-64 rows: 64-row tiles only. A 32-row tile runs on mma.sync where the 64-row tile and the
# small-M kernel (16 rows on the MMA's narrow side) take wgmma, and computed 511 of 512 values of
# a row to other float32 bits (run 23): once the tuner picked it, an answer depended on how many
# requests shared its decode batch, and two runs of a tiny W8A8 config differed in 4-14 of 1000
# answers; without it, fresh tunings answered alike (benchmarks/results/h200-2026-12-01-run22, 23).
TILED_CANDIDATES: dict[int, tuple[GemmConfig, ...]] = {
    64: (GemmConfig(64, 64, 4, 4, group_m=1, split_per_sm=2),),
    256: (GemmConfig(64, 128, 4, 4), GemmConfig(64, 64, 4, 4)),
}
TILED_LARGE = (GemmConfig(64, 128, 4, 4), GemmConfig(128, 128, 8, 3), GemmConfig(64, 128, 4, 3))
# Each K step's dot completes before its float32 promotion (block scales, or the channel
# scheme's precise accumulation), so tiles trade size for programs per SM. (A variant that
# rescaled the accumulator and let the tensor cores carry it across K steps was ~4% faster at
# M >= 2048 and 10x less accurate on sm_90: removed.)
TMA_CANDIDATES = (GemmConfig(128, 128, 8, 4), GemmConfig(64, 128, 4, 4), GemmConfig(128, 128, 8, 3))
TMA_MIN_M = 257  # below, the 64/128-row TMA tiles are mostly padding
MIN_BLOCK_N = 32  # the smallest column tile of a split launch: sizes the layer's counter workspace


def workspace_size(n: int) -> int:
    """int32 counters a layer with N outputs needs (zero-initialised, bound once)."""
    return cdiv(n, MIN_BLOCK_N)


# Not specialized: arguments that vary with the batch or only address a scale row once, so that
# one compilation serves every batch size and layer shape of a configuration.
@triton.jit(do_not_specialize=["M", "split_k", "stride_wsn"])
def _w8a8_small_m_kernel(
    x_ptr, w_ptr, ws_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k, stride_xm, stride_wn, stride_cm, stride_wsn, stride_wsg,
    SCALE_BLOCK_N: tl.constexpr,  # weight rows sharing one scale row (128 for blocks, 1 per channel)
    GROUPWISE: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    STAGES: tl.constexpr,  # the launch's num_stages, named in the K loop (see _w8a8_gemm_kernel)
):
    """x [M <= BLOCK_M, K] in bf16/fp16, quantized here; acc^T [BLOCK_N, BLOCK_M] = W_tile @ xq^T."""
    await_inputs(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rn_in = rn % N
    rows = (rm < M)[:, None]
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)

    if not GROUPWISE:
        # Per-token scales need the whole row's amax before any of it is quantized.
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for kt in range(0, k_tiles):
            x = tl.load(x_ptr + rm[:, None] * stride_xm + (kt * BLOCK_K + rk)[None, :],
                        mask=rows & (kt * BLOCK_K + rk < K)[None, :], other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
        row_scale = _scale_from_amax(amax)

    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k_first * BLOCK_K + rk)[None, :]
    w_ptrs = w_ptr + rn_in[:, None] * stride_wn + (k_first * BLOCK_K + rk)[None, :]
    if SCALE_BLOCK_N % BLOCK_N == 0:
        ws_ptrs = ws_ptr + (pid_n * BLOCK_N // SCALE_BLOCK_N) * stride_wsn
    else:
        ws_ptrs = ws_ptr + (rn_in // SCALE_BLOCK_N) * stride_wsn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=rows, other=0.0)
            w = tl.load(w_ptrs)
        else:
            in_k = rk < K - kt * BLOCK_K
            x = tl.load(x_ptrs, mask=rows & in_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=in_k[None, :], other=0.0)
        x = x.to(tl.float32)
        if GROUPWISE:
            w_s = tl.load(ws_ptrs + kt * stride_wsg)
            a_s = _scale_from_amax(tl.max(tl.abs(x), axis=1))
            d = tl.dot(w, tl.trans(_to_fp8(x, a_s[:, None])))
            if SCALE_BLOCK_N % BLOCK_N == 0:
                acc += d * (a_s * w_s)[None, :]
            else:
                acc += d * (w_s[:, None] * a_s[None, :])
        else:
            acc += tl.dot(w, tl.trans(_to_fp8(x, row_scale[:, None])), max_num_imprecise_acc=BLOCK_K)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if not GROUPWISE:
        acc = acc * tl.load(ws_ptr + rn_in * stride_wsn)[:, None] * row_scale[None, :]

    store_tile(tl.trans(acc), c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k,
               split_k, pid_n, HAS_BIAS, SPLIT)


@triton.jit
def _grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row tiles sweep the columns together so their B tiles stay in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_rows
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_rows
    return pid_m, pid_n


@triton.jit(do_not_specialize=["M", "split_k", "stride_asg", "stride_bsn"])
def _w8a8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, partial_ptr, counter_ptr,
    M, N, K, split_k,
    stride_am, stride_bn, stride_cm, stride_asm, stride_asg, stride_bsn, stride_bsg,
    SCALE_BLOCK_N: tl.constexpr, GROUPWISE: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,  # the launch's num_stages
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)

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
    # Stages named in the loop, not only as the launch option: Triton then pipelines the scale
    # loads as well as the dot operands', where it would otherwise wait for them in every K step.
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
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
            acc += tl.dot(a, b, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if not GROUPWISE:
        acc = acc * tl.load(a_scale_ptrs)[:, None] * tl.load(b_scale_ptrs)[None, :]

    store_tile(acc, c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k,
               split_k, pid_m * num_pid_n + pid_n, HAS_BIAS, SPLIT)


@triton.jit(do_not_specialize=["M", "stride_asg", "stride_bsn"])
def _w8a8_tma_kernel(
    a_desc, b_desc, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr,
    M, N, K, stride_cm, stride_asm, stride_asg, stride_bsn, stride_bsg,
    SCALE_BLOCK_N: tl.constexpr, GROUPWISE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,  # the launch's num_stages, named in the K loop (see _w8a8_gemm_kernel)
    PDL: tl.constexpr,
):
    """a_desc: [M, K] fp8 blocks [BLOCK_M, BLOCK_K]; b_desc: [N, K] fp8 blocks [BLOCK_N, BLOCK_K]."""
    await_inputs(PDL)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    rm = m0 + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    rm_in = tl.minimum(rm, M - 1)
    rn_in = tl.minimum(rn, N - 1)
    a_scale_ptrs = a_scale_ptr + rm_in * stride_asm
    if SCALE_BLOCK_N % BLOCK_N == 0:
        b_scale_ptrs = b_scale_ptr + (n0 // SCALE_BLOCK_N) * stride_bsn
    else:
        b_scale_ptrs = b_scale_ptr + (rn_in // SCALE_BLOCK_N) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        a = a_desc.load([m0, kt * BLOCK_K])
        b = b_desc.load([n0, kt * BLOCK_K])
        if GROUPWISE:
            a_s = tl.load(a_scale_ptrs + kt * stride_asg)
            b_s = tl.load(b_scale_ptrs + kt * stride_bsg)
            if SCALE_BLOCK_N % BLOCK_N == 0:
                acc += tl.dot(a, b.T) * (a_s * b_s)[:, None]
            else:
                acc += tl.dot(a, b.T) * (a_s[:, None] * b_s[None, :])
        else:
            acc += tl.dot(a, b.T, max_num_imprecise_acc=BLOCK_K)
    if not GROUPWISE:
        acc = acc * tl.load(a_scale_ptrs)[:, None] * tl.load(b_scale_ptrs)[None, :]
    _bias_cast_store(acc, c_ptr, bias_ptr, rm, rn, M, N, stride_cm, HAS_BIAS)


# Prefill-sized launches, eager in the engine: by handle (launch.py). Decode-sized ones run in
# CUDA graphs, where the JIT's dispatch costs nothing.
_tiled_launch = DirectLaunch(_w8a8_gemm_kernel)
_tma_launch = DirectLaunch(_w8a8_tma_kernel)

_ONE_ROW_TUNER = Autotuner("w8a8_one_row")
_SMALL_M_TUNER = Autotuner("w8a8_small_m")
_TILED_TUNER = Autotuner("w8a8_tiled")
_TMA_TUNER = Autotuner("w8a8_tma")


def w8a8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    groupwise: bool,
    scale_block_n: int = 128,
    bias: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    path: str | None = None,
    config: GemmConfig | GemvConfig | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """x [M, K] bf16/fp16/fp32 (unit K stride) -> out [M, N] in out_dtype, with the activation
    quantization of the scheme (1x128 groups if groupwise, else per token) done here.

    weight [N, K] fp8 contiguous; weight_scale [ceil(N/scale_block_n), ceil(K/128)] (groupwise)
    or [N]. `workspace` (int32 zeros, `workspace_size(N)`) enables split-K for small M.
    `path` ("one_row", "gemv", "small_m", "tiled", "tma") and `config`/`split_k` pin a launch (tests, sweeps);
    by default the path follows M and the GPU, and the tuner picks the config.
    """
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError(f"w8a8_linear: x {tuple(x.shape)} (unit K stride) and contiguous weight [N, {k}] expected, "
                         f"got weight {tuple(weight.shape)}")
    bias = bias_operand(bias, n)
    path = path or _default_path(m, k, n, x.device)
    if path == "one_row":
        return _one_row(x, weight, weight_scale, out_dtype, groupwise, scale_block_n, bias, workspace)
    if path == "gemv":
        return w8a8_gemv(x, weight, weight_scale, out_dtype, groupwise=groupwise, scale_block_n=scale_block_n,
                         bias=bias, config=config or fp8_gemv.candidates(groupwise, scale_block_n)[0])
    if path == "small_m":
        return _small_m(x, weight, weight_scale, out_dtype, groupwise, scale_block_n, bias, workspace, config, split_k)
    # Transient: the GEMM below is launched before the next quantization can overwrite them.
    if groupwise:
        a, a_scale = quantize_per_token_group(x, BLOCK_K, column_major_scales=True, transient=True)
    else:
        a, a_scale = quantize_per_token(x, transient=True)
    return w8a8_gemm(a, a_scale, weight, weight_scale, out_dtype, groupwise=groupwise, scale_block_n=scale_block_n,
                     bias=bias, workspace=workspace, tma=path == "tma", config=config, split_k=split_k)


def _default_path(m: int, k: int, n: int, device: torch.device) -> str:
    if m == 1:
        return "one_row"
    if m <= SMALL_M:
        return "small_m"
    # TMA rows of K fp8 bytes (and of N output elements) must be 16-byte aligned.
    if m >= TMA_MIN_M and k % 16 == 0 and n % 16 == 0 and tma_device(device):
        return "tma"
    return "tiled"


def _one_row(x, weight, weight_scale, out_dtype, groupwise, scale_block_n, bias, workspace):
    """M = 1: the GEMV (candidates first: the default) or the small-M kernel, timed together."""
    m, k = x.shape
    if m != 1:
        raise ValueError(f"w8a8_linear: the one-row path takes one row, got {m}")

    def run(cfg: GemvConfig | GemmConfig) -> torch.Tensor:
        if isinstance(cfg, GemvConfig):
            return w8a8_gemv(x, weight, weight_scale, out_dtype, groupwise=groupwise, scale_block_n=scale_block_n,
                             bias=bias, config=cfg)
        return _small_m(x, weight, weight_scale, out_dtype, groupwise, scale_block_n, bias, workspace, cfg, None)

    key = (1, weight.shape[0], k, x.dtype, out_dtype, groupwise, scale_block_n)
    candidates = fp8_gemv.candidates(groupwise, scale_block_n) + SMALL_M_CANDIDATES
    return run(_ONE_ROW_TUNER.pick(key, candidates, run, x.device))


def _small_m(x, weight, weight_scale, out_dtype, groupwise, scale_block_n, bias, workspace, config, split_k):
    m, k = x.shape
    n = weight.shape[0]
    if m > SMALL_M:
        raise ValueError(f"w8a8_linear: the small-M kernel takes up to {SMALL_M} rows, got {m}")
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if not groupwise:
        scale_block_n = 1

    def run(cfg: GemmConfig, split: int | None = None) -> None:
        n_tiles = cdiv(n, cfg.block_n)
        if split is None:
            split = automatic_split_k(m, n, cdiv(k, BLOCK_K), cfg.block_m, n_tiles, cfg.split_per_sm, workspace,
                                      x.device)
        partial, counters = split_k_buffers(split, m, n, n_tiles, workspace, x.device)
        stride_wsg = weight_scale.stride(1) if groupwise else 0
        _w8a8_small_m_kernel[(n_tiles, split)](
            x, weight, weight_scale, out, bias if bias is not None else out, partial, counters,
            m, n, k, split, x.stride(0), weight.stride(0), out.stride(0), weight_scale.stride(0), stride_wsg,
            SCALE_BLOCK_N=scale_block_n, GROUPWISE=groupwise, HAS_BIAS=bias is not None, SPLIT=split > 1,
            EVEN_K=k % BLOCK_K == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, STAGES=cfg.num_stages, **launch_options(x.device))

    if config is None:
        key = (m_bucket(m), n, k, x.dtype, out_dtype, groupwise, scale_block_n)
        config = _SMALL_M_TUNER.pick(key, SMALL_M_CANDIDATES, run, x.device)
    run(config, split_k)
    return out


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
    tma: bool = False,
    config: GemmConfig | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """a [M, K] fp8 (unit K stride), b [N, K] fp8 contiguous -> out [M, N] in out_dtype.

    groupwise: a_scale [M, ceil(K/128)] (any strides; column-major reads coalesced),
    b_scale [ceil(N/scale_block_n), ceil(K/128)]. Per channel: a_scale [M, 1] (or [M]), b_scale
    [N] (or [N, 1]). `tma` uses the TMA kernel (sm_90; K and N multiples of 16, a contiguous).
    `workspace` enables split-K on the pointer kernel for one row tile.
    """
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k or a.stride(1) != 1 or not b.is_contiguous():
        raise ValueError(f"w8a8_gemm: a {tuple(a.shape)} (unit K stride) and contiguous b [N, {k}] expected, "
                         f"got b {tuple(b.shape)}")
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if groupwise:
        scale_strides = (a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1))
    else:
        scale_strides = (a_scale.stride(0), 0, b_scale.stride(0), 0)
        scale_block_n = 1
    key = (m_bucket(m), n, k, out_dtype, groupwise, scale_block_n)
    options = launch_options(a.device)
    # What the launches specialize on besides the config; M and the M-dependent scale stride are
    # not specialized, out is fresh (aligned) and its row stride is N.
    spec = (out_dtype, groupwise, scale_block_n, n, k, scale_strides[0], scale_strides[3], options["PDL"],
            aligned(a_scale.data_ptr()), aligned(b_scale.data_ptr()),
            None if bias is None else (bias.dtype, aligned(bias.data_ptr())))
    if tma:
        if not a.is_contiguous() or k % 16 or n % 16:
            raise ValueError(f"w8a8_gemm: TMA needs a contiguous a and K, N multiples of 16; got a {tuple(a.shape)} "
                             f"strides {a.stride()}, N={n}")

        def run_tma(cfg: GemmConfig) -> None:
            from triton.tools.tensor_descriptor import TensorDescriptor

            a_desc = TensorDescriptor(a, [m, k], [k, 1], [cfg.block_m, BLOCK_K])
            b_desc = TensorDescriptor(b, [n, k], [k, 1], [cfg.block_n, BLOCK_K])
            grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)
            _tma_launch(
                (cfg, *spec), grid,
                (a_desc, b_desc, out, a_scale, b_scale, bias if bias is not None else out,
                 m, n, k, out.stride(0), *scale_strides),
                SCALE_BLOCK_N=scale_block_n, GROUPWISE=groupwise, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K, GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, STAGES=cfg.num_stages, **options)

        run_tma(config or _TMA_TUNER.pick(key, TMA_CANDIDATES, run_tma, a.device))
        return out

    def run(cfg: GemmConfig, split: int | None = None) -> None:
        m_tiles, n_tiles = cdiv(m, cfg.block_m), cdiv(n, cfg.block_n)
        if split is None:
            split = automatic_split_k(m, n, cdiv(k, BLOCK_K), cfg.block_m, n_tiles, cfg.split_per_sm, workspace,
                                      a.device)
        partial, counters = split_k_buffers(split, m, n, m_tiles * n_tiles, workspace, a.device)
        _tiled_launch(
            (cfg, split > 1, *spec, aligned(a.data_ptr()), a.stride(0), aligned(b.data_ptr()),
             aligned(partial.data_ptr()), aligned(counters.data_ptr())),
            (m_tiles * n_tiles, split),
            (a, b, out, a_scale, b_scale, bias if bias is not None else out, partial, counters,
             m, n, k, split, a.stride(0), b.stride(0), out.stride(0), *scale_strides),
            SCALE_BLOCK_N=scale_block_n, GROUPWISE=groupwise, HAS_BIAS=bias is not None, SPLIT=split > 1,
            EVEN_K=k % BLOCK_K == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K,
            GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages, STAGES=cfg.num_stages,
            **options)

    if config is None:
        config = _TILED_TUNER.pick(key, TILED_CANDIDATES.get(m_bucket(m), TILED_LARGE), run, a.device)
    run(config, split_k)
    return out
