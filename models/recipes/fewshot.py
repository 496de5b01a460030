"""lm-eval's `gsm8k` task, restated for training and in-training evaluation.

Mirrors lm-eval 0.4.13 `tasks/gsm8k/gsm8k.yaml` with its default sampler: the prompt is
`Question: {question}\\nAnswer:` + " " + answer per shot, shots joined by "\\n\\n", the test
question last; shots are drawn with `random.Random(1234).sample(train, 5)` in document order;
generation stops at "Question:"; the strict-match filter takes the first `#### N`, and
exact_match ignores case, ",", "$", a trailing "." and everything before "#### ".
tests/models/test_fewshot.py checks this against lm-eval itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

FEWSHOT_SEED = 1234  # lm-eval's default --fewshot_seed
NUM_FEWSHOT = 5
STOP = ["Question:", "</s>", "<|im_end|>"]
STRICT_MATCH = re.compile(r"#### (\-?[0-9\.\,]+)")
_IGNORE = [re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$")]

Doc = dict[str, str]


def doc_to_text(doc: Doc) -> str:
    return f"Question: {doc['question']}\nAnswer:"


def format_example(doc: Doc) -> str:
    """One solved shot, including the delimiter that follows it."""
    return f"{doc_to_text(doc)} {doc['answer']}\n\n"


def build_prompt(shots: Sequence[Doc], doc: Doc) -> str:
    return "".join(format_example(s) for s in shots) + doc_to_text(doc)


class FewshotSampler:
    """lm-eval's ContextSampler for a few-shot split distinct from the test split."""

    def __init__(self, train: Sequence[Doc], seed: int = FEWSHOT_SEED) -> None:
        self._train = list(train)
        self._rnd = random.Random(seed)

    def sample(self, n: int = NUM_FEWSHOT) -> list[Doc]:
        return self._rnd.sample(self._train, n)


def prompts(train: Sequence[Doc], test: Sequence[Doc], n: int = NUM_FEWSHOT) -> list[str]:
    """5-shot prompts for `test` in order, as one lm-eval run builds them."""
    sampler = FewshotSampler(train)
    return [build_prompt(sampler.sample(n), doc) for doc in test]


def cut_at_stop(text: str) -> str:
    for stop in STOP:
        text = text.split(stop, 1)[0]
    return text


def _normalize(text: str) -> str:
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def strict_match(response: str) -> str:
    """The strict-match filter's output for a raw generation ("[invalid]" when no `#### N`)."""
    match = STRICT_MATCH.search(cut_at_stop(response))
    return match.group(1) if match else "[invalid]"


def is_correct(response: str, doc: Doc) -> bool:
    return _normalize(strict_match(response)) == _normalize(doc["answer"])
