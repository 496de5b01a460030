"""Request models: a bad field is refused with a message naming it and the limit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from quantgate.engine.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS, ChatMessage, CompletionRequest


def test_stop_lists_within_the_limits_pass() -> None:
    stops = ["x" * MAX_STOP_CHARS] + [f"s{i}" for i in range(MAX_STOP_STRINGS - 1)]
    assert CompletionRequest(prompt="p", stop=stops).stop == stops


@pytest.mark.parametrize("stop, message", [
    ([f"zq{i:06d}" for i in range(300_000)], f"stop has 300000 strings; send at most {MAX_STOP_STRINGS}"),
    (["ok", "y" * (MAX_STOP_CHARS + 1)], f"a stop string has {MAX_STOP_CHARS + 1} characters; send stop strings "
                                         f"of at most {MAX_STOP_CHARS}"),
    ("y" * (MAX_STOP_CHARS + 1), f"a stop string has {MAX_STOP_CHARS + 1} characters"),
])
def test_too_many_or_too_long_stop_strings_are_refused(stop: list[str] | str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest(prompt="p", stop=stop)
    (error,) = info.value.errors()
    assert error["loc"] == ("stop",) and message in error["msg"]


def test_chat_text_parts_join_with_newlines_as_vllm_does() -> None:
    parts = [{"type": "text", "text": "Question: 1"}, {"type": "text", "text": "Answer: 2"}]
    assert ChatMessage(role="user", content=parts).text() == "Question: 1\nAnswer: 2"
    assert ChatMessage(role="user", content=parts[:1]).text() == "Question: 1"
    assert ChatMessage(role="user", content=[]).text() == ""
