"""Helpers shared by the parser tests: random chunkings and running a stream over them."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from armature.frontend.parsing.reasoning import ReasoningSplit, ThinkParser
from armature.frontend.parsing.tool_call import ParsedToolCalls, ToolCall, ToolCallParser


@st.composite
def chunked(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at random places (a repeated cut gives an empty delta)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 2)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def stream_tools(parser: ToolCallParser, chunks: list[str]) -> ParsedToolCalls:
    stream = parser.stream()
    content: list[str] = []
    calls: list[ToolCall] = []
    for part in [*(stream.feed(c) for c in chunks), stream.finish()]:
        content.append(part.content)
        calls.extend(part.calls)
    return ParsedToolCalls("".join(content), tuple(calls))


def stream_reasoning(parser: ThinkParser, chunks: list[str]) -> tuple[ReasoningSplit, int]:
    """The joined split and the reasoning tokens counted, one token per chunk."""
    stream = parser.stream()
    parts = [*(stream.feed(c, 1) for c in chunks), stream.finish()]
    split = ReasoningSplit(
        "".join(p.reasoning or "" for p in parts), "".join(p.content for p in parts)
    )
    return split, stream.num_reasoning_tokens
