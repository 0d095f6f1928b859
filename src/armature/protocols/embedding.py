"""Embedding contracts: what a worker started with `--task embed` takes and gives (msgspec, on
the wire between a frontend and its embedding workers).

A worker computes one L2-normalised vector per prompt from the model's last hidden states
(pooled by `Pooling`); the frontend cuts them to `dimensions` and encodes them for the client.
Vectors travel as float32 little-endian bytes: exact and a quarter of msgpack's float64.
"""

from __future__ import annotations

import enum

import msgspec

__all__ = ["EmbedRequest", "EmbedResult", "EmbeddingShape", "Pooling", "WorkerTask"]


class WorkerTask(enum.StrEnum):
    """What a worker serves: text generation, or embeddings of its prompts."""

    GENERATE = "generate"
    EMBED = "embed"


class Pooling(enum.StrEnum):
    """How a prompt's last hidden states become one vector."""

    MEAN = "mean"  # the average over every token
    LAST = "last"  # the last token's (decoder models attend it to the whole prompt)
    CLS = "cls"  # the first token's (BERT-style [CLS])


class EmbeddingShape(msgspec.Struct, frozen=True, kw_only=True):
    """The vectors an embedding engine returns: `num_dimensions` floats, pooled by `pooling`.

    `matryoshka_dimensions`: the sizes the model was trained to be cut to (Matryoshka
    representation learning, declared in its config.json); None: it may not be cut; empty:
    any size from 1 to `num_dimensions`."""

    num_dimensions: int
    pooling: Pooling
    matryoshka_dimensions: tuple[int, ...] | None = None

    def check_dimensions(self, dimensions: int) -> str | None:
        """Why vectors cannot be cut to `dimensions` (None when they can)."""
        if self.matryoshka_dimensions is None:
            return (
                "this model does not support `dimensions`: its config.json declares no "
                "Matryoshka dimensions, so its vectors cannot be shortened"
            )
        if not 1 <= dimensions <= self.num_dimensions:
            return f"dimensions must be 1..{self.num_dimensions}, got {dimensions}"
        allowed = self.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            sizes = ", ".join(str(d) for d in allowed)
            return f"this model's vectors can be cut to {sizes} dimensions, not {dimensions}"
        return None


class EmbedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Embed each prompt (token ids, none empty) independently."""

    request_id: str
    prompts: list[list[int]]


class EmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    """One vector per prompt, in prompt order: `num_dimensions` float32 values, little-endian,
    L2-normalised. `num_prompt_tokens`: the tokens embedded, over all prompts."""

    request_id: str
    vectors: list[bytes]
    num_prompt_tokens: int
