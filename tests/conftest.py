"""Model fixtures shared by the whole suite.

- `default_model_dir`: the real default model, converted once into the real default cache
  (`default_cache_dir()`), so repeated local runs reuse it; tests using it mark themselves slow.
- `tiny_llama_dir`, `tiny_qwen2_dir`, `tiny_llama3_rope_dir`: tiny random-weight safetensors
  models (seed 0, float32, no tokenizer) for engine tests that feed token ids.

Hypothesis runs without its per-example deadline: a deadline is a timing assertion, and the
suite must pass on a loaded machine (one example of a property test once took over 200 ms under
a CPU hog). Tests that set their own settings keep them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from armature.model.source import resolve_model

settings.register_profile("armature", deadline=None)
settings.load_profile("armature")

# Shared shape of the tiny models: head_dim 16, GQA with 2 query heads per KV head.
_TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 512,
}


def _save_tiny_model(config: Any, out_dir: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)  # transformers 5 writes model.safetensors only
    return out_dir


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory (converts on first use, ~30 s)."""
    return resolve_model(None).path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama, untied embeddings, RoPE theta 10000 (default rope)."""
    from transformers import LlamaConfig

    config = LlamaConfig(**_TINY_SHAPE, tie_word_embeddings=False)
    return _save_tiny_model(config, tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2 (q/k/v projections carry a bias), RoPE theta 1e6, untied embeddings."""
    from transformers import Qwen2Config

    config = Qwen2Config(
        **_TINY_SHAPE,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=False,
    )
    return _save_tiny_model(config, tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def tiny_llama3_rope_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama with llama3-type RoPE scaling (theta 500000) and tied embeddings.

    original_max_position_embeddings 64 is far below the 512 context, so positions past 64 and
    the low/high-frequency split of the scaling are both exercised.
    """
    from transformers import LlamaConfig

    config = LlamaConfig(
        **_TINY_SHAPE,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=True,
    )
    return _save_tiny_model(config, tmp_path_factory.mktemp("tiny_llama3_rope"))
