"""Rotary position embedding tables, computed exactly as Hugging Face transformers does.

Scaled variants (linear, llama3, yarn, longrope, dynamic) take their inverse frequencies and
attention factor from transformers' own RoPE init functions, so every scaling config of the
family is honoured; "dynamic" is applied statically at the model's maximum length.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["RopeTables", "apply_rope", "build_rope_tables"]


class RopeTables:
    """cos/sin of shape [max_positions, head_dim], in the model dtype."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos = cos
        self.sin = sin


def _inv_freq(model_dir: Path) -> tuple[torch.Tensor, float]:
    local = _default_rope(model_dir)
    if local is not None:
        base, dim = local
        return _default_inv_freq(base, dim), 1.0
    return _inv_freq_from_transformers(model_dir)


def _inv_freq_from_transformers(model_dir: Path) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and attention scaling of the model's config as transformers
    reads it (every RoPE type it knows)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        return inv_freq.float(), float(attention_scaling)
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(dim * float(params.get("partial_rotary_factor", 1.0)))
    return _default_inv_freq(base, dim), 1.0


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _default_rope(model_dir: Path) -> tuple[float, int] | None:
    """(base, rotary dim) of an unscaled RoPE whose base config.json states, read without
    transformers: loading the config through it imports most of transformers (seconds of a
    worker's start). None (ask transformers) for anything else: scaling, a partial rotary
    factor, a base left to the model class's default."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    plain = {"rope_type": "default"}
    if not isinstance(params, dict) or not set(params) <= {"rope_type", "rope_theta"}:
        return None
    if params.get("rope_type", "default") != "default" or scaling not in ({}, plain):
        return None
    if "partial_rotary_factor" in config:
        return None
    base = params.get("rope_theta", config.get("rope_theta"))
    dim = config.get("head_dim")
    if not dim and isinstance(config.get("hidden_size"), int):
        heads = config.get("num_attention_heads")
        dim = config["hidden_size"] // heads if isinstance(heads, int) and heads > 0 else None
    if not isinstance(base, int | float) or isinstance(base, bool) or not isinstance(dim, int):
        return None
    return float(base), int(dim)


def build_rope_tables(
    model_dir: Path, max_positions: int, dtype: torch.dtype, device: torch.device
) -> RopeTables:
    inv_freq, attention_scaling = _inv_freq(model_dir)
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * attention_scaling).to(dtype=dtype, device=device)
    sin = (emb.sin() * attention_scaling).to(dtype=dtype, device=device)
    return RopeTables(cos, sin)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos/sin: [tokens, head_dim]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (x * cos) + (_rotate_half(x) * sin)
