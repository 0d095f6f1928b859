"""Forced tool calls (`tool_choice: required` or a named function) as a grammar over the
active tool-call parser's format, so the model can only write calls the parser reads, each
naming an offered function with arguments valid against its parameters' schema. Pure.

    hermes       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>, one per line
    llama3_json  {"name": "f", "parameters": {...}}; {"name": "g", ...}

The other parsers' formats (mistral's special token, pythonic calls) have no grammar yet:
asking them for forced calls is refused by the caller (chat_request.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from armature.frontend.tool_protocol import ToolSpec
from armature.grammar.compile import JSON_OPTIONS
from armature.protocols.guide import LarkGuide

__all__ = ["CALL_FORMATS", "CallFormat", "tool_call_guide"]


@dataclass(frozen=True)
class CallFormat:
    """How one parser's format writes calls: around each call object, between calls, and
    the key its arguments go under."""

    before: str
    after: str
    separator: str
    arguments_key: str


CALL_FORMATS: dict[str, CallFormat] = {
    "hermes": CallFormat("<tool_call>\n", "\n</tool_call>", "\n", "arguments"),
    "llama3_json": CallFormat("", "", "; ", "parameters"),
}


def tool_call_guide(
    call_format: CallFormat, tools: list[ToolSpec], max_calls: int | None
) -> LarkGuide:
    """A grammar for one call (`max_calls` 1) or one or more calls to any of `tools`."""
    rules = []
    names = []
    for i, tool in enumerate(tools):
        schema = _call_schema(tool, call_format.arguments_key)
        rules.append(f"call_{i}: {_lit(call_format.before)} object_{i} {_lit(call_format.after)}")
        rules.append(f"object_{i}: %json {json.dumps(schema)}")
        names.append(f"call_{i}")
    repeat = "" if max_calls == 1 else f" ({_lit(call_format.separator)} call)*"
    lines = [f"start: call{repeat}", "call: " + " | ".join(names), *rules]
    return LarkGuide(grammar="\n".join(lines) + "\n", param="tool_choice")


def _call_schema(tool: ToolSpec, arguments_key: str) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    return {
        "x-guidance": JSON_OPTIONS,  # the %json of a Lark grammar takes its options here
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _lit(text: str) -> str:
    """`text` as a Lark string literal ('""' matches nothing and is dropped by Lark)."""
    return json.dumps(text) if text else '""'
