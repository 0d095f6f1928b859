"""`--engine vllm --task embed`: vLLM's pooling runner as an EmbeddingEngine. Each prompt of
a request is one vLLM `encode` call (vLLM batches them); its pooled vector comes back
L2-normalised as float32 bytes, as the native embedding engine's. No vLLM import here (the
build module makes the engine), so the adapter is unit-tested with a fake AsyncLLM.

It holds no KV cache that a router could use: no KV events, nothing to transfer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from armature.engines.api import EngineDeadError
from armature.engines.embedding_only import EmbeddingOnly
from armature.engines.validation import validate_embed_request
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, EmbedResult
from armature.protocols.engine import (
    EngineLoad,
    StepRecord,
)

__all__ = ["NOT_GENERATING", "VllmEmbeddingEngine", "unit_vector_bytes"]

NOT_GENERATING = "this vllm worker computes embeddings (task embed); it generates no text"


def unit_vector_bytes(data: Any) -> bytes:
    """A pooled vector (a tensor or array of floats) as unit-norm float32 little-endian
    bytes."""
    vector = np.asarray(data.tolist() if hasattr(data, "tolist") else data, dtype=np.float64)
    norm = float(np.linalg.norm(vector))
    if norm > 0:
        vector = vector / norm
    return vector.astype("<f4").tobytes()


class VllmEmbeddingEngine(EmbeddingOnly):
    """`llm`: vLLM's AsyncLLM started with the pooling runner; `make_prompt` and
    `make_pooling` build vLLM's prompt and PoolingParams (the build module's)."""

    not_generating = NOT_GENERATING
    what = "vllm embedding"

    def __init__(
        self,
        llm: Any,
        shape: EmbeddingShape,
        *,
        vocab_size: int,
        max_model_len: int,
        make_prompt: Callable[[list[int]], Any],
        make_pooling: Callable[[], Any],
    ):
        self.llm = llm
        self.shape = shape
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._make_prompt = make_prompt
        self._make_pooling = make_pooling
        self._started = False
        self._stopped = False
        self._num_running = 0  # prompts in vLLM now
        self._num_running_tokens = 0

    def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.llm.shutdown()

    @property
    def is_alive(self) -> bool:
        return self._started and not self._stopped and not self.llm.errored

    @property
    def embedding_shape(self) -> EmbeddingShape:
        return self.shape

    # ---- embeddings --------------------------------------------------------------------
    def validate_embed(self, request: EmbedRequest) -> None:
        validate_embed_request(
            request, vocab_size=self.vocab_size, max_model_len=self.max_model_len
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        if not self.is_alive:
            raise EngineDeadError("the vllm engine is not running")
        self.validate_embed(request)
        vectors = await asyncio.gather(
            *(
                self._embed_one(f"{request.request_id}-{i}", prompt)
                for i, prompt in enumerate(request.prompts)
            )
        )
        num_tokens = sum(len(prompt) for prompt in request.prompts)
        return EmbedResult(
            request_id=request.request_id, vectors=list(vectors), num_prompt_tokens=num_tokens
        )

    async def _embed_one(self, request_id: str, prompt: list[int]) -> bytes:
        """One prompt's vector; cancelling this aborts it in vLLM (closing its stream)."""
        self._num_running += 1
        self._num_running_tokens += len(prompt)
        try:
            final = None
            stream = self.llm.encode(self._make_prompt(prompt), self._make_pooling(), request_id)
            try:
                async for output in stream:
                    final = output
            finally:
                await stream.aclose()
        finally:
            self._num_running -= 1
            self._num_running_tokens -= len(prompt)
        if final is None:
            raise EngineDeadError(f"vLLM returned no embedding for {request_id}")
        return unit_vector_bytes(final.outputs.data)

    # ---- the Engine contract (the rest: EmbeddingOnly) ------------------------------------

    def get_load(self) -> EngineLoad:
        return EngineLoad(
            num_active_blocks=0,
            num_total_blocks=0,
            num_waiting=0,
            num_running=self._num_running,
            num_prefill_tokens_queued=self._num_running_tokens,
        )

    def take_step_records(self) -> list[StepRecord]:
        return []
