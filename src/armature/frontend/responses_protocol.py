"""The Responses API's request (pydantic, the HTTP edge only): POST /v1/responses and the
items of its `input`. Items are checked one by one in responses_input.py (so that an error
names its place, `input.2.call_id`); tools and tool_choice here, in the Responses flat shape
(`{"type": "function", "name": ...}`, not chat's nested `function`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from armature.frontend.format_protocol import JsonObjectFormat, JsonSchemaSpec
from armature.frontend.format_protocol import TextFormat as PlainTextFormat
from armature.frontend.parsing.json_canon import loads_bounded
from armature.frontend.protocol import (
    INT32_END,
    MAX_MESSAGES,
    ReasoningEffort,
    TokenCount,
    _Request,
)
from armature.frontend.tool_protocol import MAX_TOOLS, FunctionName, FunctionSpec

__all__ = [
    "MAX_RESPONSE_ID_CHARS",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionTool",
    "InputItem",
    "JsonSchemaTextFormat",
    "MessageItem",
    "NamedFunctionChoice",
    "ReasoningItem",
    "ReasoningOptions",
    "ResponsesRequest",
    "TextFormat",
    "TextPart",
]

MAX_RESPONSE_ID_CHARS = 128  # ours have 37 ("resp_" and 32 hex digits)
MAX_METADATA_ENTRIES = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


class _Lenient(BaseModel):
    """Items: clients send back the output items they received, fields this server does not
    read included (ids, status, annotations)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Lenient):
    """A message's text, or an assistant's refusal sent back in its history (rendered as
    what it said)."""

    type: Literal["input_text", "output_text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _its_field(self) -> TextPart:
        field = "refusal" if self.type == "refusal" else "text"
        if getattr(self, field) is None:
            raise PydanticCustomError(
                "missing", "a {kind} part needs its {field}", {"kind": self.type, "field": field}
            )
        return self

    def get_text(self) -> str:
        text = self.refusal if self.type == "refusal" else self.text
        assert text is not None  # checked when made
        return text


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: list[TextPart]  # a string comes in as one input_text part

    @field_validator("content", mode="before")
    @classmethod
    def _text_as_part(cls, value: Any) -> Any:
        return [{"type": "input_text", "text": value}] if isinstance(value, str) else value

    @field_validator("content")
    @classmethod
    def _refusals_are_the_assistants(
        cls, value: list[TextPart], info: ValidationInfo
    ) -> list[TextPart]:
        if info.data.get("role") != "assistant" and any(p.type == "refusal" for p in value):
            raise ValueError("only an assistant message may hold a refusal part")
        return value

    def text(self) -> str:
        return "".join(part.get_text() for part in self.content)


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: FunctionName
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = loads_bounded(value)
        except ValueError as exc:
            raise ValueError(f"arguments must be a JSON object in text: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must be a JSON object in text")
        return value


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str


class ReasoningItem(_Lenient):
    """Earlier reasoning, sent back with the output it led to; not rendered again (chat
    templates drop the reasoning of earlier turns)."""

    type: Literal["reasoning"]


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(FunctionSpec):
    """A function tool, flat: `{"type": "function", "name", "description", "parameters",
    "strict"}`."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind != "function":
            raise PydanticCustomError(
                "tool_type", "only function tools are served here, not {kind}", {"kind": kind}
            )
        return data


class NamedFunctionChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"]
    name: FunctionName


ToolChoiceMode = Literal["none", "auto", "required"]


def _tool_choice(value: Any) -> ToolChoiceMode | NamedFunctionChoice:
    """One error at `tool_choice` itself, not one per member of the union."""
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict):
        try:
            return NamedFunctionChoice.model_validate(value)
        except ValidationError:
            pass
    raise ValueError(
        "must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": NAME}"
    )


ResponsesToolChoice = Annotated[
    ToolChoiceMode | NamedFunctionChoice,
    PlainValidator(_tool_choice, json_schema_input_type=ToolChoiceMode | NamedFunctionChoice),
]


class JsonSchemaTextFormat(JsonSchemaSpec):
    """`text.format` of type json_schema: chat's `response_format.json_schema`, flat."""

    type: Literal["json_schema"]


TextFormat = Annotated[
    PlainTextFormat | JsonObjectFormat | JsonSchemaTextFormat, Field(discriminator="type")
]


class TextOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    format: TextFormat | None = None


class ReasoningOptions(BaseModel):
    """`reasoning`: the effort reaches the chat template as `reasoning_effort` (templates
    that take one); the summary is echoed (the reasoning item holds the reasoning itself)."""

    model_config = ConfigDict(strict=True, extra="allow")

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name


class ResponsesRequest(_Request):
    """POST /v1/responses. Unknown fields are kept (logged and ignored, as on chat); known
    fields this server does not implement are refused by `unsupported_fields`. Strict types
    and the lone-surrogate check come from `_Request`, as on chat and completions."""

    model: str
    # the item count is bounded; a string is text (its length is the context's to bound)
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]
    instructions: str | None = None
    previous_response_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_RESPONSE_ID_CHARS
    )
    store: bool = True
    stream: bool = False
    max_output_tokens: TokenCount | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA_ENTRIES)
    user: str | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tool_calls: int | None = Field(default=None, ge=1, lt=INT32_END)
    # OpenAI's Conversations and stored prompt templates: each changes what is generated
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    priority: int = Field(
        default=0, ge=-INT32_END, lt=INT32_END, description="Queue order under overload."
    )

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (value or {}).items():
            if len(key) > MAX_METADATA_KEY_CHARS or len(text) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(
                    f"keys hold at most {MAX_METADATA_KEY_CHARS} characters and values "
                    f"{MAX_METADATA_VALUE_CHARS}"
                )
        return value

    def unsupported_fields(self) -> list[tuple[str, str]]:
        """(param, reason) for each known parameter this server does not implement."""
        out = []
        if self.truncation == "auto":
            out.append(("truncation", "truncation 'auto' is not supported; only 'disabled'"))
        if self.background:
            out.append(("background", "background responses are not supported"))
        if self.include:
            out.append(("include", f"include {self.include[0]!r} is not supported"))
        if self.top_logprobs:
            out.append(("top_logprobs", "top_logprobs is not supported on /v1/responses"))
        if self.max_tool_calls is not None:
            out.append(("max_tool_calls", "max_tool_calls is not supported"))
        if self.conversation is not None:
            reason = "conversations are not supported; chain responses with previous_response_id"
            out.append(("conversation", reason))
        if self.prompt is not None:
            out.append(("prompt", "stored prompt templates are not supported; send input"))
        return out
