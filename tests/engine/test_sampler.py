"""The sampler on hand-made logits: a row's parameters must never fail the other rows."""

from __future__ import annotations

import pytest
import torch

from quantgate.engine.detokenizer import IncrementalDetokenizer
from quantgate.engine.sampler import _top_p_filter, request_generator, sample
from quantgate.engine.sampling_params import InvalidRequestError, SamplingParams
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
    for seed in (0, 1234, 2**31, 2**32 - 1):  # every 32-bit seed, both ends included, is the generator's own
        assert draws(seed) == torch.rand(8, generator=torch.Generator().manual_seed(seed)).tolist(), seed
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
    # no logprobs unless asked (they cost every step, and keep greedy decodes from overlapping)
    assert (params.logprobs, params.prompt_logprobs, params.seed, params.ignore_eos) == (None, False, None, False)
    assert params.stop_token_ids == []
    assert not params.greedy


def test_a_precomputed_greedy_tensor_is_used_and_left_unmodified() -> None:
    """Inside a CUDA graph the argmax comes precomputed in the graph's own output buffer: the
    sampled rows' draws go into a copy."""
    logits = torch.randn(3, 960, generator=torch.Generator().manual_seed(4))
    greedy = logits.argmax(dim=-1)
    before = greedy.clone()
    seqs = [_seq(SamplingParams(temperature=0.0)), _seq(SamplingParams(temperature=1.0), 5),
            _seq(SamplingParams(temperature=0.0))]
    tokens, _ = sample(logits, seqs, greedy)
    assert torch.equal(greedy, before)
    assert tokens[0] == before[0] and tokens[2] == before[2] and tokens[1] != before[1]


def test_top_p_keeps_no_token_after_the_mass_has_reached_it() -> None:
    """0.5 alone reaches top_p 0.5: the nucleus is that one token (vLLM's too), not the next one
    as well. Probabilities exact in binary, so the boundary is exact."""
    probs = torch.tensor([[0.125, 0.5, 0.25, 0.125]]).expand(2, -1)
    kept = _top_p_filter(probs, torch.tensor([0.5, 0.75]))
    assert kept.tolist() == [[0.0, 0.5, 0.0, 0.0], [0.0, 0.5, 0.25, 0.0]]


def test_the_chosen_logprob_is_each_rows_own_when_other_rows_want_none() -> None:
    logits = torch.randn(3, 960, generator=torch.Generator().manual_seed(6))
    seqs = [_seq(SamplingParams(temperature=0.0)), _seq(SamplingParams(temperature=0.0, logprobs=2)),
            _seq(SamplingParams(temperature=0.0, logprobs=0))]
    tokens, logprobs = sample(logits, seqs)
    lp = torch.log_softmax(logits, dim=-1)
    assert logprobs[0] is None
    assert logprobs[1][0] == pytest.approx(lp[1, tokens[1]].item()) and len(logprobs[1][1]) == 2
    assert logprobs[2] == (pytest.approx(lp[2, tokens[2]].item()), {})


@pytest.mark.parametrize("params, message", [
    (dict(max_tokens=-1), "max_tokens must be >= 0, got -1"),
    (dict(temperature=-0.5), "temperature must be >= 0, got -0.5"),
    (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    (dict(logprobs=-1), "logprobs must be between 0 and 20, got -1"),
    (dict(logprobs=21), "logprobs must be between 0 and 20, got 21"),
    (dict(stop=[5]), "stop must be a list of non-empty strings"),  # else a TypeError (not a 4xx) when it is added
    (dict(stop=["ok", ""]), "stop must be a list of non-empty strings"),
    (dict(stop_token_ids=[3, -1]), "stop_token_ids must be a list of token ids (integers >= 0)"),
    (dict(stop_token_ids=[True]), "stop_token_ids must be a list of token ids (integers >= 0)"),
    (dict(stop_token_ids=["3"]), "stop_token_ids must be a list of token ids (integers >= 0)"),
    (dict(stop_token_ids="3"), "stop_token_ids must be a list of token ids (integers >= 0)"),
    (dict(stop_token_ids=3), "stop_token_ids must be a list of token ids (integers >= 0)"),
])
def test_each_bad_sampling_parameter_is_refused_naming_its_range(params: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**params)
    assert str(err.value) == message


def test_sampling_parameters_at_the_edges_of_their_ranges_are_accepted() -> None:
    params = SamplingParams(max_tokens=0, temperature=0.0, top_p=1.0, logprobs=0)
    assert (params.max_tokens, params.logprobs, params.greedy) == (0, 0, True)
    assert SamplingParams(max_tokens=None, logprobs=20, top_p=1e-300).logprobs == 20


def test_temperatures_below_1e_5_are_greedy_and_from_1e_5_sampled() -> None:
    assert SamplingParams(temperature=9.99e-6).greedy and SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-5).greedy and not SamplingParams(temperature=1e-3).greedy
