"""The chat setup chosen at startup on the default model's tokenizer: the bundled ChatML tools
template and the hermes parser where the model's own ChatML template renders no tools, and
the explicit flags winning; the ChatML check itself; the choice logged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from armature.config.chat import ChatConfig
from armature.frontend.chat_setup import chatml_tools_template, load_chat_setup, renders_like
from armature.frontend.preprocess import Preprocessor

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

LLAMA_STYLE = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
FAILS = "{{ raise_exception('system messages are not supported') }}"
TOOLS = [{"type": "function", "function": {"name": "f"}}]
ASK = [{"role": "user", "content": "Hi."}]


def test_default_model_gets_the_bundled_template_and_hermes(
    default_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="armature.frontend.chat_setup"):
        setup = load_chat_setup(default_model_dir, ChatConfig())
    assert setup.parsers.tool_call_name == "hermes"
    assert setup.preprocessor.tools_template == chatml_tools_template()
    features = setup.preprocessor.template_features
    assert (features.takes_tools, features.renders_tool_calls) == (True, True)
    assert caplog.messages == [
        "chat template: the bundled ChatML tools template for chats with tools (the model's "
        "own ChatML template renders no tools); tool-call parser: hermes; reasoning parser: "
        "none"
    ]
    # chats with tools (or tool history) go through it, the others through the model's own
    own = Preprocessor(default_model_dir)
    assert setup.preprocessor.render_chat(ASK) == own.render_chat(ASK)
    assert "<tools>" in setup.preprocessor.render_chat(ASK, TOOLS)
    answered = [*ASK, {"role": "tool", "tool_call_id": "c", "content": "3"}]
    assert "<tool_response>\n3\n</tool_response>" in setup.preprocessor.render_chat(answered)


def test_explicit_flags_win(default_model_dir: Path, tmp_path: Path) -> None:
    hermes = load_chat_setup(default_model_dir, ChatConfig(tool_call_parser="hermes"))
    assert hermes.preprocessor.tools_template is not None

    other = load_chat_setup(default_model_dir, ChatConfig(tool_call_parser="llama3_json"))
    assert other.preprocessor.tools_template is None
    assert other.parsers.tool_call_name == "llama3_json"
    assert other.template == "the model's own (it renders no tools; --tool-call-parser llama3_json)"

    path = tmp_path / "t.jinja"
    path.write_text(LLAMA_STYLE)
    explicit = load_chat_setup(default_model_dir, ChatConfig(chat_template=str(path)))
    assert explicit.preprocessor.tools_template is None
    assert explicit.parsers.tool_call_name is None  # no parser given: tools are refused
    assert explicit.template == f"--chat-template {path}"
    assert explicit.preprocessor.render_chat(ASK).startswith("<|start_header_id|>user")


def test_only_a_template_that_renders_chatml_counts_as_chatml(default_model_dir: Path) -> None:
    bundled = chatml_tools_template()
    assert renders_like(Preprocessor(default_model_dir), bundled)
    assert not renders_like(Preprocessor(default_model_dir, LLAMA_STYLE), bundled)
    assert not renders_like(Preprocessor(default_model_dir, FAILS), bundled)
    # ChatML markers, another layout: a space after the role
    near = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>\n"
        "{% endfor %}"
    )
    assert not renders_like(Preprocessor(default_model_dir, near), bundled)
