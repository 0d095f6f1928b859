"""The mocker's embedding runner: what a worker started with `--engine mocker --task embed`
computes instead of a model's hidden states. The vectors are PSEUDO-EMBEDDINGS: deterministic
functions of the token ids with the model's dimension and unit norm, and nothing more; they
carry no meaning (similar texts are close only as far as they share tokens). They let a
fleet of embedding workers be run, routed, scaled and replayed without weights, at the
speed the timing model gives a prefill of the batch's tokens.

    token id t  ─▶ v(t) = standard normal vector from a generator seeded by xxh3(t)
    mean        ─▶ the mean of v(t) over the prompt's tokens
    cls         ─▶ v(first token)
    last        ─▶ a vector seeded by xxh3 of the whole prompt (a decoder's last state sees
                   every token)
    then L2-normalised, float32

The seed is fixed, not the worker's --seed: every mocker worker of a fleet gives the same
vector for the same tokens, as replicas of one model do.
"""

from __future__ import annotations

import numpy as np
import xxhash

from armature.model.arch import ModelArch
from armature.protocols.embedding import EmbeddingShape, Pooling
from armature.sim.clock import Clock
from armature.sim.timing import StepWork, TimingModel

__all__ = ["MockEmbeddingRunner", "pseudo_embedding"]

HASH_SEED = 1337


def _vector(key: bytes, num_dimensions: int) -> np.ndarray:
    rng = np.random.default_rng(xxhash.xxh3_64_intdigest(key, seed=HASH_SEED))
    return rng.standard_normal(num_dimensions)


def pseudo_embedding(prompt: list[int], num_dimensions: int, pooling: Pooling) -> np.ndarray:
    """The unit float32 vector of one non-empty prompt (module docstring)."""
    if pooling is Pooling.LAST:
        total = _vector(np.asarray(prompt, dtype="<u4").tobytes(), num_dimensions)
    elif pooling is Pooling.CLS:
        total = _vector(np.uint32(prompt[0]).tobytes(), num_dimensions)
    else:
        ids, counts = np.unique(np.asarray(prompt, dtype="<u4"), return_counts=True)
        total = np.zeros(num_dimensions)
        for token, count in zip(ids, counts, strict=True):
            total += count * _vector(token.tobytes(), num_dimensions)
        total /= len(prompt)
    return (total / np.linalg.norm(total)).astype("<f4")


class MockEmbeddingRunner:
    """The embedding engine's runner seam (`engines.native.embedding_engine`), filled with
    pseudo-embeddings and modeled time."""

    def __init__(
        self,
        arch: ModelArch,
        max_model_len: int,
        shape: EmbeddingShape,
        timing: TimingModel,
        clock: Clock,
    ):
        self.arch = arch
        self.max_model_len = max_model_len
        self.shape = shape
        self.timing = timing
        self.clock = clock

    def embed(self, prompts: list[list[int]]) -> list[bytes]:
        """Each prompt's vector (float32 little-endian bytes, unit norm), after the time the
        timing model gives a prefill of all of them."""
        work = StepWork(
            num_prefill_tokens=sum(len(p) for p in prompts),
            num_decode_requests=0,
            kv_utilization=0.0,
        )
        self.clock.advance(self.timing.step_ms(work) / 1000.0)
        return [
            pseudo_embedding(p, self.shape.num_dimensions, self.shape.pooling).tobytes()
            for p in prompts
        ]
