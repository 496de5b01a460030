"""Reference MoE: a loop over the experts that received tokens, in float32.

Weights are dequantized once at load; activations go through the scheme's FP8
quantize-dequantize (block: 1x128 groups, channel: per token, tensor: the static scale or
one dynamic scale per GEMM) exactly where the W8A8 kernels quantize them: the input of the
gate/up GEMM and the SiLU-and-mul output entering the down GEMM. It is the numerical
reference of the fast backends and runs the tiny MoE model on CPU, so it touches only the
experts that got tokens and does no per-token Python work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base import OK, MoEKernel, Verdict, bind_processed
from ..linear.emulation import qdq_activation
from ..platform import Platform
from ..schemes import MoELayerConfig, Scheme
from . import experts
from .experts import DOWN, GATE_UP


class EmulationMoEKernel(MoEKernel):
    backend = "emulation"
    schemes = frozenset(Scheme)
    cuda_graphs = False  # each expert's matmul is sized by its token count, read on the host

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return OK

    @classmethod
    def can_implement(cls, config: MoELayerConfig) -> Verdict:
        ok, reason = cls._scheme_verdict(config.scheme)
        return experts.layout_verdict(config) if ok else (ok, reason)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        cfg = self.config
        experts.check_expert_tensors(layer, cfg)
        for proj in (GATE_UP, DOWN):
            scale = getattr(layer, experts.scale_attr(cfg, proj)) if cfg.scheme.is_fp8 else None
            bind_processed(layer, f"{proj}_weight",
                           experts.dequantize_experts(getattr(layer, f"{proj}_weight"), scale, cfg, proj))
            if scale is not None:
                bind_processed(layer, experts.scale_attr(cfg, proj), scale.float())
            input_scale = experts.static_input_scale(layer, cfg, proj)
            if input_scale is not None:
                bind_processed(layer, f"{proj}_input_scale", input_scale)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        num_tokens, top_k = topk_ids.shape
        flat_ids = topk_ids.reshape(-1).long()
        if flat_ids.numel():  # checked before bincount, which refuses negative ids with its own message
            low, high = (int(v) for v in torch.aminmax(flat_ids))
            if low < 0 or high >= cfg.num_experts:
                raise ValueError(f"topk_ids must lie in [0, {cfg.num_experts}); got ids from {low} to {high}")
        counts = torch.bincount(flat_ids, minlength=cfg.num_experts)
        # Slots (token, choice) grouped by expert; a stable sort keeps token order inside an expert.
        order = torch.argsort(flat_ids, stable=True)
        segments = [(e, start, start + n) for e, (start, n) in enumerate(zip(_starts(counts), counts.tolist())) if n]
        # Whole-batch gathers and elementwise ops, one matmul per expert into its rows (no
        # scatter-adds: they dominate on CPU).
        x_q = qdq_activation(x, cfg, _input_scale(layer, cfg, GATE_UP))
        x_sorted = x_q.index_select(0, order // top_k)
        gate_up = x_q.new_empty(order.numel(), 2 * cfg.intermediate_size)
        for e, start, end in segments:
            torch.matmul(x_sorted[start:end], layer.w13_weight[e].t(), out=gate_up[start:end])
        gate, up = gate_up.split(cfg.intermediate_size, dim=1)
        inter_q = qdq_activation(F.silu(gate) * up, cfg, _input_scale(layer, cfg, DOWN))
        down = x_q.new_empty(order.numel(), cfg.hidden_size)
        for e, start, end in segments:
            torch.matmul(inter_q[start:end], layer.w2_weight[e].t(), out=down[start:end])
        down *= topk_weights.reshape(-1).float().index_select(0, order)[:, None]
        slot_of_row = torch.empty_like(order)
        slot_of_row[order] = torch.arange(order.numel(), device=order.device)
        return down.index_select(0, slot_of_row).view(num_tokens, top_k, cfg.hidden_size).sum(dim=1).to(x.dtype)


def _input_scale(layer: torch.nn.Module, cfg: MoELayerConfig, proj: str) -> torch.Tensor | None:
    return getattr(layer, f"{proj}_input_scale") if cfg.static_input_scale and cfg.scheme is Scheme.FP8_TENSOR else None


def _starts(counts: torch.Tensor) -> list[int]:
    return (torch.cumsum(counts, 0) - counts).tolist()
