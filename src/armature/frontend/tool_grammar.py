"""Forced tool calls (`tool_choice: required` or a named function) as a grammar over the
active tool-call parser's own format, so the model can only write calls that parser reads,
each naming an offered function with arguments valid against its parameters' schema. Pure.

    hermes       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>, one per line
    llama3_json  {"name": "f", "parameters": {...}}; {"name": "g", ...}
    mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
                 or, where [ARGS] is a special token (tokenizer v11+), per call:
                 [TOOL_CALLS]f[ARGS]{...}
    pythonic     [f(city="Paris", days=3), g()]

A marker that is a special token of the model's tokenizer (`special_tokens`: Mistral's
`[TOOL_CALLS]`) is that one token in the grammar, as the model writes it; otherwise it is
its text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from armature.errors import InvalidRequestError
from armature.frontend.tool_protocol import ToolSpec
from armature.grammar.compile import JSON_OPTIONS
from armature.grammar.python_literal import PythonLiteralRules
from armature.protocols.guide import LarkGuide

__all__ = ["FORCED_CALL_FORMATS", "tool_call_guide"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


@dataclass(frozen=True)
class _Calls:
    """A format's grammar pieces: around all calls, between two, and each tool's call rule
    (`call_i`) with the rules it needs."""

    opening: str  # Lark expressions ("" for none)
    separator: str
    closing: str
    rules: list[str]


# the tools that may be called (by their index in the request) -> a format's pieces, given
# how to write a marker
_Tools = list[tuple[int, ToolSpec]]
_Builder = Callable[[_Tools, Callable[[str], str]], _Calls]


def tool_call_guide(
    parser_name: str,
    tools: list[ToolSpec],
    max_calls: int | None,
    special_tokens: Mapping[str, int],
    named: str | None = None,
) -> LarkGuide:
    """A grammar for one call (`max_calls` 1) or one or more calls to any of `tools` (one
    call to the one `named`, when given), in the format of the parser named `parser_name` (one of
    FORCED_CALL_FORMATS). `special_tokens`: text -> id of the format's markers that are
    special tokens here. InvalidRequestError naming the tool's field for a tool the
    format's grammar cannot hold."""

    def marker(text: str) -> str:
        token = special_tokens.get(text)
        return f"<[{token}]>" if token is not None else _lit(text)

    chosen = [(i, t) for i, t in enumerate(tools) if named in (None, t.function.name)]
    calls = FORCED_CALL_FORMATS[parser_name](chosen, marker)
    repeat = "" if max_calls == 1 or named is not None else f"({calls.separator} call)*"
    start = " ".join(p for p in (calls.opening, "call", repeat, calls.closing) if p)
    names = " | ".join(f"call_{i}" for i, _ in chosen)
    lines = [f"start: {start}", f"call: {names}", *calls.rules]
    return LarkGuide(grammar="\n".join(lines) + "\n", param="tool_choice")


def _json_calls(before: str, after: str, arguments_key: str) -> Callable[..., list[str]]:
    """Rules of JSON call objects `{"name": ..., arguments_key: {...}}`, each between
    `before` and `after` (Lark expressions)."""

    def rules(tools: _Tools) -> list[str]:
        out = []
        for i, tool in tools:
            schema = _call_schema(tool, arguments_key)
            parts = (f"call_{i}:", before, f"object_{i}", after)
            out.append(" ".join(p for p in parts if p))
            out.append(f"object_{i}: %json {json.dumps(schema)}")
        return out

    return rules


def _hermes(tools: _Tools, marker: Callable[[str], str]) -> _Calls:
    rules = _json_calls(_lit("<tool_call>\n"), _lit("\n</tool_call>"), "arguments")(tools)
    return _Calls("", _lit("\n"), "", rules)


def _llama3_json(tools: _Tools, marker: Callable[[str], str]) -> _Calls:
    return _Calls("", _lit("; "), "", _json_calls("", "", "parameters")(tools))


def _mistral(tools: _Tools, marker: Callable[[str], str]) -> _Calls:
    if marker(ARGS) == _lit(ARGS):  # a JSON list after one [TOOL_CALLS] (v3-v7)
        rules = _json_calls("", "", "arguments")(tools)
        return _Calls(f'{marker(TOOL_CALLS)} "["', _lit(", "), '"]"', rules)
    rules = []  # [TOOL_CALLS]name[ARGS]{...} per call (v11+)
    for i, tool in tools:
        name = _lit(tool.function.name)
        rules.append(f"call_{i}: {marker(TOOL_CALLS)} {name} {marker(ARGS)} arguments_{i}")
        rules.append(f"arguments_{i}: %json {json.dumps(_arguments_schema(tool))}")
    return _Calls("", "", "", rules)


def _pythonic(tools: _Tools, marker: Callable[[str], str]) -> _Calls:
    literals = PythonLiteralRules()
    rules = []
    for i, tool in tools:
        if not tool.function.name.isidentifier():
            raise InvalidRequestError(
                f"the function name {tool.function.name!r} is not a Python name, which the "
                "pythonic call format needs; use tool_choice 'auto'",
                param=f"tools.{i}.function.name",
            )
        where = f"tools.{i}.function.parameters"
        arguments = literals.keyword_arguments(tool.function.parameters or {}, where)
        inside = f" {arguments} " if arguments else " "
        rules.append(f"call_{i}: {_lit(tool.function.name + '(')}{inside}{_lit(')')}")
    return _Calls('"["', _lit(", "), '"]"', rules + literals.lines())


FORCED_CALL_FORMATS: dict[str, _Builder] = {
    "hermes": _hermes,
    "llama3_json": _llama3_json,
    "mistral": _mistral,
    "pythonic": _pythonic,
}


# a function without `parameters` (or with `{}`) takes none, as OpenAI reads it: its forced
# call's arguments are `{}` (an open object let the model invent any)
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def _parameters(tool: ToolSpec) -> dict[str, Any]:
    """The function's parameters as the schema of its arguments: an object always (a schema
    without `type`, read as an object's, let a forced call's arguments be an array or a
    number, which no parser takes for a call)."""
    parameters = tool.function.parameters or NO_PARAMETERS
    return parameters if "type" in parameters else {"type": "object", **parameters}


def _arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    return {"x-guidance": JSON_OPTIONS, **_parameters(tool)}


def _call_schema(tool: ToolSpec, arguments_key: str) -> dict[str, Any]:
    """The schema of one call object, `{"name": ..., arguments_key: {...}}`: the function's
    parameters nested under the key, their local references (`#/$defs/X`, `#`) made to point
    there."""
    where = "/properties/" + arguments_key.replace("~", "~0").replace("/", "~1")
    parameters = _rebased(_parameters(tool), where)
    return {
        "x-guidance": JSON_OPTIONS,  # the %json of a Lark grammar takes its options here
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


# keywords whose values are instances, not schemas: a "$ref" inside one is data
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# keywords whose values map names (a property's, a definition's) to schemas
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def _rebased(schema: Any, pointer: str) -> Any:
    """`schema` (a copy) with each local `$ref` ("#" and "#/...", which name places in the
    schema's own document) prefixed by `pointer`, where the schema now sits in a larger one;
    other references are kept."""
    if isinstance(schema, list):
        return [_rebased(item, pointer) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rest = value[1:]
            out[key] = value if rest and not rest.startswith("/") else "#" + pointer + rest
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):  # names, each a schema
            out[key] = {name: _rebased(sub, pointer) for name, sub in value.items()}
        else:
            out[key] = _rebased(value, pointer)
    return out


def _lit(text: str) -> str:
    """`text` as a Lark string literal."""
    return json.dumps(text)
