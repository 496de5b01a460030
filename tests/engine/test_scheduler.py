"""Scheduler: FIFO admission bounded by free KV slots, max_num_seqs and the prefill token budget;
finishing frees the slot."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from quantgate.engine.kv_cache import KVCache
from quantgate.engine.sampling_params import SamplingParams
from quantgate.engine.scheduler import Scheduler
from quantgate.engine.sequence import Sequence

# The scheduler only counts slots: a cache of one layer, one head, one position is enough.
TINY = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=1)


def _scheduler(slots: int, max_num_seqs: int | None = None, budget: int = 100) -> Scheduler:
    kv = KVCache(TINY, slots, 1, torch.float32, torch.device("cpu"))
    return Scheduler(kv, slots if max_num_seqs is None else max_num_seqs, budget)


def _seq(name: str, prompt_len: int) -> Sequence:
    return Sequence(name, [1] * prompt_len, SamplingParams(), 1, frozenset(), None, None)


def _admitted(scheduler: Scheduler) -> list[str]:
    return [s.request_id for s in scheduler.schedule().prefills]


def test_admission_stops_at_max_num_seqs_and_at_the_free_slots():
    capped = _scheduler(slots=4, max_num_seqs=2)
    for i in range(4):
        capped.add(_seq(f"r{i}", 1))
    assert _admitted(capped) == ["r0", "r1"] and _admitted(capped) == []
    short_of_slots = _scheduler(slots=2, max_num_seqs=4)
    for i in range(4):
        short_of_slots.add(_seq(f"r{i}", 1))
    assert _admitted(short_of_slots) == ["r0", "r1"] and _admitted(short_of_slots) == []
    assert [s.request_id for s in short_of_slots.waiting] == ["r2", "r3"]


def test_prompts_are_admitted_up_to_exactly_the_prefill_budget():
    scheduler = _scheduler(slots=8, budget=10)
    for name, length in [("a", 4), ("b", 6), ("c", 1)]:
        scheduler.add(_seq(name, length))
    assert _admitted(scheduler) == ["a", "b"]  # 4 + 6 fills the budget; c's one token waits
    assert _admitted(scheduler) == ["c"]


def test_a_prompt_longer_than_the_prefill_budget_runs_alone_rather_than_never():
    scheduler = _scheduler(slots=8, budget=10)
    scheduler.add(_seq("long", 25))
    scheduler.add(_seq("short", 2))
    assert _admitted(scheduler) == ["long"]
    assert _admitted(scheduler) == ["short"]


def test_admission_is_first_come_first_served_even_when_a_later_prompt_would_fit():
    scheduler = _scheduler(slots=8, budget=10)
    for name, length in [("small", 3), ("big", 9), ("tiny", 1)]:
        scheduler.add(_seq(name, length))
    # big does not fit next to small: it runs next step, and tiny does not overtake it
    assert _admitted(scheduler) == ["small"]
    assert _admitted(scheduler) == ["big", "tiny"]


def test_a_freed_slot_goes_to_the_request_that_waited_longest():
    scheduler = _scheduler(slots=1)
    seqs = [_seq(f"r{i}", 1 + i % 2) for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    order = []
    while scheduler.has_unfinished():
        step = scheduler.schedule()
        order += [s.request_id for s in step.prefills]
        for seq in step.decodes:
            scheduler.finish(seq)
    assert order == ["r0", "r1", "r2", "r3"]


def test_finishing_frees_the_slot_once_and_a_waiting_request_leaves_the_queue():
    scheduler = _scheduler(slots=2)
    running, queued = _seq("running", 1), _seq("queued", 1)
    scheduler.add(running)
    assert _admitted(scheduler) == ["running"] and running.slot == 0
    scheduler.add(queued)
    scheduler.finish(queued)  # aborted before it got a slot
    scheduler.finish(running)
    scheduler.finish(running)  # a second finish (e.g. an abort racing the last step) frees nothing more
    assert running.slot is None and scheduler.kv.num_free == 2
    assert not scheduler.has_unfinished() and scheduler.schedule().empty


def test_decodes_come_in_increasing_slot_order_and_a_prefill_is_not_also_decoded():
    """Decode attention relies on the slot order; a slot freed early goes to the next request,
    which then decodes first although it came last. A request prefilled this step decodes from
    the next one."""
    scheduler = _scheduler(slots=3)
    seqs = {name: _seq(name, 1) for name in "abcd"}
    for name in "abc":
        scheduler.add(seqs[name])
    assert _admitted(scheduler) == ["a", "b", "c"]
    scheduler.finish(seqs["a"])
    scheduler.add(seqs["d"])
    step = scheduler.schedule()
    assert [s.request_id for s in step.prefills] == ["d"] and [s.request_id for s in step.decodes] == ["b", "c"]
    assert seqs["d"].slot == 0
    decode_only = scheduler.schedule()
    assert [s.request_id for s in decode_only.decodes] == ["d", "b", "c"] and not decode_only.empty
