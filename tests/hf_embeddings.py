"""Sentence embeddings computed with Hugging Face transformers: the reference the engine's
pooled vectors are checked against (the base model's last hidden state, after its final
norm, pooled and L2-normalised in float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def embed_many_in_order(
    client: Any, model: str, model_dir: Path
) -> tuple[list[np.ndarray], list[list[int]]]:
    """130 texts (three legs of /v1/embeddings) through `client`, float and base64: the
    vectors come back in order, equal in both encodings, with the tokens counted. Returns
    the vectors and the texts' token ids."""
    from transformers import AutoTokenizer

    texts = [f"sentence number {i} about topic {i % 7}" for i in range(130)]
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    packed = client.embeddings.create(model=model, input=texts)
    assert [d.index for d in floats.data] == list(range(130))
    assert [d.embedding for d in floats.data] == [d.embedding for d in packed.data]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = [tokenizer(text)["input_ids"] for text in texts]
    assert floats.usage.prompt_tokens == sum(len(p) for p in ids)
    return [np.array(d.embedding, dtype=np.float32) for d in floats.data], ids
