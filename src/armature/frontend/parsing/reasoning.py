"""Reasoning parsers: `<think>…</think>` split off the answer, whole and streamed.

- `qwen3`: the output opens with `<think>` (leading whitespace aside) when it reasons;
  an output that does not is all content.
- `deepseek_r1`: the chat template already opened the block, so the output starts inside
  reasoning (a leading `<think>` is tolerated) until `</think>`.

In both, reasoning never closed (the output ran out) is all reasoning, and whitespace
between `</think>` and the answer is dropped. Reasoning tokens are the output's tokens up
to and including the delta that closes the block (a delta is counted whole).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from armature.frontend.parsing.tool_call import held_prefix_chars

__all__ = ["CLOSE", "OPEN", "ReasoningSplit", "ReasoningStream", "ThinkParser"]

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: the output did not reason
    content: str


class _Phase(Enum):
    START = "start"  # undecided: only whitespace or part of `<think>` so far
    REASONING = "reasoning"
    AFTER = "after"  # `</think>` seen; dropping whitespace before the answer
    CONTENT = "content"


class ThinkParser:
    def __init__(self, *, starts_in_reasoning: bool) -> None:
        self.starts_in_reasoning = starts_in_reasoning

    def parse(self, text: str) -> ReasoningSplit:
        body = text.lstrip()
        if body.startswith(OPEN):
            rest = body[len(OPEN) :]
        elif self.starts_in_reasoning:
            rest = text
        else:
            return ReasoningSplit(None, text)
        reasoning, closed, content = rest.partition(CLOSE)
        return ReasoningSplit(reasoning, content.lstrip() if closed else "")

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.starts_in_reasoning)


class ReasoningStream:
    """Feed text deltas in order (with how many tokens each holds); each call returns the
    (reasoning, content) now safe to show; `finish` returns the rest. The concatenations
    equal `ThinkParser.parse` of the whole output."""

    def __init__(self, starts_in_reasoning: bool) -> None:
        self._starts_in_reasoning = starts_in_reasoning
        self._phase = _Phase.START
        self._pending = ""
        self._num_start_tokens = 0  # tokens fed while undecided
        self.num_reasoning_tokens = 0

    def feed(self, text: str, num_tokens: int) -> ReasoningSplit:
        if self._phase is _Phase.REASONING:
            self.num_reasoning_tokens += num_tokens
        elif self._phase is _Phase.START:
            self._num_start_tokens += num_tokens
        self._pending += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._step(reasoning, content):
            pass
        return ReasoningSplit("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningSplit:
        rest, self._pending = self._pending, ""
        if self._phase is _Phase.START and self._starts_in_reasoning:
            self.num_reasoning_tokens += self._num_start_tokens
            return ReasoningSplit(rest, "")
        if self._phase is _Phase.REASONING:
            return ReasoningSplit(rest, "")
        if self._phase is _Phase.AFTER:
            return ReasoningSplit("", "")
        return ReasoningSplit("", rest)

    def _step(self, reasoning: list[str], content: list[str]) -> bool:
        """Advance over `_pending` once; True when another step may make progress."""
        phase = self._phase
        if phase is _Phase.START:
            body = self._pending.lstrip()
            if body.startswith(OPEN):
                self._pending = body[len(OPEN) :]
                self._enter_reasoning()
            elif not body or OPEN.startswith(body):
                return False
            elif self._starts_in_reasoning:
                self._enter_reasoning()
            else:
                self._phase = _Phase.CONTENT
            return True
        if phase is _Phase.REASONING:
            end = self._pending.find(CLOSE)
            if end >= 0:
                reasoning.append(self._pending[:end])
                self._pending = self._pending[end + len(CLOSE) :]
                self._phase = _Phase.AFTER
                return True
            cut = len(self._pending) - held_prefix_chars(self._pending, CLOSE)
            reasoning.append(self._pending[:cut])
            self._pending = self._pending[cut:]
            return False
        if phase is _Phase.AFTER:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return False
            self._phase = _Phase.CONTENT
            return True
        content.append(self._pending)
        self._pending = ""
        return False

    def _enter_reasoning(self) -> None:
        self._phase = _Phase.REASONING
        self.num_reasoning_tokens += self._num_start_tokens
