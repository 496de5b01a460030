"""Incremental detokenization with OpenAI stop-string semantics.

Text is decoded one token at a time with `tokenizers`' DecodeStream (it buffers tokens that
end inside a multi-byte character). While a request runs, the last `len(longest stop) - 1`
characters are held back, since they may be the start of a stop string that a later token
completes; the text before a stop string is returned, the stop string itself never.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer | None, prompt_ids: list[int], stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stream = DecodeStream(ids=_context(tokenizer, prompt_ids), skip_special_tokens=True) if tokenizer else None
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.emitted = 0

    def add(self, token_id: int) -> bool:
        """Append a generated token; True when the text now contains a stop string (cut there)."""
        if self.stream is None:
            return False
        chunk = self.stream.step(self.tokenizer, token_id)
        if not chunk:
            return False
        start = max(0, len(self.text) - self.hold)
        self.text += chunk
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            return True
        return False

    def take(self, finished: bool) -> str:
        """Text not returned before; while running, holds back what may start a stop string."""
        end = len(self.text) if finished else max(self.emitted, len(self.text) - self.hold)
        new, self.emitted = self.text[self.emitted : end], end
        return new


def _context(tokenizer: Tokenizer, prompt_ids: list[int]) -> list[int]:
    """The prompt's tail gives the decoder context (e.g. a leading-space marker). It must end on a
    whole character: DecodeStream takes a context whose text ends in U+FFFD as no context, and
    its first output would then hold the context's text, i.e. prompt text (and stop matches in it)."""
    ids = prompt_ids[-8:]
    while ids and tokenizer.decode(ids, skip_special_tokens=True).endswith("\ufffd"):
        ids = ids[:-1]
    return ids
