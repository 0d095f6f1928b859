"""One chat choice's output, shaped as OpenAI returns it: text deltas in, reasoning, content
and tool calls out (reasoning first, then tool calls read from what follows it). Pure: the
parsers do the reading; this joins them, numbers the calls and builds the JSON.

Streamed, a call goes out as OpenAI's deltas: first `{index, id, type, function: {name,
arguments}}` once its name is known, then `{index, function: {arguments}}` pieces, which
join to the arguments the whole message gives. When model output turns out malformed after
a call began (parsing/tool_call.py), the streamed client keeps the call as far as it got
(its arguments then not a whole JSON object), receives the call's text as content, and gets
finish_reason `tool_calls` only if some call was whole; the whole message is then exactly
the non-streamed one: that text as content, without the call. Never a 500.

    text delta ─▶ ReasoningStream ─▶ reasoning_content
                        └─ content ─▶ ToolCallStream ─▶ content, tool_calls
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from armature.frontend.parsing.reasoning import ReasoningStream
from armature.frontend.parsing.tool_call import (
    BrokenCall,
    CallDelta,
    StreamPart,
    ToolCallStream,
)

__all__ = ["BrokenPiece", "CallPiece", "ChatOutput", "ChatPiece", "chat_message"]


@dataclass(frozen=True)
class CallPiece:
    """A piece of one tool call of the choice, numbered `index` in it: the first names the
    call (with the id clients answer it by); later ones carry only argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def delta(self) -> dict[str, Any]:
        """The chunk's `tool_calls` entry (OpenAI's incremental shape)."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class BrokenPiece:
    """The call `index`, begun, is not a call (parsing/tool_call.py): a streamed client
    keeps what it got of it; the whole message leaves it out."""

    index: int


ContentPart = str | CallPiece | BrokenPiece  # str: content


@dataclass(frozen=True)
class ChatPiece:
    """What one text delta adds to the choice: reasoning, then content and call pieces in
    output order."""

    reasoning: str = ""
    parts: tuple[ContentPart, ...] = ()

    @property
    def content(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def calls(self) -> tuple[CallPiece, ...]:
        return tuple(p for p in self.parts if isinstance(p, CallPiece))

    def delta(self) -> dict[str, Any]:
        """The chunk's `delta`: only the fields this piece has."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if content := self.content:
            out["content"] = content
        if calls := self.calls:
            out["tool_calls"] = [c.delta() for c in calls]
        return out


@dataclass
class ChatOutput:
    """Feed each text delta in order with its token count, the last one with `last=True`.
    With no parsers, text passes through as content."""

    reasoning: ReasoningStream | None
    tools: ToolCallStream | None
    new_call_id: Callable[[], str]
    max_calls: int | None = None  # calls past this many are dropped (parallel_tool_calls)
    num_calls: int = field(default=0, init=False)  # calls begun
    # the stream's call number -> its index in the choice (None: dropped past max_calls)
    _indexes: dict[int, int | None] = field(default_factory=dict, init=False)
    _num_broken: int = field(default=0, init=False)
    # content that is only whitespace so far is held: the whole message's content is null
    # when it is all there is beside calls (the blank lines around and between them), so a
    # stream sends it only once text follows, or at the end of an output with no call
    _held: str = field(default="", init=False)
    _has_text: bool = field(default=False, init=False)

    @property
    def num_reasoning_tokens(self) -> int | None:
        return None if self.reasoning is None else self.reasoning.num_reasoning_tokens

    def feed(self, text: str, num_tokens: int, *, last: bool = False) -> ChatPiece:
        if self.reasoning is None:
            return self._content(text, last=last)
        split = self.reasoning.feed(text, num_tokens)
        reasoning, content = split.reasoning or "", split.content
        if last:
            rest = self.reasoning.finish()
            reasoning, content = reasoning + (rest.reasoning or ""), content + rest.content
        piece = self._content(content, last=last)
        return ChatPiece(reasoning, piece.parts)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """`tool_calls` for an output that stopped after calling tools (calls not broken)."""
        called = self.num_calls > self._num_broken
        return "tool_calls" if called and engine_reason == "stop" else engine_reason

    def _content(self, text: str, *, last: bool) -> ChatPiece:
        if self.tools is None:
            return ChatPiece(parts=(text,) if text else ())
        parsed = self.tools.feed(text)
        if last:
            parsed += self.tools.finish()
        parts: list[ContentPart] = []
        for part in parsed.parts:
            issued = self._issue(part)
            if isinstance(issued, str) and not self._has_text:
                if not issued.strip():
                    self._held += issued
                    continue
                issued, self._held, self._has_text = self._held + issued, "", True
            if issued is not None:
                parts.append(issued)
        if last and self._held and self.num_calls == self._num_broken:
            parts.append(self._held)  # no call after all: the whitespace is the content
            self._held = ""
        return ChatPiece(parts=tuple(parts))

    def _issue(self, part: StreamPart) -> ContentPart | None:
        """The stream's part with the call's index in the choice (None: a dropped call's)."""
        if isinstance(part, str):
            return part
        if isinstance(part, CallDelta) and part.name is not None:
            index = None
            # a call that broke after it began gives its slot back (its text went out as
            # content): the whole-output parse never counted it
            if self.max_calls is None or self.num_calls - self._num_broken < self.max_calls:
                index, self.num_calls = self.num_calls, self.num_calls + 1
            self._indexes[part.number] = index
            if index is None:
                return None
            return CallPiece(index, part.arguments, self.new_call_id(), part.name)
        index = self._indexes[part.number]
        if index is None:
            return None
        if isinstance(part, BrokenCall):
            self._num_broken += 1
            return BrokenPiece(index)
        return CallPiece(index, part.arguments)


def chat_message(pieces: list[ChatPiece]) -> dict[str, Any]:
    """The whole response's `message` from every piece of the choice: the calls joined from
    their pieces, less the broken ones."""
    content = "".join(p.content for p in pieces)
    reasoning = "".join(p.reasoning for p in pieces)
    calls: dict[int, dict[str, Any]] = {}
    for part in (part for p in pieces for part in p.parts):
        if isinstance(part, CallPiece) and part.id is not None:
            function = {"name": part.name, "arguments": part.arguments}
            calls[part.index] = {"id": part.id, "type": "function", "function": function}
        elif isinstance(part, CallPiece):
            calls[part.index]["function"]["arguments"] += part.arguments
        elif isinstance(part, BrokenPiece):
            calls.pop(part.index)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls.values())
        if not content.strip():
            message["content"] = None
    if reasoning:
        message["reasoning_content"] = reasoning
    return message
