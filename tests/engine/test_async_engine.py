"""AsyncEngine: streaming, concurrency from asyncio, abort on early exit, errors, reload between steps."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import torch

from quantgate.engine import (AsyncEngine, EngineDeadError, InvalidRequestError, LLMEngine, RequestAborted,
                              SamplingParams, load_model)
from quantgate.engine.async_engine import default_cpu_threads


@pytest.fixture
def async_engine(dense_dir):
    engine = AsyncEngine(LLMEngine(load_model(dense_dir, device="cpu"), max_num_seqs=4, max_model_len=128))
    yield engine
    engine.shutdown()


async def _collect(engine: AsyncEngine, request_id: str, prompt: list[int], params: SamplingParams) -> list:
    return [out async for out in engine.generate(request_id, prompt, params)]


def test_concurrent_streams_match_the_synchronous_engine(async_engine, dense_engine):
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]  # one more than the 4 slots

    async def main():
        # bounded: a stream that never ends after its last output fails here, not at the suite's timeout
        return await asyncio.wait_for(asyncio.gather(
            *(_collect(async_engine, f"r{i}", p, params) for i, p in enumerate(prompts))), timeout=60)

    streams = asyncio.run(main())
    for i, (p, outs) in enumerate(zip(prompts, streams)):
        assert [len(o.new_token_ids) for o in outs] == [1] * 8 and outs[-1].finished
        dense_engine.add_request(f"s{i}", p, params)
        expected = []
        while dense_engine.has_unfinished():
            expected += [t for o in dense_engine.step() for t in o.new_token_ids]
        assert [t for o in outs for t in o.new_token_ids] == expected


def test_leaving_a_stream_early_aborts_the_request(async_engine, monkeypatch):
    # 100 steps now take over 2 s: a request left running would outlast the wait below
    step = async_engine.engine.step
    monkeypatch.setattr(async_engine.engine, "step", lambda: (time.sleep(0.02), step())[1])

    async def main():
        stream = async_engine.generate("early", [1, 2, 3], SamplingParams(max_tokens=100, temperature=0,
                                                                          ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(100):  # the abort is a command the engine thread runs before its next step
            if not async_engine.stats()["num_running"]:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())
    stats = async_engine.stats()
    assert stats["kv_slots_used"] == 0 and stats["num_generated_tokens"] < 100


def test_invalid_requests_raise_in_the_caller_and_the_engine_keeps_serving(async_engine):
    async def main():
        with pytest.raises(InvalidRequestError, match="maximum context length"):
            await _collect(async_engine, "long", [1] * 200, SamplingParams(max_tokens=1))
        return await _collect(async_engine, "ok", [1, 2], SamplingParams(max_tokens=2, temperature=0))

    assert asyncio.run(main())[-1].finished


def test_reload_runs_between_steps_while_requests_stream(async_engine):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)

    async def main():
        task = asyncio.create_task(_collect(async_engine, "during", [1, 2, 3], params))
        await async_engine.reload_weights()  # same files: the stream must be unaffected
        return await task

    outs = asyncio.run(main())
    assert sum(len(o.new_token_ids) for o in outs) == 30 and outs[-1].finish_reason == "length"


def _fail_step(async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
    """The engine's step number `failing` (1-based) raises "device fell over"; the others run."""
    step = async_engine.engine.step
    calls = []

    def broken():
        calls.append(1)
        if len(calls) == failing:
            raise RuntimeError("device fell over")
        return step()

    monkeypatch.setattr(async_engine.engine, "step", broken)


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving(async_engine, monkeypatch):
    _fail_step(async_engine, monkeypatch, 1)

    async def main():
        with pytest.raises(RuntimeError, match="engine step failed: RuntimeError: device fell over"):
            await _collect(async_engine, "unlucky", [1, 2, 3], SamplingParams(max_tokens=4))
        return await _collect(async_engine, "next", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))

    assert asyncio.run(main())[-1].finished
    assert async_engine.stats()["kv_slots_used"] == 0


def _long() -> SamplingParams:
    return SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)


def test_abort_ends_the_stream_of_a_request_still_being_read(async_engine):
    async def main():
        stream = async_engine.generate("r1", [1, 2, 3], _long())
        await stream.__anext__()
        async_engine.abort("r1")
        with pytest.raises(RequestAborted, match="'r1' was aborted"):
            await asyncio.wait_for(_drain(stream), timeout=10)

    asyncio.run(main())
    assert async_engine.stats()["kv_slots_used"] == 0


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def test_a_duplicate_request_id_is_refused_and_the_first_request_keeps_its_stream(async_engine):
    async def main():
        first = asyncio.ensure_future(_collect(async_engine, "dup", [1, 2, 3], SamplingParams(
            max_tokens=40, temperature=0, ignore_eos=True)))
        await asyncio.sleep(0)  # the first registers its stream
        with pytest.raises(InvalidRequestError, match="'dup' is already running; use a new id"):
            await _collect(async_engine, "dup", [4, 5], SamplingParams(max_tokens=2))
        return await asyncio.wait_for(first, timeout=30)

    outs = asyncio.run(main())
    assert outs[-1].finished and sum(len(o.new_token_ids) for o in outs) == 40


def test_a_request_that_finished_inside_a_failed_step_is_failed_not_left_waiting(async_engine, monkeypatch):
    step = async_engine.engine.step

    def finish_then_fail():
        outputs = step()  # the short request finishes here, then the step fails: its output is lost
        if any(o.request_id == "short" and o.finished for o in outputs):
            raise RuntimeError("failed after finishing 'short'")
        return outputs

    monkeypatch.setattr(async_engine.engine, "step", finish_then_fail)

    async def main():
        return await asyncio.wait_for(asyncio.gather(
            _collect(async_engine, "short", [1, 2], SamplingParams(max_tokens=1, temperature=0)),
            _collect(async_engine, "long", [3, 4], _long()), return_exceptions=True), timeout=30)

    short, long = asyncio.run(main())
    assert isinstance(short, RuntimeError) and "failed after finishing 'short'" in str(short)
    assert isinstance(long, RuntimeError)


def test_an_abort_of_a_request_that_left_never_reaches_a_new_request_of_the_same_id(async_engine):
    async def main():
        stream = async_engine.generate("x", [1, 2, 3], _long())
        await stream.__anext__()
        await stream.aclose()  # the consumer left: its abort is queued for the engine thread
        return await asyncio.wait_for(_collect(async_engine, "x", [4, 5], SamplingParams(
            max_tokens=3, temperature=0, ignore_eos=True)), timeout=30)

    outs = asyncio.run(main())
    assert outs[-1].finished and sum(len(o.new_token_ids) for o in outs) == 3


def test_a_consumer_whose_event_loop_closed_does_not_take_the_engine_thread_along(async_engine, monkeypatch):
    """Its stream is released on the engine thread, later: a delivery to the closed loop must not
    raise there, or every other stream would wait forever."""
    step = async_engine.engine.step
    monkeypatch.setattr(async_engine.engine, "step", lambda: (time.sleep(0.02), step())[1])

    async def leave_early():
        stream = async_engine.generate("gone", [1, 2, 3], _long())
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(leave_early())  # returns, closing its loop, while "gone" still runs
    outs = asyncio.run(asyncio.wait_for(_collect(async_engine, "stays", [4, 5], SamplingParams(
        max_tokens=20, temperature=0, ignore_eos=True)), timeout=30))
    assert outs[-1].finished and async_engine._thread.is_alive()


def test_streams_waiting_when_the_engine_stops_get_an_error_not_silence(async_engine):
    async def main():
        stream = async_engine.generate("r", [1, 2, 3], _long())
        await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, async_engine.shutdown)
        with pytest.raises(EngineDeadError, match="the engine has stopped"):
            await asyncio.wait_for(_drain(stream), timeout=10)
        with pytest.raises(EngineDeadError):
            await _collect(async_engine, "late", [1], SamplingParams(max_tokens=1))
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(async_engine.reload_weights(), timeout=10)

    asyncio.run(main())


def test_shutting_down_an_idle_engine_stops_its_thread_at_once(async_engine):
    """The idle thread sleeps until woken: shutdown must wake it, not wait out its join timeout."""
    start = time.monotonic()
    async_engine.shutdown()
    assert not async_engine._thread.is_alive() and time.monotonic() - start < 5


def test_an_unexpected_error_adding_a_request_fails_only_that_request(async_engine, monkeypatch):
    add_request = async_engine.engine.add_request

    def broken_for_bad(request_id, prompt, params):
        if request_id == "bad":
            raise RuntimeError("no memory for this one")
        add_request(request_id, prompt, params)

    monkeypatch.setattr(async_engine.engine, "add_request", broken_for_bad)

    async def main():
        with pytest.raises(RuntimeError, match="no memory for this one"):
            await asyncio.wait_for(_collect(async_engine, "bad", [1, 2], SamplingParams(max_tokens=2)), timeout=10)
        return await asyncio.wait_for(_collect(async_engine, "good", [1, 2], SamplingParams(
            max_tokens=2, temperature=0, ignore_eos=True)), timeout=30)

    assert asyncio.run(main())[-1].finished


def test_requests_and_reloads_queued_when_the_engine_stops_get_an_error_not_silence(async_engine, monkeypatch):
    """Commands queued behind a step in flight when shutdown comes are answered, not dropped."""
    step = async_engine.engine.step
    in_step, hold = threading.Event(), threading.Event()

    def held_step():
        if hold.is_set():
            in_step.set()
            while not async_engine._stopping:  # the step outlasts the shutdown request
                time.sleep(0.01)
        return step()

    monkeypatch.setattr(async_engine.engine, "step", held_step)

    async def main():
        running = async_engine.generate("running", [1, 2, 3], _long())
        await running.__anext__()
        hold.set()
        assert await asyncio.get_running_loop().run_in_executor(None, in_step.wait, 10)
        late = asyncio.ensure_future(_collect(async_engine, "late", [4, 5], SamplingParams(max_tokens=2)))
        reload = asyncio.ensure_future(async_engine.reload_weights())
        await asyncio.sleep(0.05)  # both are queued behind the step
        await asyncio.get_running_loop().run_in_executor(None, async_engine.shutdown)
        results = await asyncio.wait_for(asyncio.gather(late, reload, _drain(running), return_exceptions=True),
                                         timeout=10)
        return [type(r) for r in results]

    assert asyncio.run(main()) == [EngineDeadError] * 3


def test_a_failed_request_leaves_the_engine_at_once(async_engine, monkeypatch):
    """Its consumer is gone with the error: the request must not run on, holding a slot, to max_tokens."""
    _fail_step(async_engine, monkeypatch, 2)

    async def main():
        with pytest.raises(RuntimeError, match="device fell over"):
            await asyncio.wait_for(_collect(async_engine, "unlucky", [1, 2, 3], _long()), timeout=10)
        return async_engine.stats()  # read before the engine could finish 100 tokens

    stats = asyncio.run(main())
    assert stats["num_running"] == stats["num_waiting"] == stats["kv_slots_used"] == 0


def test_the_engine_leaves_one_cpu_core_to_the_http_side_unless_told(dense_dir, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert default_cpu_threads() == 3
    threads = torch.get_num_threads()
    try:
        AsyncEngine(LLMEngine(load_model(dense_dir, device="cpu"), max_num_seqs=1, max_model_len=16),
                    cpu_threads=2).shutdown()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert default_cpu_threads() == 1
