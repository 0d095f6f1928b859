"""One chat choice's output, shaped as OpenAI returns it: text deltas in, reasoning, content
and tool calls out (reasoning first, then tool calls read from what follows it). Pure: the
parsers do the reading; this joins them, numbers the calls and builds the JSON.

Streamed, a call goes out whole, in one delta `{index, id, type, function: {name,
arguments}}`, once the parser has made it whole (parsing/tool_call.py: a Hermes block
closed, a region of calls at the output's end): a delta sent cannot be taken back, and a
call that turns out malformed after it began (bad JSON, its text cut by max_tokens) is no
call in the non-streamed message. Its text comes as content instead, so the streamed
deltas join to exactly the non-streamed message. Never a 500.

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
    ToolCallStream,
    WholeCall,
)

__all__ = ["CallPiece", "ChatOutput", "ChatPiece", "chat_message"]


@dataclass(frozen=True)
class CallPiece:
    """One whole tool call of the choice, numbered `index` in it, with the id clients
    answer it by."""

    index: int
    arguments: str
    id: str
    name: str

    def call(self) -> dict[str, Any]:
        """The message's `tool_calls` entry."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}

    def delta(self) -> dict[str, Any]:
        """The chunk's `tool_calls` entry: the call with its index (all of it at once)."""
        return {"index": self.index, **self.call()}


ContentPart = str | CallPiece  # str: content


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
    num_calls: int = field(default=0, init=False)  # calls sent
    # the calls begun and not yet whole: the stream's call number -> name, arguments so far
    _begun: dict[int, tuple[str, list[str]]] = field(default_factory=dict, init=False)
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
        """`tool_calls` for an output that stopped after calling tools."""
        return "tool_calls" if self.num_calls and engine_reason == "stop" else engine_reason

    def _content(self, text: str, *, last: bool) -> ChatPiece:
        if self.tools is None:
            return ChatPiece(parts=(text,) if text else ())
        parsed = self.tools.feed(text)
        if last:
            parsed += self.tools.finish()
        parts: list[ContentPart] = []
        for part in parsed.parts:
            if isinstance(part, CallDelta | BrokenCall):
                self._hold(part)
                continue
            issued = self._issue(part.number) if isinstance(part, WholeCall) else part
            if isinstance(issued, str) and not self._has_text:
                if not issued.strip():
                    self._held += issued
                    continue
                issued, self._held, self._has_text = self._held + issued, "", True
            if issued is not None:
                parts.append(issued)
        if last:
            assert not self._begun, "the stream's finish makes every call whole or broken"
            if self._held and not self.num_calls:
                parts.append(self._held)  # no call after all: the whitespace is the content
                self._held = ""
        return ChatPiece(parts=tuple(parts))

    def _hold(self, part: CallDelta | BrokenCall) -> None:
        """A call's delta is kept until the call is whole; a broken call is dropped (its
        text follows as content)."""
        if isinstance(part, BrokenCall):
            del self._begun[part.number]
        elif part.name is not None:
            self._begun[part.number] = (part.name, [part.arguments])
        else:
            self._begun[part.number][1].append(part.arguments)

    def _issue(self, number: int) -> CallPiece | None:
        """The stream's whole call `number` with its index in the choice (None: dropped
        past max_calls)."""
        name, arguments = self._begun.pop(number)
        if self.max_calls is not None and self.num_calls >= self.max_calls:
            return None
        index, self.num_calls = self.num_calls, self.num_calls + 1
        return CallPiece(index, "".join(arguments), self.new_call_id(), name)


def chat_message(pieces: list[ChatPiece]) -> dict[str, Any]:
    """The whole response's `message` from every piece of the choice: what the streamed
    deltas join to."""
    content = "".join(p.content for p in pieces)
    reasoning = "".join(p.reasoning for p in pieces)
    calls = [call.call() for p in pieces for call in p.calls]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        if not content.strip():
            message["content"] = None
    if reasoning:
        message["reasoning_content"] = reasoning
    return message
