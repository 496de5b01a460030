"""Weight-only FP8 MoE (W8A16, the `marlin` backend): FP8 experts packed four to an int32,
activations and arithmetic in bf16/fp16 tensor cores, so it runs on compute capability 8.0.

The expert weights use the dense marlin layout of w8a16_gemm.py ("k-planes": int32
[ceil(K/128) * 32, N] per expert, four K=32 dot operands per load, N contiguous) and its
in-register FP8 -> bf16/fp16 conversion (`_plane`). The MoE structure is fused_moe.py's:
slots aligned per expert (moe_align.py), gate and up of the same columns in one program with
SiLU-and-mul in registers, the down projection weighted per slot, a torch sum over top-k.

Decode is memory bound: only the selected experts' weights are read, once per block of their
slots, and the small BLOCK_N of the decode configs gives every SM several programs.
Scales are in the activation dtype, [E, ceil(K/128), N] for block checkpoints (one row per
128-wide K group, expanded to columns) and [E, 1, N] otherwise, times 2^SCALE_SHIFT.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fused_moe import FusedMoEConfig, GemmTile, program_tile, sum_slots
from .launch import DirectLaunch, aligned, cdiv
from .moe_align import moe_align_block_size
from .pdl import await_inputs, launch_options
from .w8a16_gemm import _X_EXP, GROUP_K, SCALE_SHIFT, _plane, pack_weight

# (largest token count, config); block_k is the packed layout's 128 and not a choice here. H200
# sweep of benchmarks/bench_moe.py --tune up to 256 tokens (edges: geometric midpoints of the
# swept counts; T=1 and T=16 share the T=16 winner, their difference being within the sweep's
# noise); larger batches keep the default, which the sweep did not reach.
CONFIGS: tuple[tuple[int, FusedMoEConfig], ...] = (
    (64, FusedMoEConfig(16, GemmTile(32, GROUP_K, 4, 4), GemmTile(64, GROUP_K, 4, 4))),
    (512, FusedMoEConfig(32, GemmTile(64, GROUP_K, 4, 3), GemmTile(128, GROUP_K, 4, 3, 8))),
    (1 << 62, FusedMoEConfig(64, GemmTile(32, GROUP_K, 8, 3, 8), GemmTile(128, GROUP_K, 8, 3, 8))),
)


def config_for(num_tokens: int) -> FusedMoEConfig:
    return next(cfg for largest, cfg in CONFIGS if num_tokens <= largest)


def pack_experts(weight: torch.Tensor) -> torch.Tensor:
    """FP8 [E, N, K] -> int32 [E, ceil(K/128) * 32, N], each expert in the k-planes layout."""
    return torch.stack([pack_weight(w) for w in weight])


def operand_exponents(dtype: torch.dtype) -> tuple[int, float, float]:
    """(weight operand kind for `_plane`, activation multiplier, scale multiplier) for x.dtype.

    bf16: weights come out as value * 2^-120 and activations go in times 2^64 (exact), keeping
    products away from float32 subnormals; fp16: weights as value * 2^-8. The scale multiplier
    undoes both and the scales' storage shift."""
    if dtype == torch.bfloat16:
        return 1, float(2.0 ** _X_EXP), float(2.0 ** (120 - _X_EXP - SCALE_SHIFT[dtype]))
    if dtype == torch.float16:
        return 2, 1.0, float(2.0 ** (8 - SCALE_SHIFT[dtype]))
    raise ValueError(f"W8A16 MoE runs in bfloat16 or float16, not {dtype}")


@triton.jit(do_not_specialize=["num_slots", "max_rows"])
def _w8a16_gate_up_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, sorted_slots_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, max_rows, K, I, top_k,
    stride_xm, stride_we, stride_se, stride_sk, stride_om,
    X_MUL: tl.constexpr, S_MUL: tl.constexpr, GROUPWISE: tl.constexpr, OUT: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,  # the launch's num_stages, named in the K loop: scale loads pipelined too
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    pid_m, pid_n = program_tile(max_rows, I, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_slots_ptr + rows)
    live = slots < num_slots
    tokens = tl.where(live, slots // top_k, 0).to(tl.int64)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = rn % I
    rj = tl.arange(0, 32)
    n_packed = 2 * I  # gate columns, then up columns

    wg_ptrs = w_ptr + expert * stride_we + rj[:, None] * n_packed + rn_in[None, :]
    sg_ptrs = s_ptr + expert * stride_se + rn_in
    x_ptrs = x_ptr + tokens[:, None] * stride_xm + rj[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(0, tl.cdiv(K, 128), num_stages=STAGES):
        pg = tl.load(wg_ptrs)
        pu = tl.load(wg_ptrs + I)
        part_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        part_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for p in tl.static_range(4):
            if EVEN_K:
                x = tl.load(x_ptrs + p * 32, mask=live[:, None], other=0.0)
            else:
                x = tl.load(x_ptrs + p * 32, mask=live[:, None] & (kt * 128 + p * 32 + rj < K)[None, :], other=0.0)
            if OUT == 1:
                x = (x.to(tl.float32) * X_MUL).to(tl.bfloat16)
            part_g = tl.dot(x, _plane(pg, p, OUT), part_g)
            part_u = tl.dot(x, _plane(pu, p, OUT), part_u)
        if GROUPWISE:
            acc_g += part_g * tl.load(sg_ptrs + kt * stride_sk).to(tl.float32)[None, :]
            acc_u += part_u * tl.load(sg_ptrs + I + kt * stride_sk).to(tl.float32)[None, :]
        else:
            acc_g += part_g
            acc_u += part_u
        wg_ptrs += 32 * n_packed
        x_ptrs += 128
    if not GROUPWISE:
        acc_g = acc_g * tl.load(sg_ptrs).to(tl.float32)[None, :]
        acc_u = acc_u * tl.load(sg_ptrs + I).to(tl.float32)[None, :]
    acc_g = acc_g * S_MUL
    acc_u = acc_u * S_MUL

    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=(rn < I)[None, :])


@triton.jit(do_not_specialize=["num_slots", "max_rows"])
def _w8a16_down_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, topk_weights_ptr, sorted_slots_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, max_rows, N, K,
    stride_xm, stride_we, stride_se, stride_sk, stride_om,
    X_MUL: tl.constexpr, S_MUL: tl.constexpr, GROUPWISE: tl.constexpr, OUT: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,  # the launch's num_stages, named in the K loop: scale loads pipelined too
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
    rj = tl.arange(0, 32)

    w_ptrs = w_ptr + expert * stride_we + rj[:, None] * N + rn_in[None, :]
    s_ptrs = s_ptr + expert * stride_se + rn_in
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + rj[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(0, tl.cdiv(K, 128), num_stages=STAGES):
        packed = tl.load(w_ptrs)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for p in tl.static_range(4):
            if EVEN_K:
                x = tl.load(x_ptrs + p * 32, mask=live[:, None], other=0.0)
            else:
                x = tl.load(x_ptrs + p * 32, mask=live[:, None] & (kt * 128 + p * 32 + rj < K)[None, :], other=0.0)
            if OUT == 1:
                x = (x.to(tl.float32) * X_MUL).to(tl.bfloat16)
            part = tl.dot(x, _plane(packed, p, OUT), part)
        if GROUPWISE:
            acc += part * tl.load(s_ptrs + kt * stride_sk).to(tl.float32)[None, :]
        else:
            acc += part
        w_ptrs += 32 * N
        x_ptrs += 128
    if not GROUPWISE:
        acc = acc * tl.load(s_ptrs).to(tl.float32)[None, :]
    acc = acc * (tl.load(topk_weights_ptr + slots, mask=live, other=0.0) * S_MUL)[:, None]
    out_ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=live[:, None] & (rn < N)[None, :])


_gate_up = DirectLaunch(_w8a16_gate_up_kernel)
_down = DirectLaunch(_w8a16_down_kernel)


def fused_moe_w8a16(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_packed: torch.Tensor, w13_scale: torch.Tensor, w2_packed: torch.Tensor, w2_scale: torch.Tensor,
    *, hidden: int, intermediate: int, config: FusedMoEConfig | None = None, cursor: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H] bf16/fp16; packed experts from `pack_experts` (w13 [E, ceil(H/128)*32, 2I],
    w2 [E, ceil(I/128)*32, H]); scales in x.dtype (module docstring) -> [T, H] in x.dtype."""
    num_tokens, top_k = topk_ids.shape
    num_experts = w13_packed.shape[0]
    if w13_scale.dtype != x.dtype or w2_scale.dtype != x.dtype:
        raise ValueError(f"W8A16 scales must be in the activation dtype {x.dtype}, got {w13_scale.dtype}")
    out_kind, x_mul, s_mul = operand_exponents(x.dtype)
    config = config or config_for(num_tokens)
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    num_slots = topk_ids.numel()
    sorted_slots, block_expert, num_padded = moe_align_block_size(topk_ids, num_experts, config.block_m, cursor)
    rows = sorted_slots.numel()
    options = launch_options(x.device)
    common = dict(X_MUL=x_mul, S_MUL=s_mul, OUT=out_kind, BLOCK_M=config.block_m, **options)

    # By handle (launch.py; fused_moe.py says why): keyed on the caller's operands' alignment and
    # the integers specialized on (layer constants); outputs and alignment tensors are fresh.
    operands = tuple(aligned(t.data_ptr()) for t in (x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights))
    key = (config, x.dtype, topk_weights.dtype, w13_scale.shape[1] > 1, w2_scale.shape[1] > 1, *operands,
           hidden, intermediate, top_k, x.stride(0), w13_packed.stride(0), w13_scale.stride(0), w13_scale.stride(1),
           w2_packed.stride(0), w2_scale.stride(0), w2_scale.stride(1), options["PDL"])

    h = torch.empty((rows, intermediate), dtype=x.dtype, device=x.device)
    tile = config.gate_up
    _gate_up(
        key, (rows // config.block_m * cdiv(intermediate, tile.block_n),),
        (x, w13_packed, w13_scale, h, sorted_slots, block_expert, num_padded,
         num_slots, rows, hidden, intermediate, top_k,
         x.stride(0), w13_packed.stride(0), w13_scale.stride(0), w13_scale.stride(1), h.stride(0)),
        GROUPWISE=w13_scale.shape[1] > 1, EVEN_K=hidden % GROUP_K == 0,
        BLOCK_N=tile.block_n, GROUP_M=tile.group_m, num_warps=tile.num_warps, num_stages=tile.num_stages,
        STAGES=tile.num_stages, **common,
    )
    slot_out = torch.empty((num_slots, hidden), dtype=x.dtype, device=x.device)
    tile = config.down
    _down(
        key, (rows // config.block_m * cdiv(hidden, tile.block_n),),
        (h, w2_packed, w2_scale, slot_out, topk_weights, sorted_slots, block_expert, num_padded,
         num_slots, rows, hidden, intermediate,
         h.stride(0), w2_packed.stride(0), w2_scale.stride(0), w2_scale.stride(1), slot_out.stride(0)),
        GROUPWISE=w2_scale.shape[1] > 1, EVEN_K=intermediate % GROUP_K == 0,
        BLOCK_N=tile.block_n, GROUP_M=tile.group_m, num_warps=tile.num_warps, num_stages=tile.num_stages,
        STAGES=tile.num_stages, **common,
    )
    return sum_slots(slot_out, num_tokens, top_k)
