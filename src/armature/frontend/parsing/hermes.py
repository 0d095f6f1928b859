"""Hermes-style tool calls (Qwen 2.5/3, Hermes, many fine-tunes): each call is a JSON object
between `<tool_call>` and `</tool_call>`, anywhere in the output, with content around it.

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each block stands alone: a block that holds one valid call to an offered function becomes
that call; any other block (bad JSON, not a call, another function, never closed) stays in
the content, markers and all. Streamed, a call's name goes out once known and its
arguments as they are read; it is whole once its block closes.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from armature.frontend.parsing.call_reader import CallObjectReader
from armature.frontend.parsing.json_canon import JSON_SPACE
from armature.frontend.parsing.tool_call import (
    BrokenCall,
    ParsedToolCalls,
    StreamedToolCalls,
    StreamPart,
    ToolCall,
    WholeCall,
    call_from_object,
    cut_at_marker,
    loads_json,
    offered,
)

__all__ = ["END", "START", "HermesParser", "HermesStream", "parse_block"]

START = "<tool_call>"
END = "</tool_call>"
_BLOCK = re.compile(re.escape(START) + "(.*?)" + re.escape(END), re.DOTALL)


def parse_block(body: str) -> ToolCall | None:
    """The call one block's body holds, or None."""
    try:
        obj = loads_json(body)
    except ValueError:
        return None
    return call_from_object(obj)


class HermesParser:
    markers = (START, END)

    def parse(self, text: str, names: Collection[str] | None = None) -> ParsedToolCalls:
        content: list[str] = []
        calls: list[ToolCall] = []
        end = 0
        for match in _BLOCK.finditer(text):
            content.append(text[end : match.start()])
            call = parse_block(match.group(1))
            if call is None or not offered(call, names):
                content.append(match.group(0))
            else:
                calls.append(call)
            end = match.end()
        content.append(text[end:])
        return ParsedToolCalls("".join(content), tuple(calls))

    def stream(self, names: Collection[str] | None = None) -> HermesStream:
        return HermesStream(names)


class HermesStream:
    """Content streams until a start marker may be arriving. A block's call streams as it
    is read (call_reader.py), up to the block's first end marker (where the whole-output
    parse ends it too); a block that does not hold exactly one call to an offered function
    there (or never closes) is content, markers and all, and its call, if begun, is
    broken."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        self._names = names
        self._pending = ""  # text not yet read: a partial start or end marker
        self._body: str | None = None  # in a block: its text so far
        self._reader = CallObjectReader(0)
        self._offered = True  # the block's call names no function but an offered one
        self._num_calls = 0

    def feed(self, text: str) -> StreamedToolCalls:
        self._pending += text
        parts: list[StreamPart] = []
        while True:
            marker = START if self._body is None else END
            ready, self._pending, found = cut_at_marker(self._pending, marker)
            self._take(ready, parts)
            if not found:
                break
            if self._body is None:
                self._body, self._reader = "", CallObjectReader(self._num_calls)
                self._offered = True
            else:
                self._end_block(parts, closed=True)
        return StreamedToolCalls.of(parts)

    def finish(self) -> StreamedToolCalls:
        parts: list[StreamPart] = []
        self._take(self._pending, parts)
        self._pending = ""
        if self._body is not None:
            self._end_block(parts, closed=False)
        return StreamedToolCalls.of(parts)

    def _take(self, text: str, parts: list[StreamPart]) -> None:
        """Text outside a block is content; inside, the block's call reads it."""
        if self._body is None:
            parts.append(text)
            return
        self._body += text
        deltas = self._reader.feed(text)
        self._offered = self._offered and all(offered(d, self._names) for d in deltas)
        parts.extend(deltas)

    def _end_block(self, parts: list[StreamPart], *, closed: bool) -> None:
        reader, body = self._reader, self._body
        assert body is not None
        self._body = None
        if reader.header_sent:
            self._num_calls += 1
        if closed and reader.done and self._offered and not reader.rest.strip(JSON_SPACE):
            parts.append(WholeCall(reader.number))
            return
        if reader.header_sent:
            parts.append(BrokenCall(reader.number))
        parts.append(START + body + (END if closed else ""))
