"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A graph reads fixed addresses: the static input buffers below, the KV cache, and every
weight buffer of the model. Weight reloads therefore copy into the same storage (see
`layers.KernelLayer`), so a graph captured before a reload computes with the new weights.
Padding rows of a bucket write to the cache's scratch slot and are dropped.
"""

from __future__ import annotations

import bisect
import logging

import torch

from .kv_cache import KVCache
from .model import ForwardBatch, Qwen3ForCausalLM

logger = logging.getLogger("quantgate.engine")


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphs:
    def __init__(self, model: Qwen3ForCausalLM, kv: KVCache, max_batch: int) -> None:
        self.model, self.kv = model, kv
        self.sizes = bucket_sizes(max_batch)
        device = kv.k.device
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slots = torch.full((n,), kv.scratch_slot, dtype=torch.int64, device=device)
        self.lens = torch.ones(n, dtype=torch.int64, device=device)
        self.rows = torch.arange(n, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture()

    def _batch(self, size: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:size], positions=self.positions[:size], slots=self.slots[:size],
            prefill_segments=[], num_prefill_tokens=0, decode_slots=self.slots[:size], decode_lens=self.lens[:size],
            decode_kv_len=self.kv.max_len, decode_slot_range=None, logits_indices=self.rows[:size],
        )

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory
                batch = self._batch(size)
                self.model(batch, self.kv)  # warm-up: lazy library initialisation must not be captured
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits = self.model(batch, self.kv)
                self.graphs[size] = (graph, logits)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        logger.info("Captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, batch_size: int) -> bool:
        return 0 < batch_size <= self.sizes[-1]

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Replay the smallest bucket that holds this decode-only batch -> logits [B, vocab]."""
        b = batch.num_decode
        size = self.sizes[bisect.bisect_left(self.sizes, b)]
        self.input_ids[:b].copy_(batch.input_ids)
        self.positions[:b].copy_(batch.positions)
        self.slots[:b].copy_(batch.decode_slots)
        self.lens[:b].copy_(batch.decode_lens)
        self.input_ids[b:size].zero_()
        self.positions[b:size].zero_()
        self.slots[b:size].fill_(self.kv.scratch_slot)
        self.lens[b:size].fill_(1)
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:b]
