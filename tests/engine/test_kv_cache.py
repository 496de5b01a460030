"""KV cache planning (slots that fit a memory budget) and the slot allocator."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from quantgate.engine.kv_cache import KVCache, KVCacheBudgetError, plan_num_slots

MiB = 2**20
# 1 KiB per token: a slot of 1024 tokens is 1 MiB.
KIB_PER_TOKEN = SimpleNamespace(kv_bytes_per_token=lambda dtype: 1024)
TINY = SimpleNamespace(num_layers=2, num_kv_heads=1, head_dim=4)


def test_a_budget_of_two_slots_runs_one_sequence_next_to_the_scratch_slot():
    assert plan_num_slots(KIB_PER_TOKEN, torch.float32, 1024, 8, 2 * MiB) == 1
    assert plan_num_slots(KIB_PER_TOKEN, torch.float32, 1024, 8, 9 * MiB) == 8


def test_a_budget_too_small_for_one_sequence_names_the_sizes_and_the_fix():
    with pytest.raises(KVCacheBudgetError) as err:
        plan_num_slots(KIB_PER_TOKEN, torch.float32, 1024, 8, 2 * MiB - 1)
    assert str(err.value) == (
        "the KV cache budget of 2 MiB cannot hold one sequence of --max-model-len 1024 and the cache's "
        "scratch slot (2 x 1.0 MiB); lower --max-model-len or raise the budget")


def test_a_budget_that_caps_the_sequences_below_max_num_seqs_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="quantgate.engine"):
        assert plan_num_slots(KIB_PER_TOKEN, torch.float32, 1024, 8, 9 * MiB) == 8
        assert caplog.messages == []  # the budget holds all 8: nothing to say
        assert plan_num_slots(KIB_PER_TOKEN, torch.float32, 1024, 8, 4 * MiB) == 3
    assert caplog.messages == [
        "KV cache budget 4 MiB holds 3 sequences of 1024 tokens: at most 3 run at once (--max-num-seqs 8)"]


def test_the_scratch_slot_is_allocated_past_every_sequence_slot_and_never_handed_out():
    kv = KVCache(TINY, 3, 16, torch.float32, torch.device("cpu"))
    assert kv.k.shape == kv.v.shape == (2, 4, 1, 16, 4) and kv.scratch_slot == 3
    assert sorted(kv.allocate() for _ in range(3)) == [0, 1, 2] and kv.num_free == 0
    # Idle slots inside a decode range are read: they must hold numbers, not leftover memory.
    assert not kv.k.any() and not kv.v.any()


def test_the_lowest_free_slot_is_handed_out_first():
    # Running sequences then sit in a compact range, which decode reads as one view.
    kv = KVCache(TINY, 4, 16, torch.float32, torch.device("cpu"))
    slots = [kv.allocate() for _ in range(4)]
    assert slots == [0, 1, 2, 3]
    kv.release(2)
    kv.release(0)
    assert [kv.allocate(), kv.allocate()] == [0, 2] and kv.num_free == 0
