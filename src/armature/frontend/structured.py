"""A request's structured output: OpenAI's `response_format` or one of vLLM's `guided_*`
fields as the `Guide` the engine follows, checked by the grammar library so that a bad
schema, regex or grammar is a 400 naming its field. Pure (the check compiles the grammar,
so callers run it off the event loop)."""

from __future__ import annotations

import json
from typing import Any

from armature.errors import InvalidRequestError
from armature.frontend.errors import ApiError
from armature.frontend.format_protocol import JsonObjectFormat, JsonSchemaFormat
from armature.frontend.parsing.json_canon import loads_bounded
from armature.frontend.protocol import GenerationFields
from armature.frontend.tool_protocol import ToolSpec
from armature.grammar.compile import check_guide
from armature.protocols.guide import (
    ChoiceGuide,
    Guide,
    JsonObjectGuide,
    JsonSchemaGuide,
    LarkGuide,
    RegexGuide,
)

__all__ = ["check_request_guide", "check_tool_schemas", "request_guide"]


def request_guide(body: GenerationFields) -> Guide | None:
    """The guide `body` asks for (None: free text); ApiError when it asks for several, or
    gives guided_json text that is not a JSON object."""
    guides = [g for g in (_response_format(body), *_guided(body)) if g is not None]
    if len(guides) > 1:
        raise ApiError(
            "give at most one of response_format (json_object or json_schema), guided_json, "
            "guided_regex, guided_choice and guided_grammar",
            param=guides[1].param,
        )
    return guides[0] if guides else None


def check_request_guide(guide: Guide) -> None:
    """ApiError (400, naming the guide's field and the problem) for a guide that cannot be
    compiled."""
    try:
        check_guide(guide)
    except InvalidRequestError as exc:
        raise ApiError(str(exc), param=exc.param, code="invalid_value") from None


def check_tool_schemas(tools: list[ToolSpec]) -> None:
    """ApiError (400, naming `tools.N.function.parameters` and the problem) for the first
    tool whose parameters are not a JSON schema the grammar library compiles. Checked for
    every tool_choice: the schemas reach the prompt whether or not the calls are forced."""
    for i, tool in enumerate(tools):
        parameters = tool.function.parameters
        if parameters is not None:
            param = f"tools.{i}.function.parameters"
            check_request_guide(_schema_guide(parameters, param))


def _response_format(body: GenerationFields) -> Guide | None:
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return JsonObjectGuide(param="response_format")
    if isinstance(fmt, JsonSchemaFormat):
        return _schema_guide(fmt.json_schema.schema_, "response_format.json_schema.schema")
    return None


def _guided(body: GenerationFields) -> list[Guide | None]:
    return [
        None if body.guided_json is None else _guided_json(body.guided_json),
        None
        if body.guided_regex is None
        else RegexGuide(pattern=body.guided_regex, param="guided_regex"),
        None
        if body.guided_choice is None
        else ChoiceGuide(choices=tuple(body.guided_choice), param="guided_choice"),
        None
        if body.guided_grammar is None
        else LarkGuide(grammar=body.guided_grammar, param="guided_grammar"),
    ]


def _guided_json(value: str | dict[str, Any]) -> JsonSchemaGuide:
    if isinstance(value, str):
        try:
            value = loads_bounded(value)
        except ValueError as exc:
            raise ApiError(f"guided_json is not JSON: {exc}", param="guided_json") from None
        if not isinstance(value, dict):
            raise ApiError("guided_json must be a JSON schema object", param="guided_json")
    return _schema_guide(value, "guided_json")


def _schema_guide(schema: Any, param: str) -> JsonSchemaGuide:
    """The guide of a decoded JSON schema; ApiError naming `param` for one that JSON text
    cannot carry (NaN or Infinity, which the body's parser reads into a schema's numbers)."""
    try:
        text = json.dumps(schema, allow_nan=False)
    except ValueError:
        what = "the JSON schema holds NaN or Infinity, which JSON text cannot"
        raise ApiError(what, param=param, code="invalid_value") from None
    return JsonSchemaGuide(schema_json=text, param=param)
