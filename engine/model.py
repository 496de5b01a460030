"""Qwen3 (dense) and Qwen3-MoE over a packed batch and a slot-based KV cache.

Module names equal the Hugging Face checkpoint names (`model.layers.0.self_attn.o_proj`), so
the kernel report, ignore lists and the loader all speak one language. Merged projections take
vLLM's names (`self_attn.qkv_proj`, `mlp.gate_up_proj`: `loader.MERGED_PROJECTIONS`);
`QuantLinear.shards` lists the checkpoint modules they stand for.

One forward runs a mixed batch: the prompts being prefilled (packed, one causal attention
per prompt) followed by one token for each running sequence (batched attention over its
cache slot). Linears, norms and MLPs see all rows at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from quantgate.kernels.moe.routing import select_experts

from .config import ModelConfig
from .kv_cache import KVCache
from . import layers
from .layers import FusedMoE, QuantLinear, RMSNorm, RotaryEmbedding, apply_rotary, silu_and_mul


@dataclass
class ForwardBatch:
    """Rows [0, num_prefill_tokens) are prompts (one segment per prompt), the rest decode tokens.

    `decode_kv_len` is how many cache positions decode attention reads. Decode rows are in
    increasing slot order. `decode_slot_range` (first, end) lets decode attention read the
    cache as a view of the slots in that range (a gather of 32 sequences' caches costs more
    than their attention on CPU); queries are placed at `decode_slots - first`. Without it
    the sequences' cache rows are gathered (shape-static, what CUDA graphs capture).
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int64, cache slot of each row
    prefill_segments: list[tuple[int, int]]  # (first row, length) per prompt
    num_prefill_tokens: int
    decode_slots: torch.Tensor  # [B] int64
    decode_lens: torch.Tensor  # [B] int64: context length including the new token
    decode_kv_len: int
    decode_slot_range: tuple[int, int] | None
    logits_indices: torch.Tensor  # rows whose logits are wanted

    @property
    def num_decode(self) -> int:
        return self.decode_slots.shape[0]



@dataclass
class LayerInputs:
    """What every layer derives from the batch in the same way, so the model computes it once
    per forward (inside a CUDA graph too).

    `fused`: norms, RoPE, cache writes and decode attention run as the Triton kernels of
    `triton_ops` (on CUDA), which read the rotary tables and decode lengths themselves; the
    eager PyTorch path uses the fields below."""

    batch: ForwardBatch
    rotary: RotaryEmbedding
    fused: bool
    cos: torch.Tensor | None  # [T, 1, head_dim] RoPE, activation dtype
    sin: torch.Tensor | None
    decode_rows: torch.Tensor | None  # row of each decode sequence in the slot range; None: rows are sequences
    decode_mask: torch.Tensor | None  # [rows, 1, 1, decode_kv_len] keys each decode row may attend to

    @classmethod
    def build(cls, batch: ForwardBatch, rotary: RotaryEmbedding, dtype: torch.dtype, fused: bool) -> LayerInputs:
        if fused:
            return cls(batch, rotary, True, None, None, None, None)
        cos, sin = rotary(batch.positions, dtype)
        if not batch.num_decode:
            return cls(batch, rotary, False, cos, sin, None, None)
        rows, lens = None, batch.decode_lens
        if batch.decode_slot_range is not None:
            first, end = batch.decode_slot_range
            if end - first != batch.num_decode:  # slots in order: a full range is exactly these sequences
                rows = batch.decode_slots - first
                lens = torch.ones(end - first, dtype=lens.dtype, device=lens.device).index_copy_(0, rows, lens)
        keys = torch.arange(batch.decode_kv_len, device=lens.device)
        return cls(batch, rotary, False, cos, sin, rows, (keys[None, :] < lens[:, None])[:, None, None, :])


class LayerFactory(Protocol):
    """Builds the kernel-backed layers (the loader's, which selects their kernels)."""

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> QuantLinear: ...

    def merged_linear(self, prefix: str, name: str, in_features: int, sizes: tuple[int, ...],
                      bias: bool) -> QuantLinear | None:
        """`prefix.name` (e.g. self_attn.qkv_proj) standing for the checkpoint's projections of
        that input, or None when their tensors do not concatenate exactly."""

    def moe(self, name: str) -> FusedMoE: ...


def _projections(factory: LayerFactory, prefix: str, merged: str, parts: tuple[str, ...], in_features: int,
                 sizes: tuple[int, ...], bias: bool) -> tuple[QuantLinear | None, list[QuantLinear]]:
    """(the merged projection, []) or (None, one linear per part)."""
    layer = factory.merged_linear(prefix, merged, in_features, sizes, bias)
    if layer is not None:
        return layer, []
    return None, [factory.linear(f"{prefix}.{p}", in_features, n, bias) for p, n in zip(parts, sizes)]


class Attention(nn.Module):
    def __init__(self, prefix: str, cfg: ModelConfig, device: torch.device, factory: LayerFactory) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        bias = cfg.attention_bias
        self.qkv_proj, separate = _projections(factory, prefix, "qkv_proj", ("q_proj", "k_proj", "v_proj"),
                                               cfg.hidden_size, (q_size, kv_size, kv_size), bias)
        self.q_proj, self.k_proj, self.v_proj = separate or (None, None, None)
        self.o_proj = factory.linear(f"{prefix}.o_proj", q_size, cfg.hidden_size, bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.dtype, device)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.dtype, device)

    def forward(self, x: torch.Tensor, inputs: LayerInputs, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        batch, t = inputs.batch, x.shape[0]
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if inputs.fused:
            from . import triton_ops

            q, k = triton_ops.qk_norm_rope_to_cache(
                q, k, v, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, inputs.rotary.cos,
                inputs.rotary.sin, batch.positions, batch.slots, k_cache, v_cache)
            v = v.view(t, self.num_kv_heads, self.head_dim)
        else:
            q = self.q_norm(q.view(t, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(t, self.num_kv_heads, self.head_dim))
            v = v.view(t, self.num_kv_heads, self.head_dim)
            q, k = apply_rotary(q, inputs.cos, inputs.sin), apply_rotary(k, inputs.cos, inputs.sin)
            k_cache[batch.slots, :, batch.positions] = k
            v_cache[batch.slots, :, batch.positions] = v

        out = torch.empty_like(q)
        for first, length in batch.prefill_segments:
            rows = slice(first, first + length)
            qs, ks, vs = (a[rows].transpose(0, 1).unsqueeze(0) for a in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=True)
            out[rows] = o[0].transpose(0, 1)
        if batch.num_decode:
            n = batch.num_prefill_tokens
            if inputs.fused:
                triton_ops.decode_attention(q[n:], k_cache, v_cache, batch.decode_slots, batch.decode_lens,
                                            self.scale, out[n:], batch.decode_kv_len)
            else:
                out[n:] = self._decode(q[n:], inputs, k_cache, v_cache)
        return self.o_proj(out.view(t, self.num_heads * self.head_dim))

    def _decode(self, q: torch.Tensor, inputs: LayerInputs, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        batch, kv_len = inputs.batch, inputs.batch.decode_kv_len
        if batch.decode_slot_range is None:
            keys, values = k_cache[batch.decode_slots, :, :kv_len], v_cache[batch.decode_slots, :, :kv_len]
        else:
            span = slice(*batch.decode_slot_range)
            keys, values = k_cache[span, :, :kv_len], v_cache[span, :, :kv_len]
        rows = inputs.decode_rows
        if rows is not None:  # queries of the range's idle slots are zeros; their output is dropped
            q = q.new_zeros(inputs.decode_mask.shape[0], self.num_heads, self.head_dim).index_copy_(0, rows, q)
        o = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=inputs.decode_mask, scale=self.scale,
                                           enable_gqa=True)[:, :, 0]
        return o if rows is None else o[rows]


class MLP(nn.Module):
    def __init__(self, prefix: str, hidden: int, intermediate: int, factory: LayerFactory) -> None:
        super().__init__()
        self.gate_up_proj, separate = _projections(factory, prefix, "gate_up_proj", ("gate_proj", "up_proj"), hidden,
                                                   (intermediate, intermediate), False)
        self.gate_proj, self.up_proj = separate or (None, None)
        self.down_proj = factory.linear(f"{prefix}.down_proj", intermediate, hidden, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            return self.down_proj(silu_and_mul(*self.gate_up_proj.split(self.gate_up_proj(x))))
        return self.down_proj(silu_and_mul(self.gate_proj(x), self.up_proj(x)))


class SparseMoeBlock(nn.Module):
    def __init__(self, prefix: str, cfg: ModelConfig, factory: LayerFactory) -> None:
        super().__init__()
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = factory.linear(f"{prefix}.gate", cfg.hidden_size, cfg.num_experts, False)
        self.experts = factory.moe(f"{prefix}.experts")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        return self.experts(x, topk_weights, topk_ids)


class DecoderLayer(nn.Module):
    def __init__(self, index: int, cfg: ModelConfig, device: torch.device, factory: LayerFactory) -> None:
        super().__init__()
        prefix = f"model.layers.{index}"
        self.self_attn = Attention(f"{prefix}.self_attn", cfg, device, factory)
        if cfg.is_moe_layer(index):
            self.mlp = SparseMoeBlock(f"{prefix}.mlp", cfg, factory)
        else:
            self.mlp = MLP(f"{prefix}.mlp", cfg.hidden_size, cfg.intermediate_size, factory)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, inputs: LayerInputs, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this layer's output, the residual stream before it): the caller's next norm adds them,
        one kernel for the residual add and the norm (the first layer's residual is its input)."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(x, inputs, k_cache, v_cache), residual)
        return self.mlp(x), residual


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, device: torch.device, factory: LayerFactory) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings, device)
        self.layers = nn.ModuleList(DecoderLayer(i, cfg, device, factory) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, device)


class Qwen3ForCausalLM(nn.Module):
    """Dense Qwen3 and Qwen3-MoE (the MoE layers are chosen per layer by the config)."""

    def __init__(self, cfg: ModelConfig, device: torch.device, factory: LayerFactory) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg, device, factory)
        self.lm_head = factory.linear("lm_head", cfg.hidden_size, cfg.vocab_size, False)

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """-> float32 logits [len(batch.logits_indices), vocab]."""
        x = self.model.embed_tokens(batch.input_ids)
        head_dim = self.config.head_dim
        fused = layers.uses_triton_ops(x) and (head_dim & (head_dim - 1)) == 0  # the kernels' tiles are powers of two
        inputs = LayerInputs.build(batch, self.model.rotary_emb, x.dtype, fused)
        residual = None
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, inputs, kv.k[i], kv.v[i])
        rows = batch.logits_indices
        x, _ = self.model.norm(x[rows], residual[rows])
        return self.lm_head(x).float()
