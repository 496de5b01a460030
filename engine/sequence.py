"""One request's state inside the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .detokenizer import IncrementalDetokenizer
from .sampling_params import SamplingParams


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: params.max_tokens, or what fits in max_model_len
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    finish_reason: str | None = None
    prompt_logprobs: list | None = None  # filled by the prefill step when requested

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
