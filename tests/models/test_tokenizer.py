"""The shipped tokenizer: reproducible, one token per digit, loadable offline by transformers."""

from __future__ import annotations

import pytest

import fewshot
import synth_gsm8k
import tokenizer as tokenizer_recipe


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_recipe.TOKENIZER_DIR)


def test_retraining_gives_the_shipped_bytes() -> None:
    files = tokenizer_recipe.tokenizer_files()
    # Both files the engine and lm-eval read: an empty dict would make the loop below check nothing.
    assert set(files) == {"tokenizer.json", "tokenizer_config.json"}
    for name, data in files.items():
        assert (tokenizer_recipe.TOKENIZER_DIR / name).read_bytes() == data, name


def test_digits_are_single_tokens_and_text_round_trips(tok) -> None:
    docs = synth_gsm8k.read_jsonl(synth_gsm8k.DATA_DIR / "test.jsonl")[:50]
    for doc in docs:
        text = fewshot.format_example(doc)
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text
        pieces = tok.convert_ids_to_tokens(ids)
        assert all(not any(c.isdigit() for c in p) or (len(p) == 1 and p.isdigit()) for p in pieces)


def test_special_tokens_vocab_and_chat_template(tok) -> None:
    assert len(tok) % 64 == 0 and len(tok) <= 2048
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    assert {"<|im_start|>", "<|im_end|>"} <= set(tok.get_vocab())
    rendered = tok.apply_chat_template([{"role": "user", "content": "Question: 2+2?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nQuestion: 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok("<|im_end|>")["input_ids"]) == ["<|im_end|>"]
