"""EmbeddingService: a validated /v1/embeddings request -> tokens -> legs on the embedding
workers (EmbedRouter) -> OpenAI's response body. The route lives in embedding_routes.py.

    input ──tokenize──▶ prompts ──split_prompts──▶ legs ──EmbedRouter.embed (concurrently)──▶
    vectors ──encode_vector (dimensions, encoding_format)──▶ {"object": "list", "data": ...}
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from armature.engines.api import InvalidRequestError
from armature.frontend.embedding_protocol import EmbeddingRequest
from armature.frontend.embedding_vectors import encode_vector
from armature.frontend.errors import ApiError
from armature.frontend.jobs import ServedModel
from armature.frontend.preprocess import Preprocessor
from armature.frontend.tasks import wrong_task
from armature.protocols.embedding import EmbedRequest, EmbedResult, WorkerTask
from armature.router.embed_policy import split_prompts
from armature.router.embedding import EmbedRouter

__all__ = ["EmbeddingService"]


class EmbeddingService:
    def __init__(
        self,
        router: EmbedRouter,
        preprocessor: Preprocessor,
        model: ServedModel,
        has_generate: Callable[[], bool],
    ):
        """`has_generate`: whether any worker of task generate is routed to (for the 400 that
        names the task this model is served for)."""
        self.router = router
        self.preprocessor = preprocessor
        self.model = model
        self.has_generate = has_generate

    async def create(self, body: EmbeddingRequest) -> dict[str, Any]:
        """The response body for `body`. ApiError (4xx, 503) for what cannot be served;
        InvalidRequestError and EngineDeadError from the workers pass through."""
        self._check(body)
        prompts = await self._tokenize(body)
        legs = [
            EmbedRequest(request_id=f"embd-{uuid.uuid4().hex}", prompts=leg)
            for leg in split_prompts(prompts)
        ]
        try:
            for leg in legs:
                self.router.validate(leg)
        except InvalidRequestError as exc:
            raise ApiError(str(exc), param="input") from None
        results = await _all(legs, self.router)
        vectors = [vector for result in results for vector in result.vectors]
        num_tokens = sum(result.num_prompt_tokens for result in results)
        data = [
            {
                "object": "embedding",
                "index": index,
                "embedding": encode_vector(vector, body.encoding_format, body.dimensions),
            }
            for index, vector in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": self.model.name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }

    def _check(self, body: EmbeddingRequest) -> None:
        """ApiError unless the model, the task and `dimensions` fit the embedding pool."""
        if body.model != self.model.name:
            raise ApiError(
                f"the model {body.model!r} does not exist; this server serves {self.model.name!r}",
                status_code=404,
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        has_embed = bool(self.router.engines)
        mismatch = wrong_task(
            body.model, WorkerTask.EMBED, has_generate=self.has_generate(), has_embed=has_embed
        )
        if mismatch is not None:
            raise mismatch
        shape = self.router.shape
        if shape is None or not self.router.get_workers():
            raise ApiError(
                "no embedding worker is serving",
                status_code=503,
                type="service_unavailable",
                code="engine_unavailable",
            )
        if body.dimensions is not None:
            reason = shape.check_dimensions(body.dimensions)
            if reason is not None:
                raise ApiError(reason, param="dimensions", code="unsupported_parameter")

    async def _tokenize(self, body: EmbeddingRequest) -> list[list[int]]:
        texts = body.get_texts()
        if texts is None:
            prompts = body.get_token_ids()
        else:
            prompts = await asyncio.to_thread(lambda: [self.preprocessor.encode(t) for t in texts])
        limit = self.model.max_model_len
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ApiError(f"input[{index}] has no tokens", param="input")
            if len(prompt) > limit:
                raise ApiError(
                    f"input[{index}] has {len(prompt)} tokens; this model's maximum context "
                    f"length is {limit} tokens",
                    param="input",
                    code="context_length_exceeded",
                )
        return prompts


async def _all(legs: list[EmbedRequest], router: EmbedRouter) -> list[EmbedResult]:
    """Every leg's result, in order, computed concurrently; the first failure cancels the
    rest (so a client that leaves, or a refused leg, leaves no work behind)."""
    tasks = [asyncio.ensure_future(router.embed(leg)) for leg in legs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
