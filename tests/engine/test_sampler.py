"""The sampler on hand-made logits: a row's parameters must never fail the other rows."""

from __future__ import annotations

import pytest
import torch

from quantgate.engine.detokenizer import IncrementalDetokenizer
from quantgate.engine.sampler import request_generator, sample
from quantgate.engine.sampling_params import SamplingParams
from quantgate.engine.sequence import Sequence


def _seq(params: SamplingParams, seed: int = 0) -> Sequence:
    generator = None if params.greedy else torch.Generator().manual_seed(seed)
    return Sequence("r", [1], params, 4, frozenset(), generator, IncrementalDetokenizer(None, [1], []))


@pytest.mark.parametrize("top_p", [1e-300, 5e-324, 1e-46])  # all 0.0 in float32
def test_a_top_p_below_float32_samples_the_argmax_and_spares_the_batch(top_p: float) -> None:
    logits = torch.randn(4, 960, generator=torch.Generator().manual_seed(0))
    seqs = [_seq(SamplingParams(temperature=1.0, top_p=top_p)), _seq(SamplingParams(temperature=1.0, top_p=0.9)),
            _seq(SamplingParams(temperature=1.0)), _seq(SamplingParams(temperature=0.0))]
    tokens, _ = sample(logits, seqs)
    argmax = logits.argmax(dim=-1).tolist()
    assert tokens[0] == argmax[0] and tokens[3] == argmax[3]
    top = logits[1].softmax(-1).sort(descending=True)
    nucleus = top.indices[: int((top.values.cumsum(-1) < 0.9).sum()) + 1].tolist()
    assert tokens[1] in nucleus and 0 <= tokens[2] < 960


@pytest.mark.parametrize("temperature", [1e-5, 2.0, 1e39, float("inf")])  # 1e39 and inf: inf in float32
def test_extreme_temperatures_draw_valid_tokens(temperature: float) -> None:
    logits = torch.randn(2, 960, generator=torch.Generator().manual_seed(1))
    seqs = [_seq(SamplingParams(temperature=temperature, top_p=0.5)), _seq(SamplingParams(temperature=1.0))]
    tokens, _ = sample(logits, seqs)
    assert all(0 <= t < 960 for t in tokens)


def test_more_logprobs_than_the_vocabulary_lists_every_token() -> None:
    logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(2))
    seqs = [_seq(SamplingParams(temperature=0.0, logprobs=20)), _seq(SamplingParams(temperature=0.0, logprobs=3))]
    tokens, logprobs = sample(logits, seqs)
    assert tokens == logits.argmax(dim=-1).tolist()
    assert [len(top) for _, top in logprobs] == [8, 3]


def test_request_generators_of_seeds_2_32_apart_draw_differently() -> None:
    """The CPU generator keeps a seed's low 32 bits: 5 and 5 + 2**32 (and -1 and 2**32 - 1) drew
    the same samples. Seeds inside 32 bits keep their draws (calibrated sampled runs repeat)."""
    def draws(seed: int) -> list[float]:
        return torch.rand(8, generator=request_generator(seed, torch.device("cpu"))).tolist()

    for a, b in ((5, 5 + 2**32), (0, 2**32), (-1, 2**32 - 1), (2**63 - 1, 2**31 - 1), (2**40, 2**41)):
        assert draws(a) != draws(b), (a, b)
    assert draws(1234) == torch.rand(8, generator=torch.Generator().manual_seed(1234)).tolist()
    assert draws(2**40) == draws(2**40)  # still a seed: the same seed repeats


def _frequencies(logits: torch.Tensor, params: SamplingParams, n: int = 10_000) -> torch.Tensor:
    """How often each token of one logits row is drawn, over n requests with seeds 0..n-1."""
    tokens, _ = sample(logits.expand(n, -1), [_seq(params, seed) for seed in range(n)])
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]).double() / n


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_draws_follow_the_softmax_of_the_logits_over_the_temperature(temperature: float) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    freq = _frequencies(logits, SamplingParams(temperature=temperature))
    assert torch.allclose(freq, expected, atol=0.03), (freq, expected)


def test_top_p_keeps_the_token_whose_mass_crosses_it_and_renormalizes() -> None:
    """probabilities 0.5, 0.3, 0.2 with top_p 0.6: the nucleus is the first two tokens (0.5 alone
    does not reach 0.6), drawn 5:3; the third never."""
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    freq = _frequencies(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert freq[2] == 0
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0], dtype=torch.float64), atol=0.03), freq


def test_a_sampled_row_after_a_greedy_row_keeps_its_own_temperature_and_top_p() -> None:
    """The sampled rows' settings are gathered by row index: a greedy row first must not lend its
    top_p (1.0) or temperature to the next row."""
    logits = torch.randn(3, 960, generator=torch.Generator().manual_seed(3))
    for seed in range(20):
        seqs = [_seq(SamplingParams(temperature=0.0)), _seq(SamplingParams(temperature=1.0, top_p=1e-6), seed),
                _seq(SamplingParams(temperature=1e-4, top_p=1.0), seed)]
        tokens, _ = sample(logits, seqs)
        assert tokens == logits.argmax(dim=-1).tolist()


def test_a_stop_given_as_one_string_is_one_stop_string() -> None:
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]  # not a stop at each of its characters


def test_default_sampling_params_sample_as_vllms_do() -> None:
    params = SamplingParams()
    assert (params.temperature, params.top_p, params.max_tokens, params.stop) == (1.0, 1.0, 16, [])
    assert not params.greedy
