"""LLMEngine behaviour: continuous batching, batch invariance, sampling, stops, logprobs, limits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quantgate.engine import InvalidRequestError, LLMEngine, SamplingParams, load_model
from quantgate.engine.llm_engine import uncapturable_kernels

from .conftest import random_prompts, run_to_completion
from .test_parity import _hf, _ints


def _tokens(outputs) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def _greedy(max_tokens: int = 10, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kw)


def test_greedy_results_do_not_depend_on_batch_composition(dense_engine, seed):
    prompts = random_prompts(10, dense_engine.vocab_size, torch.Generator().manual_seed(seed))
    alone = {}
    for i, p in enumerate(prompts):
        dense_engine.add_request(f"a{i}", p, _greedy(ignore_eos=True))
        alone[i] = _tokens(run_to_completion(dense_engine)[f"a{i}"])
    for i, p in enumerate(prompts):  # all at once: 8 slots, so two join later, mid-flight
        dense_engine.add_request(f"b{i}", p, _greedy(ignore_eos=True))
    together = run_to_completion(dense_engine)
    assert {i: _tokens(together[f"b{i}"]) for i in alone} == alone


def test_new_requests_join_running_ones_at_the_next_step(dense_engine):
    dense_engine.add_request("first", [5, 6, 7], _greedy(20, ignore_eos=True))
    dense_engine.step()
    dense_engine.step()
    dense_engine.add_request("second", [8, 9], _greedy(5, ignore_eos=True))
    produced = {o.request_id: len(o.new_token_ids) for o in dense_engine.step()}
    assert produced == {"first": 1, "second": 1}  # one step: a decode for one, the prefill of the other
    run_to_completion(dense_engine)


def test_max_tokens_and_eos_finish_requests(dense_engine):
    dense_engine.add_request("len", [3, 4, 5], _greedy(7, ignore_eos=True))
    outs = run_to_completion(dense_engine)["len"]
    assert len(_tokens(outs)) == 7 and outs[-1].finished and outs[-1].finish_reason == "length"
    assert outs[-1].num_generated_tokens == 7 and outs[-1].num_prompt_tokens == 3
    first = _tokens(outs)[0]
    dense_engine.add_request("stop", [3, 4, 5], _greedy(7, stop_token_ids=[first]))
    outs = run_to_completion(dense_engine)["stop"]
    assert _tokens(outs) == [first] and outs[-1].finish_reason == "stop"


def test_logprobs_are_the_model_distribution(dense_dir, dense_engine):
    hf = _hf(dense_dir)
    prompt = [11, 12, 13, 14, 15]
    dense_engine.add_request("lp", prompt, SamplingParams(max_tokens=3, temperature=0, logprobs=3,
                                                          prompt_logprobs=True, ignore_eos=True))
    outs = run_to_completion(dense_engine)["lp"]
    tokens = _tokens(outs)
    with torch.no_grad():
        ref = torch.log_softmax(hf(_ints([prompt + tokens])).logits[0].double(), dim=-1)
    plp = outs[0].prompt_logprobs
    assert plp[0] is None and len(plp) == len(prompt)
    for pos in range(1, len(prompt)):
        lp, top = plp[pos]
        assert lp == pytest.approx(float(ref[pos - 1, prompt[pos]]), abs=1e-4)
        assert list(top) == ref[pos - 1].topk(3).indices.tolist()
    generated = [lp for out in outs for lp in out.token_logprobs]
    tops = [top for out in outs for top in out.top_logprobs]
    for j, t in enumerate(tokens):
        row = ref[len(prompt) - 1 + j]
        assert generated[j] == pytest.approx(float(row[t]), abs=1e-4)
        assert next(iter(tops[j])) == t  # greedy: the chosen token is the most likely
    assert all(out.prompt_logprobs is None for out in outs[1:])


def test_prompt_logprobs_of_prompts_prefilled_together_with_decodes_are_each_their_own(dense_engine, seed):
    prompts = random_prompts(3, dense_engine.vocab_size, torch.Generator().manual_seed(seed), low=3)
    echo = SamplingParams(max_tokens=2, temperature=0, logprobs=2, prompt_logprobs=True, ignore_eos=True)
    alone = []
    for i, p in enumerate(prompts):
        dense_engine.add_request(f"alone{i}", p, echo)
        alone.append(run_to_completion(dense_engine)[f"alone{i}"][0].prompt_logprobs)
    dense_engine.add_request("running", [1, 2, 3], _greedy(5, ignore_eos=True))
    dense_engine.step()
    for i, p in enumerate(prompts):  # prefilled in one step, next to the running request's decode
        dense_engine.add_request(f"together{i}", p, echo)
    outs = run_to_completion(dense_engine)
    for i, expected in enumerate(alone):
        got = outs[f"together{i}"][0].prompt_logprobs
        assert got[0] is None and len(got) == len(expected)
        for (lp, top), (lp_ref, top_ref) in zip(got[1:], expected[1:]):
            assert lp == pytest.approx(lp_ref, abs=1e-5) and list(top) == list(top_ref)


@pytest.mark.parametrize("length", [4, 256])  # 256: the whole context (max_model_len), as a scoring call may send
def test_max_tokens_zero_returns_only_prompt_logprobs(dense_engine, length):
    dense_engine.add_request("echo", [1, 2, 3, 4] * (length // 4), SamplingParams(max_tokens=0, logprobs=1,
                                                                                   prompt_logprobs=True))
    (out,) = run_to_completion(dense_engine)["echo"]
    assert out.finished and out.finish_reason == "length" and out.new_token_ids == []
    assert len(out.prompt_logprobs) == length


def test_prompt_logprobs_have_as_many_alternatives_as_logprobs_asks(dense_engine):
    """echo with logprobs=0 wants each prompt token's own logprob and no alternatives (None: a
    direct engine caller that asked for no logprobs at all)."""
    for k in (None, 0, 2):
        dense_engine.add_request(f"k{k}", [1, 2, 3, 4, 5],
                                 SamplingParams(max_tokens=0, logprobs=k, prompt_logprobs=True))
    outs = run_to_completion(dense_engine)
    for k in (None, 0, 2):
        (out,) = outs[f"k{k}"]
        assert [len(top) for _, top in out.prompt_logprobs[1:]] == [k or 0] * 4, k


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(dense_engine, seed):
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=seed, ignore_eos=True)
    dense_engine.add_request("s1", [7, 8, 9], params)
    alone = _tokens(run_to_completion(dense_engine)["s1"])
    dense_engine.add_request("noise", [1, 2], SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True))
    dense_engine.add_request("s2", [7, 8, 9], params)
    assert _tokens(run_to_completion(dense_engine)["s2"]) == alone
    # only the seed differs (the same top_p too), so the difference is the seed's
    dense_engine.add_request("other", [7, 8, 9], replace(params, seed=seed + 1))
    assert _tokens(run_to_completion(dense_engine)["other"]) != alone


@pytest.mark.parametrize("top_p", [1e-6, 1e-300])  # 1e-300: 0 in float32
def test_tiny_top_p_samples_the_most_likely_token_and_spares_the_batch(dense_engine, top_p):
    dense_engine.add_request("g", [7, 8, 9], _greedy(8, ignore_eos=True))
    greedy = _tokens(run_to_completion(dense_engine)["g"])
    dense_engine.add_request("p", [7, 8, 9], SamplingParams(max_tokens=8, temperature=1.5, top_p=top_p,
                                                            ignore_eos=True))
    dense_engine.add_request("n", [1, 2], SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True))
    outs = run_to_completion(dense_engine)
    assert _tokens(outs["p"]) == greedy and len(_tokens(outs["n"])) == 8


def test_tiny_temperatures_are_greedy_and_do_not_fail_the_batch(dense_engine):
    dense_engine.add_request("g", [7, 8, 9], _greedy(6, ignore_eos=True))
    greedy = _tokens(run_to_completion(dense_engine)["g"])
    for i, t in enumerate((1e-300, 5e-324, 1e-6)):
        dense_engine.add_request(f"t{i}", [7, 8, 9], SamplingParams(max_tokens=6, temperature=t, ignore_eos=True))
    dense_engine.add_request("hot", [7, 8, 9], SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True))
    outs = run_to_completion(dense_engine)
    assert [_tokens(outs[f"t{i}"]) for i in range(3)] == [greedy] * 3 and len(_tokens(outs["hot"])) == 6


def test_stop_strings_cut_the_text_before_them(dense_engine):
    tok = dense_engine.tokenizer
    dense_engine.add_request("free", [7, 8, 9], _greedy(16, ignore_eos=True))
    outs = run_to_completion(dense_engine)["free"]
    text = "".join(o.new_text for o in outs)
    # a random model can end inside a multi-byte character: those bytes are never emitted
    assert text == tok.decode(_tokens(outs), skip_special_tokens=True).rstrip("\ufffd")
    stop = text[5:8]  # whatever the model says, stop in the middle of it
    assert stop and stop in text
    dense_engine.add_request("cut", [7, 8, 9], _greedy(16, ignore_eos=True, stop=[stop]))
    outs = run_to_completion(dense_engine)["cut"]
    assert "".join(o.new_text for o in outs) == text[: text.find(stop)]
    assert outs[-1].finish_reason == "stop"


def test_abort_frees_the_slot(dense_engine):
    free = dense_engine.kv.num_free
    dense_engine.add_request("gone", [1, 2, 3], _greedy(50))
    dense_engine.step()
    assert dense_engine.kv.num_free == free - 1
    assert dense_engine.abort("gone") and not dense_engine.abort("gone")
    assert dense_engine.kv.num_free == free and not dense_engine.has_unfinished()


@pytest.mark.parametrize("prompt,params,message", [
    ([1] * 250, _greedy(10), "maximum context length is 256 tokens"),
    ([1] * 257, _greedy(0), r"you requested 257 tokens \(257 in the prompt, 0 for the completion\)"),
    ([1] * 262, SamplingParams(max_tokens=None, temperature=0), "your prompt has 262 tokens, which leaves none for the completion"),
    ([], _greedy(), "prompt is empty"),
    ([1, 10**6], _greedy(), "token id 1000000 is out of range"),
])
def test_requests_that_cannot_run_are_rejected(dense_engine, prompt, params, message):
    with pytest.raises(InvalidRequestError, match=message):
        dense_engine.add_request("bad", prompt, params)
    assert not dense_engine.has_unfinished()


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 0), ("max_tokens", -1), ("logprobs", 21),
                                         ("stop", [""]), ("temperature", float("nan")), ("top_p", float("nan"))])
def test_sampling_params_validate_their_ranges(field, value):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})


def test_kv_budget_bounds_the_running_sequences(dense_dir):
    loaded = load_model(dense_dir, device="cpu")
    per_seq = loaded.model_config.kv_bytes_per_token(loaded.dtype) * 64
    engine = LLMEngine(loaded, max_num_seqs=8, max_model_len=64, kv_cache_memory=4 * per_seq)
    assert engine.kv.num_slots == 3  # and the scratch slot: four in the budget
    assert engine.kv.k.nbytes + engine.kv.v.nbytes <= 4 * per_seq
    for i in range(5):
        engine.add_request(str(i), [1, 2, 3], _greedy(5))
    engine.step()
    assert engine.stats()["num_running"] == 3 and engine.stats()["num_waiting"] == 2
    assert len(run_to_completion(engine)) == 5
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        LLMEngine(loaded, max_model_len=64, kv_cache_memory=2 * per_seq - 1)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLMEngine(loaded, max_model_len=10**6)


def test_kernels_that_cannot_be_captured_are_named_for_the_graphs_decision(dense_dir, moe_dir):
    """On a GPU the engine decodes eagerly when a selected kernel synchronizes with the host
    (tests/engine/test_cuda_graphs.py runs it); which kernels do is decided from the selection."""
    assert uncapturable_kernels(load_model(dense_dir, device="cpu", linear_backend="emulation")) is None
    reason = uncapturable_kernels(load_model(moe_dir, device="cpu", moe_backend="emulation"))
    assert reason is not None and reason.startswith("EmulationMoEKernel (serving model.layers.")
    assert "synchronizes with the host and cannot be captured" in reason


def test_engine_limits_are_checked_at_their_bounds(dense_engine):
    loaded = dense_engine.loaded  # max_position_embeddings 512
    assert LLMEngine(loaded, max_num_seqs=1, max_model_len=None).max_model_len == 512
    assert LLMEngine(loaded, max_num_seqs=1, max_model_len=2).max_model_len == 2
    with pytest.raises(ValueError) as err:
        LLMEngine(loaded, max_model_len=1)
    assert str(err.value) == "--max-model-len 1 must be between 2 and the model's max_position_embeddings (512)"
    with pytest.raises(ValueError) as err:
        LLMEngine(loaded, max_model_len=513)
    assert str(err.value) == "--max-model-len 513 must be between 2 and the model's max_position_embeddings (512)"
    with pytest.raises(ValueError) as err:
        LLMEngine(loaded, max_num_seqs=0, max_model_len=64)
    assert str(err.value) == "--max-num-seqs must be at least 1, got 0"


@pytest.mark.parametrize("bad", [384, -1])  # the dense model's vocabulary is 0..383
def test_token_ids_just_outside_the_vocabulary_are_rejected_not_run(dense_engine, bad):
    with pytest.raises(InvalidRequestError) as err:
        dense_engine.add_request("bad", [5, bad], _greedy())
    assert str(err.value) == f"token id {bad} is out of range (vocabulary: 0..383)"
    # Had it been queued, its step would fail every request batched with it.
    dense_engine.add_request("edges", [0, 383], _greedy(2, ignore_eos=True))
    dense_engine.add_request("other", [1, 2], _greedy(2, ignore_eos=True))
    outs = run_to_completion(dense_engine)
    assert [len(_tokens(outs[r])) for r in ("edges", "other")] == [2, 2]


def test_a_duplicate_request_id_is_refused_and_the_first_request_runs_on(dense_engine):
    dense_engine.add_request("dup", [1, 2, 3], _greedy(4, ignore_eos=True))
    with pytest.raises(InvalidRequestError, match="request id 'dup' is already running"):
        dense_engine.add_request("dup", [4, 5], _greedy(2, ignore_eos=True))
    outs = run_to_completion(dense_engine)["dup"]
    assert len(_tokens(outs)) == 4 and outs[0].num_prompt_tokens == 3


def test_stop_strings_without_a_tokenizer_are_rejected(dense_engine, monkeypatch):
    monkeypatch.setattr(dense_engine, "tokenizer", None)
    with pytest.raises(InvalidRequestError) as err:
        dense_engine.add_request("s", [1, 2], _greedy(stop=["x"]))
    assert str(err.value) == "stop strings need a tokenizer, and this model folder has none"
    assert not dense_engine.has_unfinished()


def test_without_max_tokens_a_request_runs_to_the_end_of_the_context(dense_engine):
    dense_engine.add_request("rest", [1] * 250, SamplingParams(max_tokens=None, temperature=0, ignore_eos=True))
    outs = run_to_completion(dense_engine)["rest"]
    assert len(_tokens(outs)) == 6 and outs[-1].finish_reason == "length"  # 250 + 6 = max_model_len 256
    with pytest.raises(InvalidRequestError) as err:
        dense_engine.add_request("full", [1] * 256, SamplingParams(max_tokens=None, temperature=0))
    assert str(err.value) == ("This model's maximum context length is 256 tokens. However, your prompt has 256 "
                              "tokens, which leaves none for the completion. Reduce the length of the prompt.")
    with pytest.raises(InvalidRequestError) as err:
        dense_engine.add_request("over", [1] * 250, _greedy(7))
    assert str(err.value) == ("This model's maximum context length is 256 tokens. However, you requested 257 tokens "
                              "(250 in the prompt, 7 for the completion). Reduce the length of the prompt or max_tokens.")


def test_a_stop_token_that_is_also_the_last_allowed_token_finishes_with_stop(dense_engine):
    dense_engine.add_request("probe", [3, 4, 5], _greedy(1, ignore_eos=True))
    (first,) = _tokens(run_to_completion(dense_engine)["probe"])
    dense_engine.add_request("both", [3, 4, 5], _greedy(1, stop_token_ids=[first]))
    outs = run_to_completion(dense_engine)["both"]
    assert _tokens(outs) == [first] and outs[-1].finish_reason == "stop"


def test_the_text_of_a_stop_token_is_not_returned(dense_engine):
    dense_engine.add_request("free", [7, 8, 9], _greedy(16, ignore_eos=True))
    outs = run_to_completion(dense_engine)["free"]
    tokens = _tokens(outs)
    # the first token with text of its own that the model had not said before
    j = next(j for j, o in enumerate(outs) if o.new_text and tokens[j] not in tokens[:j])
    dense_engine.add_request("cut", [7, 8, 9], _greedy(16, ignore_eos=True, stop_token_ids=[tokens[j]]))
    cut = run_to_completion(dense_engine)["cut"]
    assert _tokens(cut) == tokens[: j + 1] and cut[-1].finish_reason == "stop"
    assert "".join(o.new_text for o in cut) == "".join(o.new_text for o in outs[:j])


def test_the_prefill_token_budget_splits_prompts_over_steps(dense_engine):
    engine = LLMEngine(dense_engine.loaded, max_num_seqs=4, max_model_len=64, max_prefill_tokens=8)
    for name in ("a", "b"):
        engine.add_request(name, [1, 2, 3, 4, 5], _greedy(3, ignore_eos=True))
    assert [o.request_id for o in engine.step()] == ["a"]  # 5 + 5 > 8: b is prefilled next step
    assert sorted(o.request_id for o in engine.step()) == ["a", "b"]
    run_to_completion(engine)


def test_stats_count_each_prompt_once_and_only_generated_tokens(dense_engine):
    before = dense_engine.stats()
    dense_engine.add_request("gen", [1, 2, 3, 4], _greedy(3, ignore_eos=True))
    dense_engine.add_request("score", [5, 6, 7, 8, 9], SamplingParams(max_tokens=0, prompt_logprobs=True))
    run_to_completion(dense_engine)
    after = dense_engine.stats()
    assert after["num_prompt_tokens"] - before["num_prompt_tokens"] == 9
    assert after["num_generated_tokens"] - before["num_generated_tokens"] == 3
    assert after["kv_slots_used"] == 0 and after["num_running"] == after["num_waiting"] == 0


def test_eos_stops_a_request_unless_it_ignores_eos(dense_engine, monkeypatch):
    dense_engine.add_request("probe", [3, 4, 5], _greedy(5, ignore_eos=True))
    first = _tokens(run_to_completion(dense_engine)["probe"])[0]
    # The random model rarely says its real EOS: make the token it says first the EOS.
    monkeypatch.setattr(dense_engine, "eos_token_ids", frozenset({first}))
    dense_engine.add_request("eos", [3, 4, 5], _greedy(5))
    dense_engine.add_request("ignore", [3, 4, 5], _greedy(5, ignore_eos=True))
    outs = run_to_completion(dense_engine)
    assert _tokens(outs["eos"]) == [first] and outs["eos"][-1].finish_reason == "stop"
    assert len(_tokens(outs["ignore"])) == 5 and outs["ignore"][-1].finish_reason == "length"


def test_text_held_back_for_a_stop_string_is_returned_when_the_request_ends_by_length(dense_engine):
    dense_engine.add_request("free", [7, 8, 9], _greedy(16, ignore_eos=True))
    text = "".join(o.new_text for o in run_to_completion(dense_engine)["free"])
    # a three-character stop string the model never says: its last two characters are held back
    # while it runs, in case they start the stop string
    dense_engine.add_request("held", [7, 8, 9], _greedy(16, ignore_eos=True, stop=["\x00\x01\x02"]))
    outs = run_to_completion(dense_engine)["held"]
    assert "".join(o.new_text for o in outs) == text and outs[-1].finish_reason == "length"
