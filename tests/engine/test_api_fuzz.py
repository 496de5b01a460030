"""Property-based fuzz of the HTTP API (hypothesis): whatever a client sends, the answer is
never a 5xx, a 200 has the OpenAI shape, a stream ends with [DONE] and carries no internal
error, and the server still answers /health afterwards."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import test_server
from .test_server import NAME, VOCAB_SIZE, sse_events

# The served tiny model and its client, shared with test_server.py (module-scoped there and here).
tiny_model, engine, client = test_server.tiny_model, test_server.engine, test_server.client

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
any_json = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=10)


def mutated(valid: dict[str, st.SearchStrategy], required: dict[str, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    """Request bodies: valid ones (so requests reach the engine), valid ones with one field set to
    arbitrary JSON, arbitrary JSON, and arbitrary bytes."""
    good = st.fixed_dictionaries(required, optional={k: v for k, v in valid.items() if k not in required})

    def break_one(draw_body: dict, key: str, value: object) -> dict:
        return {**draw_body, key: value}

    broken = st.builds(break_one, good, st.sampled_from(sorted(valid)), any_json)
    as_json = st.one_of(good, good, broken, broken, any_json).map(lambda v: json.dumps(v, allow_nan=True).encode())
    return st.one_of(as_json, as_json, as_json, as_json, st.binary(max_size=40))


texts = st.text(max_size=30)
token_ids = st.lists(st.integers(min_value=0, max_value=VOCAB_SIZE - 1), min_size=1, max_size=12)
SAMPLING = {
    "model": st.sampled_from([NAME, "alias"]),
    "max_tokens": st.integers(min_value=1, max_value=24),
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0.01, max_value=1),
    "seed": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "stop": st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=3)),
    "n": st.just(1),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "presence_penalty": st.just(0.0),
    "user": st.text(max_size=5),
}
COMPLETION = SAMPLING | {
    "prompt": st.one_of(texts.filter(str.strip), token_ids, st.lists(texts.filter(str.strip), min_size=1, max_size=3),
                        st.lists(token_ids, min_size=1, max_size=3)),
    "logprobs": st.integers(min_value=0, max_value=20),
    "echo": st.booleans(),
    "best_of": st.just(1),
}
text_part = st.fixed_dictionaries({"type": st.just("text"), "text": texts})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]),
     "content": st.one_of(texts, st.lists(text_part, max_size=2))},
    optional={"name": st.text(max_size=5)})
CHAT = SAMPLING | {
    "messages": st.lists(message, min_size=1, max_size=3),
    "max_completion_tokens": st.integers(min_value=1, max_value=24),
    "logprobs": st.booleans(),
    "chat_template_kwargs": st.dictionaries(st.text(max_size=6), any_json, max_size=2),
    "add_generation_prompt": st.booleans(),
}


def check_answer(client, path: str, raw: bytes) -> None:
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = sse_events(response)
        assert events[-1] == "[DONE]"
        assert not [e for e in events[:-1] if "error" in e], events
        return
    body = response.json()
    assert body["choices"] and body["usage"]["total_tokens"] == (
        body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"])


@settings(FUZZ, max_examples=150)
@given(raw=mutated(COMPLETION, required={"prompt": COMPLETION["prompt"]}))
def test_fuzz_completions(client, raw: bytes) -> None:
    check_answer(client, "/v1/completions", raw)


@settings(FUZZ, max_examples=120)
@given(raw=mutated(CHAT, required={"messages": CHAT["messages"]}))
def test_fuzz_chat(client, raw: bytes) -> None:
    check_answer(client, "/v1/chat/completions", raw)


TOKENIZE = {
    "model": SAMPLING["model"], "prompt": texts, "messages": CHAT["messages"], "add_special_tokens": st.booleans(),
    "add_generation_prompt": st.booleans(), "tokens": token_ids,
}


@settings(FUZZ, max_examples=60)
@given(path=st.sampled_from(["/tokenize", "/detokenize"]), raw=mutated(TOKENIZE, required={}))
def test_fuzz_tokenizer_endpoints(client, path: str, raw: bytes) -> None:
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text


@settings(FUZZ, max_examples=60)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       path=st.sampled_from(["/health", "/v1/models", "/v1/kernels", "/metrics", "/v1/reload_weights",
                             "/v1/completions", "/v1/chat/completions", "/v1", "/v1/embeddings", "/tokenize",
                             "/detokenize", "/tokenizer_info"]),
       raw=st.binary(max_size=20))
def test_fuzz_other_routes(client, method: str, path: str, raw: bytes) -> None:
    response = client.request(method, path, content=raw)
    assert response.status_code < 500, response.text


@pytest.fixture(scope="module", autouse=True)
def still_healthy_afterwards(client):
    yield
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200
