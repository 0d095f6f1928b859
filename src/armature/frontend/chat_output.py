"""One chat choice's output, shaped as OpenAI returns it: text deltas in, reasoning, content
and tool calls out (reasoning first, then tool calls read from what follows it). Pure: the
parsers do the reading; this joins them, numbers the calls and builds the JSON.

    text delta ─▶ ReasoningStream ─▶ reasoning_content
                        └─ content ─▶ ToolCallStream ─▶ content, tool_calls
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from armature.frontend.parsing.reasoning import ReasoningStream
from armature.frontend.parsing.tool_call import ParsedToolCalls, ToolCall, ToolCallStream

__all__ = ["ChatOutput", "ChatPiece", "IssuedCall", "chat_message"]


@dataclass(frozen=True)
class IssuedCall:
    """A parsed call with its place in the choice and the id clients answer it by."""

    index: int
    id: str
    call: ToolCall

    def as_dict(self) -> dict[str, Any]:
        function = {"name": self.call.name, "arguments": self.call.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class ChatPiece:
    reasoning: str = ""
    content: str = ""
    calls: tuple[IssuedCall, ...] = ()

    def delta(self) -> dict[str, Any]:
        """The chunk's `delta`: only the fields this piece has."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content:
            out["content"] = self.content
        if self.calls:
            out["tool_calls"] = [{"index": c.index, **c.as_dict()} for c in self.calls]
        return out


@dataclass
class ChatOutput:
    """Feed each text delta in order with its token count, the last one with `last=True`.
    With no parsers, text passes through as content."""

    reasoning: ReasoningStream | None
    tools: ToolCallStream | None
    new_call_id: Callable[[], str]
    max_calls: int | None = None  # calls past this many are dropped (parallel_tool_calls)
    num_calls: int = field(default=0, init=False)

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
        return ChatPiece(reasoning, piece.content, piece.calls)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """`tool_calls` for an output that stopped after calling tools."""
        return "tool_calls" if self.num_calls and engine_reason == "stop" else engine_reason

    def _content(self, text: str, *, last: bool) -> ChatPiece:
        if self.tools is None:
            return ChatPiece(content=text)
        parsed = self.tools.feed(text)
        if last:
            rest = self.tools.finish()
            parsed = ParsedToolCalls(parsed.content + rest.content, parsed.calls + rest.calls)
        return ChatPiece(content=parsed.content, calls=self._issue(parsed.calls))

    def _issue(self, calls: tuple[ToolCall, ...]) -> tuple[IssuedCall, ...]:
        issued = []
        for call in calls:
            if self.max_calls is not None and self.num_calls >= self.max_calls:
                break
            issued.append(IssuedCall(self.num_calls, self.new_call_id(), call))
            self.num_calls += 1
        return tuple(issued)


def chat_message(pieces: list[ChatPiece]) -> dict[str, Any]:
    """The whole response's `message` from every piece of the choice."""
    content = "".join(p.content for p in pieces)
    reasoning = "".join(p.reasoning for p in pieces)
    calls = [c.as_dict() for p in pieces for c in p.calls]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        if not content.strip():
            message["content"] = None
    if reasoning:
        message["reasoning_content"] = reasoning
    return message
