"""Hermes-style tool calls (Qwen 2.5/3, Hermes, many fine-tunes): each call is a JSON object
between `<tool_call>` and `</tool_call>`, anywhere in the output, with content around it.

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each block stands alone: a block that holds one valid call becomes that call; any other
block (bad JSON, not a call, never closed) stays in the content, markers and all.
"""

from __future__ import annotations

import json
import re

from armature.frontend.parsing.tool_call import (
    ParsedToolCalls,
    ToolCall,
    call_from_object,
    held_prefix_chars,
)

__all__ = ["END", "START", "HermesParser", "HermesStream", "parse_block"]

START = "<tool_call>"
END = "</tool_call>"
_BLOCK = re.compile(re.escape(START) + "(.*?)" + re.escape(END), re.DOTALL)


def parse_block(body: str) -> ToolCall | None:
    """The call one block's body holds, or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return call_from_object(obj)


class HermesParser:
    markers = (START, END)

    def parse(self, text: str) -> ParsedToolCalls:
        content: list[str] = []
        calls: list[ToolCall] = []
        end = 0
        for match in _BLOCK.finditer(text):
            content.append(text[end : match.start()])
            call = parse_block(match.group(1))
            if call is None:
                content.append(match.group(0))
            else:
                calls.append(call)
            end = match.end()
        content.append(text[end:])
        return ParsedToolCalls("".join(content), tuple(calls))

    def stream(self) -> HermesStream:
        return HermesStream()


class HermesStream:
    """Content streams until a start marker may be arriving; a block is held until its end
    marker, then emitted as one call (or, when invalid, as content)."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet emitted: a partial marker, or a block's body so far
        self._in_block = False

    def feed(self, text: str) -> ParsedToolCalls:
        self._pending += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._in_block:
                end = self._pending.find(END)
                if end < 0:
                    break
                body = self._pending[:end]
                call = parse_block(body)
                if call is None:
                    content.append(START + body + END)
                else:
                    calls.append(call)
                self._pending = self._pending[end + len(END) :]
                self._in_block = False
                continue
            start = self._pending.find(START)
            if start < 0:
                keep = held_prefix_chars(self._pending, START)
                content.append(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                break
            content.append(self._pending[:start])
            self._pending = self._pending[start + len(START) :]
            self._in_block = True
        return ParsedToolCalls("".join(content), tuple(calls))

    def finish(self) -> ParsedToolCalls:
        rest = (START if self._in_block else "") + self._pending
        self._pending = ""
        self._in_block = False
        return ParsedToolCalls(rest)
