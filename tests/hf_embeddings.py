"""Sentence embeddings computed with Hugging Face transformers: the reference the engine's
pooled vectors are checked against (the base model's last hidden state, after its final
norm, pooled and L2-normalised in float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from armature.protocols.embedding import Pooling

MIN_COSINE = 0.999


class HfEmbeddings:
    def __init__(self, model_dir: Path):
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.eval()

    def embed(self, token_ids: list[int], pooling: Pooling) -> np.ndarray:
        with torch.no_grad():
            hidden = self.model(torch.tensor([token_ids])).last_hidden_state[0].float()
        pooled = {Pooling.MEAN: hidden.mean(0), Pooling.LAST: hidden[-1], Pooling.CLS: hidden[0]}
        return torch.nn.functional.normalize(pooled[pooling], dim=-1).numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))
