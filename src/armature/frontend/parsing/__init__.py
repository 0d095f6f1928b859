"""Parsers of model output (pure: text in, parts out): tool calls by model family and
reasoning blocks, each whole and streamed. The names are the ones --tool-call-parser and
--reasoning-parser take (config/chat.py lists them; a test keeps the two in step).

    tool_call.py   ToolCall, the parser protocols, the JSON object rule, streamed deltas
    json_canon.py  a JSON value rewritten canonically as it streams (call arguments)
    call_reader.py a call object or arguments value read as it streams
    hermes.py      <tool_call>{json}</tool_call> blocks
    region.py      the stream for formats whose calls fill the rest of the output:
    llama3.py        {"name":..., "parameters":...}; ... after an optional <|python_tag|>
    mistral.py       [TOOL_CALLS][...] and [TOOL_CALLS]name[ARGS]{...}
    pythonic.py      [f(a=1), g(b="x")], read with ast
    reasoning.py   <think>…</think>, with or without the opening tag
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from armature.frontend.parsing.hermes import HermesParser
from armature.frontend.parsing.llama3 import LLAMA3_JSON
from armature.frontend.parsing.mistral import MISTRAL
from armature.frontend.parsing.pythonic import PYTHONIC
from armature.frontend.parsing.reasoning import ThinkParser
from armature.frontend.parsing.tool_call import ToolCallParser

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "OutputParsers"]

TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesParser(),
    "llama3_json": LLAMA3_JSON,
    "mistral": MISTRAL,
    "pythonic": PYTHONIC,
}
REASONING_PARSERS: dict[str, ThinkParser] = {
    "qwen3": ThinkParser(starts_in_reasoning=False),
    "deepseek_r1": ThinkParser(starts_in_reasoning=True),
}


@dataclass(frozen=True)
class OutputParsers:
    """The parsers a frontend reads chat output with (None: that part is not read)."""

    tool_call: ToolCallParser | None = None
    reasoning: ThinkParser | None = None
    tool_call_name: str | None = None  # the tool-call parser's flag name (its call format)
    # the parser's markers that are special tokens of this tokenizer: id -> text, kept when
    # decoding output that is read for calls (see ToolCallParser.markers)
    kept_tokens: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def named(cls, tool_call: str | None, reasoning: str | None) -> OutputParsers:
        """By their flag names (config/chat.py)."""
        return cls(
            None if tool_call is None else TOOL_CALL_PARSERS[tool_call],
            None if reasoning is None else REASONING_PARSERS[reasoning],
            tool_call,
        )
