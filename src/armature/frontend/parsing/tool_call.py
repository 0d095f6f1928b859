"""What a tool-call parser returns, the two shapes every parser has (whole output and a
stream), and the one rule that turns a decoded JSON object into a call.

A parser never raises on model output: text it cannot read as calls stays content. JSON
with a repeated key is not read as calls (json.loads would keep the last value, while a
stream has already sent the first), nor is a call to a function not offered (`names`):
the request's tools are all a client can run.

Streams send a call as it is read: a first delta with its name once the name is known and
its arguments have begun, then the arguments' canonical JSON text in pieces (json_canon.py),
which join to exactly the whole-output `arguments`. When the text of a call whose first
delta went out turns out not to be a call after all (bad JSON, a block never closed, prose
after a region of calls), the stream cannot take the deltas back: it sends `BrokenCall`
for it and then the text as content, so the content streamed always joins to the
whole-output content; once no later text can break a call, it sends `WholeCall` for it.
The calls made whole are the whole-output calls.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from armature.frontend.parsing.json_canon import dumps_canonical, loads_bounded, within_depth

__all__ = [
    "ARGUMENT_KEYS",
    "BrokenCall",
    "CallDelta",
    "ParsedToolCalls",
    "StreamPart",
    "StreamedToolCalls",
    "ToolCall",
    "ToolCallParser",
    "ToolCallStream",
    "WholeCall",
    "call_from_object",
    "cut_at_marker",
    "held_prefix_chars",
    "loads_json",
    "offered",
    "raw_decode_json",
]

# The keys models put a call's arguments under: OpenAI/hermes say arguments, Llama 3 says
# parameters.
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON object text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedToolCalls:
    """Output text split into what the user reads and the calls the model made."""

    content: str
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class CallDelta:
    """A piece of a call as it streams. `number`: the call's place among the stream's calls,
    from 0. A call's first delta carries its `name`; all its deltas' `arguments` join to
    the call's arguments."""

    number: int
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class BrokenCall:
    """The call `number`, already begun, is not a call: its text follows as content."""

    number: int


@dataclass(frozen=True)
class WholeCall:
    """The call `number`, all its deltas sent, is a call: no later text breaks it."""

    number: int


StreamPart = str | CallDelta | BrokenCall | WholeCall  # str: content


@dataclass(frozen=True)
class StreamedToolCalls:
    """What a stream has read from the text fed so far, in output order."""

    parts: tuple[StreamPart, ...] = ()

    @staticmethod
    def of(parts: list[StreamPart]) -> StreamedToolCalls:
        """`parts` without empty content."""
        return StreamedToolCalls(tuple(p for p in parts if p != ""))

    def __add__(self, other: StreamedToolCalls) -> StreamedToolCalls:
        return StreamedToolCalls(self.parts + other.parts)


class ToolCallStream(Protocol):
    """One output's incremental parser. `feed` takes each text delta in order and returns the
    content now safe to show and the call deltas now certain; `finish` (once, at the end)
    returns the rest. Joined, the content equals the whole-output `parse`'s content, and
    the calls made whole equal its calls. Every call begun is made whole or broken, by
    `finish` at the latest."""

    def feed(self, text: str) -> StreamedToolCalls: ...

    def finish(self) -> StreamedToolCalls: ...


class ToolCallParser(Protocol):
    """A model family's tool-call format (chosen by --tool-call-parser). `markers`: the
    format's marker strings, which some vocabularies hold as special tokens (Mistral's
    `[TOOL_CALLS]`, Llama's `<|python_tag|>`); decoding drops special tokens, so the
    frontend keeps these ones in the text it feeds the parser (chat_setup.py). `names`: the
    functions offered (None: any); a call to another is read as malformed."""

    @property
    def markers(self) -> tuple[str, ...]: ...

    def parse(self, text: str, names: Collection[str] | None = None) -> ParsedToolCalls: ...

    def stream(self, names: Collection[str] | None = None) -> ToolCallStream: ...


def offered(call: ToolCall | CallDelta, names: Collection[str] | None) -> bool:
    """Whether `call` names one of `names` (None: any function). A delta without a name
    (arguments text) names nothing."""
    return names is None or call.name is None or call.name in names


def call_from_object(obj: Any) -> ToolCall | None:
    """The call a decoded `{"name": ..., "arguments"|"parameters": {...}}` object describes
    (Llama 3.2 adds `"type": "function"`), or None when it is not exactly one. Arguments
    given as JSON text must hold an object too."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    keys = [key for key in ARGUMENT_KEYS if key in obj]
    if len(keys) != 1 or set(obj) - {"type"} != {"name", keys[0]}:
        return None
    if obj.get("type", "function") != "function":
        return None
    arguments = obj[keys[0]]
    if isinstance(arguments, str):
        try:
            arguments = loads_json(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    try:  # json.loads reads NaN and Infinity, which JSON text must not carry
        return ToolCall(name, dumps_canonical(arguments))
    except ValueError:
        return None


def loads_json(text: str) -> Any:
    """`json.loads`, refusing (ValueError) an object with a repeated key and nesting deeper
    than MAX_JSON_DEPTH containers (as the streamed reader does)."""
    return loads_bounded(text, _DECODER)


def raw_decode_json(text: str, at: int) -> tuple[Any, int]:
    """`JSONDecoder.raw_decode` with `loads_json`'s rules."""
    try:
        value, end = _DECODER.raw_decode(text, at)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    return within_depth(value), end


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a key repeats")
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def cut_at_marker(text: str, marker: str) -> tuple[str, str, bool]:
    """`text` cut at the first `marker`: (the text before it, the text after it, True); or,
    with no marker, (what can go out now, what must be held back because the marker may be
    arriving, False)."""
    at = text.find(marker)
    if at >= 0:
        return text[:at], text[at + len(marker) :], True
    keep = len(text) - held_prefix_chars(text, marker)
    return text[:keep], text[keep:], False


def held_prefix_chars(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`: the
    characters a stream must hold back because the marker may be arriving."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
