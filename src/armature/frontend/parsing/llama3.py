"""Llama 3.1/3.2 JSON tool calls: the whole output is one or more call objects separated by
`;`, optionally after `<|python_tag|>`:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

An output that does not start that way is content, and so is one whose region is not
calls from start to end.
"""

from __future__ import annotations

from armature.frontend.parsing.call_reader import CallObjectReader
from armature.frontend.parsing.region import RegionFormat
from armature.frontend.parsing.tool_call import (
    CallDelta,
    ToolCall,
    call_from_object,
    raw_decode_json,
)

__all__ = ["LLAMA3_JSON", "PYTHON_TAG", "Llama3Reader", "parse_call_objects"]

PYTHON_TAG = "<|python_tag|>"


def parse_call_objects(region: str) -> tuple[ToolCall, ...] | None:
    """`{call}; {call} ...` (after an optional python tag), consumed to the end."""
    text = region.removeprefix(PYTHON_TAG)
    calls: list[ToolCall] = []
    at = 0
    while True:
        at = _skip_space(text, at)
        try:
            obj, at = raw_decode_json(text, at)
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


class Llama3Reader:
    """`parse_call_objects`'s region as it streams (a RegionReader)."""

    def __init__(self) -> None:
        self.failed = False
        self.num_begun = 0
        self._state = "start"  # start | before (a call) | call | after (a call)
        self._call = CallObjectReader(0)

    def feed(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        while text and not self.failed:
            if self._state == "call":
                out += self._call.feed(text)
                self.num_begun = self._call.number + self._call.header_sent
                self.failed = self._call.failed
                if not self._call.done:
                    break
                text, self._state = self._call.rest, "after"
            elif text[0].isspace():
                text = text[1:]
            elif self._state == "start" and text.startswith(PYTHON_TAG):
                # the region opened with its opener whole: the tag is never cut here
                text, self._state = text[len(PYTHON_TAG) :], "before"
            elif self._state in ("start", "before") and text[0] == "{":
                self._call, self._state = CallObjectReader(self.num_begun), "call"
            elif self._state == "after" and text[0] == ";":
                text, self._state = text[1:], "before"
            else:
                self.failed = True
        return out

    def finish(self) -> bool:
        return not self.failed and self._state == "after"


LLAMA3_JSON = RegionFormat(
    openers=(PYTHON_TAG, "{"),
    at_start=True,
    parse_region=parse_call_objects,
    markers=(PYTHON_TAG,),
    reader=Llama3Reader,
)
