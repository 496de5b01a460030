"""Triton kernels for the model's non-GEMM work on CUDA: one launch where eager PyTorch needs many.

A batch-1 decode step is latency-bound: inside a CUDA graph every kernel still costs a few
microseconds however little it does, and the eager ops of one Qwen3 layer (RMSNorm alone is
five of them) came to about 50 kernels, 1,400 per step for 28 layers: more time than reading
the weights. These kernels do the same arithmetic, rounding to the activation dtype at the
points PyTorch does, in one launch each:

  - `rms_norm`: RMSNorm, optionally after adding the residual (which it updates in place);
  - `qk_norm_rope_to_cache`: q/k head norms and rotary embedding, k and v written to the cache;
  - `decode_attention`: one query per sequence against its cache slot, GQA, online softmax,
    the keys split across programs; it reads each sequence's own length, so a step's cost
    follows its context;
  - `silu_and_mul`.

`layers.py` and `model.py` pick them for CUDA tensors (the attention ones for power-of-two head
sizes); tests run them under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantgate.kernels.triton.launch import DirectLaunch, aligned, cdiv, next_power_of_2
from quantgate.kernels.triton.pdl import await_inputs, launch_options
from quantgate.kernels.triton.scratch import device_buffer


@triton.jit
def _round(x, dtype: tl.constexpr):
    """Round float32 to the activation dtype and back: where an eager op would store its result."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n, stride_x, stride_res, stride_out, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = _round(x + tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32), dtype)
        tl.store(res_ptr + row * stride_res + cols, x.to(dtype), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * _round(x * rstd, dtype)).to(dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, n] -> weight * rmsnorm(x) (normalised in float32, scaled in x.dtype). With `residual`,
    the input is x + residual, and residual is overwritten with that sum (the next layer's input)."""
    rows, n = x.shape
    out = torch.empty_like(x)
    if rows:
        res = residual if residual is not None else x
        strides = (x.stride(0), res.stride(0), out.stride(0))
        options = launch_options(x.device)
        key = (x.dtype, weight.dtype, n, *strides, aligned(x.data_ptr()), aligned(res.data_ptr()),
               aligned(weight.data_ptr()), residual is not None, options["PDL"])
        _rms_norm(key, (rows,), (x, res, weight, out, n, *strides, eps),
                  HAS_RESIDUAL=residual is not None, BLOCK=next_power_of_2(n), **options)
    return out


# Eager prefill is bound by host time: launches by handle (kernels/triton/launch.py).
_rms_norm = DirectLaunch(_rms_norm_kernel)


@triton.jit
def _norm_rope_half(lo, hi, w_ptr, cos_ptr, sin_ptr, half, eps, head_dim, dtype: tl.constexpr):
    """RMSNorm of one head given as its two halves, then neox rotary: rotate_half(x) = (-hi, lo)."""
    rstd = 1.0 / tl.sqrt((tl.sum(lo * lo, axis=0) + tl.sum(hi * hi, axis=0)) / head_dim + eps)
    lo = _round(tl.load(w_ptr + half).to(tl.float32) * _round(lo * rstd, dtype), dtype)
    hi = _round(tl.load(w_ptr + half + head_dim // 2).to(tl.float32) * _round(hi * rstd, dtype), dtype)
    cos_lo, cos_hi = _round(tl.load(cos_ptr + half), dtype), _round(tl.load(cos_ptr + half + head_dim // 2), dtype)
    sin_lo, sin_hi = _round(tl.load(sin_ptr + half), dtype), _round(tl.load(sin_ptr + half + head_dim // 2), dtype)
    out_lo = _round(lo * cos_lo, dtype) - _round(hi * sin_lo, dtype)
    out_hi = _round(hi * cos_hi, dtype) + _round(lo * sin_hi, dtype)
    return out_lo, out_hi


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_out_ptr, q_w_ptr, k_w_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, k_cache_ptr,
    v_cache_ptr, stride_q, stride_k, stride_v, stride_qo, stride_ko, stride_cos,
    stride_cs, stride_ch, stride_cp, eps,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PDL: tl.constexpr,
):
    """Program (token, head): heads [0, NUM_HEADS) are queries, the rest key/value heads."""
    await_inputs(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    half = tl.arange(0, HEAD_DIM // 2)
    dtype = q_out_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + t)
    cos_row, sin_row = cos_ptr + pos * stride_cos, sin_ptr + pos * stride_cos
    if h < NUM_HEADS:
        src = q_ptr + t * stride_q + h * HEAD_DIM
        lo, hi = _norm_rope_half(tl.load(src + half).to(tl.float32), tl.load(src + half + HEAD_DIM // 2).to(tl.float32),
                                 q_w_ptr, cos_row, sin_row, half, eps, HEAD_DIM, dtype)
        dst = q_out_ptr + t * stride_qo + h * HEAD_DIM
    else:
        kv_head = h - NUM_HEADS
        src = k_ptr + t * stride_k + kv_head * HEAD_DIM
        lo, hi = _norm_rope_half(tl.load(src + half).to(tl.float32), tl.load(src + half + HEAD_DIM // 2).to(tl.float32),
                                 k_w_ptr, cos_row, sin_row, half, eps, HEAD_DIM, dtype)
        cache = tl.load(slot_ptr + t) * stride_cs + kv_head * stride_ch + pos * stride_cp
        tl.store(k_cache_ptr + cache + half, lo.to(dtype))
        tl.store(k_cache_ptr + cache + half + HEAD_DIM // 2, hi.to(dtype))
        v_src = v_ptr + t * stride_v + kv_head * HEAD_DIM
        tl.store(v_cache_ptr + cache + half, tl.load(v_src + half))
        tl.store(v_cache_ptr + cache + half + HEAD_DIM // 2, tl.load(v_src + half + HEAD_DIM // 2))
        dst = k_out_ptr + t * stride_ko + kv_head * HEAD_DIM
    tl.store(dst + half, lo.to(dtype))
    tl.store(dst + half + HEAD_DIM // 2, hi.to(dtype))


def qk_norm_rope_to_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor,
                          k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                          positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H*D], k and v [T, Hkv*D] (projection outputs) -> q [T, H, D] and k [T, Hkv, D], each
    head RMS-normed and rotated; that k and v are also written to the caches [slots, Hkv, max_len, D]
    at (slot, position). cos/sin: float32 tables [max_positions, D], rounded to q.dtype as the eager
    path does."""
    tokens, num_kv_heads, head_dim = q.shape[0], k_cache.shape[1], k_cache.shape[3]
    num_heads = q.shape[1] // head_dim
    q_out = torch.empty(tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(tokens, num_kv_heads, head_dim, dtype=q.dtype, device=q.device)
    if tokens:
        assert all(a.stride(-1) == 1 for a in (q, k, v, k_cache, v_cache, cos, sin))
        assert k_cache.stride() == v_cache.stride() and cos.stride() == sin.stride()
        _qk_norm_rope_kernel[(tokens, num_heads + num_kv_heads)](
            q, k, v, q_out, k_out, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache,
            q.stride(0), k.stride(0), v.stride(0), q_out.stride(0), k_out.stride(0), cos.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, **launch_options(q.device))
    return q_out, k_out


# A sequence's keys are split into min(MAX_SPLITS, ceil(len / SPLIT_KEYS)) contiguous shares,
# one program each: at batch 1 the 16 heads of a 1.7B model are 16 programs on 132 SMs, and each
# walked its whole context one block (a global-memory round trip) after another. The split
# depends on the sequence's length only, never on the batch or the captured context bucket, so
# eager runs and graph replays compute the same sums.
BLOCK_N = 64
SPLIT_KEYS = 128
MAX_SPLITS = 16


@triton.jit(do_not_specialize=["grid_splits"])
def _decode_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, len_ptr, out_ptr, partial_ptr, counter_ptr,
                             scale, stride_qb, stride_ob, stride_cs, stride_ch, stride_cp, grid_splits,
                             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                             SPLIT_KEYS: tl.constexpr, MAX_SPLITS: tl.constexpr, PDL: tl.constexpr):
    """Program (sequence, query head, split): an online softmax in float32 over its share of
    keys [0, len). With several splits, each writes (acc, max, sum) to `partial`, and the one
    that arrives last merges them in split order (so the result does not depend on arrival
    order), writes the output and resets the counter of (sequence, head) to zero."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    await_inputs(PDL)
    d = tl.arange(0, HEAD_DIM)
    keys = tl.arange(0, BLOCK_N)
    length = tl.load(len_ptr + b).to(tl.int32)
    blocks = tl.cdiv(length, BLOCK_N)
    share = tl.cdiv(blocks, tl.minimum(tl.cdiv(length, SPLIT_KEYS), MAX_SPLITS)) * BLOCK_N
    splits = tl.cdiv(length, share)
    if split < splits:
        q = tl.load(q_ptr + b * stride_qb + h * HEAD_DIM + d).to(tl.float32) * scale
        base = tl.load(slot_ptr + b) * stride_cs + (h // GROUP) * stride_ch
        m = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)
        total = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)
        acc = tl.zeros([HEAD_DIM], tl.float32)
        end = tl.minimum(split * share + share, length)
        for start in range(split * share, end, BLOCK_N):
            valid = (start + keys) < end
            offsets = base + (start + keys)[:, None] * stride_cp + d[None, :]
            # Both loads in flight before either is used.
            k = tl.load(k_cache_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_cache_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            total = total * alpha + tl.sum(p, axis=0)
            m = m_new
        dst = out_ptr + b * stride_ob + h * HEAD_DIM + d
        if splits == 1:
            tl.store(dst, (acc / total).to(out_ptr.dtype.element_ty))
        else:
            row = b * tl.num_programs(1) + h
            slot = partial_ptr + (row * grid_splits + split) * (HEAD_DIM + 2)
            tl.store(slot + d, acc)
            tl.store(slot + HEAD_DIM, m)
            tl.store(slot + HEAD_DIM + 1, total)
            # All threads' partial stores precede the (single-thread, release) counter update.
            tl.debug_barrier()
            arrived = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
            if arrived == splits - 1:
                first = partial_ptr + row * grid_splits * (HEAD_DIM + 2)
                # .cg: read from L2 what other SMs wrote, never this SM's L1.
                m = tl.load(first + HEAD_DIM, cache_modifier=".cg")
                total = tl.load(first + HEAD_DIM + 1, cache_modifier=".cg")
                acc = tl.load(first + d, cache_modifier=".cg")
                for other in range(1, splits):
                    part = first + other * (HEAD_DIM + 2)
                    m_part = tl.load(part + HEAD_DIM, cache_modifier=".cg")
                    m_new = tl.maximum(m, m_part)
                    alpha, beta = tl.exp(m - m_new), tl.exp(m_part - m_new)
                    acc = acc * alpha + tl.load(part + d, cache_modifier=".cg") * beta
                    total = total * alpha + tl.load(part + HEAD_DIM + 1, cache_modifier=".cg") * beta
                    m = m_new
                tl.store(dst, (acc / total).to(out_ptr.dtype.element_ty))
                tl.store(counter_ptr + row, 0)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lens: torch.Tensor, scale: float, out: torch.Tensor, max_len: int) -> None:
    """q [B, H, D], one query per sequence at the last of its `lens` (<= max_len) positions of
    cache `slots`; writes softmax(q k^T * scale) v over those positions into out [B, H, D]."""
    batch, num_heads, head_dim = q.shape
    if batch:
        assert q.stride(2) == 1 and q.stride(1) == head_dim and out.stride(2) == 1 and out.stride(1) == head_dim
        grid_splits = min(MAX_SPLITS, cdiv(max(max_len, 1), SPLIT_KEYS))
        rows = batch * num_heads
        partials = device_buffer(q.device, "attention_partials", rows * grid_splits * (head_dim + 2), torch.float32)
        counters = device_buffer(q.device, "attention_counters", rows, torch.int32)
        _decode_attention_kernel[(batch, num_heads, grid_splits)](
            q, k_cache, v_cache, slots, lens, out, partials, counters, scale, q.stride(0), out.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), grid_splits,
            GROUP=num_heads // k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_N=BLOCK_N, SPLIT_KEYS=SPLIT_KEYS,
            MAX_SPLITS=MAX_SPLITS, num_warps=8, **launch_options(q.device))


@triton.jit(do_not_specialize=["n"])
def _silu_and_mul_kernel(gate_ptr, up_ptr, out_ptr, n, stride_gate, stride_up, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    await_inputs(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    dtype = out_ptr.dtype.element_ty
    g = tl.load(gate_ptr + row * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_up + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (_round(g / (1.0 + tl.exp(-g)), dtype) * u).to(dtype), mask=mask)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [T, n] tensors with unit column stride (column views of a merged
    gate_up projection need no copy), silu rounded to the dtype first (as the two eager ops are)."""
    if gate.stride(-1) != 1 or up.stride(-1) != 1:
        gate, up = gate.contiguous(), up.contiguous()
    rows, n = gate.shape
    out = torch.empty(rows, n, dtype=gate.dtype, device=gate.device)
    if rows and n:
        strides = (gate.stride(0), up.stride(0))
        options = launch_options(gate.device)
        key = (gate.dtype, *strides, aligned(gate.data_ptr()), aligned(up.data_ptr()), options["PDL"])
        _silu_and_mul(key, (rows, cdiv(n, 1024)), (gate, up, out, n, *strides), BLOCK=1024, **options)
    return out


_silu_and_mul = DirectLaunch(_silu_and_mul_kernel)
