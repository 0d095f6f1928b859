"""Rotary position embedding tables, computed exactly as Hugging Face transformers does.

Scaled variants (linear, llama3, yarn, longrope, dynamic) take their inverse frequencies and
attention factor from transformers' own RoPE init functions, so every scaling config of the
family is honoured; "dynamic" is applied statically at the model's maximum length.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["RopeTables", "apply_rope", "build_rope_tables"]


class RopeTables:
    """cos/sin of shape [max_positions, head_dim], in the model dtype."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos = cos
        self.sin = sin


def _inv_freq(model_dir: Path) -> tuple[torch.Tensor, float]:
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
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv_freq, 1.0


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
