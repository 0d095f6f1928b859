"""Model architecture read from a Hugging Face config: the numbers the runner needs.

Llama, Qwen2 and Mistral share one decoder shape (RMSNorm, RoPE, GQA, SwiGLU); they differ in
q/k/v bias, RoPE scaling and sliding windows, captured here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelArch", "read_arch", "read_matryoshka_dimensions"]


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """DESIGN §4: num_layers * 2 * num_kv_heads * head_dim * dtype_bytes."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes


def _eos_ids(path: Path, config: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (config, _read_json(path / "generation_config.json")):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            value = [value]
        for token_id in value or []:
            if token_id not in ids:
                ids.append(int(token_id))
    return tuple(ids)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def read_arch(path: Path) -> ModelArch:
    """Parse `path/config.json` (and generation_config.json for EOS ids)."""
    config = _read_json(path / "config.json")
    num_heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    model_type = str(config.get("model_type", "llama"))
    sliding_window = config.get("sliding_window")
    if model_type == "qwen2" and not config.get("use_sliding_window", False):
        sliding_window = None
    return ModelArch(
        model_type=model_type,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        eos_token_ids=_eos_ids(path, config),
        sliding_window=int(sliding_window) if sliding_window else None,
    )


def read_matryoshka_dimensions(path: Path) -> tuple[int, ...] | None:
    """The sizes `path/config.json` says the model's embeddings may be cut to (Matryoshka),
    as vLLM reads them: `matryoshka_dimensions` (a list) or `is_matryoshka: true` (empty: any
    size). None: the model declares neither, and its vectors may not be cut."""
    config = _read_json(path / "config.json")
    dimensions = config.get("matryoshka_dimensions")
    if isinstance(dimensions, list) and dimensions:
        return tuple(sorted(int(d) for d in dimensions))
    if config.get("is_matryoshka") is True:
        return ()
    return None
