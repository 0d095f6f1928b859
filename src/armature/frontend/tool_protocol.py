"""The request fields of tool calling (pydantic, the HTTP edge only): the `tools` a chat
offers, `tool_choice`, and the calls and results that history messages carry. Field errors
name their place (`tools.0.function.name`); checks that need the whole request (a
tool_choice naming no tool) live in chat_request.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
)

__all__ = [
    "MAX_TOOLS",
    "MAX_TOOL_CALLS",
    "FunctionCall",
    "FunctionSpec",
    "MessageToolCall",
    "NamedToolChoice",
    "ToolChoice",
    "ToolSpec",
]

MAX_TOOLS = 128  # OpenAI's limit on tools per request
MAX_TOOL_CALLS = 128  # calls one history message may carry
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names

FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionSpec(_Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A function's parameters are a JSON Schema of an object (OpenAI)."""
        if value is None:
            return value
        kind = value.get("type", "object")
        if kind != "object":
            raise ValueError(f"a function's parameters must be an object schema, not {kind!r}")
        properties = value.get("properties", {})
        if not isinstance(properties, dict) or not all(
            isinstance(p, dict) for p in properties.values()
        ):
            raise ValueError("properties must map each parameter name to a schema object")
        required = value.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError("required must be a list of parameter names")
        return value


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class _FunctionName(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: _FunctionName


ToolChoiceMode = Literal["none", "auto", "required"]
_TOOL_CHOICE_MODES = ("none", "auto", "required")


def _tool_choice(value: Any) -> ToolChoiceMode | NamedToolChoice:
    """One error at `tool_choice` itself, not one per member of the union."""
    if isinstance(value, str) and value in _TOOL_CHOICE_MODES:
        return value  # type: ignore[return-value]
    if isinstance(value, dict):
        try:
            return NamedToolChoice.model_validate(value)
        except ValidationError:
            pass
    raise ValueError(
        "must be 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": NAME}}'
    )


ToolChoice = Annotated[
    ToolChoiceMode | NamedToolChoice,
    PlainValidator(_tool_choice, json_schema_input_type=ToolChoiceMode | NamedToolChoice),
]


class _Lenient(BaseModel):
    """History items: clients send back what they received, fields this server ignores
    included (such as the openai client's model dumps)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class FunctionCall(_Lenient):
    name: str = Field(min_length=1)
    arguments: str  # JSON object text, as OpenAI returns it


class MessageToolCall(_Lenient):
    """A call in an assistant message of the history."""

    id: str
    type: Literal["function"]
    function: FunctionCall
