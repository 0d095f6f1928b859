"""Llama 3.1/3.2 JSON tool calls: the whole output is one or more call objects separated by
`;`, optionally after `<|python_tag|>`:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

An output that does not start that way is content, and so is one whose region is not
calls from start to end.
"""

from __future__ import annotations

import json

from armature.frontend.parsing.region import RegionFormat
from armature.frontend.parsing.tool_call import ToolCall, call_from_object

__all__ = ["LLAMA3_JSON", "PYTHON_TAG", "parse_call_objects"]

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def parse_call_objects(region: str) -> tuple[ToolCall, ...] | None:
    """`{call}; {call} ...` (after an optional python tag), consumed to the end."""
    text = region.removeprefix(PYTHON_TAG)
    calls: list[ToolCall] = []
    at = 0
    while True:
        at = _skip_space(text, at)
        try:
            obj, at = _DECODER.raw_decode(text, at)
        except ValueError:
            return None
        call = call_from_object(obj)
        if call is None:
            return None
        calls.append(call)
        at = _skip_space(text, at)
        if at == len(text):
            return tuple(calls)
        if text[at] != ";":
            return None
        at += 1


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


LLAMA3_JSON = RegionFormat(
    openers=(PYTHON_TAG, "{"),
    at_start=True,
    parse_region=parse_call_objects,
    markers=(PYTHON_TAG,),
)
