"""`AsyncEngine`: the `LLMEngine` in one background thread, for an asyncio server.

Only the engine thread touches the engine: requests, aborts and reloads are queued as
commands it runs between steps, so a reload never overlaps a forward. Outputs go back to
each request's asyncio queue on the loop that asked for it.

On CPU the model's intra-op threads leave one core to the HTTP side: torch's OpenMP threads
spin while they wait for each other, and when one of them shares its core with the event
loop (or the eval client) every op stalls. On this project's 2-core machines a CPU server
with 2 threads ran the engine benchmark 8x slower than with 1 while other work ran.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable

import torch

from .llm_engine import LLMEngine
from .sampling_params import InvalidRequestError, RequestOutput, SamplingParams

logger = logging.getLogger("quantgate.engine")


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; the server cannot serve requests any more."""

    def __init__(self, message: str = "the engine has stopped; restart the server") -> None:
        super().__init__(message)


class RequestAborted(RuntimeError):
    """`AsyncEngine.abort` stopped the request; its stream ends with this."""


def default_cpu_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) - 1)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, cpu_threads: int | None = None) -> None:
        if engine.device.type == "cpu":
            torch.set_num_threads(cpu_threads or default_cpu_threads())
            logger.info("Engine uses %d CPU threads", torch.get_num_threads())
        self.engine = engine
        self._commands: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}  # running requests' streams, touched on the engine thread only
        self._stopping = False
        self._stopped = False  # the engine thread has ended: commands answer EngineDeadError (_submit)
        self._thread = threading.Thread(target=self._loop, name="quantgate-engine", daemon=True)
        self._thread.start()

    # -- API for the server (any thread / event loop)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Incremental outputs of one request; leaving early (client gone) aborts it."""
        if self._stopping or not self._thread.is_alive():
            raise EngineDeadError()
        # The stream is bound to the id and released on the engine thread, between steps: a
        # request reusing the id of one that just left never gets that one's outputs or abort.
        stream: _Stream = (asyncio.get_running_loop(), asyncio.Queue())
        self._submit(lambda: self._add(request_id, stream, prompt_token_ids, params))
        finished = False
        try:
            while not finished:
                item = await stream[1].get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._submit(lambda: self._release(request_id, stream, finished))

    def abort(self, request_id: str) -> None:
        """Stop a request; a consumer still reading its stream gets RequestAborted."""
        def command() -> None:
            if not self._stopped and self.engine.abort(request_id):
                self._deliver(request_id, RequestAborted(f"request {request_id!r} was aborted"))

        self._submit(command)

    async def reload_weights(self) -> None:
        """Re-read the weights between two steps; requests in flight continue with the new weights."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def reload() -> None:
            try:
                if self._stopped:
                    raise EngineDeadError()
                self.engine.loaded.reload_weights()
            except BaseException as exc:  # handed to the caller
                _call_soon(loop, _settle, done, exc)
            else:
                _call_soon(loop, _settle, done, None)

        self._submit(reload)
        await done

    def stats(self) -> dict:
        return self.engine.stats()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)

    # -- engine thread

    def _submit(self, command: Callable[[], None]) -> None:
        with self._lock:
            if not self._stopped:
                self._commands.append(command)
                self._wake.set()
                return
        command()  # stopped: every command only answers, thread-safely (EngineDeadError, or nothing)

    def _add(self, request_id: str, stream: _Stream, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if self._stopped:
            _put(stream, EngineDeadError())
            return
        if request_id in self._streams:  # the running request keeps its stream
            _put(stream, InvalidRequestError(f"request id {request_id!r} is already running; use a new id"))
            return
        try:
            self.engine.add_request(request_id, prompt_token_ids, params)
        except Exception as exc:  # e.g. InvalidRequestError: raised in the caller's generate()
            _put(stream, exc)
            return
        self._streams[request_id] = stream

    def _release(self, request_id: str, stream: _Stream, finished: bool) -> None:
        if not self._stopped and self._streams.get(request_id) is stream:
            del self._streams[request_id]
            if not finished:
                self.engine.abort(request_id)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            _put(stream, item)

    def _loop(self) -> None:
        try:
            self._serve()
        finally:  # stopped, or the thread failed: no stream may wait for an answer that never comes
            with self._lock:
                self._stopped = True
                commands, self._commands = self._commands, []
            for command in commands:
                command()
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDeadError())
            self._streams.clear()

    def _serve(self) -> None:
        while not self._stopping:
            with self._lock:
                commands, self._commands = self._commands, []
            for command in commands:
                command()
            if not self.engine.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            in_step = set(self.engine.request_ids())
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step fails its requests, not the server
                logger.exception("engine step failed")
                self._fail_all(exc, in_step)
                continue
            for out in outputs:
                self._deliver(out.request_id, out)

    def _fail_all(self, exc: Exception, in_step: set[str]) -> None:
        # A request that finished inside the failed step is gone from the engine, and its last
        # output with the step's: it is failed too, or its stream would wait forever.
        for request_id in in_step | set(self.engine.request_ids()):
            self.engine.abort(request_id)
            self._deliver(request_id, RuntimeError(f"engine step failed: {type(exc).__name__}: {exc}"))


_Stream = tuple[asyncio.AbstractEventLoop, asyncio.Queue]


def _put(stream: _Stream, item: RequestOutput | BaseException) -> None:
    loop, queue = stream
    _call_soon(loop, queue.put_nowait, item)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop has closed: its consumer is gone, and must not take the engine thread along
        pass


def _settle(future: asyncio.Future, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
