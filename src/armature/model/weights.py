"""Load a Llama-family checkpoint's safetensors into fused, runner-ready tensors.

q/k/v projections are fused into one matrix and gate/up into another, so each layer runs two
fewer matmuls per step. Pickle checkpoints are never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from armature.errors import ConfigError
from armature.model.arch import ModelArch

__all__ = ["LayerWeights", "ModelWeights", "load_weights"]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied
    # [hidden, vocab] copy for one-row float32 logits on CPU: measured 4.3 ms vs 8.3 ms for
    # F.linear at one row (SmolLM2, 2-core AVX2), while F.linear wins from 4 rows up
    lm_head_t: torch.Tensor | None = None


def _read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    tensors[name] = f.get_tensor(name)
        except (SafetensorError, OSError) as exc:  # a truncated or corrupt file
            raise ConfigError(f"cannot read the weights in {file}: {exc}") from None
    return tensors


def load_weights(
    model_dir: Path, arch: ModelArch, dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    raw = _read_tensors(model_dir)

    def take(name: str) -> torch.Tensor:
        if name not in raw:
            raise ConfigError(f"the checkpoint in {model_dir} lacks tensor {name!r}")
        return raw.pop(name).to(device=device, dtype=dtype).contiguous()

    layers: list[LayerWeights] = []
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat(
            [
                take(p + "self_attn.q_proj.weight"),
                take(p + "self_attn.k_proj.weight"),
                take(p + "self_attn.v_proj.weight"),
            ]
        )
        bias = None
        if arch.qkv_bias:
            bias = torch.cat(
                [
                    take(p + "self_attn.q_proj.bias"),
                    take(p + "self_attn.k_proj.bias"),
                    take(p + "self_attn.v_proj.bias"),
                ]
            )
        gate_up = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        layers.append(
            LayerWeights(
                input_norm=take(p + "input_layernorm.weight"),
                qkv=qkv,
                qkv_bias=bias,
                o_proj=take(p + "self_attn.o_proj.weight"),
                post_norm=take(p + "post_attention_layernorm.weight"),
                gate_up=gate_up,
                down=take(p + "mlp.down_proj.weight"),
            )
        )
    embed = take("model.embed_tokens.weight")
    if "lm_head.weight" in raw and not arch.tie_word_embeddings:
        lm_head = take("lm_head.weight")
    else:
        lm_head = embed
    # float32 only: the same layout in emulated bfloat16 takes a far slower path (~40x)
    use_transposed = device.type == "cpu" and dtype == torch.float32
    lm_head_t = lm_head.t().contiguous() if use_transposed else None
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=take("model.norm.weight"),
        lm_head=lm_head,
        lm_head_t=lm_head_t,
    )
