"""Next-token choice and logprobs, batched over the rows of one step.

Greedy rows take the argmax. Sampled rows apply temperature and top-p, then draw with the
request's own generator, so a seeded request's draws never depend on other requests. Its
logits can: a batch of other sizes rounds differently in the last bits (vLLM is not
batch-invariant either), and an FP8 checkpoint's activation quantization can turn such a bit
into a whole FP8 step (on the tiny models, one other prompt in the batch moved a prompt's
logprobs by up to 0.76 nats with a per-tensor scale, which depends on the whole batch by design,
and 0.03-0.05 otherwise), so a long generation may diverge from the same request run alone
where two tokens nearly tie: 1 of 24 greedy GSM8K answers changed between sent alone and sent
in one batch (session 13). Per-question results repeat exactly only with the same batching,
e.g. `max_concurrency: 1`. Logprobs are of the model's distribution (before
temperature and top-p), as OpenAI and vLLM report them.
"""

from __future__ import annotations

import torch

from .sequence import Sequence

TokenLogprob = tuple[float, dict[int, float]]  # (chosen token's logprob, {token id: logprob} top-k)

_MASK64 = (1 << 64) - 1


def request_generator(seed: int, device: torch.device) -> torch.Generator:
    """A request's own generator. The CPU generator (mt19937) keeps only a seed's low 32 bits, so
    seeds 2**32 apart (or -1 and 2**32 - 1) drew the same samples; a seed outside [0, 2**32) is
    first mixed down to 32 bits by splitmix64's finalizer. CUDA's Philox keeps all 64 bits."""
    if device.type == "cpu" and not 0 <= seed < 1 << 32:
        z = ((seed & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        seed = (z ^ (z >> 31)) >> 32
    return torch.Generator(device=device).manual_seed(seed)


def sample(logits: torch.Tensor, seqs: list[Sequence],
           greedy: torch.Tensor | None = None) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits [len(seqs), vocab] float32 -> (token per row, logprobs per row where requested).
    `greedy`: the argmax of each row when already computed (inside a CUDA graph); not modified."""
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    tokens = logits.argmax(dim=-1) if greedy is None else greedy.clone() if rows else greedy
    if rows:
        index = torch.tensor(rows, device=logits.device)
        temps = torch.tensor([seqs[i].params.temperature for i in rows], device=logits.device)
        probs = torch.softmax(logits[index] / temps[:, None], dim=-1)
        top_p = torch.tensor([seqs[i].params.top_p for i in rows], device=logits.device)
        if bool((top_p < 1).any()):
            probs = _top_p_filter(probs, top_p)
        for j, i in enumerate(rows):
            tokens[i] = torch.multinomial(probs[j], 1, generator=seqs[i].generator)[0]
    chosen = tokens.tolist()
    return chosen, _logprobs(logits, chosen, [s.params.logprobs for s in seqs])


def _top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    drop = mass_before >= top_p[:, None]
    # A top_p below float32's range (1e-300) is 0 here and would drop every token, and the row's
    # failed draw would fail the whole batch's step: the most likely token always stays.
    drop[:, 0] = False
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def _logprobs(logits: torch.Tensor, chosen: list[int], wanted: list[int | None]) -> list[TokenLogprob | None]:
    rows = [i for i, k in enumerate(wanted) if k is not None]
    out: list[TokenLogprob | None] = [None] * len(wanted)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    lp = torch.log_softmax(logits[index], dim=-1)
    picked = lp.gather(1, torch.tensor([chosen[i] for i in rows], device=logits.device)[:, None])[:, 0].tolist()
    k = min(max(wanted[i] for i in rows), lp.shape[-1])  # a vocabulary under 20 tokens has fewer alternatives
    top_vals, top_ids = (t.tolist() for t in lp.topk(k, dim=-1)) if k else ([[]] * len(rows), [[]] * len(rows))
    for j, i in enumerate(rows):
        n = wanted[i]
        out[i] = (picked[j], dict(zip(top_ids[j][:n], top_vals[j][:n])))
    return out


def prompt_logprobs(logits: torch.Tensor, prompt_ids: list[int], k: int) -> list[TokenLogprob | None]:
    """logits of every prompt position [L, vocab] -> per prompt token: None for the first, then
    the logprob the model gave it after the tokens before it, with the top-k alternatives."""
    following = prompt_ids[1:]
    entries = _logprobs(logits[: len(following)], following, [k] * len(following))
    return [None, *entries]
