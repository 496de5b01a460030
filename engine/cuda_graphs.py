"""Decode steps replayed from CUDA graphs, one per (batch size, context length) bucket.

The context bucket bounds how many cache positions attention reads, so a step costs what
its longest sequence needs, not `max_model_len`. A graph reads fixed addresses: the static
input buffers below, the KV cache, and every weight buffer of the model. Weight reloads
therefore copy into the same storage (see `layers.KernelLayer`), so a graph captured before
a reload computes with the new weights. A bucket's padding rows repeat the batch's first row
(its token, position and cache slot) and are dropped: they compute exactly that row's values, so
what a kernel computes over the whole batch (a dynamic per-tensor activation scale) is what an
eager step over the real rows computes, and their cache writes store what the first row stores.
(Padding that decoded another token changed such a scale, and the greedy tokens with it.)

Inside the graphs, the project's Triton kernels are launched with programmatic dependent launch
where the GPU has it (kernels/triton/pdl.py): each kernel is scheduled while the one before
finishes, and a GEMV streams its first weights before its input is ready.

Every graph is captured when the engine starts (`num_captures` counts them; it never grows
while serving), and each also computes the greedy tokens, so a greedy step reads back one
int64 per sequence rather than running argmax and indexing eagerly. A step's input tokens may
be a device tensor (the greedy tokens of the step before, not yet read on the host): the engine
launches the next step before it has read this one (`LLMEngine`, overlapped decode).
"""

from __future__ import annotations

import bisect
import logging

import torch

from .kv_cache import KVCache
from .model import ForwardBatch, Qwen3ForCausalLM

logger = logging.getLogger("quantgate.engine")


MIN_CONTEXT_BUCKET = 256


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


def context_buckets(max_len: int) -> list[int]:
    """Powers of two from MIN_CONTEXT_BUCKET, and max_len itself."""
    buckets, n = [], MIN_CONTEXT_BUCKET
    while n < max_len:
        buckets.append(n)
        n *= 2
    return buckets + [max_len]


class DecodeGraphs:
    def __init__(self, model: Qwen3ForCausalLM, kv: KVCache, max_batch: int) -> None:
        self.model, self.kv = model, kv
        self.sizes = bucket_sizes(max_batch)
        self.contexts = context_buckets(kv.max_len)
        n = self.sizes[-1]
        # Rows: token ids, positions, slots, context lengths. One host-to-device copy per step
        # fills all four, written through a numpy view of pinned memory (no tensor built per step).
        # Two host buffers, used in turn: with overlapped decode one step's copy may still be
        # queued while the host fills the next; the step before that has been read, so its is done.
        self.static = torch.zeros(4, n, dtype=torch.int64, device=kv.k.device)
        self.host = torch.zeros(2, 4, n, dtype=torch.int64).pin_memory()
        self._host_rows = self.host.numpy()
        self._turn = 0
        self.rows = torch.arange(n, device=kv.k.device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.num_captures = 0
        self._host_rows[:] = [[0], [0], [kv.scratch_slot], [1]]  # captured on rows that only touch the scratch slot
        self.static.copy_(self.host[0])
        self._capture()

    def batch(self, size: int, context: int) -> ForwardBatch:
        """The static decode batch the graph of these buckets reads (also usable for an eager run)."""
        ids, positions, slots, lens = self.static[:, :size]
        return ForwardBatch(
            input_ids=ids, positions=positions, slots=slots, prefill_segments=[], num_prefill_tokens=0,
            decode_slots=slots, decode_lens=lens, decode_kv_len=context, decode_slot_range=None,
            logits_indices=self.rows[:size],
        )

    @torch.inference_mode()
    def _capture(self) -> None:
        from quantgate.kernels.triton import pdl  # Triton: imported where CUDA is, not with the engine

        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        # The warm-up compiles the kernels' PDL variants outside the capture (kernels/triton/pdl.py).
        with torch.cuda.stream(stream), pdl.for_graph_capture():
            for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory
                for context in reversed(self.contexts):
                    batch = self.batch(size, context)
                    self.model(batch, self.kv)  # warm-up: lazy library initialisation must not be captured
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        logits = self.model(batch, self.kv)
                        greedy = logits.argmax(dim=-1)
                    self.graphs[size, context] = (graph, logits, greedy)
                    self.num_captures += 1
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        logger.info("Captured %d CUDA graphs: decode batch sizes %s x context lengths %s", len(self.graphs),
                    self.sizes, self.contexts)

    def can_run(self, batch_size: int) -> bool:
        return 0 < batch_size <= self.sizes[-1]

    def buckets(self, batch_size: int, context: int) -> tuple[int, int]:
        """The smallest captured (batch size, context length) that holds this decode batch."""
        return (self.sizes[bisect.bisect_left(self.sizes, batch_size)],
                self.contexts[bisect.bisect_left(self.contexts, context)])

    def run(self, token_ids: list[int] | torch.Tensor, positions: list[int],
            slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph for this decode batch -> (logits [b, vocab], greedy tokens [b]), b = len(positions).
        `token_ids` may be on the device (copied there in stream order, never read on the host)."""
        b = len(positions)
        size, context = self.buckets(b, max(positions) + 1)
        self._turn ^= 1
        rows, host = self._host_rows[self._turn], self.host[self._turn]
        if not isinstance(token_ids, torch.Tensor):
            rows[0, :b] = token_ids
        rows[1, :b], rows[2, :b] = positions, slots
        rows[3, :b] = rows[1, :b] + 1
        rows[:, b:size] = rows[:, :1]
        self.static[:, :size].copy_(host[:, :size], non_blocking=True)
        if isinstance(token_ids, torch.Tensor):
            self.static[0, :b].copy_(token_ids)
            if size > b:
                self.static[0, b:size].copy_(token_ids[:1].expand(size - b))
        graph, logits, greedy = self.graphs[size, context]
        graph.replay()
        return logits[:b], greedy[:b]
