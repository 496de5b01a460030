"""The model's chat template (Hugging Face format), rendered with jinja2 as transformers does.

The template comes from `chat_template.jinja` (transformers >= 4.43 writes it beside the
tokenizer) or the `chat_template` entry of `tokenizer_config.json` (a string, or a list of
named templates of which "default" is used). It runs in jinja2's immutable sandbox, so a
template cannot touch the server; its `raise_exception(...)` calls (e.g. "roles must
alternate") become ChatTemplateError, which the server reports as a 400.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (no template, or the template refused them)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class ChatTemplate:
    """A model's template; a missing or broken one is reported on each chat request, so that
    /v1/completions still serves such a model."""

    def __init__(self, source: str | None, special_tokens: dict[str, str], origin: str) -> None:
        self.source = source
        self.special_tokens = special_tokens  # only those the folder sets; templates see the others undefined
        self._template: jinja2.Template | None = None
        self._problem: str | None = None
        if source is None:
            self._problem = (f"this model has no chat template (none in {origin}); use /v1/completions with a "
                             "prompt, or add a chat_template to the model's tokenizer_config.json")
            return
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            self._problem = f"the chat template in {origin} does not parse ({exc}); fix it or use /v1/completions"

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ChatTemplate:
        path = Path(path)
        config_file = path / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text())
            except json.JSONDecodeError as exc:
                return cls(None, {}, f"{config_file}, which is not valid JSON: {exc}")
        special = {name: _token_text(config[name]) for name in SPECIAL_TOKENS if config.get(name) is not None}
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            return cls(jinja_file.read_text(), special, str(jinja_file))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": ..., "template": ...}]
            named = {entry.get("name"): entry.get("template") for entry in source if isinstance(entry, dict)}
            source = named.get("default")
        return cls(source if isinstance(source, str) else None, special, str(config_file))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        if self._template is None:
            raise ChatTemplateError(self._problem)
        variables = {**self.special_tokens, **kwargs, "messages": messages,
                     "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed on these messages: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            # A template indexing content it assumes to be there (messages[0], message.tool_calls...).
            raise ChatTemplateError(f"the chat template cannot render these messages: {type(exc).__name__}: {exc}") \
                from None


def _token_text(entry: Any) -> str:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    return str(entry.get("content", "")) if isinstance(entry, dict) else str(entry)
