"""Parsers of model output (pure: text in, parts out): tool calls by model family and
reasoning blocks, each whole and streamed. The names are the ones --tool-call-parser and
--reasoning-parser take (config/chat.py lists them; a test keeps the two in step).

    tool_call.py   ToolCall, the parser protocols, the JSON object rule
    hermes.py      <tool_call>{json}</tool_call> blocks
    region.py      the stream for formats whose calls fill the rest of the output:
    llama3.py        {"name":..., "parameters":...}; ... after an optional <|python_tag|>
    mistral.py       [TOOL_CALLS][...] and [TOOL_CALLS]name[ARGS]{...}
    pythonic.py      [f(a=1), g(b="x")], read with ast
    reasoning.py   <think>…</think>, with or without the opening tag
"""

from __future__ import annotations

from armature.frontend.parsing.hermes import HermesParser
from armature.frontend.parsing.llama3 import LLAMA3_JSON
from armature.frontend.parsing.mistral import MISTRAL
from armature.frontend.parsing.pythonic import PYTHONIC
from armature.frontend.parsing.reasoning import ThinkParser
from armature.frontend.parsing.tool_call import ToolCallParser

__all__ = ["REASONING_PARSERS", "TOOL_CALL_PARSERS", "reasoning_parser", "tool_call_parser"]

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


def tool_call_parser(name: str | None) -> ToolCallParser | None:
    return None if name is None else TOOL_CALL_PARSERS[name]


def reasoning_parser(name: str | None) -> ThinkParser | None:
    return None if name is None else REASONING_PARSERS[name]
