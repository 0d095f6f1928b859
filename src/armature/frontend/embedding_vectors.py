"""Vectors as the client asked for them: cut to `dimensions` and renormalised (Matryoshka),
then written as JSON floats or as base64 of little-endian float32 bytes (OpenAI's format).
Pure."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np

__all__ = ["encode_vector"]

EncodingFormat = Literal["float", "base64"]


def encode_vector(
    vector: bytes, encoding_format: EncodingFormat, dimensions: int | None = None
) -> list[float] | str:
    """`vector` (float32 little-endian bytes, unit norm) for the response: its first
    `dimensions` values rescaled to unit L2 norm when cut, as floats or base64."""
    values = np.frombuffer(vector, dtype="<f4")
    if dimensions is not None and dimensions < len(values):
        values = values[:dimensions]
        norm = float(np.linalg.norm(values.astype(np.float64)))
        if norm > 0.0:
            values = (values / norm).astype("<f4")
    if encoding_format == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    return [float(x) for x in values]
