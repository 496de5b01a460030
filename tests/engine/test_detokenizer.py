"""Incremental detokenization with the shipped tokenizer: the text is the generated tokens' only."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models

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


def test_a_stop_string_at_the_very_start_stops_with_no_text(tok: Tokenizer) -> None:
    text, stopped = _run(IncrementalDetokenizer(tok, tok.encode("Q").ids, ["Question:"]),
                         tok.encode("Question: next").ids)
    assert stopped and text == ""


def test_special_tokens_generated_among_the_text_are_not_returned(tok: Tokenizer) -> None:
    """With ignore_eos the model may go on past <|im_end|>: the text skips it, as vLLM's does by default."""
    generated = [*tok.encode("Hi").ids, tok.token_to_id("<|im_end|>"), *tok.encode(" there").ids]
    assert _run(IncrementalDetokenizer(tok, tok.encode("Q").ids, []), generated) == ("Hi there", False)


def test_a_stream_holds_back_the_longest_stop_string_less_one_character(tok: Tokenizer) -> None:
    for stops, held in (([], ""), (["#", "###"], "72")):  # the longest stop string less one character
        detok = IncrementalDetokenizer(tok, tok.encode("Q").ids, stops)
        streamed = ""
        for i in tok.encode("The answer is 72").ids:
            assert not detok.add(i)
            streamed += detok.take(finished=False)
        assert streamed == "The answer is 72".removesuffix(held), stops
        assert detok.take(finished=True) == held, stops


def _llama_style_tokenizer() -> Tokenizer:
    """A SentencePiece-style decoder (Llama, Mistral): it drops the space marker of the text's first
    token, so a token decoded without the prompt before it loses its leading space."""
    vocab = {"<unk>": 0, "\u2581The": 1, "\u2581answer:": 2, "\u258172": 3, "<0xC3>": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


@pytest.mark.parametrize("prompt", [[1, 2], [1, 2, 4]], ids=["whole", "ending-inside-a-character"])
def test_the_first_generated_word_keeps_its_leading_space(prompt: list[int]) -> None:
    """lm-eval appends the text to the prompt: "The answer:" + " 72", never "The answer:72"."""
    assert _run(IncrementalDetokenizer(_llama_style_tokenizer(), prompt, []), [3]) == (" 72", False)
