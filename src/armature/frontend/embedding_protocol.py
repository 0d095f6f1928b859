"""The /v1/embeddings request (pydantic, the HTTP edge only), as strict as protocol.py's:
`input` is a string, a list of strings, a list of token ids or a list of token-id lists, none
of them empty, at most MAX_EMBEDDING_INPUTS of them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, field_validator
from pydantic_core import PydanticCustomError

from armature.frontend.protocol import INT32_END, TokenId, _Request

__all__ = ["MAX_EMBEDDING_INPUTS", "EmbeddingInput", "EmbeddingRequest"]

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's bound on one request's inputs

EmbeddingInput = str | list[str] | list[TokenId] | list[list[TokenId]]

_SHAPE = (
    "input must be a string, a list of strings, a list of token ids (integers 0..2**31-1) or "
    "a list of token-id lists"
)


class EmbeddingRequest(_Request):
    model: str
    input: EmbeddingInput = Field(
        description=f"The text or token ids to embed: one input, or up to "
        f"{MAX_EMBEDDING_INPUTS} in a list; none may be empty."
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64: each vector as little-endian float32 bytes."
    )
    dimensions: int | None = Field(
        default=None,
        ge=1,
        lt=INT32_END,
        description="Cut the vectors to this size (Matryoshka models only).",
    )
    user: str | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _one_error_per_input(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """One message naming `input` (not each union member's), and no empty input."""
        try:
            parsed = handler(value)
        except ValidationError:
            raise PydanticCustomError("input_shape", _SHAPE) from None
        if not parsed:
            raise PydanticCustomError("input_empty", "input must not be empty")
        # a flat list of token ids is one input (its length is the context's to bound)
        if isinstance(parsed, list) and not all(isinstance(item, int) for item in parsed):
            if len(parsed) > MAX_EMBEDDING_INPUTS:
                raise PydanticCustomError(
                    "input_too_long",
                    "input may hold at most {limit} items, got {count}",
                    {"limit": MAX_EMBEDDING_INPUTS, "count": len(parsed)},
                )
            for index, item in enumerate(parsed):
                if isinstance(item, str | list) and not item:
                    raise PydanticCustomError(
                        "input_empty", "input[{index}] must not be empty", {"index": index}
                    )
        return parsed

    def get_texts(self) -> list[str] | None:
        """The inputs as texts (None: they are token ids)."""
        value = self.input
        if isinstance(value, str):
            return [value]
        texts = [item for item in value if isinstance(item, str)]
        return texts if len(texts) == len(value) else None

    def get_token_ids(self) -> list[list[int]]:
        """The inputs as token-id lists (when they are token ids)."""
        value = self.input
        assert not isinstance(value, str)
        if all(isinstance(item, int) for item in value):
            return [[item for item in value if isinstance(item, int)]]
        return [list(item) for item in value if isinstance(item, list)]
