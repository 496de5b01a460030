"""Top-k softmax routing of Qwen3-MoE, shared by every MoE backend.

Ties go to the lower expert id: `torch.topk` does not promise an order among equal values
(it picks 1 and 3 out of three equal 0.3 at ids 1, 2, 3 on CPU), so a stable descending
sort decides instead, and every backend sees the same experts.
"""

from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_weights [T, top_k] float32, topk_ids [T, top_k] int32).

    Softmax in float32 over all experts, the `top_k` largest probabilities, optionally
    divided by their sum (Qwen3-MoE `norm_topk_prob`).
    """
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [tokens, experts], got shape {tuple(router_logits.shape)}")
    num_experts = router_logits.shape[1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts ({num_experts})")
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.contiguous(), ids.to(torch.int32).contiguous()
