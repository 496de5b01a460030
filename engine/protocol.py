"""OpenAI-shaped request and response models of `quantgate serve`.

Requests are validated strictly (no "16" for 16, no NaN, no 1e400, no int64 overflow) so that
every bad input becomes a 400 naming the field before anything reaches the engine. Unknown
fields are ignored, as OpenAI clients send fields this server has no use for (`user`, ...);
fields that would change the result and that the engine cannot honour (`n` > 1, penalties,
`logit_bias`, `suffix`, tools, guided decoding, beam search: REFUSED_UNLESS_NEUTRAL) are
declared so that a request using them is refused, never silently served differently. Fields
OpenAI marks nullable take `null` as unset.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # vLLM's default max_logprobs; OpenAI allows 5 on completions, 20 on chat
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Every stop string is searched for after every token on the one engine thread, so a request's
# stop list costs all running requests time. OpenAI allows 4; lm-eval sends a handful.
MAX_STOP_STRINGS, MAX_STOP_CHARS = 64, 1024



def _unicode(text: str) -> str:
    # JSON can carry lone UTF-16 surrogates ("\ud800") that no tokenizer or UTF-8 encoder takes.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("unicode", "contains an unpaired UTF-16 surrogate (\\ud800-\\udfff); "
                                  "send valid Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]
TokenIds = list[int]
Prompt = Text | list[Text] | TokenIds | list[TokenIds]

# Shown instead of pydantic's per-union-member errors for fields that accept several shapes.
UNION_HINTS = {
    "prompt": "must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "must be a string or a list of strings",
    "content": "must be a string or a list of {'type': 'text', 'text': ...} parts",
}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


def _null_is_default(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """OpenAI marks these fields nullable and clients send `null` for unset ones."""
    return cls.model_fields[info.field_name].default if value is None else value


class StreamOptions(_Strict):
    include_usage: bool = False

    _nullable = field_validator("include_usage", mode="before")(classmethod(_null_is_default))


def _unsupported(message: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported", message)


_NO = (False, [], {})
# Request fields (vLLM's and OpenAI's) that change the answer and that the engine does not
# implement: field -> (values that change nothing, why). Any other value is a 400.
REFUSED_UNLESS_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "include_stop_str_in_output": (_NO, "the text ends before the stop string, as OpenAI returns it"),
    "use_beam_search": (_NO, "decoding is greedy or sampled, never beam search"),
    "guided_json": (_NO, "guided decoding is not implemented"),
    "guided_regex": (_NO, "guided decoding is not implemented"),
    "guided_choice": (_NO, "guided decoding is not implemented"),
    "guided_grammar": (_NO, "guided decoding is not implemented"),
    "structured_outputs": (_NO, "structured outputs are not implemented"),
    "prompt_logprobs": (_NO, "for the prompt's logprobs send echo: true with logprobs to /v1/completions"),
    "continue_final_message": (_NO, "the reply always starts a new assistant turn"),  # chat
    "functions": (_NO, "function calling is not implemented"),  # chat, OpenAI's older form of tools
    "tool_choice": (("none", "auto"), "function calling is not implemented"),  # chat
}


class _SamplingRequest(_Strict):
    """Fields /v1/completions and /v1/chat/completions share."""

    model: Text | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: Text | list[Text] | None = None
    n: int = Field(1, ge=INT64_MIN, le=INT64_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: fixed-length outputs for benchmarks
    # vLLM's sampling extensions (lm-eval passes gen_kwargs through): only their neutral values.
    top_k: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=INT64_MAX)
    min_tokens: int | None = Field(None, ge=0, le=INT64_MAX)
    stop_token_ids: list[int] | None = None  # vLLM's extension: stop on any of these token ids
    response_format: dict[str, Any] | None = None
    # Fields of vLLM's and OpenAI's APIs that change the answer and that this engine does not
    # implement: refused unless at their neutral value (REFUSED_UNLESS_NEUTRAL).
    include_stop_str_in_output: Any = None
    use_beam_search: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None

    _nullable = field_validator("n", "stream", "ignore_eos", mode="before")(classmethod(_null_is_default))

    @field_validator(*REFUSED_UNLESS_NEUTRAL, check_fields=False)
    @classmethod
    def _refused_unless_neutral(cls, value: Any, info: ValidationInfo) -> Any:
        neutral, why = REFUSED_UNLESS_NEUTRAL[info.field_name]
        if value is None or any(value == n and type(value) is type(n) for n in neutral):
            return value
        raise _unsupported(f"{info.field_name} is not supported: {why}; leave it unset")

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value and value.get("type", "text") != "text":
            raise _unsupported("only response_format {'type': 'text'} is supported")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise _unsupported("stream_options is only allowed with stream: true")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise _unsupported(f"n={n} is not supported: this server returns one choice per prompt (n=1)")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value:
            raise _unsupported(f"{info.field_name} is not supported; leave it unset or 0")
        return value

    @field_validator("top_k", "min_p", "repetition_penalty", "min_tokens")
    @classmethod
    def _neutral_extension(cls, value: float | None, info: ValidationInfo) -> float | None:
        neutral = {"top_k": (None, 0, -1), "min_p": (None, 0.0), "repetition_penalty": (None, 1.0),
                   "min_tokens": (None, 0)}[info.field_name]
        if value not in neutral:
            raise _unsupported(f"{info.field_name}={value} is not supported; leave it unset "
                               f"(or {neutral[-1]}, which changes nothing)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise _unsupported("logit_bias is not supported; leave it unset")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(s == "" for s in stops):
            raise _unsupported("stop strings must not be empty")
        if len(stops) > MAX_STOP_STRINGS:
            raise _unsupported(f"stop has {len(stops)} strings; send at most {MAX_STOP_STRINGS}")
        longest = max(stops, key=len, default="")
        if len(longest) > MAX_STOP_CHARS:
            raise _unsupported(f"a stop string has {len(longest)} characters; send stop strings of at most "
                               f"{MAX_STOP_CHARS}")
        return stops

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    prompt: Prompt
    echo: bool = False  # before max_tokens, whose validator reads it
    # 0 only with echo: the prompt (and its logprobs) back and nothing generated, OpenAI's
    # and vLLM's scoring call.
    max_tokens: int | None = Field(None, ge=0, le=INT64_MAX)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    suffix: str | None = None
    prompt_logprobs: Any = None

    _nullable_echo = field_validator("echo", mode="before")(classmethod(_null_is_default))

    @field_validator("prompt")
    @classmethod
    def _some_prompt(cls, prompt: Prompt) -> Prompt:
        if isinstance(prompt, list) and not prompt:
            raise _unsupported("prompt is an empty list; send at least one prompt")
        return prompt

    @field_validator("max_tokens")
    @classmethod
    def _zero_needs_echo(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value == 0 and not info.data.get("echo"):
            raise _unsupported("max_tokens 0 needs echo: true (it returns the prompt, with its logprobs when "
                               "logprobs is set, and generates nothing); send max_tokens >= 1, or echo: true")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise _unsupported(f"best_of={value} is not supported; leave it unset or 1")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise _unsupported("suffix (insertion) is not supported; leave it unset")
        return value

    def prompts(self) -> list[str | TokenIds]:
        """One entry per choice: a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or isinstance(p[0], int):
            return [p]
        return list(p)


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        # vLLM hands string-format templates (Qwen3's among them) the parts joined by newlines;
        # the same request must render the same prompt on both engines.
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    continue_final_message: Any = None
    functions: Any = None
    tool_choice: Any = None
    prompt_logprobs: Any = None  # vLLM's chat extension
    echo: Any = None  # vLLM's chat extension (the last message echoed first)

    _nullable_chat = field_validator("logprobs", mode="before")(classmethod(_null_is_default))

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: Any) -> Any:
        # Not in REFUSED_UNLESS_NEUTRAL: its validator would also refuse /v1/completions' echo.
        if value is not None and value is not False:
            raise _unsupported("echo is not supported on /v1/chat/completions; leave it unset")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise _unsupported("top_logprobs needs logprobs: true")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise _unsupported("tools (function calling) are not supported; leave tools unset")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a prompt, or chat messages rendered with the chat template."""

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, validate_default=True)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @field_validator("messages")
    @classmethod
    def _one_input(cls, messages: list[ChatMessage] | None, info: ValidationInfo) -> list[ChatMessage] | None:
        if (messages is None) == (info.data.get("prompt") is None):
            raise _unsupported("send exactly one of prompt and messages")
        return messages


class DetokenizeRequest(_Strict):
    model: Text | None = None
    tokens: TokenIds


# ---- responses -------------------------------------------------------------------------------


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """Legacy completions logprobs: parallel lists, the first prompt token's entries null."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "quantgate"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
