"""The KV cache: one preallocated slot of `max_model_len` positions per running sequence.

A slot per sequence (rather than paged blocks) lets decode attention read a range of slots
as a plain view: on CPU that is several times faster than gathering blocks, and on CUDA the
gather over fixed slots is shape-static, which CUDA graphs need. Admission never has to
preempt: a sequence that got a slot can always run to `max_model_len`. The memory budget
therefore bounds the number of slots, i.e. the number of sequences that run at once.

Layout per layer: [slots + 1, kv_heads, max_len, head_dim]; the last slot is scratch, written
by the padding rows of a CUDA-graph batch.
"""

from __future__ import annotations

import heapq
import logging

import torch

from .config import ModelConfig

logger = logging.getLogger("quantgate.engine")


class KVCacheBudgetError(ValueError):
    """The memory budget cannot hold even one sequence of max_model_len tokens."""


def plan_num_slots(cfg: ModelConfig, dtype: torch.dtype, max_model_len: int, max_num_seqs: int,
                   budget_bytes: int) -> int:
    per_slot = cfg.kv_bytes_per_token(dtype) * max_model_len
    slots = min(max_num_seqs, budget_bytes // per_slot - 1)  # KVCache allocates a scratch slot too
    if slots < 1:
        raise KVCacheBudgetError(
            f"the KV cache budget of {budget_bytes / 2**20:.0f} MiB cannot hold one sequence of "
            f"--max-model-len {max_model_len} and the cache's scratch slot (2 x {per_slot / 2**20:.1f} MiB); lower "
            "--max-model-len or raise the budget"
        )
    if slots < max_num_seqs:
        logger.warning(
            "KV cache budget %.0f MiB holds %d sequences of %d tokens: at most %d run at once (--max-num-seqs %d)",
            budget_bytes / 2**20, slots, max_model_len, slots, max_num_seqs,
        )
    return slots


class KVCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (cfg.num_layers, num_slots + 1, cfg.num_kv_heads, max_len, cfg.head_dim)
        # Zeros, not empty: idle slots inside a decode range are read (and their output dropped).
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_len = max_len
        self._free = list(range(num_slots))  # a heap: the lowest slot first keeps running slots compact

    @property
    def scratch_slot(self) -> int:
        return self.num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        return heapq.heappop(self._free)

    def release(self, slot: int) -> None:
        heapq.heappush(self._free, slot)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
