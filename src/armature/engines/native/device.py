"""Pick the device and dtype for `auto` settings."""

from __future__ import annotations

import torch

from armature.errors import ConfigError

__all__ = ["pick_device", "pick_dtype"]


def pick_device(requested: str) -> str:
    """'auto' -> cuda where present, else cpu. Asking for cuda without one is an error."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is available")
    return requested


def pick_dtype(requested: str, device: str) -> str:
    """'auto' -> bfloat16 where the device computes it natively, else float32.

    On CPU, bfloat16 halves the bytes a decode step streams, but only CPUs with native bf16
    dot products (AVX512-BF16, AMX) compute it fast: on an AVX2-only CPU oneDNN emulates it and
    a bf16 matmul measured 2-5x slower than float32, so those CPUs get float32."""
    if requested != "auto":
        return requested
    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
