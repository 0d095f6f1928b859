"""Structured output on the engine boundary: a `Guide` says what the generated text must match
(a JSON schema, any JSON object, a regex, one of a few strings, or a Lark grammar). Engines
that constrain decoding honour it; the others refuse the request (DESIGN §3 Engine contract).

`param` names the request field the guide came from (`response_format.json_schema.schema`,
`guided_regex`, `tool_choice`), so an engine's refusal of a bad guide names it for the client.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ChoiceGuide",
    "Guide",
    "JsonObjectGuide",
    "JsonSchemaGuide",
    "LarkGuide",
    "RegexGuide",
]


class JsonSchemaGuide(msgspec.Struct, frozen=True, kw_only=True, tag="json_schema"):
    """JSON text valid against `schema_json` (a JSON Schema, serialized)."""

    schema_json: str
    param: str


class JsonObjectGuide(msgspec.Struct, frozen=True, kw_only=True, tag="json_object"):
    """Any JSON object (OpenAI's `response_format: json_object`)."""

    param: str


class RegexGuide(msgspec.Struct, frozen=True, kw_only=True, tag="regex"):
    """Text matching `pattern` as a whole (Rust regex syntax, as vLLM's backends take it)."""

    pattern: str
    param: str


class ChoiceGuide(msgspec.Struct, frozen=True, kw_only=True, tag="choice"):
    """Exactly one of `choices`."""

    choices: tuple[str, ...]
    param: str


class LarkGuide(msgspec.Struct, frozen=True, kw_only=True, tag="lark"):
    """Text of a Lark grammar (llguidance's dialect: `start` is the root; `%json {schema}`
    embeds a JSON schema, as the tool-call grammars do)."""

    grammar: str
    param: str


Guide = JsonSchemaGuide | JsonObjectGuide | RegexGuide | ChoiceGuide | LarkGuide
