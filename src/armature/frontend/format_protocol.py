"""The request field of structured output (pydantic, the HTTP edge only): OpenAI's
`response_format` (text, json_object, json_schema), with the bounds of vLLM's `guided_*`
fields (declared in protocol.py). Field errors name their place
(`response_format.json_schema.name`); whether a schema or regex is valid is checked by the
grammar (structured.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MAX_GUIDED_CHOICES",
    "MAX_GUIDE_CHARS",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "JsonSchemaSpec",
    "ResponseFormat",
    "TextFormat",
]

MAX_GUIDED_CHOICES = 1024
MAX_GUIDE_CHARS = 1 << 20  # a regex or grammar text: 1 MiB


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(_Strict):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    # `schema` would shadow pydantic's BaseModel.schema
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]
