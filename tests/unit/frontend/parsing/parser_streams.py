"""Helpers shared by the parser tests: random chunkings and running a stream over them."""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass

from hypothesis import strategies as st

from armature.frontend.parsing.reasoning import ReasoningSplit, ThinkParser
from armature.frontend.parsing.tool_call import (
    BrokenCall,
    CallDelta,
    ParsedToolCalls,
    ToolCall,
    ToolCallParser,
    WholeCall,
)


@st.composite
def chunked(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at random places (a repeated cut gives an empty delta)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 2)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@dataclass
class StreamedOutput:
    """Everything a stream sent for one output."""

    content: str
    deltas: list[CallDelta]
    broken: set[int]
    whole: list[int]  # the calls made whole, in the order they were

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls made whole, each its name and joined arguments, in order."""
        names: dict[int, str] = {}
        arguments: dict[int, list[str]] = {}
        for delta in self.deltas:
            if delta.name is not None:
                assert delta.number not in names, "one first delta per call"
                names[delta.number] = delta.name
            assert delta.number in names, "a call's first delta names it"
            arguments.setdefault(delta.number, []).append(delta.arguments)
        assert sorted(names) == list(range(len(names))), "calls numbered from 0 in order"
        assert sorted(self.broken | set(self.whole)) == sorted(names), "each whole or broken"
        return tuple(ToolCall(names[n], "".join(arguments[n])) for n in self.whole)

    def argument_deltas(self, number: int) -> list[str]:
        return [d.arguments for d in self.deltas if d.number == number and d.arguments]


def run_stream(
    parser: ToolCallParser, chunks: list[str], names: Collection[str] | None = None
) -> StreamedOutput:
    stream = parser.stream(names)
    out = StreamedOutput("", [], set(), [])
    for result in [*(stream.feed(c) for c in chunks), stream.finish()]:
        for part in result.parts:
            if isinstance(part, str):
                assert part, "no empty content"
                out.content += part
            elif isinstance(part, BrokenCall | WholeCall):
                assert part.number not in out.broken | set(out.whole), "one end per call"
                if isinstance(part, BrokenCall):
                    out.broken.add(part.number)
                else:
                    out.whole.append(part.number)
            else:
                assert part.number not in out.broken | set(out.whole), "no delta after its end"
                out.deltas.append(part)
    return out


def stream_tools(
    parser: ToolCallParser, chunks: list[str], names: Collection[str] | None = None
) -> ParsedToolCalls:
    """The stream's content and unbroken calls, as the whole-output parse gives them."""
    out = run_stream(parser, chunks, names)
    return ParsedToolCalls(out.content, out.calls())


def stream_reasoning(parser: ThinkParser, chunks: list[str]) -> tuple[ReasoningSplit, int]:
    """The joined split and the reasoning tokens counted, one token per chunk."""
    stream = parser.stream()
    parts = [*(stream.feed(c, 1) for c in chunks), stream.finish()]
    split = ReasoningSplit(
        "".join(p.reasoning or "" for p in parts), "".join(p.content for p in parts)
    )
    return split, stream.num_reasoning_tokens
