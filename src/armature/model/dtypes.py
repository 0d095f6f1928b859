"""Torch dtypes by the names that the configuration and the KV layout use."""

from __future__ import annotations

import torch

from armature.errors import ConfigError

__all__ = ["torch_dtype"]

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named `name` (ConfigError naming the choices for another)."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        choices = ", ".join(_TORCH_DTYPES)
        raise ConfigError(f"unknown dtype {name!r}; choose one of {choices}") from None
