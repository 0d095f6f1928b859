"""What a tool-call parser returns, the two shapes every parser has (whole output and a
stream), and the one rule that turns a decoded JSON object into a call.

A parser never raises on model output: text it cannot read as calls stays content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ARGUMENT_KEYS",
    "ParsedToolCalls",
    "ToolCall",
    "ToolCallParser",
    "ToolCallStream",
    "call_from_object",
    "held_prefix_chars",
]

# The keys models put a call's arguments under: OpenAI/hermes say arguments, Llama 3 says
# parameters.
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON object text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedToolCalls:
    """Output text split into what the user reads and the calls the model made."""

    content: str
    calls: tuple[ToolCall, ...] = ()


class ToolCallStream(Protocol):
    """One output's incremental parser. `feed` takes each text delta in order and returns the
    content now safe to show and the calls now complete; `finish` (once, at the end) returns
    the rest. The concatenated results equal the parser's whole-output `parse`."""

    def feed(self, text: str) -> ParsedToolCalls: ...

    def finish(self) -> ParsedToolCalls: ...


class ToolCallParser(Protocol):
    """A model family's tool-call format (chosen by --tool-call-parser). `markers`: the
    format's marker strings, which some vocabularies hold as special tokens (Mistral's
    `[TOOL_CALLS]`, Llama's `<|python_tag|>`); decoding drops special tokens, so the
    frontend keeps these ones in the text it feeds the parser (chat_setup.py)."""

    @property
    def markers(self) -> tuple[str, ...]: ...

    def parse(self, text: str) -> ParsedToolCalls: ...

    def stream(self) -> ToolCallStream: ...


def call_from_object(obj: Any) -> ToolCall | None:
    """The call a decoded `{"name": ..., "arguments"|"parameters": {...}}` object describes
    (Llama 3.2 adds `"type": "function"`), or None when it is not exactly one. Arguments
    given as JSON text must hold an object too."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    keys = [key for key in ARGUMENT_KEYS if key in obj]
    if len(keys) != 1 or set(obj) - {"type"} != {"name", keys[0]}:
        return None
    if obj.get("type", "function") != "function":
        return None
    arguments = obj[keys[0]]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    try:  # json.loads reads NaN and Infinity, which JSON text must not carry
        return ToolCall(name, json.dumps(arguments, ensure_ascii=False, allow_nan=False))
    except ValueError:
        return None


def held_prefix_chars(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`: the
    characters a stream must hold back because the marker may be arriving."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
