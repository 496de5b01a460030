"""ChatTemplate: where the template comes from, and rendering as transformers' apply_chat_template does."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from quantgate.engine.chat_template import ChatTemplate, ChatTemplateError

MESSAGES = [{"role": "system", "content": "Sei breve."}, {"role": "user", "content": "Può darsi?"},
            {"role": "user", "content": "dropped"}]

# Block tags on their own, indented lines; a loop that breaks; tojson of non-ASCII text.
LAYOUT = """{% for message in messages %}
  {% if loop.index > 2 %}{% break %}{% endif %}
  <{{ message['role'] }}>{{ message | tojson }}
{% endfor %}
{% if add_generation_prompt %}
  <assistant>
{% endif %}"""


def _template(source: str, **special: str) -> ChatTemplate:
    return ChatTemplate(source, special, "test")


def _folder(tmp_path: Path, config: dict | str, jinja: str | None = None) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return tmp_path


def test_block_whitespace_loop_controls_and_tojson_render_as_transformers_does() -> None:
    # The expected texts are transformers 4.x apply_chat_template(..., chat_template=LAYOUT, tokenize=False).
    template = _template(LAYOUT)
    system_and_user = ('  <system>{"role": "system", "content": "Sei breve."}\n'
                       '  <user>{"role": "user", "content": "Può darsi?"}\n')
    assert template.render(MESSAGES, add_generation_prompt=True) == system_and_user + "  <assistant>\n"
    assert template.render(MESSAGES, add_generation_prompt=False) == system_and_user


def test_special_tokens_stored_as_added_token_dicts_render_as_their_text(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"bos_token": {"content": "<s>", "lstrip": False, "special": True},
                                "eos_token": "</s>", "pad_token": None,
                                "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"})
    template = ChatTemplate.from_model_dir(folder)
    assert template.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>hi</s>"


def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"chat_template": "from the config"}, jinja="from the jinja file")
    assert ChatTemplate.from_model_dir(folder).render([]) == "from the jinja file"


def test_of_named_templates_the_default_one_is_used(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"chat_template": [{"name": "tool_use", "template": "tools"},
                                                  {"name": "default", "template": "plain"}]})
    assert ChatTemplate.from_model_dir(folder).render([]) == "plain"


def test_a_tokenizer_config_that_is_not_json_is_reported_on_each_chat_request(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "{not json")
    template = ChatTemplate.from_model_dir(folder)  # the server still starts: /v1/completions serves
    with pytest.raises(ChatTemplateError) as caught:
        template.render([{"role": "user", "content": "hi"}])
    assert str(caught.value) == (
        f"this model has no chat template (none in {folder / 'tokenizer_config.json'}, which is not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); use /v1/completions with "
        "a prompt, or add a chat_template to the model's tokenizer_config.json")


def test_a_template_refusal_keeps_the_templates_own_message() -> None:
    template = _template("{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}"
                         "{% endif %}ok")
    assert template.render([{"role": "user", "content": "hi"}]) == "ok"
    with pytest.raises(ChatTemplateError) as caught:
        template.render([{"role": "assistant", "content": "hi"}])
    assert str(caught.value) == "roles must alternate"


@pytest.mark.parametrize(("source", "message"), [
    ("{{ messages[0].nope.upper() }}",
     "the chat template failed on these messages: 'dict object' has no attribute 'nope'"),
    ("{{ messages[0]['content'] + 1 }}",
     'the chat template cannot render these messages: TypeError: can only concatenate str (not "int") to str'),
    ("{{ '{role}'.format() }}", "the chat template cannot render these messages: KeyError: 'role'"),
])
def test_a_template_failing_on_the_messages_is_a_chat_template_error(source: str, message: str) -> None:
    with pytest.raises(ChatTemplateError) as caught:
        _template(source).render([{"role": "user", "content": "hi"}])
    assert str(caught.value) == message


def test_strftime_now_gives_templates_the_date() -> None:
    before = datetime.now().year
    assert _template("{{ strftime_now('%Y') }}").render([]) in (str(before), str(before + 1))


def test_template_kwargs_reach_the_template_and_override_special_tokens_as_in_transformers() -> None:
    template = _template("{{ bos_token }}|{{ enable_thinking }}", bos_token="<s>")
    assert template.render([], enable_thinking=False) == "<s>|False"
    assert template.render([], bos_token="[BOS]", enable_thinking=True) == "[BOS]|True"
