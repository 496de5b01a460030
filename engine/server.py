"""The OpenAI-compatible HTTP surface of `quantgate serve` (SPEC section 6).

`build_app(engine, loaded, settings)` returns a FastAPI app over an `AsyncEngine`: every HTTP
request becomes one engine request per prompt, so concurrent clients share the engine's
running batch. Bad input is turned into an OpenAI-style 4xx before the engine sees it; an
error inside one request becomes that request's 500 and never stops the server. A client
that disconnects has its engine requests aborted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from safetensors import SafetensorError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tokenizers import Tokenizer

from quantgate.kernels import IncompatibleBufferError

from . import AsyncEngine, EngineDeadError, InvalidRequestError, LoadedModel, RequestOutput, SamplingParams
from .chat_template import SPECIAL_TOKENS, ChatTemplate, ChatTemplateError
from .loader import ConfigChanged, WeightsPartlyReloaded
from .metrics import PROMETHEUS_CONTENT_TYPE, RequestMetricsMiddleware, ServerMetrics
from .protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    UNION_HINTS,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenIds,
    TokenizeRequest,
    TokenizeResponse,
    TokenLogprob,
    TopLogprob,
    Usage,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20  # far above any prompt a supported max_model_len can hold
PROTECTED_PATHS = ("/v1", "/tokenize", "/detokenize", "/tokenizer_info")  # --api-key guards these
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client gone before the answer
T = TypeVar("T")


@dataclass(frozen=True)
class ServerSettings:
    served_model_names: tuple[str, ...]  # the first one is reported in responses
    max_model_len: int
    api_key: str | None = None


class APIError(Exception):
    """An OpenAI-style error response."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        body = ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))
        return JSONResponse(body.model_dump(), status_code=self.status)


# ---- request -> engine ---------------------------------------------------------------------------


@dataclass
class _Job:
    """One prompt of a request: one engine request."""

    request_id: str
    index: int
    prompt_text: str
    prompt_ids: TokenIds
    params: SamplingParams


@dataclass
class _Finished:
    """Everything an engine request produced, accumulated from its incremental outputs."""

    job: _Job
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0

    def add(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.token_ids += out.new_token_ids
        self.token_logprobs += out.token_logprobs or []
        self.top_logprobs += out.top_logprobs or []
        if out.prompt_logprobs:
            self.prompt_logprobs = list(out.prompt_logprobs)
        self.num_prompt_tokens = out.num_prompt_tokens
        if out.finished:
            self.finish_reason = out.finish_reason


class OpenAIServer:
    """Request handling, independent of routing (build_app wires it to FastAPI)."""

    def __init__(self, engine: AsyncEngine, loaded: LoadedModel, settings: ServerSettings,
                 metrics: ServerMetrics) -> None:
        self.engine = engine
        self.tokenizer = loaded.tokenizer
        self.settings = settings
        self.metrics = metrics
        self.vocab_size = int(loaded.model_config.vocab_size)
        self.max_token_bytes = _max_token_bytes(loaded.tokenizer)
        self.chat_template = ChatTemplate.from_model_dir(loaded.path)

    # -- text <-> tokens (the folder's tokenizer.json through `tokenizers`; a folder may ship none)

    async def encode(self, text: str, add_special_tokens: bool, param: str, bounded: bool = True) -> TokenIds:
        """Token ids of `text`, off the event loop (encode_batch releases the GIL, so other
        clients keep streaming); with `bounded` (a prompt to run), a text that cannot fit
        max_model_len is refused untokenized."""
        if self.tokenizer is None:
            raise APIError(400, f"this model folder has no tokenizer, so {param} cannot be text; "
                           "send the prompt as token ids to /v1/completions", param=param)
        limit = self.settings.max_model_len
        if bounded and self.max_token_bytes and len(text.encode()) > limit * self.max_token_bytes:
            raise APIError(400, f"This model's maximum context length is {limit} tokens; the {param} text "
                           f"({len(text.encode())} bytes) is longer than any {limit} tokens can be. "
                           "Shorten it.", param=param, code="context_length_exceeded")
        encoded = await asyncio.to_thread(self.tokenizer.encode_batch, [text], add_special_tokens=add_special_tokens)
        return encoded[0].ids

    def decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.decode([token_id])

    # -- checks shared by both endpoints

    def model_name(self, requested: str | None) -> str:
        names = self.settings.served_model_names
        if requested is not None and requested not in names:
            raise APIError(404, f"The model `{requested}` does not exist; this server serves {', '.join(names)}",
                           param="model", code="model_not_found")
        return names[0]

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of range: the vocabulary has {self.vocab_size} tokens "
                           f"(ids 0..{self.vocab_size - 1})", param=param)

    async def _job(self, request_id: str, index: int, prompt: str | TokenIds, max_tokens: int | None,
                   params: Callable[[int], SamplingParams], param: str) -> _Job:
        if isinstance(prompt, str):
            text, ids = prompt, await self.encode(prompt, add_special_tokens=True, param=param)
        else:
            self.check_token_ids(prompt, param)
            text, ids = self.decode(prompt), list(prompt)
        if not ids:
            raise APIError(400, "the prompt is empty (0 tokens); send at least one token", param=param)
        limit = self.settings.max_model_len
        if max_tokens is None and len(ids) >= limit:  # no room left for even one generated token
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt has {len(ids)} tokens, "
                "which leaves none for the completion. Shorten the prompt (or restart the server with a larger "
                "--max-model-len).", param=param, code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = limit - len(ids)
        if len(ids) + max_tokens > limit:  # max_tokens 0 (scoring) needs only the prompt to fit
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                "completion). Reduce the length of the prompt or max_tokens (or restart the server with a "
                "larger --max-model-len).", param=param, code="context_length_exceeded")
        return _Job(request_id, index, text, ids, params(max_tokens))

    async def generate(self, job: _Job) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one job, metered. Leaving early (a client gone, a cancelled
        request) closes the engine's stream, which aborts the engine request."""
        accepted = time.perf_counter()
        first_token_at: float | None = None
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        async with aclosing(self.engine.generate(job.request_id, job.prompt_ids, job.params)) as outputs:
            async for out in outputs:
                if out.new_token_ids:
                    self.metrics.generation_tokens.inc(len(out.new_token_ids))
                    if first_token_at is None:
                        first_token_at = time.perf_counter()
                        self.metrics.time_to_first_token.observe(first_token_at - accepted)
                if out.finished and first_token_at is not None and out.num_generated_tokens > 1:
                    self.metrics.time_per_output_token.observe(
                        (time.perf_counter() - first_token_at) / (out.num_generated_tokens - 1))
                yield out

    async def collect(self, job: _Job) -> _Finished:
        done = _Finished(job)
        async with aclosing(self.generate(job)) as outputs:
            async for out in outputs:
                done.add(out)
        return done

    async def merged(self, jobs: Sequence[_Job]) -> AsyncIterator[tuple[_Job, RequestOutput]]:
        """Outputs of several jobs as they come (one stream per multi-prompt request)."""
        if len(jobs) == 1:
            async with aclosing(self.generate(jobs[0])) as outputs:
                async for out in outputs:
                    yield jobs[0], out
            return
        queue: asyncio.Queue[tuple[_Job, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(job: _Job) -> None:
            try:
                async with aclosing(self.generate(job)) as outputs:
                    async for out in outputs:
                        await queue.put((job, out))
                await queue.put((job, None))
            except Exception as exc:  # handed to the consumer, which raises it
                await queue.put((job, exc))

        tasks = [asyncio.create_task(pump(job)) for job in jobs]
        try:
            remaining = len(jobs)
            while remaining:
                job, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield job, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stop_strings(self, req: CompletionRequest) -> list[str]:
        """`stop`, refused here rather than by the engine, so a stream is refused before it starts (a
        chat request is text, so it never reaches here without a tokenizer)."""
        stop = list(req.stop or [])
        if stop and self.tokenizer is None:
            raise APIError(400, "stop strings need a tokenizer, and this model folder has none; send "
                           "stop_token_ids instead", param="stop")
        return stop

    def stop_token_ids(self, req: CompletionRequest | ChatCompletionRequest) -> list[int]:
        """vLLM's `stop_token_ids`, checked against the vocabulary."""
        ids = list(req.stop_token_ids or [])
        self.check_token_ids(ids, "stop_token_ids")
        return ids

    def top_dict(self, top: dict[int, float] | None) -> dict[str, float] | None:
        """Token text -> logprob. Tokens inside one UTF-8 character all read "\ufffd": where texts
        collide the most likely one's logprob stays, so the entry's best is still the best token's
        (lm-eval's is_greedy takes the max; a later, less likely token overwrote it)."""
        if top is None:
            return None
        out: dict[str, float] = {}
        for t, lp in sorted(top.items(), key=lambda item: -item[1]):
            out.setdefault(self.token_text(t), _finite(lp))
        return out

    # -- /v1/completions

    async def completion_jobs(self, req: CompletionRequest) -> list[_Job]:
        base = f"cmpl-{uuid.uuid4().hex}"
        prompts = req.prompts()

        stop, stop_ids = self.stop_strings(req), self.stop_token_ids(req)

        def params(max_tokens: int) -> SamplingParams:
            return SamplingParams(
                max_tokens=max_tokens, temperature=_or(req.temperature, 1.0), top_p=_or(req.top_p, 1.0),
                seed=req.seed, stop=stop, stop_token_ids=stop_ids, logprobs=req.logprobs,
                prompt_logprobs=req.echo and req.logprobs is not None, ignore_eos=req.ignore_eos)

        max_tokens = _or(req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS)
        return [await self._job(base if len(prompts) == 1 else f"{base}-{i}", i, p, max_tokens, params, "prompt")
                for i, p in enumerate(prompts)]

    def completion_logprobs(self, echoed: _Job | None, prompt_logprobs: Sequence[Any], token_ids: Sequence[int],
                            token_logprobs: Sequence[float], top_logprobs: Sequence[dict[int, float]],
                            text_offset: int = 0) -> CompletionLogprobs:
        """Legacy logprobs lists; with `echoed`, its prompt tokens come first (the very first one
        has no logprob). `text_offset` is where these tokens start in the choice's text."""
        tokens: list[str] = []
        lps: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        if echoed is not None:
            tokens += [self.token_text(t) for t in echoed.prompt_ids]
            for i, entry in enumerate(_pad(prompt_logprobs, len(echoed.prompt_ids))):
                lp, top = _prompt_entry(entry) if i else (None, None)
                lps.append(lp)
                tops.append(self.top_dict(_with_chosen(top, echoed.prompt_ids[i], lp)))
        tokens += [self.token_text(t) for t in token_ids]
        lps += [_finite(lp) for lp in token_logprobs]
        tops += [self.top_dict(_with_chosen(top, t, lp)) for t, lp, top in zip(token_ids, token_logprobs, top_logprobs)]
        offsets = []
        for token in tokens:
            offsets.append(text_offset)
            text_offset += len(token)
        return CompletionLogprobs(tokens=tokens, token_logprobs=lps, top_logprobs=tops, text_offset=offsets)

    async def completions(self, req: CompletionRequest, model: str, jobs: list[_Job]) -> CompletionResponse:
        results = await _all_or_none([self.collect(job) for job in jobs])
        choices = []
        for d in results:
            logprobs = None
            if req.logprobs is not None:
                logprobs = self.completion_logprobs(d.job if req.echo else None, d.prompt_logprobs, d.token_ids,
                                                    d.token_logprobs, d.top_logprobs)
            choices.append(CompletionChoice(index=d.job.index, text=(d.job.prompt_text if req.echo else "") + d.text,
                                            logprobs=logprobs, finish_reason=d.finish_reason))
        return CompletionResponse(id=_response_id(jobs), model=model, choices=choices, usage=_usage(results))

    async def stream_completions(self, req: CompletionRequest, model: str, jobs: list[_Job]) -> AsyncIterator[str]:
        response_id, created = _response_id(jobs), int(time.time())
        # Per choice, absent until its first chunk: where its next token starts, counted in token
        # strings as the whole response counts them (a token inside a UTF-8 character has no text yet).
        text_offsets: dict[int, int] = {}
        prompt_tokens = completion_tokens = 0

        async def events() -> AsyncIterator[str]:
            nonlocal prompt_tokens, completion_tokens
            async with aclosing(self.merged(jobs)) as outputs:
                async for job, out in outputs:
                    echoed = job if req.echo and job.index not in text_offsets else None
                    text = (echoed.prompt_text if echoed else "") + out.new_text
                    logprobs = None
                    start = text_offsets.setdefault(job.index, 0)
                    if req.logprobs is not None:
                        logprobs = self.completion_logprobs(echoed, out.prompt_logprobs or [], out.new_token_ids,
                                                            out.token_logprobs or [], out.top_logprobs or [], start)
                        text_offsets[job.index] = start + sum(len(token) for token in logprobs.tokens)
                    if out.finished:
                        prompt_tokens += out.num_prompt_tokens
                        completion_tokens += out.num_generated_tokens
                    choice = CompletionChoice(index=job.index, text=text, logprobs=logprobs,
                                              finish_reason=out.finish_reason if out.finished else None)
                    chunk = CompletionResponse(id=response_id, created=created, model=model, choices=[choice])
                    yield _sse(chunk.model_dump(exclude={"usage"}))
            if req.include_usage_in_stream:
                usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                              total_tokens=prompt_tokens + completion_tokens)
                yield _sse(CompletionResponse(id=response_id, created=created, model=model, choices=[],
                                              usage=usage).model_dump())

        async for event in _sse_stream(events()):
            yield event

    # -- /v1/chat/completions

    def render_chat(self, req: ChatCompletionRequest) -> str:
        messages = [{"role": m.role, "content": m.text()} | ({"name": m.name} if m.name else {})
                    for m in req.messages]
        extra = req.chat_template_kwargs or {}
        taken = sorted(set(extra) & {"messages", "add_generation_prompt"})
        if taken:
            raise APIError(400, f"chat_template_kwargs may not set {', '.join(taken)}: send them as the request's own "
                           "fields", param="chat_template_kwargs")
        try:
            return self.chat_template.render(messages, add_generation_prompt=req.add_generation_prompt, **extra)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), param="messages") from None

    async def chat_job(self, req: ChatCompletionRequest) -> _Job:
        # The template wrote the special tokens itself.
        ids = await self.encode(self.render_chat(req), add_special_tokens=False, param="messages")

        stop_ids = self.stop_token_ids(req)

        def params(max_tokens: int) -> SamplingParams:
            return SamplingParams(
                max_tokens=max_tokens, temperature=_or(req.temperature, 1.0), top_p=_or(req.top_p, 1.0),
                seed=req.seed, stop=list(req.stop or []), stop_token_ids=stop_ids,
                logprobs=_or(req.top_logprobs, 0) if req.logprobs else None, ignore_eos=req.ignore_eos)

        return await self._job(f"chatcmpl-{uuid.uuid4().hex}", 0, ids, req.requested_max_tokens, params, "messages")

    def chat_logprobs(self, req: ChatCompletionRequest, token_ids: list[int], logprobs: list[float],
                      tops: list[dict[int, float]]) -> ChatLogprobs | None:
        if not req.logprobs:
            return None
        k = _or(req.top_logprobs, 0)
        content = []
        for token_id, lp, top in zip(token_ids, logprobs, tops, strict=True):
            best = sorted((top or {}).items(), key=lambda kv: -kv[1])[:k]
            content.append(TokenLogprob(
                **_chat_token(self.token_text(token_id), lp),
                top_logprobs=[TopLogprob(**_chat_token(self.token_text(t), v)) for t, v in best]))
        return ChatLogprobs(content=content)

    async def chat(self, req: ChatCompletionRequest, model: str, job: _Job) -> ChatCompletionResponse:
        done = await self.collect(job)
        choice = ChatChoice(index=0, message=AssistantMessage(content=done.text),
                            logprobs=self.chat_logprobs(req, done.token_ids, done.token_logprobs, done.top_logprobs),
                            finish_reason=done.finish_reason)
        return ChatCompletionResponse(id=job.request_id, model=model, choices=[choice], usage=_usage([done]))

    async def stream_chat(self, req: ChatCompletionRequest, model: str, job: _Job) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(delta: DeltaMessage, **kwargs: Any) -> str:
            choice = ChatChunkChoice(index=0, delta=delta, **kwargs)
            body = ChatCompletionChunk(id=job.request_id, created=created, model=model, choices=[choice])
            payload = body.model_dump(exclude={"usage"})
            payload["choices"][0]["delta"] = delta.model_dump(exclude_none=True)  # OpenAI sends role only once
            return _sse(payload)

        async def events() -> AsyncIterator[str]:
            yield chunk(DeltaMessage(role="assistant", content=""))
            last: RequestOutput | None = None
            async with aclosing(self.merged([job])) as outputs:
                async for _, out in outputs:
                    last = out
                    logprobs = self.chat_logprobs(req, out.new_token_ids, out.token_logprobs or [],
                                                  out.top_logprobs or [])
                    if out.new_text or logprobs:
                        yield chunk(DeltaMessage(content=out.new_text), logprobs=logprobs)
                    if out.finished:
                        yield chunk(DeltaMessage(), finish_reason=out.finish_reason)
            if req.include_usage_in_stream and last is not None:
                usage = Usage(prompt_tokens=last.num_prompt_tokens, completion_tokens=last.num_generated_tokens,
                              total_tokens=last.num_prompt_tokens + last.num_generated_tokens)
                yield _sse(ChatCompletionChunk(id=job.request_id, created=created, model=model, choices=[],
                                               usage=usage).model_dump())

        async for event in _sse_stream(events()):
            yield event

    # -- vLLM's tokenizer endpoints (lm-eval's remote tokenizer uses them)

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        self.model_name(req.model)
        if req.messages is not None:
            text = self.render_chat(ChatCompletionRequest(messages=req.messages,
                                                          add_generation_prompt=req.add_generation_prompt))
            ids = await self.encode(text, add_special_tokens=False, param="messages", bounded=False)
        else:
            # Unbounded, as vLLM's: lm-eval counts a whole document here before cutting it into
            # windows that fit (loglikelihood_rolling), and a refusal aborted its run.
            ids = await self.encode(req.prompt, add_special_tokens=req.add_special_tokens, param="prompt",
                                    bounded=False)
        return TokenizeResponse(count=len(ids), max_model_len=self.settings.max_model_len, tokens=ids)

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        self.model_name(req.model)
        self.check_token_ids(req.tokens, "tokens")
        return DetokenizeResponse(prompt=self.decode(req.tokens))

    def tokenizer_info(self) -> dict[str, Any]:
        special = self.chat_template.special_tokens
        return {**{name: special.get(name) for name in SPECIAL_TOKENS},
                "chat_template": self.chat_template.source, "model_max_length": self.settings.max_model_len,
                "vocab_size": self.vocab_size}


# ---- helpers ---------------------------------------------------------------------------------------


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def _finite(value: float) -> float:
    """JSON has no -inf; a token of probability 0 gets the most negative float instead."""
    return value if math.isfinite(value) else -3.4e38


def _pad(entries: Sequence[Any], n: int) -> list[Any]:
    return list(entries) + [None] * (n - len(entries))


def _with_chosen(top: dict[int, float] | None, token: int, logprob: float | None) -> dict[int, float] | None:
    """A legacy completions top_logprobs entry: the top alternatives plus the token itself, as
    OpenAI and vLLM report it (so up to logprobs + 1 entries)."""
    if top is None or logprob is None or token in top:
        return top
    return {**top, token: logprob}


def _prompt_entry(entry: Any) -> tuple[float | None, dict[int, float] | None]:
    """A prompt position's (logprob, top alternatives) as the engine reports it."""
    if entry is None:
        return None, None
    lp, top = entry
    return (None if lp is None else _finite(lp)), top


def _max_token_bytes(tokenizer: Tokenizer | None) -> int | None:
    """The most UTF-8 bytes of text one token can stand for, or None when unbounded (a model with
    an unknown token may map any run of unknown text to it)."""
    if tokenizer is None or json.loads(tokenizer.to_str()).get("model", {}).get("unk_token") is not None:
        return None
    return max((len(token.encode()) for token in tokenizer.get_vocab(with_added_tokens=True)), default=None)


def _response_id(jobs: Sequence[_Job]) -> str:
    """The id of the whole response: the request id, or their common stem for several prompts."""
    return jobs[0].request_id if len(jobs) == 1 else jobs[0].request_id.rsplit("-", 1)[0]


def _chat_token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def _usage(results: Sequence[_Finished]) -> Usage:
    prompt = sum(d.num_prompt_tokens or len(d.job.prompt_ids) for d in results)
    completion = sum(len(d.token_ids) for d in results)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _sse_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """OpenAI's server-sent events: the chunks, an error event if the request fails midway, then [DONE]."""
    try:
        async with aclosing(events) as stream:
            async for event in stream:
                yield event
    except APIError as exc:
        error = ErrorInfo(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
        yield _sse({"error": error.model_dump()})
    except InvalidRequestError as exc:
        yield _sse({"error": ErrorInfo(message=str(exc), type="invalid_request_error").model_dump()})
    except Exception as exc:
        log.exception("streamed request failed")
        yield _sse({"error": ErrorInfo(message=f"internal error: {type(exc).__name__}: {exc}",
                                       type="internal_error").model_dump()})
    yield "data: [DONE]\n\n"


async def _all_or_none(work: Sequence[Awaitable[T]]) -> list[T]:
    """Like asyncio.gather, but one failure cancels the others (their engine requests abort)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _unless_disconnected(raw: Request, work: Awaitable[T]) -> T | None:
    """Run `work` while watching the connection; if the client leaves first, cancel it (which
    aborts its engine requests) and return None."""

    async def disconnected() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


_TYPE_TAG = re.compile(r"[\[\](),]|^(str|int|float|bool)$")  # union members pydantic adds to a location


def _field_path(loc: Sequence[Any]) -> list[str]:
    return [str(p) for p in loc if p != "body" and not _TYPE_TAG.search(str(p))]


def _validation_error(exc: RequestValidationError) -> APIError:
    """pydantic's errors -> one OpenAI error naming the offending field."""
    errors = list(exc.errors())
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    path = _field_path(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "parse error")
        return APIError(400, f"the request body is not valid JSON ({reason}); send a JSON object")
    if not path:
        if first.get("type") == "missing":
            return APIError(400, "the request body is empty; send a JSON object with Content-Type: application/json")
        return APIError(400, "the request body must be a JSON object (Content-Type: application/json)")
    # A field accepting several shapes fails once per shape: a value of a right shape that is
    # wrong in itself says the most; if every shape mismatched, name the shapes.
    same_field = [e for e in errors if _field_path(e.get("loc", ()))[: len(path)] == path]
    specific = next((e for e in same_field if not e.get("type", "").endswith("_type")), None)
    if specific is None and len(same_field) > 1 and path[-1] in UNION_HINTS:
        param = ".".join(path)
        return APIError(400, f"{param}: {UNION_HINTS[path[-1]]}", param=param)
    chosen = specific or first
    param = ".".join(_field_path(chosen.get("loc", ())))
    message = "this field is required" if chosen.get("type") == "missing" else chosen.get("msg", "invalid value")
    return APIError(400, f"{param}: {message}", param=param)


# ---- app -----------------------------------------------------------------------------------------


def build_app(engine: AsyncEngine, loaded: LoadedModel, settings: ServerSettings) -> FastAPI:
    metrics = ServerMetrics(engine_stats=engine.stats)
    server = OpenAIServer(engine, loaded, settings, metrics)
    app = FastAPI(title="quantgate serve", description="OpenAI-compatible server of quantgate's engine")
    app.state.server = server
    routes: list[str] = []  # "GET /health", ... for 404/405 messages; filled once the routes exist

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(InvalidRequestError)
    async def _refused(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return APIError(400, str(exc)).response()

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return APIError(503, str(exc), type="service_unavailable").response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        message = str(exc.detail)
        if exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's words
            # What json.loads raises besides JSONDecodeError (a validation error of its own): bytes
            # that are not UTF-8, nesting deeper than Python's recursion limit, an integer of more
            # digits than Python converts (sys.get_int_max_str_digits, 4300 by default).
            message = ("the request body cannot be read as JSON: it is not UTF-8 text, its JSON nests too deeply, or "
                       "it holds an integer thousands of digits long; send a JSON object encoded as UTF-8 with "
                       "numbers of ordinary size")
            code = "invalid_body"
        if exc.status_code in (404, 405):
            message = f"{message}: {request.method} {request.url.path}; this server has {', '.join(routes)}"
        return APIError(exc.status_code, message, type=kind, code=code).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="internal_error").response()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        cards = [ModelCard(id=name, root=str(loaded.path.resolve()),
                           max_model_len=settings.max_model_len) for name in settings.served_model_names]
        return ModelList(data=cards)

    @app.post("/v1/completions", response_model=CompletionResponse, responses={400: {"model": ErrorResponse}})
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        # Checked before a stream starts, so a bad request is a 4xx, not an error event after a 200.
        model, jobs = server.model_name(req.model), await server.completion_jobs(req)
        if req.stream:
            return StreamingResponse(server.stream_completions(req, model, jobs), media_type="text/event-stream")
        return _json(await _unless_disconnected(raw, server.completions(req, model, jobs)))

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses={400: {"model": ErrorResponse}})
    async def chat(req: ChatCompletionRequest, raw: Request) -> Response:
        model, job = server.model_name(req.model), await server.chat_job(req)
        if req.stream:
            return StreamingResponse(server.stream_chat(req, model, job), media_type="text/event-stream")
        return _json(await _unless_disconnected(raw, server.chat(req, model, job)))

    @app.get("/v1/kernels")
    async def kernels() -> dict[str, Any]:
        return loaded.kernel_report()

    @app.post("/v1/reload_weights")
    async def reload_weights() -> dict[str, Any]:
        start = time.perf_counter()
        try:
            await engine.reload_weights()
        except ConfigChanged as exc:  # the folder is fine, for a restart: no advice to fix it
            raise APIError(409, f"reload from {loaded.path} refused: {exc}. The served weights are unchanged",
                           type="conflict", code="reload_failed") from None
        except (ValueError, SafetensorError) as exc:  # the files no longer fit the model; checked before any write
            raise APIError(409, f"reload from {loaded.path} failed: {exc}. The served weights are unchanged: fix "
                           "the checkpoint and reload again, or restart the server for a different model",
                           type="conflict", code="reload_failed") from None
        except (IncompatibleBufferError, WeightsPartlyReloaded) as exc:  # raised after the new weights were written
            raise APIError(409, f"reload from {loaded.path} failed after the new weights were read: {exc}. Restart "
                           "the server", type="conflict", code="reload_failed") from None
        return {"status": "ok", "seconds": round(time.perf_counter() - start, 3)}

    @app.post("/tokenize", response_model=TokenizeResponse)
    async def tokenize(req: TokenizeRequest) -> TokenizeResponse:
        return await server.tokenize(req)

    @app.post("/detokenize", response_model=DetokenizeResponse)
    async def detokenize(req: DetokenizeRequest) -> DetokenizeResponse:
        return server.detokenize(req)

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return server.tokenizer_info()

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    endpoints = [route for route in app.routes if route.path.startswith((*PROTECTED_PATHS, "/health", "/metrics"))]
    routes.extend(f"{sorted(route.methods)[0]} {route.path}" for route in endpoints)
    # Added first, so it is innermost: the metrics count the 503 its client gets.
    app.add_middleware(CancelledRequestMiddleware)
    app.add_middleware(BodyLimitMiddleware)
    if settings.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=settings.api_key)
    # Added last, so it is outermost: it also counts the 401s.
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, endpoints=frozenset(r.path for r in endpoints))
    return app


class _BodyTooLarge(Exception):
    pass


class _HttpMiddleware:
    """A pure ASGI middleware (streamed responses pass through untouched) for HTTP requests; the
    rest (lifespan) goes straight to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class BodyLimitMiddleware(_HttpMiddleware):
    """Bodies over MAX_BODY_BYTES get the OpenAI-style 413: at once when Content-Length says so,
    else as soon as the streamed body passes the limit (the app is still reading it then, so no
    response has started)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            await self._refuse(scope, receive, send)
            return
        received, refused = 0, False

        async def counted() -> Message:
            nonlocal received, refused
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES and not refused:
                refused = True
                await self._refuse(scope, receive, send)
                raise _BodyTooLarge  # the app stops reading; FastAPI may turn it into a 400, never sent
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        try:
            await self.app(scope, counted, unless_refused)
        except _BodyTooLarge:
            pass

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send) -> None:
        refusal = APIError(413, f"the request body is larger than this server takes ({MAX_BODY_BYTES} bytes); send "
                           "a shorter prompt", code="request_too_large")
        await refusal.response()(scope, receive, send)


class CancelledRequestMiddleware(_HttpMiddleware):
    """A request cancelled under the app (a forced quit: the second Ctrl-C) still ends as the API
    says: an OpenAI-style 503 when no response has started, an error event and [DONE] when an
    event stream has. Without it uvicorn sends a plain-text 500 and logs a traceback per request."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = streaming = False

        async def tracked(message: Message) -> None:
            nonlocal started, streaming
            if message["type"] == "http.response.start":
                started = True
                streaming = dict(message.get("headers", [])).get(b"content-type", b"").startswith(b"text/event-stream")
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            refusal = APIError(503, "the server is shutting down; send the request again once it is back",
                               type="server_error", code="server_shutting_down")
            with suppress(Exception):  # the client may be gone too
                if not started:
                    await refusal.response()(scope, receive, send)
                elif streaming:
                    error = ErrorInfo(message=refusal.message, type=refusal.type, code=refusal.code)
                    await send({"type": "http.response.body", "more_body": False,
                                "body": (_sse({"error": error.model_dump()}) + "data: [DONE]\n\n").encode()})


class BearerAuthMiddleware(_HttpMiddleware):
    """--api-key: `Authorization: Bearer <key>` on PROTECTED_PATHS, else an OpenAI-style 401."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        super().__init__(app)
        self.expected = api_key.encode()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"].startswith(PROTECTED_PATHS):
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            # The scheme is case-insensitive (RFC 9110); the key is compared in constant time.
            if scheme.lower() != b"bearer" or not secrets.compare_digest(given.strip(), self.expected):
                refusal = APIError(401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' "
                                   "with the key given to --api-key", code="invalid_api_key")
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _json(result: Any) -> Response:
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(result.model_dump())

