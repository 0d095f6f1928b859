"""Shapes and hardware with round numbers for the configurator's tests: a tiny Llama whose
FLOPs and bytes can be computed by hand, and a system whose rates make them easy to time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from armature.configurator.model_spec import ModelSpec
from armature.configurator.systems import Sourced, SystemSpec

# L=2 layers, h=64, 4 heads and 2 KV heads of 16 (q 64 wide, k and v 32 each), I=128, V=512
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def tiny_llama(dtype: str = "bfloat16") -> ModelSpec:
    return ModelSpec(
        name="tiny",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=512,
        tie_word_embeddings=False,
        dtype=dtype,
        max_context_tokens=4096,
    )


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _n(value: float) -> Sourced:
    return Sourced(value, "test")


def toy_system(**overrides: float) -> SystemSpec:
    """1e12 FLOP/s in bfloat16 (GEMMs at half, attention at a quarter), 1e10 B/s of
    memory at full efficiency, links of 1e9 B/s at full efficiency and 1 us a hop, 0.1 ms a
    step; 1e9 bytes of which 90% usable, 1e8 reserved."""
    values: dict[str, float] = {
        "memory_bandwidth_bytes_s": 1e10,
        "memory_capacity_bytes": 1e9,
        "intra_node_bandwidth_bytes_s": 1e9,
        "inter_node_bandwidth_bytes_s": 1e8,
        "gpus_per_node": 8,
        "gemm_efficiency": 0.5,
        "attention_efficiency": 0.25,
        "memory_efficiency": 1.0,
        "link_efficiency": 1.0,
        "link_latency_s": 1e-6,
        "step_overhead_s": 1e-4,
        "memory_utilization": 0.9,
        "reserved_bytes": 1e8,
    }
    values.update(overrides)
    return SystemSpec(
        name="toy",
        description="a toy accelerator",
        peak_flops_per_s={"bfloat16": _n(1e12)},
        **{key: _n(value) for key, value in values.items()},
    )
