"""A model's shape as the configurator needs it, read from a Hugging Face `config.json` (a
model directory, or the file alone): its parameters, weight bytes and KV bytes per token.

    per layer   attention  q, k, v, o:  h*(hq + 2*hkv) + hq*h      hq = heads * head_dim
                MLP        dense:       3*h*I                       hkv = kv_heads * head_dim
                           MoE:         E*3*h*Ie + 3*h*Is + h*E     (experts, shared, router)
                norms      2*h
    model       embedding V*h, LM head V*h unless tied, final norm h

A MoE model's first `num_dense_layers` layers (DeepSeek's first_k_dense_replace) are dense.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armature.errors import ConfigError

__all__ = ["DTYPE_BYTES", "ModelSpec", "read_model_spec"]

# bytes per weight and per KV element of each dtype the configurator knows
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # a dense layer's MLP
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    max_context_tokens: int
    # MoE (num_experts 0: dense)
    num_experts: int = 0
    num_experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0  # shared experts together (0: none)
    num_dense_layers: int = 0  # leading dense layers of a MoE model

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def splits_over(self, tp: int) -> bool:
        """Whether `tp` GPUs can share the attention, as engines shard it: the query heads
        divide by `tp`, and the KV heads do too, or each is replicated over a whole number of
        GPUs (`tp` a multiple of them)."""
        kv = self.num_kv_heads
        return self.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def get_attention_params(self) -> int:
        """One layer's q, k, v and o projections."""
        h = self.hidden_size
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h

    def get_moe_params(self) -> int:
        """One MoE layer's experts, shared experts and router."""
        h = self.hidden_size
        experts = self.num_experts * 3 * h * self.expert_intermediate_size
        return experts + 3 * h * self.shared_intermediate_size + h * self.num_experts

    def get_num_params(self) -> int:
        """Every weight of the model."""
        h = self.hidden_size
        dense_mlp = 3 * h * self.intermediate_size
        num_dense = self.num_layers - self.num_moe_layers
        layers = self.num_layers * (self.get_attention_params() + 2 * h)
        layers += num_dense * dense_mlp + self.num_moe_layers * self.get_moe_params()
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return layers + embeddings + h

    def get_weight_bytes(self) -> int:
        return self.get_num_params() * self.dtype_bytes

    def get_kv_bytes_per_token(self) -> int:
        """DESIGN §4: num_layers * 2 * num_kv_heads * head_dim * dtype_bytes."""
        return self.num_layers * 2 * self.kv_size * self.dtype_bytes


def _read_config(path: Path) -> tuple[str, dict[str, Any]]:
    """(the model's name, its config.json) from a model directory or the file itself."""
    file = path / "config.json" if path.is_dir() else path
    name = (path if path.is_dir() else path.parent).resolve().name or "model"
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--model {path}: no config.json there") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--model {path}: cannot read {file.name}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--model {path}: {file.name} is not a JSON object")
    return name, data


# above any real model's sizes; products of a few of them stay within a float's range
_MAX_CONFIG_INT = 2**31 - 1


def _positive(
    config: dict[str, Any], *keys: str, default: int | None = None, minimum: int = 1
) -> int:
    """The first of `keys` present in `config`, an integer in [`minimum`, 2**31 - 1]."""
    for key in keys:
        value = config.get(key)
        if value is not None:
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not minimum <= value <= _MAX_CONFIG_INT
            ):
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
                raise ConfigError(
                    f"config.json: {key} must be an integer in [{minimum}, {_MAX_CONFIG_INT}],"
                    f" got {shown}"
                )
            return value
    if default is None:
        raise ConfigError(f"config.json has no {keys[0]} (not a decoder-only LLM config?)")
    return default


def read_model_spec(path: Path, dtype: str) -> ModelSpec:
    """The model at `path` (a directory holding config.json, or the file) in `dtype`.
    ConfigError (one line) for a file that is missing or not a decoder LLM's config."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    name, config = _read_config(path)
    try:
        return _spec(name, config, dtype)
    except ConfigError as exc:  # "config.json: ...": the file as given, which may be another
        message = str(exc).removeprefix("config.json")
        file = path / "config.json" if path.is_dir() else path
        raise ConfigError(f"--model {path}: {file.name}{message}") from None


def _spec(name: str, config: dict[str, Any], dtype: str) -> ModelSpec:
    """The shape `config` (a config.json's object) gives; ConfigError naming config.json."""
    text = config.get("text_config")  # a multimodal model's language model
    if text is not None:
        if not isinstance(text, dict):
            raise ConfigError("config.json: text_config must be an object")
        config = text
    heads = _positive(config, "num_attention_heads")
    hidden = _positive(config, "hidden_size")
    if hidden % heads and "head_dim" not in config:
        raise ConfigError("config.json: hidden_size is not a multiple of num_attention_heads")
    experts = _positive(
        config, "num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0
    )
    intermediate = _positive(config, "intermediate_size")
    expert_intermediate = _positive(config, "moe_intermediate_size", default=intermediate)
    shared = _positive(config, "shared_expert_intermediate_size", default=0, minimum=0)
    num_shared = _positive(config, "n_shared_experts", default=0, minimum=0)
    shared = shared or num_shared * expert_intermediate
    num_layers = _positive(config, "num_hidden_layers")
    per_token = _positive(config, "num_experts_per_tok", default=2 if experts else 0)
    if experts and per_token > experts:
        raise ConfigError(
            f"config.json: num_experts_per_tok ({per_token}) is above the experts ({experts})"
        )
    kv_heads = _positive(config, "num_key_value_heads", default=heads)
    if heads % kv_heads:  # grouped-query attention shares each KV head among whole groups
        raise ConfigError(
            f"config.json: num_attention_heads ({heads}) is not a multiple of "
            f"num_key_value_heads ({kv_heads})"
        )
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_positive(config, "head_dim", default=hidden // heads),
        intermediate_size=intermediate,
        vocab_size=_positive(config, "vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype,
        max_context_tokens=_positive(config, "max_position_embeddings", default=4096),
        num_experts=experts,
        num_experts_per_token=per_token,
        expert_intermediate_size=expert_intermediate if experts else 0,
        shared_intermediate_size=shared if experts else 0,
        num_dense_layers=min(
            num_layers, _positive(config, "first_k_dense_replace", default=0, minimum=0)
        )
        if experts
        else 0,
    )
