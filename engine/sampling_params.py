"""Per-request generation settings and the engine's incremental outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # OpenAI's limit for top logprobs
GREEDY_BELOW_TEMPERATURE = 1e-5  # logits / T overflows float32 long before T reaches 0


class InvalidRequestError(ValueError):
    """A request the engine will not run; the message names the field and the allowed range."""


@dataclass
class SamplingParams:
    max_tokens: int | None = 16  # None: up to max_model_len
    temperature: float = 1.0  # 0 (or below 1e-5): greedy
    top_p: float = 1.0
    seed: int | None = None  # per request: its samples do not depend on the other requests
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None  # top-k alternatives per generated token (0: only the chosen token's)
    prompt_logprobs: bool = False  # logprobs of the prompt tokens too (completions `echo`)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 0:
            raise InvalidRequestError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings")
        # bool is an int to Python, but `true` as a token id is a client's mistake, not token 1
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be a list of token ids (integers >= 0)")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


@dataclass
class RequestOutput:
    """What one engine step produced for one request (incremental: only the new tokens)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    token_logprobs: list[float] | None  # one per new token, when logprobs was requested
    top_logprobs: list[dict[int, float]] | None  # token id -> logprob, per new token
    # First output only, when prompt_logprobs was requested: per prompt token, None for the
    # first, else (logprob, {token id: logprob} of the top `logprobs` alternatives).
    prompt_logprobs: list[tuple[float, dict[int, float]] | None] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" once finished
    num_prompt_tokens: int
    num_generated_tokens: int
