"""`LLMEngine`: requests in, incremental outputs out, one `step()` at a time.

Each step runs one forward over a mixed batch (new prompts packed, one token per running
sequence), samples, detokenizes and checks stop conditions. Decode-only steps on CUDA replay
a captured graph for the batch-size bucket (`cuda_graphs.py`) unless `enforce_eager`.

Overlapped decode: when every running sequence is greedy (no logprobs) and no waiting request
can join, a graph step's tokens stay on the device and feed the next step, which is launched
before the host reads them. The host's share of a step (reading tokens, detokenizing, stop
checks, scheduling, the next launch) then runs while the GPU computes, instead of between
steps. A sequence that stops on the token just read (a stop token or string) had one more step
launched for it; that token is dropped, and its KV rows are rewritten by whoever gets the slot
next, after it in stream order.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import torch

from .cuda_graphs import DecodeGraphs
from .detokenizer import IncrementalDetokenizer
from .kv_cache import KVCache, plan_num_slots
from .loader import LoadedModel
from .model import ForwardBatch
from .sampler import prompt_logprobs, request_generator, sample
from .sampling_params import InvalidRequestError, RequestOutput, SamplingParams
from .scheduler import Scheduler, ScheduledStep
from .sequence import Sequence

logger = logging.getLogger("quantgate.engine")

CPU_KV_BUDGET_FRACTION = 0.25  # of physical memory
CUDA_KV_BUDGET_FRACTION = 0.8  # of the memory free after loading the model
# Prompt tokens per step: on CPU, activations of ~4k tokens stay cache-friendly (a step of 22k
# tokens ran 2x slower per token); a prompt longer than the budget still runs, alone.
PREFILL_TOKENS = {"cpu": 4096, "cuda": 16384}


@dataclass
class LaunchedDecode:
    """A greedy graph decode step queued on the GPU whose tokens the host has not read yet."""

    seqs: list[Sequence]
    greedy: torch.Tensor  # [b] on the device: valid until the next graph replay
    tokens: torch.Tensor  # [b] host copy of `greedy`, valid once `done` has completed
    done: torch.cuda.Event | None


def default_kv_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_KV_BUDGET_FRACTION)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * CPU_KV_BUDGET_FRACTION)


def uncapturable_kernels(loaded: LoadedModel) -> str | None:
    """Why decode cannot run in CUDA graphs with the kernels `loaded` selected, or None."""
    blocking: dict[str, list[str]] = {}
    for name, layer in loaded.kernel_layers().items():
        kernel = layer.selection.kernel
        if not kernel.cuda_graphs:
            blocking.setdefault(kernel.kernel_name(), []).append(name)
    if not blocking:
        return None
    return "; ".join(f"{kernel} (serving {modules[0]}{f' and {len(modules) - 1} more' if len(modules) > 1 else ''}) "
                     "synchronizes with the host and cannot be captured" for kernel, modules in blocking.items())


class LLMEngine:
    def __init__(
        self,
        loaded: LoadedModel,
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        kv_cache_memory: int | None = None,
        max_prefill_tokens: int | None = None,
        overlap_decode: bool = True,
    ) -> None:
        cfg = loaded.model_config
        limit = cfg.max_position_embeddings
        max_model_len = limit if max_model_len is None else max_model_len
        if not 2 <= max_model_len <= limit:
            raise ValueError(
                f"--max-model-len {max_model_len} must be between 2 and the model's max_position_embeddings ({limit})"
            )
        if max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be at least 1, got {max_num_seqs}")
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.max_model_len = max_model_len
        budget = default_kv_budget(self.device) if kv_cache_memory is None else kv_cache_memory
        slots = plan_num_slots(cfg, loaded.dtype, max_model_len, max_num_seqs, budget)
        self.kv = KVCache(cfg, slots, max_model_len, loaded.dtype, self.device)
        self.scheduler = Scheduler(self.kv, slots, max_prefill_tokens or PREFILL_TOKENS[self.device.type])
        self.eos_token_ids = frozenset(cfg.eos_token_ids)
        self.vocab_size = cfg.vocab_size
        self._requests: dict[str, Sequence] = {}
        self._seeds = random.Random(seed)
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.graphs: DecodeGraphs | None = None
        self.graphs_off_reason = "--enforce-eager" if enforce_eager else None
        if self.device.type == "cuda" and not enforce_eager:
            self.graphs_off_reason = uncapturable_kernels(loaded)
            if self.graphs_off_reason is None:
                self.graphs = DecodeGraphs(self.model, self.kv, slots)
            else:
                logger.warning("CUDA graphs off, decode runs eagerly: %s", self.graphs_off_reason)
        self.overlap_decode = overlap_decode
        self.num_overlapped_steps = 0  # graph steps launched before the host had read the step in front
        self._launched: LaunchedDecode | None = None
        # Two readback buffers and events used in turn: a step's buffer was last used by the step
        # two back, which has been read.
        cuda = self.device.type == "cuda"
        self._readback = torch.zeros(2, slots, dtype=torch.int64, pin_memory=cuda)
        self._readback_done = [torch.cuda.Event(), torch.cuda.Event()] if cuda else [None, None]
        self._readback_turn = 0
        logger.info(
            "Engine: %d KV slots of %d tokens (%.0f MiB), CUDA graphs %s",
            slots, max_model_len, self.kv.nbytes / 2**20, "on" if self.graphs else "off",
        )

    # -- requests

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        prompt = list(prompt_token_ids)
        max_tokens = self._validate(prompt, params)
        generator = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            generator = request_generator(seed, self.device)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        seq = Sequence(request_id, prompt, params, max_tokens, stop_ids, generator,
                       IncrementalDetokenizer(self.tokenizer, prompt, params.stop))
        self._requests[request_id] = seq
        self.scheduler.add(seq)

    def _validate(self, prompt: list[int], params: SamplingParams) -> int:
        if not prompt:
            raise InvalidRequestError("the prompt is empty (0 tokens); send at least one token")
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} is out of range (vocabulary: 0..{self.vocab_size - 1})")
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer, and this model folder has none")
        max_tokens = self.max_model_len - len(prompt) if params.max_tokens is None else params.max_tokens
        if params.max_tokens is None and max_tokens < 1:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                f"{len(prompt)} tokens, which leaves none for the completion. Reduce the length of the prompt.")
        if len(prompt) + max_tokens > self.max_model_len:  # max_tokens 0 (scoring) needs only the prompt to fit
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} for the "
                f"completion). Reduce the length of the prompt or max_tokens."
            )
        return max_tokens

    def abort(self, request_id: str) -> bool:
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq)
        return True

    def request_ids(self) -> list[str]:
        return list(self._requests)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> dict:
        return {
            "num_waiting": len(self.scheduler.waiting),
            "num_running": len(self.scheduler.running),
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "kv_slots": self.kv.num_slots,
            "kv_slots_used": self.kv.num_slots - self.kv.num_free,
        }

    # -- one step

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        if self._launched is not None:
            launched, self._launched = self._launched, None
            self._launched = self._launch_next(launched)
            outputs = self._read(launched)
            if outputs or self._launched is not None:
                return outputs
        step = self.scheduler.schedule()
        if step.empty:
            return []
        if self._can_overlap(step):
            launched = self._launch(step.decodes, [s.last_token for s in step.decodes], ahead=0)
            self._launched = self._launch_next(launched)
            return self._read(launched)
        greedy = None
        if self.graphs is not None and not step.prefills and self.graphs.can_run(len(step.decodes)):
            seqs = step.decodes
            logits, greedy = self.graphs.run([s.last_token for s in seqs], [s.num_tokens - 1 for s in seqs],
                                             [s.slot for s in seqs])
            prompt_spans, sample_rows = {}, {s.request_id: i for i, s in enumerate(seqs)}
        else:
            batch, prompt_spans, sample_rows = self._build_batch(step)
            logits = self.model(batch, self.kv)
        seqs = step.prefills + step.decodes
        sampling = [s for s in seqs if s.max_tokens > 0]
        rows = [sample_rows[s.request_id] for s in sampling]
        sampled_logits = logits
        if rows != list(range(logits.shape[0])):  # decode-only steps sample every row in order: no gather
            sampled_logits, greedy = logits[rows], None
        tokens, logprobs = sample(sampled_logits, sampling, greedy)
        sampled = {s.request_id: (t, lp) for s, t, lp in zip(sampling, tokens, logprobs)}
        outputs = []
        for seq in seqs:
            first, length = prompt_spans.get(seq.request_id, (0, 0))
            if length:
                seq.prompt_logprobs = prompt_logprobs(logits[first : first + length], seq.prompt_ids,
                                                      seq.params.logprobs or 0)
            outputs.append(self._advance(seq, sampled.get(seq.request_id), is_prefill=seq in step.prefills))
        self.num_prompt_tokens += sum(len(s.prompt_ids) for s in step.prefills)
        self.num_generated_tokens += len(tokens)
        return outputs

    # -- overlapped decode (see the module docstring)

    def _can_overlap(self, step: ScheduledStep) -> bool:
        return (self.overlap_decode and self.graphs is not None and not step.prefills
                and self.graphs.can_run(len(step.decodes))
                and all(s.params.greedy and s.params.logprobs is None for s in step.decodes))

    def _launch(self, seqs: list[Sequence], tokens: list[int] | torch.Tensor, ahead: int) -> LaunchedDecode:
        """Queue a graph step for `seqs`; `ahead` = 1 when their last token is still on the device."""
        _, greedy = self.graphs.run(tokens, [s.num_tokens - 1 + ahead for s in seqs], [s.slot for s in seqs])
        self._readback_turn ^= 1
        host = self._readback[self._readback_turn, : len(seqs)]
        host.copy_(greedy, non_blocking=True)
        done = self._readback_done[self._readback_turn]
        if done is not None:
            done.record()
        return LaunchedDecode(seqs, greedy, host, done)

    def _launch_next(self, prev: LaunchedDecode) -> LaunchedDecode | None:
        """The step after `prev`, fed prev's tokens on the device; None when the host must read
        them first: a waiting request can join, a sequence left, or one ends by length on them."""
        seqs, scheduler = prev.seqs, self.scheduler
        joins = scheduler.waiting and self.kv.num_free and len(scheduler.running) < scheduler.max_num_seqs
        if (joins or len(scheduler.running) != len(seqs)
                or any(self._requests.get(s.request_id) is not s for s in seqs)
                or any(len(s.output_ids) + 1 >= s.max_tokens or s.num_tokens + 1 >= self.max_model_len
                       for s in seqs)):
            return None
        self.num_overlapped_steps += 1
        return self._launch(seqs, prev.greedy, ahead=1)

    def _read(self, launched: LaunchedDecode) -> list[RequestOutput]:
        if launched.done is not None:
            launched.done.synchronize()
        outputs = [self._advance(seq, (token, None), is_prefill=False)
                   for seq, token in zip(launched.seqs, launched.tokens.tolist())
                   if self._requests.get(seq.request_id) is seq]  # else finished or aborted since the launch
        self.num_generated_tokens += len(outputs)
        return outputs

    def _build_batch(self, step: ScheduledStep) -> tuple[ForwardBatch, dict[str, tuple[int, int]], dict[str, int]]:
        """The forward inputs, where each prompt's logits rows are (for prompt logprobs), and
        which logits row each sequence samples from."""
        ids, positions, slots, segments, logits_rows = [], [], [], [], []
        prompt_spans: dict[str, tuple[int, int]] = {}
        sample_rows: dict[str, int] = {}
        for seq in step.prefills:
            n, first = len(seq.prompt_ids), len(ids)
            segments.append((first, n))
            ids += seq.prompt_ids
            positions += range(n)
            slots += [seq.slot] * n
            if seq.params.prompt_logprobs:
                prompt_spans[seq.request_id] = (len(logits_rows), n)
                logits_rows += range(first, first + n)
            else:
                logits_rows.append(first + n - 1)
            sample_rows[seq.request_id] = len(logits_rows) - 1
        num_prefill = len(ids)
        decode_slots, decode_lens = [], []
        for seq in step.decodes:
            sample_rows[seq.request_id] = len(logits_rows)
            logits_rows.append(len(ids))
            ids.append(seq.last_token)
            positions.append(seq.num_tokens - 1)
            slots.append(seq.slot)
            decode_slots.append(seq.slot)
            decode_lens.append(seq.num_tokens)
        slot_range = None
        if decode_slots:
            first_slot, end_slot = decode_slots[0], decode_slots[-1] + 1
            # A view over a range with a few idle slots beats gathering the caches (see ForwardBatch).
            if end_slot - first_slot <= 2 * len(decode_slots):
                slot_range = (first_slot, end_slot)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        batch = ForwardBatch(
            input_ids=tensor(ids), positions=tensor(positions), slots=tensor(slots), prefill_segments=segments,
            num_prefill_tokens=num_prefill, decode_slots=tensor(decode_slots), decode_lens=tensor(decode_lens),
            decode_kv_len=max(decode_lens, default=0), decode_slot_range=slot_range, logits_indices=tensor(logits_rows),
        )
        return batch, prompt_spans, sample_rows

    def _advance(self, seq: Sequence, sampled, is_prefill: bool) -> RequestOutput:
        new_ids: list[int] = []
        token_logprobs = top_logprobs = None
        if sampled is None:  # max_tokens 0: only the prompt (and its logprobs) was wanted
            seq.finish_reason = "length"
        else:
            token, lp = sampled
            new_ids.append(token)
            seq.output_ids.append(token)
            if lp is not None:
                token_logprobs, top_logprobs = [lp[0]], [lp[1]]
            if token in seq.stop_ids or seq.detokenizer.add(token):
                seq.finish_reason = "stop"
            elif len(seq.output_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
                seq.finish_reason = "length"
        out = RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_ids,
            new_text=seq.detokenizer.take(seq.finished),
            token_logprobs=token_logprobs,
            top_logprobs=top_logprobs,
            prompt_logprobs=seq.prompt_logprobs if is_prefill else None,
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=len(seq.prompt_ids),
            num_generated_tokens=len(seq.output_ids),
        )
        if seq.finished:
            self.abort(seq.request_id)
        return out
