"""The OpenAI HTTP surface (engine/server.py) in-process, on a real tiny Qwen3 through the
engine: shapes an OpenAI client relies on, logprobs against a float64 reference, streaming,
/v1/kernels, /metrics, --api-key, and every class of bad input answered with a 4xx."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from quantgate.engine import AsyncEngine, EngineDeadError, InvalidRequestError, LLMEngine, load_model
from quantgate.engine.server import ServerSettings, build_app

from .tiny_models import write_model

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "models" / "data" / "tokenizer-v1"
MAX_MODEL_LEN = 96
VOCAB_SIZE = 960  # the shipped tokenizer's
NAME = "tiny"


def build_tiny_qwen3(path: Path, seed: int = 0, max_position_embeddings: int = 256) -> Path:
    """The engine tests' random float32 Qwen3, with the shipped tokenizer and its chat template."""
    write_model(path, seed=seed, vocab_size=VOCAB_SIZE, max_position_embeddings=max_position_embeddings)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, path / name)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    loaded = load_model(tiny_model, device="cpu", dtype="float32")
    async_engine = AsyncEngine(LLMEngine(loaded, max_num_seqs=8, max_model_len=MAX_MODEL_LEN, enforce_eager=True,
                                         seed=0))
    yield loaded, async_engine
    async_engine.shutdown()


def make_client(engine, api_key: str | None = None) -> TestClient:
    loaded, async_engine = engine
    settings = ServerSettings(served_model_names=(NAME, "alias"), max_model_len=MAX_MODEL_LEN, api_key=api_key)
    return TestClient(build_app(async_engine, loaded, settings))


@pytest.fixture(scope="module")
def client(engine):
    with make_client(engine) as c:
        yield c


def complete(client: TestClient, **body) -> dict:
    response = client.post("/v1/completions", json={"model": NAME, **body})
    assert response.status_code == 200, response.text
    return response.json()


def sse_events(response: httpx.Response) -> list[dict | str]:
    """The data payloads of a server-sent event stream, [DONE] kept as a string."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ---- basic endpoints --------------------------------------------------------------------------------


def test_health_and_models(client: TestClient, tiny_model: Path) -> None:
    assert client.get("/health").status_code == 200
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [NAME, "alias"]
    assert body["data"][0]["root"] == str(tiny_model.resolve())  # resolved: --server-url compares folders
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_models_root_is_the_resolved_folder_for_a_relative_path(engine, tiny_model: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # --server-url compares this root with a config's model folder: `quantgate serve models/x` must
    # report the folder, not the relative path it was given.
    loaded, async_engine = engine
    monkeypatch.chdir(tiny_model.parent)
    relative = dataclasses.replace(loaded, path=Path(tiny_model.name))
    with make_client((relative, async_engine)) as c:
        assert c.get("/v1/models").json()["data"][0]["root"] == str(tiny_model.resolve())


def test_completion_shape_and_usage(client: TestClient) -> None:
    body = complete(client, prompt="Question: 2 + 3 =", max_tokens=5, temperature=0)
    assert body["object"] == "text_completion" and body["model"] == NAME and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str) and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["completion_tokens"] <= 5 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 5


def test_neutral_extension_values_are_accepted(client: TestClient) -> None:
    body = complete(client, prompt="a", max_tokens=2, temperature=0, top_k=-1, min_p=0.0, repetition_penalty=1.0,
                    min_tokens=0, user="ci", presence_penalty=0.0)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "echo": False, "tools": [],
        "tool_choice": "none", "continue_final_message": False, "top_k": 0, "response_format": {"type": "text"}})
    assert chat.status_code == 200, chat.text


def test_alias_name_and_missing_model_are_accepted(client: TestClient) -> None:
    for model in ("alias", None):
        response = client.post("/v1/completions", json={"model": model, "prompt": "a", "max_tokens": 1})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == NAME


def test_greedy_is_deterministic_and_batch_independent(client: TestClient) -> None:
    prompts = ["Ava has 3 apples.", "Ben buys 12 pens and", "1 2 3 4"]
    alone = [complete(client, prompt=p, max_tokens=8, temperature=0, logprobs=0)["choices"][0] for p in prompts]
    together = complete(client, prompt=prompts, max_tokens=8, temperature=0, logprobs=0)["choices"]
    assert [c["index"] for c in together] == [0, 1, 2]
    assert [c["text"] for c in together] == [c["text"] for c in alone]
    assert [c["logprobs"]["tokens"] for c in together] == [c["logprobs"]["tokens"] for c in alone]


def test_token_id_prompts_equal_text_prompts(client: TestClient, engine) -> None:
    tokenizer = engine[0].tokenizer
    text = "Grace walks 4 miles"
    ids = tokenizer.encode(text).ids
    by_text = complete(client, prompt=text, max_tokens=6, temperature=0)["choices"][0]["text"]
    by_ids = complete(client, prompt=ids, max_tokens=6, temperature=0)["choices"][0]["text"]
    by_batch = complete(client, prompt=[ids, ids], max_tokens=6, temperature=0)["choices"]
    assert by_text == by_ids == by_batch[0]["text"] == by_batch[1]["text"]


def test_seeded_sampling_repeats(client: TestClient) -> None:
    runs = [complete(client, prompt="Tara", max_tokens=8, temperature=1.0, top_p=0.9, seed=1234)
            for _ in range(2)]
    assert runs[0]["choices"][0]["text"] == runs[1]["choices"][0]["text"]


def test_tiny_temperatures_do_not_break_the_batch(client: TestClient) -> None:
    """A denormal temperature overflows logits / T; it must behave as greedy, and it must not
    fail the other requests stepping in the same batch."""
    greedy = complete(client, prompt="Sam", max_tokens=4, temperature=0)["choices"][0]["text"]

    async def together() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await asyncio.gather(*(
                http.post("/v1/completions", json={"prompt": "Sam", "max_tokens": 4, "temperature": t})
                for t in (1e-300, 5e-324, 0.0, 1.0)))

    responses = client.portal.call(together)
    assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
    assert [r.json()["choices"][0]["text"] for r in responses[:3]] == [greedy] * 3


def test_stop_string_cuts_the_text(client: TestClient) -> None:
    free = complete(client, prompt="Maya counts", max_tokens=12, temperature=0)["choices"][0]["text"]
    candidates = [free[i:i + 2] for i in range(1, len(free) - 2) if free[i:i + 2].strip()]
    if not candidates:
        pytest.skip(f"the random model's greedy text {free!r} has no usable stop string")
    stop = candidates[0]
    cut = complete(client, prompt="Maya counts", max_tokens=12, temperature=0, stop=[stop])["choices"][0]
    assert cut["text"] == free[: free.index(stop)]
    assert cut["finish_reason"] == "stop"


# ---- logprobs and echo ------------------------------------------------------------------------------


def reference_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """log p(token_i | tokens_<i) for i >= 1, from transformers in float64."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits, dim=-1)
    return logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_echo_logprobs_match_float64_reference(client: TestClient, tiny_model: Path, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    n = int(torch.randint(5, 40, (1,), generator=generator))
    ids = torch.randint(1, VOCAB_SIZE, (n,), generator=generator).tolist()
    body = complete(client, prompt=ids, max_tokens=1, temperature=0, logprobs=2, echo=True)
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    got = torch.tensor(lp["token_logprobs"][1:n], dtype=torch.float64)
    want = reference_logprobs(tiny_model, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4)
    # The generated token is greedy: its logprob is the best of its alternatives (lm-eval's is_greedy).
    last = lp["top_logprobs"][-1]
    assert 1 <= len(last) <= 3 and math.isclose(lp["token_logprobs"][-1], max(last.values()), abs_tol=1e-6)


def test_logprobs_shapes_and_offsets(client: TestClient) -> None:
    prompt = "Hugo reads 25 pages"
    body = complete(client, prompt=prompt, max_tokens=4, temperature=0, logprobs=3, echo=True)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(prompt)
    if not any("\ufffd" in token for token in lp["tokens"]):  # a token inside a UTF-8 character has no text alone
        assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    for value, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
        assert value <= 0 and all(v <= 0 for v in top.values()) and 1 <= len(top) <= 4
    plain = complete(client, prompt=prompt, max_tokens=4, temperature=0, logprobs=0)["choices"][0]
    assert plain["text"] == choice["text"][len(prompt):]
    assert len(plain["logprobs"]["tokens"]) == body["usage"]["completion_tokens"]


def test_echo_with_max_tokens_0_returns_the_scored_prompt_and_generates_nothing(client: TestClient) -> None:
    """OpenAI's (and vLLM's) scoring call: the prompt and its logprobs, nothing generated."""
    prompts = ["Hugo reads 25 pages", "Ava has 3 apples."]
    scored = complete(client, prompt=prompts, max_tokens=0, temperature=0, logprobs=2, echo=True)
    usage = scored["usage"]
    assert usage["completion_tokens"] == 0 and usage["total_tokens"] == usage["prompt_tokens"]
    for prompt, choice in zip(prompts, scored["choices"], strict=True):
        assert choice["text"] == prompt and choice["finish_reason"] == "length"
        lp = choice["logprobs"]
        one = complete(client, prompt=prompt, max_tokens=1, temperature=0, logprobs=2, echo=True)
        want = one["choices"][0]["logprobs"]
        n = one["usage"]["prompt_tokens"]
        assert lp["tokens"] == want["tokens"][:n] and lp["text_offset"] == want["text_offset"][:n]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:] == pytest.approx(want["token_logprobs"][1:n], abs=1e-5)
    bare = complete(client, prompt=prompts[0], max_tokens=0, echo=True)
    assert bare["choices"][0]["text"] == prompts[0] and bare["choices"][0]["logprobs"] is None

    streamed = client.post("/v1/completions", json={"prompt": prompts[0], "max_tokens": 0, "echo": True,
                                                    "logprobs": 2, "temperature": 0, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    assert streamed.status_code == 200, streamed.text
    *chunks, usage_chunk, done = sse_events(streamed)
    assert done == "[DONE]" and usage_chunk["usage"]["completion_tokens"] == 0
    (chunk,) = chunks
    (choice,) = chunk["choices"]
    first = scored["choices"][0]
    assert choice["text"] == prompts[0] and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == first["logprobs"]["tokens"]


def test_max_tokens_0_needs_echo_and_only_the_prompt_to_fit(client: TestClient) -> None:
    refused = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    assert "max_tokens 0 needs echo: true" in refused.json()["error"]["message"]
    full = complete(client, prompt=[5] * MAX_MODEL_LEN, max_tokens=0, echo=True, logprobs=1)
    assert full["usage"] == {"prompt_tokens": MAX_MODEL_LEN, "completion_tokens": 0, "total_tokens": MAX_MODEL_LEN}
    assert len(full["choices"][0]["logprobs"]["token_logprobs"]) == MAX_MODEL_LEN
    over = client.post("/v1/completions", json={"prompt": [5] * (MAX_MODEL_LEN + 1), "max_tokens": 0, "echo": True})
    assert over.status_code == 400
    assert (f"you requested {MAX_MODEL_LEN + 1} tokens ({MAX_MODEL_LEN + 1} in the prompt, 0 for the completion)"
            in over.json()["error"]["message"])


# ---- chat -------------------------------------------------------------------------------------------


def test_chat_template_renders_as_transformers_does(client: TestClient, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3 + 3?"}]
    want = AutoTokenizer.from_pretrained(tiny_model).apply_chat_template(messages, tokenize=False,
                                                                          add_generation_prompt=True)
    got = client.app.state.server.chat_template.render(messages, add_generation_prompt=True)
    assert got == want


def test_chat_equals_completion_of_the_rendered_template(client: TestClient, engine) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 + 5?"}]
    chat = client.post("/v1/chat/completions", json={"model": NAME, "messages": messages, "max_tokens": 6,
                                                     "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    rendered = client.app.state.server.chat_template.render(messages, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    prompt_ids = engine[0].tokenizer.encode(rendered, add_special_tokens=False).ids
    plain = complete(client, prompt=prompt_ids, max_tokens=6, temperature=0)
    assert choice["message"]["content"] == plain["choices"][0]["text"]
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    content = choice["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 2 and entry["bytes"] == list(entry["token"].encode())
        assert math.isclose(entry["logprob"], max(t["logprob"] for t in entry["top_logprobs"]), abs_tol=1e-6)


def test_chat_content_parts_and_max_completion_tokens(client: TestClient) -> None:
    as_text = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hello\nthere"}], "max_completion_tokens": 3, "temperature": 0})
    as_parts = client.post("/v1/chat/completions", json={  # vLLM joins text parts with newlines
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"},
                                                  {"type": "text", "text": "there"}]}],
        "max_tokens": 3, "temperature": 0})
    assert as_text.status_code == as_parts.status_code == 200
    assert as_text.json()["choices"][0]["message"] == as_parts.json()["choices"][0]["message"]
    assert as_text.json()["usage"]["prompt_tokens"] == as_parts.json()["usage"]["prompt_tokens"]
    assert as_text.json()["usage"]["completion_tokens"] <= 3
    both = client.post("/v1/chat/completions", json={  # as OpenAI and vLLM: max_completion_tokens wins
        "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2, "max_tokens": 6,
        "temperature": 0, "ignore_eos": True})
    assert both.status_code == 200 and both.json()["usage"]["completion_tokens"] == 2


# ---- streaming --------------------------------------------------------------------------------------


def test_completion_stream_equals_the_whole_answer(client: TestClient) -> None:
    request = {"model": NAME, "prompt": ["Olga", "Pedro has"], "max_tokens": 7, "temperature": 0, "logprobs": 1,
               "echo": True}
    whole = client.post("/v1/completions", json=request).json()
    streamed = client.post("/v1/completions", json={**request, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert sum((c["logprobs"]["tokens"] for c in mine), []) == choice["logprobs"]["tokens"]
        assert sum((c["logprobs"]["text_offset"] for c in mine), []) == choice["logprobs"]["text_offset"]
        assert [c["finish_reason"] for c in mine][-1] == choice["finish_reason"]
        assert all(c["finish_reason"] is None for c in mine[:-1])
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)


def test_chat_stream_equals_the_whole_answer(client: TestClient) -> None:
    request = {"messages": [{"role": "user", "content": "Count: 1 2 3"}], "max_tokens": 6, "temperature": 0}
    whole = client.post("/v1/chat/completions", json=request).json()["choices"][0]
    events = sse_events(client.post("/v1/chat/completions", json={**request, "stream": True}))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]


def serve_outputs(monkeypatch: pytest.MonkeyPatch, engine, steps: list[tuple[int, str, float]]) -> None:
    """The engine answers every request with these (token, text, logprob) steps, each token its
    own top alternative."""
    from quantgate.engine import RequestOutput

    async def generate(request_id, prompt_token_ids, params):
        for n, (token, text, lp) in enumerate(steps, 1):
            finished = n == len(steps)
            yield RequestOutput(request_id=request_id, new_token_ids=[token], new_text=text, token_logprobs=[lp],
                                top_logprobs=[{token: lp}], prompt_logprobs=None, finished=finished,
                                finish_reason="length" if finished else None,
                                num_prompt_tokens=len(prompt_token_ids), num_generated_tokens=n)

    monkeypatch.setattr(engine[1], "generate", generate)


def test_a_chat_stream_carries_the_logprobs_of_a_token_without_text_yet(client: TestClient, engine,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The first byte of "é" has no text alone: its logprob still comes, in a chunk of no content."""
    tokenizer = engine[0].tokenizer
    serve_outputs(monkeypatch, engine, [(tokenizer.token_to_id("Ã"), "", -1.0), (tokenizer.token_to_id("©"), "é", -0.5)])
    request = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    events = sse_events(client.post("/v1/chat/completions", json={**request, "stream": True}))
    streamed = [entry for event in events[:-1] for choice in event["choices"]
                for entry in (choice.get("logprobs") or {}).get("content", [])]
    whole = client.post("/v1/chat/completions", json=request).json()["choices"][0]
    assert whole["message"]["content"] == "é"
    assert streamed == whole["logprobs"]["content"] and [e["logprob"] for e in streamed] == [-1.0, -0.5]


def test_a_token_of_probability_zero_gets_a_finite_logprob(client: TestClient, engine,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """JSON has no -Infinity: the most negative float stands for it, and the answer stays a 200."""
    serve_outputs(monkeypatch, engine, [(5, "x", -math.inf)])
    completion = complete(client, prompt="a", logprobs=1)["choices"][0]["logprobs"]
    assert completion["token_logprobs"] == [-3.4e38] and list(completion["top_logprobs"][0].values()) == [-3.4e38]
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                     "logprobs": True, "top_logprobs": 1})
    assert chat.status_code == 200, chat.text
    (entry,) = chat.json()["choices"][0]["logprobs"]["content"]
    assert entry["logprob"] == entry["top_logprobs"][0]["logprob"] == -3.4e38


# ---- kernels, reload, metrics, auth -------------------------------------------------------------------


def test_tokenizer_endpoints(client: TestClient, engine) -> None:
    tokenizer = engine[0].tokenizer
    text = "Zane has 14 marbles."
    tokens = client.post("/tokenize", json={"prompt": text}).json()
    assert tokens["tokens"] == tokenizer.encode(text).ids and tokens["count"] == len(tokens["tokens"])
    assert tokens["max_model_len"] == MAX_MODEL_LEN
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": text}
    messages = [{"role": "user", "content": "hi"}]
    chat = client.post("/tokenize", json={"messages": messages}).json()
    usage = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|endoftext|>" and info["bos_token"] is None
    assert "<|im_start|>" in info["chat_template"] and info["model_max_length"] == MAX_MODEL_LEN
    assert_openai_error(client.post("/detokenize", json={"tokens": [VOCAB_SIZE]}), 400, "tokens")
    assert_openai_error(client.post("/tokenize", json={"prompt": "a", "messages": messages}), 400, "messages")
    assert_openai_error(client.post("/tokenize", json={}), 400, "messages")
    assert_openai_error(client.post("/tokenize", json={"messages": []}), 400, "messages")  # was a 500
    assert_openai_error(client.post("/tokenize", json={"prompt": "a", "model": "x"}), 404, "model")


def test_kernels_report_shape(client: TestClient, tiny_model: Path, tmp_path: Path) -> None:
    from quantgate.kernels import Scheme

    from .tiny_models import quantize_folder

    body = client.get("/v1/kernels").json()
    assert body["platform"]["device"] == "cpu"
    modules = body["modules"]
    assert "lm_head" in modules and any(name.endswith("self_attn.qkv_proj") for name in modules)
    for entry in modules.values():
        assert entry["layer"] in ("linear", "moe")
        assert {"scheme", "kernel", "backend", "rejected"} <= set(entry)
        assert all({"kernel", "reason"} <= set(r) for r in entry["rejected"])
    # An FP8 block checkpoint on CPU: its quantized layers name the GPU kernels they could not use.
    fp8 = quantize_folder(tiny_model, tmp_path / "fp8-block", Scheme.FP8_BLOCK, "fp8")
    loaded = load_model(fp8, device="cpu", dtype="float32")
    async_engine = AsyncEngine(LLMEngine(loaded, max_num_seqs=2, max_model_len=64, enforce_eager=True))
    try:
        with make_client((loaded, async_engine)) as c:
            modules = c.get("/v1/kernels").json()["modules"]
    finally:
        async_engine.shutdown()
    down = modules["model.layers.0.mlp.down_proj"]
    assert (down["scheme"], down["kernel"]) == ("fp8-block", "EmulationLinearKernel")
    rejected = {r["kernel"]: r["reason"] for r in down["rejected"]}
    assert set(rejected) == {"TorchBlockScaledMMLinearKernel", "TritonBlockFp8LinearKernel", "MarlinFp8LinearKernel"}
    marlin = rejected["MarlinFp8LinearKernel"]
    assert marlin.startswith("requires CUDA") and marlin.endswith("this is cpu")
    assert modules["lm_head"]["scheme"] == "unquantized" and modules["lm_head"]["rejected"] == []


def test_a_folder_without_a_tokenizer_serves_token_ids_and_says_so_for_text(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "untokenized"
    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns("tokenizer*"))
    loaded = load_model(folder, device="cpu", dtype="float32")
    async_engine = AsyncEngine(LLMEngine(loaded, max_num_seqs=2, max_model_len=64, enforce_eager=True))
    try:
        with make_client((loaded, async_engine)) as c:
            for stream in (False, True):
                text = c.post("/v1/completions", json={"prompt": "hi", "stream": stream})
                assert_openai_error(text, 400, "prompt")
                assert "no tokenizer" in text.json()["error"]["message"]
                assert "send the prompt as token ids" in text.json()["error"]["message"]
                stop = c.post("/v1/completions", json={"prompt": [5, 6], "stop": ["x"], "stream": stream})
                assert_openai_error(stop, 400, "stop")  # refused before a stream starts, as every bad request
                assert "send stop_token_ids instead" in stop.json()["error"]["message"]
            chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            assert_openai_error(chat, 400, "messages")  # the folder has no tokenizer_config.json either
            assert "has no chat template" in chat.json()["error"]["message"]
            ids = complete(c, prompt=[5, 6, 7], max_tokens=2, temperature=0, logprobs=0, ignore_eos=True)
            assert ids["choices"][0]["logprobs"]["tokens"][0].startswith("token_id:")
    finally:
        async_engine.shutdown()


def test_reload_weights_keeps_answers(client: TestClient) -> None:
    before = complete(client, prompt="Quinn", max_tokens=5, temperature=0)["choices"][0]["text"]
    response = client.post("/v1/reload_weights")
    assert response.status_code == 200 and response.json()["status"] == "ok"
    assert complete(client, prompt="Quinn", max_tokens=5, temperature=0)["choices"][0]["text"] == before


@contextlib.contextmanager
def _served_from_a_folder(tmp_path: Path) -> Iterator[tuple[Path, Any, TestClient]]:
    """A float32 tiny model served from a folder the test may rewrite before a reload: (folder,
    loaded model, client)."""
    model = build_tiny_qwen3(tmp_path / "model")
    loaded = load_model(model, device="cpu", dtype="float32")
    async_engine = AsyncEngine(LLMEngine(loaded, max_num_seqs=2, max_model_len=64, enforce_eager=True))
    try:
        with make_client((loaded, async_engine)) as c:
            yield model, loaded, c
    finally:
        async_engine.shutdown()


def test_reload_from_a_changed_checkpoint_is_a_conflict(tmp_path: Path) -> None:
    with _served_from_a_folder(tmp_path) as (model, _, c):
        original = (model / "model.safetensors").read_bytes()
        before = complete(c, prompt="Vera", max_tokens=4, temperature=0)["choices"][0]["text"]
        from transformers import Qwen3Config, Qwen3ForCausalLM

        wider = Qwen3Config.from_pretrained(model)
        wider.intermediate_size = 192  # same tensor names, other shapes
        Qwen3ForCausalLM(wider).save_pretrained(tmp_path / "wider")
        shutil.copy(tmp_path / "wider" / "model.safetensors", model / "model.safetensors")
        response = c.post("/v1/reload_weights")
        assert response.status_code == 409, response.text
        assert "does not match" in response.json()["error"]["message"]
        (model / "model.safetensors").write_bytes(original[: len(original) // 2])  # a torn copy
        response = c.post("/v1/reload_weights")
        assert response.status_code == 409 and response.json()["error"]["code"] == "reload_failed", response.text
        (model / "model.safetensors").write_bytes(original)
        assert c.post("/v1/reload_weights").status_code == 200
        assert complete(c, prompt="Vera", max_tokens=4, temperature=0)["choices"][0]["text"] == before


def test_a_reload_after_config_json_changed_says_to_restart_not_to_fix_the_checkpoint(tmp_path: Path) -> None:
    with _served_from_a_folder(tmp_path) as (model, _, c):
        config = json.loads((model / "config.json").read_text())
        flipped = dict(config, tie_word_embeddings=not config["tie_word_embeddings"])
        (model / "config.json").write_text(json.dumps(flipped))
        response = c.post("/v1/reload_weights")
        message = response.json()["error"]["message"]
        assert response.status_code == 409 and response.json()["error"]["code"] == "reload_failed", response.text
        assert "the checkpoint's config changed since the server started (tie_word_embeddings: " in message
        assert "restart the server to serve the new format" in message and "fix the checkpoint" not in message
        assert message.endswith("The served weights are unchanged")
        (model / "config.json").write_text(json.dumps(config))
        assert c.post("/v1/reload_weights").status_code == 200


def test_a_reload_refused_for_the_checkpoint_keeps_serving_the_old_weights(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file, save_file

    from quantgate.engine.checkpoint import INDEX

    from .test_config import deny_reading

    with _served_from_a_folder(tmp_path) as (model, _, c):
        original = (model / "model.safetensors").read_bytes()
        before = complete(c, prompt="Vera", max_tokens=4, temperature=0)["choices"][0]["text"]
        tensors = load_file(str(model / "model.safetensors"))
        # new values everywhere (a half-done reload would show), and a layer config.json does not have
        changed = {name: -t for name, t in tensors.items()}
        changed.update({n.replace(".1.", ".2.", 1): t for n, t in tensors.items() if n.startswith("model.layers.1.")})
        save_file(changed, str(model / "model.safetensors"))
        response = c.post("/v1/reload_weights")
        assert response.status_code == 409, response.text
        message = response.json()["error"]["message"]
        assert "the checkpoint has tensors of layers 2" in message and "The served weights are unchanged" in message
        assert complete(c, prompt="Vera", max_tokens=4, temperature=0)["choices"][0]["text"] == before
        (model / "model.safetensors").write_bytes(original)
        (model / INDEX).write_text(json.dumps({"weight_map": {name: "model.safetensors" for name in tensors}}))
        deny_reading(monkeypatch, INDEX)
        response = c.post("/v1/reload_weights")
        assert response.status_code == 409, response.text
        assert f"{model / INDEX} cannot be read (permission denied" in response.json()["error"]["message"]
        monkeypatch.undo()
        assert c.post("/v1/reload_weights").status_code == 200
        assert complete(c, prompt="Vera", max_tokens=4, temperature=0)["choices"][0]["text"] == before


def test_a_reload_that_fails_after_writing_says_the_weights_are_mixed(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """process_weights runs after the new weights are written (marlin refusing scales fp16 cannot
    hold): that 409 must not claim the served weights are unchanged."""
    def refuse() -> None:
        raise ValueError("scales do not fit")

    with _served_from_a_folder(tmp_path) as (_, loaded, c):
        monkeypatch.setattr(next(iter(loaded.kernel_layers().values())), "process_weights", refuse)
        response = c.post("/v1/reload_weights")
        message = response.json()["error"]["message"]
        assert response.status_code == 409 and "some layers already hold the new weights" in message, message
        assert "Restart the server" in message and "unchanged" not in message


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else r"(?:\{\})?") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_metrics_move(client: TestClient) -> None:
    before = client.get("/metrics").text
    ok = complete(client, prompt="Rosa", max_tokens=4, temperature=0, ignore_eos=True)  # 4 tokens: a TPOT
    bad = client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert bad.status_code == 400
    after = client.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    a, b = after.text, before
    ok_label = 'endpoint="/v1/completions",status="200"'
    bad_label = 'endpoint="/v1/completions",status="400"'
    assert metric(a, "quantgate_requests_total", ok_label) == metric(b, "quantgate_requests_total", ok_label) + 1
    assert metric(a, "quantgate_requests_total", bad_label) == metric(b, "quantgate_requests_total", bad_label) + 1
    usage = ok["usage"]
    assert (metric(a, "quantgate_prompt_tokens_total") - metric(b, "quantgate_prompt_tokens_total")
            == usage["prompt_tokens"])
    assert (metric(a, "quantgate_generation_tokens_total") - metric(b, "quantgate_generation_tokens_total")
            == usage["completion_tokens"])
    latency = 'endpoint="/v1/completions"'
    assert (metric(a, "quantgate_request_latency_seconds_count", latency)
            == metric(b, "quantgate_request_latency_seconds_count", latency) + 2)
    ttft = "quantgate_time_to_first_token_seconds_count"
    assert metric(a, ttft) == metric(b, ttft) + 1  # once per request, not per token
    tpot = "quantgate_time_per_output_token_seconds_count"
    assert metric(a, tpot) == metric(b, tpot) + 1
    for gauge in ("quantgate_num_requests_running", "quantgate_num_requests_waiting", "quantgate_kv_cache_slots",
                  "quantgate_kv_cache_slots_used"):  # metric() reads a missing one as 0
        assert re.search(rf"^{gauge} ", a, re.M), gauge
    assert metric(a, "quantgate_num_requests_running") == 0 and metric(a, "quantgate_num_requests_waiting") == 0
    assert metric(a, "quantgate_kv_cache_slots") >= 1 and metric(a, "quantgate_kv_cache_slots_used") == 0


def test_token_latencies_are_measured_once_per_request(client: TestClient, engine,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """TTFT: from acceptance to the first token; TPOT: the mean gap between the tokens after the first."""
    serve_outputs(monkeypatch, engine, [(5, "a", -1.0), (6, "b", -1.0), (7, "c", -1.0)])
    clock = iter([10.0, 11.0, 15.0])  # accepted, first token, last token
    monkeypatch.setattr("quantgate.engine.server.time", SimpleNamespace(perf_counter=lambda: next(clock),
                                                                        time=time.time))
    before = client.get("/metrics").text
    complete(client, prompt="a", max_tokens=3)
    after = client.get("/metrics").text
    for name, value in (("quantgate_time_to_first_token_seconds", 1.0),
                        ("quantgate_time_per_output_token_seconds", 2.0)):
        assert metric(after, name + "_count") - metric(before, name + "_count") == 1, name
        assert metric(after, name + "_sum") - metric(before, name + "_sum") == pytest.approx(value), name


def test_unknown_paths_share_one_metrics_label(client: TestClient) -> None:
    """Random URLs (scanners) must not each become a time series."""
    before = client.get("/metrics").text
    assert client.get("/nope-1").status_code == client.post("/v1/nope-2").status_code == 404
    after = client.get("/metrics").text
    other = 'endpoint="other",status="404"'
    assert metric(after, "quantgate_requests_total", other) == metric(before, "quantgate_requests_total", other) + 2
    assert "nope" not in after


def test_null_is_unset_where_openai_allows_it(client: TestClient) -> None:
    plain = complete(client, prompt="Rosa", max_tokens=4, temperature=0)["choices"][0]["text"]
    nulls = complete(client, prompt="Rosa", max_tokens=4, temperature=0, stream=None, n=None, echo=None,
                     ignore_eos=None)
    assert nulls["choices"][0]["text"] == plain
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                     "logprobs": None, "stream": None})
    assert chat.status_code == 200 and chat.json()["choices"][0]["logprobs"] is None
    streamed = client.post("/v1/completions", json={"prompt": "Rosa", "max_tokens": 2, "stream": True,
                                                    "stream_options": {"include_usage": None}})
    assert streamed.status_code == 200 and sse_events(streamed)[-1] == "[DONE]"


def test_request_fields_reach_the_engine(client: TestClient, engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """What each endpoint asks of the engine: OpenAI's defaults (temperature 1, top_p 1) for unset
    fields, and every sampling field a request sets."""
    from quantgate.engine import SamplingParams

    async_engine = engine[1]
    real_generate = async_engine.generate
    sent: list[SamplingParams] = []

    def recorded(request_id, prompt_token_ids, params):
        sent.append(params)
        return real_generate(request_id, prompt_token_ids, params)

    monkeypatch.setattr(async_engine, "generate", recorded)
    complete(client, prompt="a", max_tokens=1)
    fields = {"max_tokens": 2, "seed": 5, "stop": ["zq"], "stop_token_ids": [3], "ignore_eos": True,
              "temperature": 0.5, "top_p": 0.8}
    complete(client, prompt="a", **fields)
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **fields})
    assert chat.status_code == 200, chat.text
    default, *chosen = sent
    assert (default.temperature, default.top_p, default.seed, default.stop, default.ignore_eos) == (
        1.0, 1.0, None, [], False)
    for params in chosen:
        assert (params.max_tokens, params.seed, params.stop, params.stop_token_ids, params.ignore_eos,
                params.temperature, params.top_p) == (2, 5, ["zq"], [3], True, 0.5, 0.8)


def test_stop_token_ids_are_honoured(client: TestClient) -> None:
    free = complete(client, prompt="Rosa", max_tokens=6, temperature=0, ignore_eos=True)["choices"][0]
    assert free["finish_reason"] == "length"
    stopped = complete(client, prompt="Rosa", max_tokens=6, temperature=0, ignore_eos=True,
                       stop_token_ids=list(range(VOCAB_SIZE)))  # whatever comes first stops it
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] == 1
    # As vLLM: the stop token counts as generated, and its text is not part of the answer
    assert free["text"] and stopped["choices"][0]["text"] == ""


def test_completion_top_logprobs_hold_the_chosen_token(client: TestClient) -> None:
    # As OpenAI and vLLM: the sampled token is in its own entry, so up to logprobs + 1 entries.
    for k in (0, 2):
        lp = complete(client, prompt="Ava has 3 apples.", max_tokens=5, temperature=1.0, seed=3, logprobs=k,
                      echo=True)["choices"][0]["logprobs"]
        for token, logprob, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
            assert top[token] == pytest.approx(logprob) and len(top) <= k + 1


def test_a_body_over_the_limit_gets_a_json_413(client: TestClient) -> None:
    from quantgate.engine.server import MAX_BODY_BYTES

    def chunks():  # no Content-Length: the limit is found while the body streams in
        for _ in range(MAX_BODY_BYTES // 2**20 + 1):
            yield b"x" * 2**20

    for body in (b"x" * (MAX_BODY_BYTES + 1), chunks()):
        response = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
        assert f"larger than this server takes ({MAX_BODY_BYTES} bytes); send a shorter prompt" in response.text
    at_the_limit = b'{"prompt": [5], "max_tokens": 1}'.ljust(MAX_BODY_BYTES)  # JSON may end in whitespace
    assert client.post("/v1/completions", content=at_the_limit,
                       headers={"content-type": "application/json"}).status_code == 200
    assert client.get("/health").status_code == 200


def test_a_prompt_that_fills_the_context_says_so(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": LONG}]})
    message = response.json()["error"]["message"]
    assert response.status_code == 400 and "leaves none for the completion" in message
    assert "Shorten the prompt (or restart the server with a larger --max-model-len)" in message


def test_chat_without_max_tokens_gets_the_rest_of_the_context(client: TestClient) -> None:
    def messages(n: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "and" + " and" * n}]

    base = client.post("/tokenize", json={"messages": messages(0)}).json()["count"]
    full = messages(MAX_MODEL_LEN - base)
    assert client.post("/tokenize", json={"messages": full}).json()["count"] == MAX_MODEL_LEN  # " and" is one token
    response = client.post("/v1/chat/completions", json={"messages": full})
    assert_openai_error(response, 400, "messages")
    assert "leaves none for the completion" in response.json()["error"]["message"]
    one_left = client.post("/v1/chat/completions", json={"messages": messages(MAX_MODEL_LEN - base - 1),
                                                         "temperature": 0, "ignore_eos": True})
    assert one_left.status_code == 200, one_left.text
    assert one_left.json()["usage"]["completion_tokens"] == 1 and one_left.json()["choices"][0]["finish_reason"] == "length"


def test_a_text_of_exactly_max_model_len_of_the_longest_tokens_can_be_scored(client: TestClient) -> None:
    """The untokenized bound refuses only a text longer than any max_model_len tokens can be:
    the longest token (EOS, 13 bytes) repeated max_model_len times still fits."""
    prompt = "<|endoftext|>" * MAX_MODEL_LEN
    scored = complete(client, prompt=prompt, max_tokens=0, echo=True)
    assert scored["usage"]["prompt_tokens"] == MAX_MODEL_LEN and scored["choices"][0]["text"] == prompt


def test_api_key(engine) -> None:
    with make_client(engine, api_key="sesame") as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            assert c.post("/tokenize", json={"prompt": "a"}, headers=headers).status_code == 401
            assert c.post("/detokenize", json={"tokens": [5]}, headers=headers).status_code == 401
            assert c.get("/tokenizer_info", headers=headers).status_code == 401
            response = c.get("/v1/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert "send the header 'Authorization: Bearer <key>' with the key given to --api-key" in response.text
            assert c.post("/v1/completions", json={"prompt": "a"}, headers=headers).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sesame"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "bearer sesame"}).status_code == 200  # RFC 9110
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert metric(c.get("/metrics").text, "quantgate_requests_total", 'endpoint="/v1/models",status="401"') == 3


# ---- many clients -----------------------------------------------------------------------------------


def test_concurrent_clients_get_their_own_greedy_answers(client: TestClient) -> None:
    prompts = [f"Problem {i}: {i} + {2 * i} =" for i in range(12)]
    alone = [complete(client, prompt=p, max_tokens=6, temperature=0)["choices"][0]["text"] for p in prompts]

    async def all_at_once() -> list[str]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            responses = await asyncio.gather(*(
                http.post("/v1/completions", json={"prompt": p, "max_tokens": 6, "temperature": 0}) for p in prompts))
        return [r.json()["choices"][0]["text"] for r in responses]

    assert client.portal.call(all_at_once) == alone


def test_an_internal_error_fails_only_its_request(client: TestClient, engine, monkeypatch) -> None:
    async_engine = engine[1]
    real_generate = async_engine.generate

    def broken(request_id, prompt_token_ids, params):
        if prompt_token_ids[:1] == [7]:
            raise RuntimeError("boom")
        if prompt_token_ids[:1] == [6]:
            raise EngineDeadError("the engine has stopped; restart the server")
        if prompt_token_ids[:1] == [5]:  # a refusal the server did not check first
            raise InvalidRequestError("the engine refuses this request")
        return real_generate(request_id, prompt_token_ids, params)

    monkeypatch.setattr(async_engine, "generate", broken)
    server_error = 'endpoint="/v1/completions",status="500"'
    before = metric(client.get("/metrics").text, "quantgate_requests_total", server_error)
    with TestClient(client.app, raise_server_exceptions=False) as c:  # answer 500 as uvicorn would
        check_internal_error_is_contained(c)
    assert metric(client.get("/metrics").text, "quantgate_requests_total", server_error) == before + 1


def check_internal_error_is_contained(client: TestClient) -> None:
    failed = client.post("/v1/completions", json={"prompt": [7, 8, 9], "max_tokens": 2})
    assert failed.status_code == 500 and "boom" in failed.json()["error"]["message"]
    dead = client.post("/v1/completions", json={"prompt": [6], "max_tokens": 2})
    assert dead.status_code == 503 and "restart the server" in dead.json()["error"]["message"]
    assert_openai_error(client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2}), 400, None)
    streamed = sse_events(client.post("/v1/completions", json={"prompt": [7, 8], "max_tokens": 2, "stream": True}))
    assert "boom" in streamed[-2]["error"]["message"] and streamed[-1] == "[DONE]"
    assert streamed[-2]["error"]["type"] == "internal_error"  # the server's fault, not the request's
    assert complete(client, prompt=[8, 9], max_tokens=2)["choices"][0]["finish_reason"] in ("stop", "length")
    assert client.get("/health").status_code == 200


# ---- bad input --------------------------------------------------------------------------------------

LONG = " ".join(["7"] * (MAX_MODEL_LEN + 5))
BAD_COMPLETIONS = [
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "n": 0}, 400, "n"),  # one choice would come back for none asked
    ({"prompt": "x", "best_of": 3}, 400, "best_of"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({"prompt": LONG}, 400, "prompt"),
    ({"prompt": "7" * 2_000_000}, 400, "prompt"),  # refused before tokenization
    ({"prompt": "x", "max_tokens": MAX_MODEL_LEN}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**30}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "16"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "temperature": 2.5}, 400, "temperature"),  # OpenAI's range is 0..2
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "seed": 2**64}, 400, "seed"),
    ({"prompt": "x", "seed": -(2**63) - 1}, 400, "seed"),  # a CUDA generator refuses it: a 500 there
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "logprobs": True}, 400, "logprobs"),
    ({"prompt": "x", "stop": [""]}, 400, "stop"),
    ({"prompt": "x", "stop": 5}, 400, "stop"),
    ({"prompt": "x", "stop": [f"zq{i:06d}" for i in range(300_000)]}, 400, "stop"),
    ({"prompt": "x", "stop": ["y" * 1025]}, 400, "stop"),
    ({"prompt": "x", "echo": "yes"}, 400, "echo"),
    ({"prompt": "x", "stream": 1}, 400, "stream"),
    ({"prompt": "x", "presence_penalty": 1.0}, 400, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -0.5}, 400, "frequency_penalty"),  # a negative one is no more neutral
    ({"prompt": "x", "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ({"prompt": "x", "suffix": "y"}, 400, "suffix"),
    ({"prompt": "x", "top_k": 40}, 400, "top_k"),
    ({"prompt": "x", "repetition_penalty": 1.2}, 400, "repetition_penalty"),
    ({"prompt": "x", "min_p": 0.1}, 400, "min_p"),
    ({"prompt": "x", "min_tokens": 2}, 400, "min_tokens"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [[]]}, 400, "prompt"),
    ({"prompt": [-1, 5]}, 400, "prompt"),
    ({"prompt": [VOCAB_SIZE]}, 400, "prompt"),
    ({"prompt": [1, "a"]}, 400, "prompt"),
    ({"prompt": {"text": "x"}}, 400, "prompt"),
    ({"prompt": "\ud800"}, 400, "prompt"),
    ({"prompt": ["ok", "\udfff"]}, 400, "prompt.1"),
    ({"prompt": "x", "model": "\ud800"}, 400, "model"),
    ({"max_tokens": 3}, 400, "prompt"),
    # What would change the answer and is not implemented: refused, never ignored.
    ({"prompt": "x", "use_beam_search": True}, 400, "use_beam_search"),
    ({"prompt": "x", "guided_json": {"type": "object"}}, 400, "guided_json"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"prompt": "x", "prompt_logprobs": 1}, 400, "prompt_logprobs"),
    ({"prompt": "x", "include_stop_str_in_output": True}, 400, "include_stop_str_in_output"),
    ({"prompt": "x", "stop_token_ids": [VOCAB_SIZE]}, 400, "stop_token_ids"),
    ({"prompt": "x", "stream": False, "stream_options": {"include_usage": True}}, 400, "stream_options"),
]
BAD_CHATS = [
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "\udcff"}]}, 400, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "other"}, 404, "model"),
    ({"messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -5}, 400, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),  # no echo on chat
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}, 400, "functions"),
    ({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}, 400, "continue_final_message"),
    ({"messages": [{"role": "user", "content": "hi"}], "echo": True}, 400, "echo"),
    ({"messages": [{"role": "user", "content": "hi"}], "echo": 0}, 400, "echo"),
    ({"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 2}, 400, "prompt_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop_token_ids": [VOCAB_SIZE]}, 400, "stop_token_ids"),
    ({"messages": [{"role": "user", "content": "hi"}], "guided_regex": "a+"}, 400, "guided_regex"),
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": 5}}, 400,
     "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": 5}}, 400,
     "chat_template_kwargs"),
]


def post_json(client: TestClient, path: str, body: object) -> httpx.Response:
    """json.dumps escapes what httpx would refuse to encode (lone surrogates)."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize("body,status,param", BAD_COMPLETIONS, ids=[json.dumps(b)[:40] for b, _, _ in BAD_COMPLETIONS])
def test_bad_completion_requests(client: TestClient, body: dict, status: int, param: str) -> None:
    assert_openai_error(post_json(client, "/v1/completions", body), status, param)
    if "stream" not in body:  # a streamed request is refused before its stream starts
        assert_openai_error(post_json(client, "/v1/completions", {**body, "stream": True}), status, param)


@pytest.mark.parametrize("body,status,param", BAD_CHATS, ids=[json.dumps(b)[:40] for b, _, _ in BAD_CHATS])
def test_bad_chat_requests(client: TestClient, body: dict, status: int, param: str) -> None:
    assert_openai_error(post_json(client, "/v1/chat/completions", body), status, param)


@pytest.mark.parametrize("raw", [b"{bad json", b"", b"[1, 2]", b'"text"', b"null", b"42",
                                 b'{"prompt": "x", "max_tokens": NaN}', b'{"prompt": "x", "temperature": Infinity}',
                                 b'{"prompt": "x", "max_tokens": 1e400}', b'{"prompt": "x", "top_p": -Infinity}',
                                 "{\"prompt\": \"\udcff\"}".encode("utf-8", "surrogatepass"), b"\xff\xfe\x00"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_bodies(client: TestClient, path: str, raw: bytes) -> None:
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b'{"prompt": "\xff\xfe abc"}', b"[" * 100_000,
                                 b'{"prompt": "a", "max_tokens": 1' + b"0" * 5000 + b"}"])
def test_bodies_json_cannot_read_say_why(client: TestClient, raw: bytes) -> None:
    """FastAPI's own words were "There was an error parsing the body", with no cause or fix."""
    response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_body"
    assert ("not UTF-8 text, its JSON nests too deeply, or it holds an integer thousands of digits long"
            in response.json()["error"]["message"])


@pytest.mark.parametrize("method,path,body,message", [
    ("POST", "/v1/completions", b"", "the request body is empty; send a JSON object with Content-Type: application/json"),
    ("POST", "/v1/completions", b"[1, 2]", "the request body must be a JSON object (Content-Type: application/json)"),
    ("POST", "/v1/completions", b'{"max_tokens": 3}', "prompt: this field is required"),
    ("POST", "/v1/completions", b'{"prompt": "x", "model": "gpt-4"}',
     "The model `gpt-4` does not exist; this server serves tiny, alias"),
    ("POST", "/v1/completions", b'{"prompt": [960]}',
     f"token id {VOCAB_SIZE} is out of range: the vocabulary has {VOCAB_SIZE} tokens (ids 0..{VOCAB_SIZE - 1})"),
    ("POST", "/v1/completions", b'{"prompt": ""}', "the prompt is empty (0 tokens); send at least one token"),
    ("POST", "/v1/completions", b'{"prompt": [5], "max_tokens": 200}',
     "you requested 201 tokens (1 in the prompt, 200 for the completion). Reduce the length of the prompt or "
     "max_tokens (or restart the server with a larger --max-model-len)."),
    ("PUT", "/health", None, "Method Not Allowed: PUT /health; this server has GET /health, GET /v1/models, "
                             "POST /v1/completions"),
])
def test_refusals_name_the_cause_and_the_fix(client: TestClient, method: str, path: str, body: bytes | None,
                                             message: str) -> None:
    response = client.request(method, path, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500 and message in response.json()["error"]["message"], response.text


def test_text_too_long_for_any_tokenization_is_refused_untokenized(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": "Ava " * 500_000})
    assert_openai_error(response, 400, "prompt")
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert "longer than any" in response.json()["error"]["message"] and "Shorten it" in response.json()["error"]["message"]
    # /tokenize counts it, as vLLM's does: lm-eval's rolling loglikelihood sends whole documents
    # there before cutting them into windows that fit, and a refusal aborted its run.
    counted = client.post("/tokenize", json={"prompt": "Ava " * 5_000}).json()
    assert counted["count"] > MAX_MODEL_LEN and counted["max_model_len"] == MAX_MODEL_LEN


def test_unknown_routes_and_methods(client: TestClient) -> None:
    missing = client.get("/v1/engines")
    assert missing.status_code == 404 and "/v1/completions" in missing.json()["error"]["message"]
    assert missing.json()["error"]["code"] == "not_found"
    wrong_method = client.get("/v1/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("content_type", [None, b"text/event-stream"])
def test_a_request_cancelled_by_a_forced_quit_still_gets_an_openai_error(content_type: bytes | None) -> None:
    """The second Ctrl-C cancels in-flight requests: a JSON 503, or an error event and [DONE]."""
    from quantgate.engine.server import CancelledRequestMiddleware

    async def cancelled_app(scope, receive, send) -> None:
        if content_type is not None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        raise asyncio.CancelledError

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(CancelledRequestMiddleware(cancelled_app)({"type": "http", "path": "/v1/completions",
                                                            "headers": []}, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    if content_type is None:
        assert sent[0]["status"] == 503 and json.loads(body)["error"]["code"] == "server_shutting_down"
    else:
        assert body.endswith(b"data: [DONE]\n\n") and b'"code":"server_shutting_down"' in body
        assert sent[-1]["more_body"] is False



def test_top_logprobs_keep_the_likeliest_of_tokens_whose_texts_collide(engine) -> None:
    """Tokens that hold part of one UTF-8 character all read "\\ufffd" alone: the entry keeps the
    likeliest one's logprob, so its best is still the best token's (lm-eval's is_greedy). A random
    prompt of the echo test hit it: a less likely "\\ufffd" token had overwritten the chosen one."""
    from quantgate.engine.server import OpenAIServer

    loaded, async_engine = engine
    settings = ServerSettings(served_model_names=(NAME,), max_model_len=MAX_MODEL_LEN)
    server = OpenAIServer(async_engine, loaded, settings, metrics=None)  # top_dict reads no metrics
    partial = [t for t in range(loaded.model_config.vocab_size) if server.token_text(t) == "\ufffd"][:3]
    assert len(partial) >= 2, "the tiny tokenizer has byte tokens inside multi-byte characters"
    top = {partial[0]: -0.5, 5: -2.0, partial[1]: -4.35}  # the engine's order: likeliest first
    assert server.top_dict(top)["\ufffd"] == -0.5
    assert max(server.top_dict(top).values()) == -0.5
