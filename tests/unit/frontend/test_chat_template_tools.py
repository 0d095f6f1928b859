"""Tools through the default model's tokenizer: what its own template renders (neither tools
nor calls, so the frontend refuses them), and the ChatML tools template round-tripping an
agent turn: the calls it writes parse back, with the hermes parser, to the same calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from armature.frontend.chat_request import template_messages
from armature.frontend.chat_setup import chatml_tools_template
from armature.frontend.parsing import TOOL_CALL_PARSERS
from armature.frontend.parsing.tool_call import ToolCall
from armature.frontend.preprocess import Preprocessor
from armature.frontend.protocol import ChatMessage

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

TEMPLATE = chatml_tools_template()
TOOLS: Any = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALLS = [ToolCall("add", '{"a": 1, "b": [2, "three"]}'), ToolCall("add", "{}")]
HISTORY: Any = [
    {"role": "user", "content": "Add."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(CALLS)
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": "3"},
]


def test_the_default_template_renders_neither_tools_nor_calls(default_model_dir: Path) -> None:
    preprocessor = Preprocessor(default_model_dir)
    features = preprocessor.template_features
    assert (features.takes_tools, features.renders_tool_calls) == (False, False)
    # a tool message alone still renders, by its role
    messages = template_messages(
        [ChatMessage.model_validate(m) for m in [HISTORY[0], HISTORY[2]]],
        preprocessor.template_features,
    )
    assert preprocessor.render_chat(messages).endswith(
        "<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    )


def test_calls_written_by_the_template_parse_back(default_model_dir: Path) -> None:
    preprocessor = Preprocessor(default_model_dir, TEMPLATE)
    features = preprocessor.template_features
    assert (features.takes_tools, features.renders_tool_calls) == (True, True)
    assert {"messages", "tools", "add_generation_prompt"} <= features.variables
    messages = template_messages([ChatMessage.model_validate(m) for m in HISTORY], features)
    text = preprocessor.render_chat(messages, TOOLS)
    assert json.dumps(TOOLS[0]) in text
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert TOOL_CALL_PARSERS["hermes"].parse(assistant).calls == tuple(CALLS)
    assert "<tool_response>\n3\n</tool_response>" in text
    # the prompt's tokens decode back to the rendered text
    ids = preprocessor.encode_chat(messages, TOOLS)
    assert preprocessor.decode(ids, skip_special_tokens=False) == text
