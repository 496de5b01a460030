"""Fused MoE on tensor cores: W8A8 FP8 (block, channel, tensor scales) and unquantized bf16/fp16.

out[t] = sum_j w[t, j] * down_e(SiLU(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, j].

Five launches for block checkpoints: `moe_align_block_size` groups the (token, choice) slots
by expert; the activations are quantized (act_quant.py: 1x128 groups, per token, or per
tensor); one grouped GEMM computes gate and up for the same columns, so SiLU-and-mul happens
in registers and, for block checkpoints, so does the 1x128 quantization of its output (its
BLOCK_N is the 128-wide group; channel and tensor scales need the whole row or tensor, so
they quantize the float32 result in one more launch); a second grouped GEMM applies the down
projection and the routing weight per slot. Summing a token's top-k slots is one torch
reduction.

Numerics (W8A8), the definition kernels/moe/reference.py checks against: activations are
quantized by kernels/quant.py's rule, scale = float32(amax / 448) by one correctly rounded
division (`div_rn`, never a product with a rounded 1/448), value = e4m3 round-to-nearest-even of
float32(a / scale); for the intermediate, `a` is the float32 SiLU(gate) * up straight from the
accumulators, never rounded to the activation dtype. Exactness matters because the intermediate
is quantized: a relative difference d in the gate/up result moves about d / ulp of its FP8
roundings by one step and costs about sqrt(d * ulp) of the output (the reference module says more).

The sizes that change with the batch (slots, aligned rows) are not specialized on, so a new
batch size does not compile new kernels; only the tile table's token bucket does. Nor are the
scale strides (scalar-like loads): layers of other shapes, and channel and tensor scales, then
share compilations.

Rows of the intermediate are the aligned rows of `moe_align_block_size`, so the down GEMM
reads them contiguously.

FP8 operands enter the tensor cores as fp16 (`_exact_dot`: every e4m3 value is an fp16 value,
and fp16 products accumulate in float32). FP8 tensor-core instructions accumulate with about 13
significant bits (Hopper's QGMMA, which Triton emits for BLOCK_M >= 64 on sm_90 and leaves
unpromoted by default, and sm_89's QMMA), a relative error of ~1e-4 in gate/up that the
intermediate's FP8 quantization turns into ~3e-3 of the output (H200 run 2: 2.9e-3 at 2048
tokens against 2.8e-4 at 16, whose BLOCK_M = 16 tiles Triton already ran as fp16 mma.sync). The
weights stay FP8 in memory, which is where a MoE layer spends its time at these sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..quant import FP8_DTYPE
from . import act_quant
from .act_quant import _scale_from_amax, _to_fp8
from .launch import DirectLaunch, aligned, cdiv
from .moe_align import moe_align_block_size
from .pdl import await_inputs, launch_options

GROUP = 128  # activation group and weight block edge of block checkpoints

# How a GEMM reads its activation scales.
A_UNSCALED, A_GROUPWISE, A_PER_ROW = 0, 1, 2


@dataclass(frozen=True)
class GemmTile:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 1


@dataclass(frozen=True)
class FusedMoEConfig:
    block_m: int  # rows per expert block; shared by both GEMMs (one alignment)
    gate_up: GemmTile  # block_n counts intermediate columns (gate and up tiles of that width each)
    down: GemmTile


# (largest token count, config): the first row with T <= largest applies. H200 sweep of
# benchmarks/bench_moe.py --tune (Qwen3-30B-A3B layer, results/h200-2026-11-29-run1). Edges are
# geometric midpoints of the swept token counts. The T=1 winner was within the sweep's own noise
# of the T=16 one (eager timings at T <= 16 are launch-bound: one config re-measured 0.186 and
# 0.222 ms), so one row serves both and saves a compilation; bf16 kept its defaults (the
# sweep ran out of time after T=1, a host-bound measurement).
FP8_CONFIGS: tuple[tuple[int, FusedMoEConfig], ...] = (
    (64, FusedMoEConfig(16, GemmTile(128, 128, 4, 4), GemmTile(64, 128, 4, 4))),
    (512, FusedMoEConfig(16, GemmTile(128, 128, 4, 4), GemmTile(128, 128, 4, 4, 8))),
    (1 << 62, FusedMoEConfig(64, GemmTile(128, 128, 8, 3, 8), GemmTile(128, 128, 4, 4, 8))),
)
BF16_CONFIGS: tuple[tuple[int, FusedMoEConfig], ...] = (
    (32, FusedMoEConfig(16, GemmTile(64, 64, 4, 4), GemmTile(64, 64, 4, 4))),
    (512, FusedMoEConfig(32, GemmTile(64, 64, 4, 4), GemmTile(128, 64, 4, 4))),
    (1 << 62, FusedMoEConfig(64, GemmTile(128, 64, 8, 3, 8), GemmTile(128, 64, 4, 4, 8))),
)


def config_for(num_tokens: int, fp8: bool) -> FusedMoEConfig:
    return next(cfg for largest, cfg in (FP8_CONFIGS if fp8 else BF16_CONFIGS) if num_tokens <= largest)


@dataclass(frozen=True)
class ExpertScales:
    """How one GEMM's weight scales are indexed: scale(e, n, kt) =
    ptr[e * stride_e + (n // rows_per_scale) * stride_n + kt * stride_k] (+ up_offset for up rows)."""

    tensor: torch.Tensor
    rows_per_scale: int
    stride_e: int
    stride_n: int
    stride_k: int
    up_offset: int = 0


def block_scales(scale: torch.Tensor, intermediate: int = 0) -> ExpertScales:
    """[E, ceil(N/128), ceil(K/128)] float32; `intermediate` (gate/up only) locates the up rows."""
    return ExpertScales(scale, GROUP, scale.stride(0), scale.stride(1), scale.stride(2),
                        (intermediate // GROUP) * scale.stride(1))


def channel_scales(scale: torch.Tensor, intermediate: int = 0) -> ExpertScales:
    """[E, N, 1] (or [E, N]) float32."""
    return ExpertScales(scale, 1, scale.stride(0), scale.stride(1), 0, intermediate * scale.stride(1))


def tensor_scales(scale: torch.Tensor) -> ExpertScales:
    """[E, 2] (gate, up) for the gate/up weight, [E] for the down weight; float32."""
    return ExpertScales(scale, 1, scale.stride(0), 0, 0, scale.stride(1) if scale.dim() == 2 else 0)


@triton.jit
def _exact_dot(a, b, acc):
    """acc + a @ b in float32 with exact products, FP8 operands as fp16 (module docstring);
    acc None starts from zero."""
    if a.dtype == tl.float8e4nv:
        return tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    return tl.dot(a, b, acc)


@triton.jit
def program_tile(max_rows, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row blocks (mostly one expert's) sweep the columns together."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(max_rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_rows
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_rows
    return pid_m, pid_n


_SCALE_STRIDES = ["stride_asm", "stride_asg", "stride_wse", "stride_wsn", "stride_wsk"]


@triton.jit(do_not_specialize=["num_slots", "max_rows", *_SCALE_STRIDES, "up_scale_offset", "stride_osm"])
def _gate_up_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, out_ptr, out_scale_ptr,
    sorted_slots_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, max_rows, K, I, top_k,
    stride_am, stride_asm, stride_asg,
    stride_we, stride_wn,
    stride_wse, stride_wsn, stride_wsk, up_scale_offset,
    stride_om, stride_osm,
    A_SCALES: tl.constexpr, W_ROWS_PER_SCALE: tl.constexpr,
    QUANT_OUT: tl.constexpr,  # write FP8 + 1x128 scales (BLOCK_N == 128), else the out dtype
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    pid_m, pid_n = program_tile(max_rows, I, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        if not QUANT_OUT:
            # Unused rows hold zeros, so a per-tensor amax over the whole buffer sees only real rows.
            tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + rn[None, :],
                     tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty), mask=(rn < I)[None, :])
        return

    slots = tl.load(sorted_slots_ptr + rows)
    live = slots < num_slots
    tokens = tl.where(live, slots // top_k, 0)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rn_in = rn % I  # wrapped columns keep loads in bounds; the store masks them
    rk = tl.arange(0, BLOCK_K)

    # Loop-invariant int32 offsets from scalar bases that advance along K: one offset tensor
    # per operand stays live instead of 64-bit pointer tensors (registers, no spills).
    a_base = a_ptr
    a_offs = tokens[:, None] * stride_am + rk[None, :]
    w_base = w_ptr + expert * stride_we
    w_offs = rn_in[None, :] * stride_wn + rk[:, None]
    w_up = I * stride_wn
    sg_ptrs = w_scale_ptr + expert * stride_wse + (rn_in // W_ROWS_PER_SCALE) * stride_wsn
    su_ptrs = sg_ptrs + up_scale_offset

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_base + a_offs, mask=live[:, None], other=0.0)
            bg = tl.load(w_base + w_offs)
            bu = tl.load(w_base + w_up + w_offs)
        else:
            in_k = rk < K - kt * BLOCK_K
            a = tl.load(a_base + a_offs, mask=live[:, None] & in_k[None, :], other=0.0)
            bg = tl.load(w_base + w_offs, mask=in_k[:, None], other=0.0)
            bu = tl.load(w_base + w_up + w_offs, mask=in_k[:, None], other=0.0)
        if A_SCALES == 1:  # the block scales change every BLOCK_K (128) step
            a_s = tl.load(a_scale_ptr + tokens * stride_asm + kt * stride_asg)[:, None]
            acc_g += _exact_dot(a, bg, None) * (a_s * tl.load(sg_ptrs + kt * stride_wsk)[None, :])
            acc_u += _exact_dot(a, bu, None) * (a_s * tl.load(su_ptrs + kt * stride_wsk)[None, :])
        else:
            acc_g = _exact_dot(a, bg, acc_g)
            acc_u = _exact_dot(a, bu, acc_u)
        a_base += BLOCK_K
        w_base += BLOCK_K
    if A_SCALES == 2:
        a_s = tl.load(a_scale_ptr + tokens * stride_asm)[:, None]
        acc_g = acc_g * (a_s * tl.load(sg_ptrs)[None, :])
        acc_u = acc_u * (a_s * tl.load(su_ptrs)[None, :])

    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    in_n = (rn < I)[None, :]
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + rn[None, :]
    if QUANT_OUT:
        h = tl.where(in_n, h, 0.0)
        scale = _scale_from_amax(tl.max(tl.abs(h), axis=1))
        tl.store(out_ptrs, _to_fp8(h, scale[:, None]), mask=in_n)
        tl.store(out_scale_ptr + rows * stride_osm + pid_n, scale)
    else:
        tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=in_n)


@triton.jit(do_not_specialize=["num_slots", "max_rows", *_SCALE_STRIDES])
def _down_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, out_ptr, topk_weights_ptr,
    sorted_slots_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, max_rows, N, K,
    stride_am, stride_asm, stride_asg,
    stride_we, stride_wn,
    stride_wse, stride_wsn, stride_wsk,
    stride_om,
    A_SCALES: tl.constexpr, W_ROWS_PER_SCALE: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    pid_m, pid_n = program_tile(max_rows, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_slots_ptr + rows)
    live = slots < num_slots
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = rn % N
    rk = tl.arange(0, BLOCK_K)

    a_base = a_ptr
    a_offs = rows[:, None] * stride_am + rk[None, :]
    w_base = w_ptr + expert * stride_we
    w_offs = rn_in[None, :] * stride_wn + rk[:, None]
    s_ptrs = w_scale_ptr + expert * stride_wse + (rn_in // W_ROWS_PER_SCALE) * stride_wsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_base + a_offs, mask=live[:, None], other=0.0)
            b = tl.load(w_base + w_offs)
        else:
            in_k = rk < K - kt * BLOCK_K
            a = tl.load(a_base + a_offs, mask=live[:, None] & in_k[None, :], other=0.0)
            b = tl.load(w_base + w_offs, mask=in_k[:, None], other=0.0)
        if A_SCALES == 1:
            a_s = tl.load(a_scale_ptr + rows * stride_asm + kt * stride_asg)
            acc += _exact_dot(a, b, None) * (a_s[:, None] * tl.load(s_ptrs + kt * stride_wsk)[None, :])
        else:
            acc = _exact_dot(a, b, acc)
        a_base += BLOCK_K
        w_base += BLOCK_K
    if A_SCALES == 2:
        acc = acc * (tl.load(a_scale_ptr + rows * stride_asm)[:, None] * tl.load(s_ptrs)[None, :])

    acc = acc * tl.load(topk_weights_ptr + slots, mask=live, other=0.0)[:, None]
    out_ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=live[:, None] & (rn < N)[None, :])


# Eager MoE calls (prefill, --enforce-eager decode) are bound by host time: the JIT's dispatch of
# these ~25-argument launches took ~30 us each on the H200's host (run 11), so they go by handle
# (launch.py). The keys name what the launches specialize on besides the kernels' constexprs:
# the operands' dtypes and alignment, and the integers not in `do_not_specialize` (layer
# constants). Outputs and the alignment tensors are fresh allocations, so aligned.
_gate_up = DirectLaunch(_gate_up_kernel)
_down = DirectLaunch(_down_kernel)


def _operands_key(*tensors: torch.Tensor) -> tuple:
    return tuple((t.dtype, aligned(t.data_ptr())) for t in tensors)


def _launch_gate_up(a, a_scale, a_mode, w13, scales: ExpertScales | None, out, out_scale, align, num_slots,
                    top_k, cfg: FusedMoEConfig) -> None:
    sorted_slots, block_expert, num_padded = align
    _, two_i, k = w13.shape
    inter = two_i // 2
    tile = cfg.gate_up
    s = scales or ExpertScales(a, 1, 0, 0, 0)  # unquantized: never read
    a_scale_arg = a_scale if a_scale is not None else a
    out_scale_arg = out_scale if out_scale is not None else out
    grid = (cdiv(sorted_slots.numel(), cfg.block_m) * cdiv(inter, tile.block_n),)
    specialized = (k, inter, top_k, a.stride(0), w13.stride(0), w13.stride(1), out.stride(0))
    options = launch_options(a.device)
    _gate_up(
        (a_mode, s.rows_per_scale, out_scale is not None, cfg.block_m, tile, out.dtype, out_scale_arg.dtype,
         *_operands_key(a, a_scale_arg, w13, s.tensor), *specialized, options["PDL"]),
        grid,
        (a, a_scale_arg, w13, s.tensor, out, out_scale_arg, sorted_slots, block_expert, num_padded,
         num_slots, sorted_slots.numel(), k, inter, top_k,
         a.stride(0), _stride(a_scale, 0), _stride(a_scale, 1),
         w13.stride(0), w13.stride(1),
         s.stride_e, s.stride_n, s.stride_k, s.up_offset,
         out.stride(0), _stride(out_scale, 0)),
        A_SCALES=a_mode, W_ROWS_PER_SCALE=s.rows_per_scale, QUANT_OUT=out_scale is not None,
        EVEN_K=k % tile.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        num_warps=tile.num_warps, num_stages=tile.num_stages, **options,
    )


def _launch_down(a, a_scale, a_mode, w2, scales: ExpertScales | None, out, topk_weights, align, num_slots,
                 cfg: FusedMoEConfig) -> None:
    sorted_slots, block_expert, num_padded = align
    _, n, k = w2.shape
    tile = cfg.down
    s = scales or ExpertScales(a, 1, 0, 0, 0)
    a_scale_arg = a_scale if a_scale is not None else a
    grid = (cdiv(sorted_slots.numel(), cfg.block_m) * cdiv(n, tile.block_n),)
    specialized = (n, k, a.stride(0), w2.stride(0), w2.stride(1), out.stride(0))
    options = launch_options(a.device)
    _down(
        (a_mode, s.rows_per_scale, cfg.block_m, tile, out.dtype, topk_weights.dtype,
         aligned(topk_weights.data_ptr()), *_operands_key(a, a_scale_arg, w2, s.tensor), *specialized, options["PDL"]),
        grid,
        (a, a_scale_arg, w2, s.tensor, out, topk_weights, sorted_slots, block_expert, num_padded,
         num_slots, sorted_slots.numel(), n, k,
         a.stride(0), _stride(a_scale, 0), _stride(a_scale, 1),
         w2.stride(0), w2.stride(1),
         s.stride_e, s.stride_n, s.stride_k,
         out.stride(0)),
        A_SCALES=a_mode, W_ROWS_PER_SCALE=s.rows_per_scale, EVEN_K=k % tile.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        num_warps=tile.num_warps, num_stages=tile.num_stages, **options,
    )


def _stride(t: torch.Tensor | None, dim: int) -> int:
    """Stride of a scale tensor; 0 for a missing dimension (a per-tensor scale broadcasts)."""
    return 0 if t is None or t.dim() <= dim else t.stride(dim)


def _check_offsets(x: torch.Tensor, rows: int, w13: torch.Tensor) -> None:
    """The kernels index activations and one expert's weights with int32 offsets."""
    if max(x.numel(), rows * w13.shape[1], w13[0].numel()) >= 2**31:
        raise ValueError(f"MoE call too large for int32 offsets ({x.shape[0]} tokens): split the batch")


def sum_slots(slot_out: torch.Tensor, num_tokens: int, top_k: int) -> torch.Tensor:
    if top_k == 1:
        return slot_out
    return slot_out.view(num_tokens, top_k, -1).sum(dim=1)


def fused_moe_fp8(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13: torch.Tensor, w13_scales: ExpertScales, w2: torch.Tensor, w2_scales: ExpertScales,
    *, activation: str, config: FusedMoEConfig | None = None,
    input_scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    cursor: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A8 MoE. x [T, H] bf16/fp16; w13 [E, 2I, H] and w2 [E, H, I] FP8 (K contiguous);
    activation: 'group' (1x128, block checkpoints), 'token' (channel) or 'tensor' (static
    `input_scales` (w13, w2) as 0-d tensors, or dynamic when None). -> [T, H] in x.dtype."""
    num_tokens, top_k = topk_ids.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    config = config or config_for(num_tokens, fp8=True)
    if activation == "group" and config.gate_up.block_n != GROUP:
        raise ValueError(f"block FP8 fuses the 1x{GROUP} quantization into gate/up: its block_n must be {GROUP}")
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    num_slots = topk_ids.numel()
    align = moe_align_block_size(topk_ids, num_experts, config.block_m, cursor)
    rows = align[0].numel()
    _check_offsets(x, rows, w13)

    if activation == "group":
        xq, xs = act_quant.quantize_per_token_group(x, GROUP)
        inter_q = torch.empty((rows, inter), dtype=FP8_DTYPE, device=x.device)
        inter_s = torch.empty((rows, cdiv(inter, GROUP)), dtype=torch.float32, device=x.device)
        _launch_gate_up(xq, xs, A_GROUPWISE, w13, w13_scales, inter_q, inter_s, align, num_slots, top_k, config)
        down_mode = A_GROUPWISE
    else:
        if activation == "token":
            xq, xs = act_quant.quantize_per_token(x)
        else:
            xq, xs = act_quant.quantize_per_tensor(x, input_scales[0])
        # float32 so that the activation quantization sees the GEMM's own values, as the reference does.
        h = torch.empty((rows, inter), dtype=torch.float32, device=x.device)
        _launch_gate_up(xq, xs, A_PER_ROW, w13, w13_scales, h, None, align, num_slots, top_k, config)
        if activation == "token":
            inter_q, inter_s = act_quant.quantize_per_token(h)
        else:
            inter_q, inter_s = act_quant.quantize_per_tensor(h, input_scales[1])
        down_mode = A_PER_ROW
    slot_out = torch.empty((num_slots, x.shape[1]), dtype=x.dtype, device=x.device)
    _launch_down(inter_q, inter_s, down_mode, w2, w2_scales, slot_out, topk_weights, align, num_slots, config)
    return sum_slots(slot_out, num_tokens, top_k)


def fused_moe_unquantized(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    *, config: FusedMoEConfig | None = None, cursor: torch.Tensor | None = None,
) -> torch.Tensor:
    """bf16/fp16 MoE: x [T, H], w13 [E, 2I, H], w2 [E, H, I] in x.dtype -> [T, H]."""
    num_tokens, top_k = topk_ids.shape
    config = config or config_for(num_tokens, fp8=False)
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    num_slots = topk_ids.numel()
    align = moe_align_block_size(topk_ids, w13.shape[0], config.block_m, cursor)
    _check_offsets(x, align[0].numel(), w13)
    h = torch.empty((align[0].numel(), w13.shape[1] // 2), dtype=x.dtype, device=x.device)
    _launch_gate_up(x, None, A_UNSCALED, w13, None, h, None, align, num_slots, top_k, config)
    slot_out = torch.empty((num_slots, x.shape[1]), dtype=x.dtype, device=x.device)
    _launch_down(h, None, A_UNSCALED, w2, None, slot_out, topk_weights, align, num_slots, config)
    return sum_slots(slot_out, num_tokens, top_k)
