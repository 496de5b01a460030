"""Continuous batching: which sequences run in the next step.

Every step decodes one token for each running sequence and admits waiting requests (FIFO)
while a KV slot is free, `max_num_seqs` allows, and their prompts fit the step's prefill
token budget (the first waiting prompt is always admitted, so a long prompt cannot starve).
New requests therefore join the running ones at the next step, and their prefills are
batched together with the decodes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .kv_cache import KVCache
from .sequence import Sequence


@dataclass
class ScheduledStep:
    prefills: list[Sequence]
    decodes: list[Sequence]  # in increasing slot order (decode attention relies on it)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, kv: KVCache, max_num_seqs: int, max_prefill_tokens: int) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        decodes = sorted(self.running, key=lambda s: s.slot)
        prefills: list[Sequence] = []
        budget = self.max_prefill_tokens
        while self.waiting and self.kv.num_free and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if prefills and len(seq.prompt_ids) > budget:
                break
            self.waiting.popleft()
            seq.slot = self.kv.allocate()
            budget -= len(seq.prompt_ids)
            prefills.append(seq)
            self.running.append(seq)
        return ScheduledStep(prefills, decodes)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its slot."""
        if seq.slot is not None:
            self.running.remove(seq)
            self.kv.release(seq.slot)
            seq.slot = None
        elif seq in self.waiting:
            self.waiting.remove(seq)
