"""Incremental detokenization with the shipped tokenizer: the text is the generated tokens' only."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from quantgate.engine.detokenizer import IncrementalDetokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "data" / "tokenizer-v1" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


def _run(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[str, bool]:
    stopped = any(detok.add(i) for i in ids)
    return detok.take(finished=True), stopped


def test_a_prompt_ending_inside_a_character_leaks_no_prompt_text(tok: Tokenizer) -> None:
    ids = tok.encode("Question: I like 🙂").ids
    prompt, generated = ids[:-1], [ids[-1], *tok.encode(" Answer").ids]  # the emoji's last byte comes first
    assert tok.decode(prompt).endswith("\ufffd")
    text, stopped = _run(IncrementalDetokenizer(tok, prompt, ["like"]), generated)
    assert text == tok.decode(generated) == "\ufffd Answer" and not stopped


def test_a_whole_prompt_gives_the_decoder_its_context(tok: Tokenizer) -> None:
    prompt, generated = tok.encode("Question: 🙂").ids, tok.encode(" I like it").ids
    text, stopped = _run(IncrementalDetokenizer(tok, prompt, ["like"]), generated)
    assert text == " I " and stopped


def test_stop_strings_are_found_across_tokens_and_never_returned(tok: Tokenizer) -> None:
    generated = tok.encode("The answer is 72. Question: next").ids
    detok = IncrementalDetokenizer(tok, tok.encode("Q").ids, ["Question:", "zz" * 500])
    streamed, stopped = "", False
    for i in generated:
        stopped = detok.add(i)
        streamed += detok.take(finished=stopped)
        if stopped:
            break
    assert stopped and streamed == "The answer is 72. "


def test_of_several_stop_strings_the_text_ends_before_the_first_to_occur(tok: Tokenizer) -> None:
    """Two stop strings that one token (":") completes: the text ends where the earlier one starts,
    whatever their order in the list."""
    generated = tok.encode("So 5 + 7 = 12.\n\nQuestion: and").ids
    for stops in (["Question:", "\n\nQuestion:"], ["\n\nQuestion:", "Question:"]):
        text, stopped = _run(IncrementalDetokenizer(tok, tok.encode("Q").ids, stops), generated)
        assert stopped and text == "So 5 + 7 = 12.", stops
