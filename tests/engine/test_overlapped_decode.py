"""Overlapped decode (LLMEngine): launching a greedy step before the host has read the one in
front changes no output, whatever arrives, stops or is aborted in between.

On CPU the graphs are stood in for by `EagerDecodeGraphs` (DecodeGraphs' `run` contract,
computed eagerly), so the engine's own scheduling of launches and reads is what is tested here;
tests/engine/test_cuda_graphs.py checks real graphs on a GPU.
"""

from __future__ import annotations

import torch

from quantgate.engine import LLMEngine, SamplingParams, load_model
from quantgate.engine.model import ForwardBatch

from .conftest import random_prompts, run_to_completion


class EagerDecodeGraphs:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.fed_on_device = 0  # runs whose input tokens were a tensor (the previous step's, unread)

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= 8

    def run(self, token_ids, positions: list[int], slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        if isinstance(token_ids, torch.Tensor):
            self.fed_on_device += 1
            ids = token_ids.clone()
        else:
            ids = ints(token_ids)
        lens = ints(positions) + 1
        batch = ForwardBatch(
            input_ids=ids, positions=ints(positions), slots=ints(slots), prefill_segments=[], num_prefill_tokens=0,
            decode_slots=ints(slots), decode_lens=lens, decode_kv_len=int(lens.max()), decode_slot_range=None,
            logits_indices=torch.arange(len(positions)),
        )
        logits = self.engine.model(batch, self.engine.kv)
        return logits, logits.argmax(dim=-1)


def _engine(path, overlap: bool) -> LLMEngine:
    engine = LLMEngine(load_model(path, device="cpu"), max_num_seqs=6, max_model_len=128, overlap_decode=overlap)
    engine.graphs = EagerDecodeGraphs(engine)
    return engine


def serve_mixed_workload(engine: LLMEngine, prompts: list[list[int]], first_token: dict[int, int],
                         abort_at: int | None = 7) -> dict[str, list[int]]:
    """A workload that touches every reason to stop overlapping: requests joining mid-flight
    (more than the slots), stop tokens (request i % 3 == 0 stops on first_token[i]), short
    max_tokens, an abort at step `abort_at`, a sampled request."""
    def params(i: int) -> SamplingParams:
        if i == 5:
            return SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
        stop = [first_token[i]] if i % 3 == 0 and i in first_token else []
        return SamplingParams(max_tokens=4 + 3 * (i % 5), temperature=0, ignore_eos=True, stop_token_ids=stop)

    outputs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    steps = 0
    while pending or engine.has_unfinished():
        if pending and steps % 3 == 0:
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, params(i))
        if steps == abort_at:
            assert engine.abort("1")
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        steps += 1
    return outputs


def test_overlapped_decode_gives_the_outputs_of_one_step_at_a_time(dense_dir, seed):
    plain = _engine(dense_dir, overlap=False)
    prompts = random_prompts(12, plain.vocab_size, torch.Generator().manual_seed(seed), high=30)
    first = {int(k): v[0] for k, v in serve_mixed_workload(plain, prompts, {}).items() if v}
    plain = _engine(dense_dir, overlap=False)
    expected = serve_mixed_workload(plain, prompts, first)
    overlapped = _engine(dense_dir, overlap=True)
    assert serve_mixed_workload(overlapped, prompts, first) == expected
    assert plain.num_overlapped_steps == 0 and plain.graphs.fed_on_device == 0
    assert overlapped.num_overlapped_steps == overlapped.graphs.fed_on_device > 10
    assert overlapped.stats()["num_generated_tokens"] == sum(map(len, expected.values()))
    assert overlapped.kv.num_free == overlapped.kv.num_slots


def test_a_step_launched_for_a_sequence_that_stopped_is_dropped(dense_dir):
    engine = _engine(dense_dir, overlap=True)
    engine.add_request("probe", [3, 4, 5], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    tokens = [t for out in run_to_completion(engine)["probe"] for t in out.new_token_ids]
    # Stops on its third token: the fourth step was already launched when the third was read.
    engine.add_request("stop", [3, 4, 5], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[tokens[2]],
                                                         ignore_eos=True))
    launches = engine.graphs.fed_on_device
    outs = run_to_completion(engine)["stop"]
    assert [t for o in outs for t in o.new_token_ids] == tokens[: tokens.index(tokens[2]) + 1]
    assert outs[-1].finish_reason == "stop"
    assert engine.graphs.fed_on_device > launches
    # The next request first drains the dropped step, then runs as if it had never been.
    engine.add_request("again", [3, 4, 5], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    outs = run_to_completion(engine)
    assert list(outs) == ["again"] and [t for o in outs["again"] for t in o.new_token_ids] == tokens
    assert engine.step() == [] and not engine.has_unfinished()


def test_a_request_arriving_while_steps_overlap_joins_at_once(dense_dir):
    engine = _engine(dense_dir, overlap=True)
    engine.add_request("first", [3, 4, 5], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    for _ in range(4):
        engine.step()
    assert engine.num_overlapped_steps > 0
    engine.add_request("late", [6, 7], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    # The step in flight is read first; the next one prefills the newcomer instead of making it
    # wait for "first" to finish.
    joined = [[o.request_id for o in engine.step()] for _ in range(2)]
    assert "late" in joined[1] and engine.stats()["num_running"] == 2
    run_to_completion(engine)


def test_greedy_requests_that_want_logprobs_get_them_for_every_token(dense_dir):
    engine = _engine(dense_dir, overlap=True)
    engine.add_request("lp", [3, 4, 5], SamplingParams(max_tokens=6, temperature=0, logprobs=1, ignore_eos=True))
    outs = run_to_completion(engine)["lp"]
    assert [len(o.token_logprobs) for o in outs] == [1] * 6
    assert engine.num_overlapped_steps == 0  # logprobs are read on the host at every step


def test_no_step_is_launched_past_a_sequence_that_ends_by_length(dense_dir):
    engine = _engine(dense_dir, overlap=True)
    engine.add_request("six", [3, 4, 5], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    outs = run_to_completion(engine)["six"]
    assert sum(len(o.new_token_ids) for o in outs) == 6 and outs[-1].finish_reason == "length"
    # token 1 from the prefill, token 2 from a decode fed by the host, tokens 3-6 fed on the device
    assert engine.graphs.fed_on_device == engine.num_overlapped_steps == 4
