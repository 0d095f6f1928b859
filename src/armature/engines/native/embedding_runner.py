"""The embedding runner: the model's weights without a KV cache, one forward over a batch of
whole prompts, pooled into unit vectors. Synchronous; the embedding engine's thread calls it."""

from __future__ import annotations

import numpy as np
import torch

from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import resolve_max_model_len
from armature.model.arch import read_arch, read_matryoshka_dimensions
from armature.model.dtypes import torch_dtype
from armature.model.forward import encode
from armature.model.pooling import pool
from armature.model.rope import build_rope_tables
from armature.model.weights import load_weights
from armature.protocols.embedding import EmbeddingShape, Pooling

__all__ = ["EmbeddingRunner"]


class EmbeddingRunner:
    def __init__(self, config: NativeEngineConfig, pooling: Pooling):
        self.device = torch.device(config.device)
        dtype = torch_dtype(config.dtype)
        self.arch = read_arch(config.model_dir)
        self.max_model_len = resolve_max_model_len(config, self.arch)
        self.weights = load_weights(config.model_dir, self.arch, dtype, self.device)
        self.rope = build_rope_tables(config.model_dir, self.max_model_len, dtype, self.device)
        self.shape = EmbeddingShape(
            num_dimensions=self.arch.hidden_size,
            pooling=pooling,
            matryoshka_dimensions=read_matryoshka_dimensions(config.model_dir),
        )

    def embed(self, prompts: list[list[int]]) -> list[bytes]:
        """Each prompt's vector (float32 little-endian bytes, unit L2 norm), in order. Every
        prompt is non-empty and fits the context (the engine validated it)."""
        spans: list[tuple[int, int]] = []
        flat: list[int] = []
        for prompt in prompts:
            spans.append((len(flat), len(prompt)))
            flat.extend(prompt)
        input_ids = torch.tensor(flat, dtype=torch.long, device=self.device)
        hidden = encode(input_ids, spans, self.weights, self.arch, self.rope)
        vectors = pool(hidden, spans, self.shape.pooling).cpu().numpy().astype("<f4")
        return [np.ascontiguousarray(row).tobytes() for row in vectors]
