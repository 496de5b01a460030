"""select_experts: softmax top-k routing against a float64 reference, ties, renormalisation."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels.moe.routing import select_experts


def _reference(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.double(), dim=-1)
    rows_w, rows_i = [], []
    for row in probs.tolist():
        # Largest probability first; equal probabilities: lower expert id first.
        order = sorted(range(len(row)), key=lambda e: (-row[e], e))[:top_k]
        weights = [row[e] for e in order]
        if renormalize:
            weights = [w / sum(weights) for w in weights]
        rows_w.append(weights)
        rows_i.append(order)
    return torch.tensor(rows_w, dtype=torch.float64), torch.tensor(rows_i)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64_reference(renormalize: bool, dtype: torch.dtype, seed: int) -> None:
    logits = torch.randn(33, 24).to(dtype)
    weights, ids = select_experts(logits, 5, renormalize)
    ref_w, ref_i = _reference(logits.float(), 5, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (33, 5)
    assert torch.equal(ids.long(), ref_i)
    torch.testing.assert_close(weights.double(), ref_w, rtol=1e-6, atol=1e-7)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(33), rtol=1e-6, atol=1e-6)


def test_ties_go_to_the_lower_expert_id() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0, 3.0], [-1.0, 5.0, 0.0, 5.0, 5.0]])
    _, ids = select_experts(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 2], [0, 1], [1, 3]]


def test_wide_rows_with_ties(seed: int) -> None:
    # Quantized logits make many ties among 128 experts, as bf16 routers do.
    logits = torch.randint(-3, 4, (64, 128)).float()
    weights, ids = select_experts(logits, 8, renormalize=False)
    ref_w, ref_i = _reference(logits, 8, renormalize=False)
    assert torch.equal(ids.long(), ref_i)
    torch.testing.assert_close(weights.double(), ref_w, rtol=1e-6, atol=1e-7)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="top_k=9 must be between 1 and the number of experts \\(8\\)"):
        select_experts(torch.zeros(2, 8), 9, True)
    with pytest.raises(ValueError, match="top_k=0 must be between 1 and the number of experts \\(8\\)"):
        select_experts(torch.zeros(2, 8), 0, True)
    with pytest.raises(ValueError, match="\\[tokens, experts\\]"):
        select_experts(torch.zeros(8), 2, True)
    # A batch dimension is refused too, not read as [tokens, experts] = [batch, tokens].
    with pytest.raises(ValueError, match="\\[tokens, experts\\], got shape \\(2, 3, 8\\)"):
        select_experts(torch.zeros(2, 3, 8), 2, True)


def test_top_k_may_be_every_expert() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [1.0, 1.0, 1.0, 1.0]])
    weights, ids = select_experts(logits, 4, renormalize=False)
    assert ids.tolist() == [[1, 2, 0, 3], [0, 1, 2, 3]]
    torch.testing.assert_close(weights, torch.softmax(logits, -1).sort(-1, descending=True).values)
