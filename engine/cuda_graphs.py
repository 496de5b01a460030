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
        n = self.sizes[-1]
        # Rows: token ids, positions, slots, context lengths. One host-to-device copy per step
        # fills all four (per-step host overhead is a large part of a small model's decode step).
        self.static = torch.zeros(4, n, dtype=torch.int64, device=kv.k.device)
        self.host = torch.zeros(4, n, dtype=torch.int64).pin_memory()
        self.rows = torch.arange(n, device=kv.k.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._fill_padding(0, n)
        self.static.copy_(self.host)
        self._capture()

    def batch(self, size: int) -> ForwardBatch:
        """The static decode batch a graph of this size reads (also usable for an eager run)."""
        ids, positions, slots, lens = self.static[:, :size]
        return ForwardBatch(
            input_ids=ids, positions=positions, slots=slots, prefill_segments=[], num_prefill_tokens=0,
            decode_slots=slots, decode_lens=lens, decode_kv_len=self.kv.max_len, decode_slot_range=None,
            logits_indices=self.rows[:size],
        )

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory
                batch = self.batch(size)
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

    def _fill_padding(self, start: int, end: int) -> None:
        self.host[:, start:end] = torch.tensor([0, 0, self.kv.scratch_slot, 1])[:, None]

    def run(self, token_ids: list[int], positions: list[int], slots: list[int]) -> torch.Tensor:
        """Replay the smallest bucket that holds this decode batch -> logits [len(token_ids), vocab]."""
        b = len(token_ids)
        size = self.sizes[bisect.bisect_left(self.sizes, b)]
        # The previous step's copy has finished: its logits were read on the host since.
        self.host[:3, :b] = torch.tensor([token_ids, positions, slots])
        self.host[3, :b] = self.host[1, :b] + 1
        self._fill_padding(b, size)
        self.static[:, :size].copy_(self.host[:, :size], non_blocking=True)
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:b]
