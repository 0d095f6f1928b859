"""The embedding router inside the frontend: the workers of task embed, one request at a time
to the least loaded (`pick_embed_worker`), load tracked on every path.

    EmbeddingService --embed(request)--> EmbedRouter --pick--> embedding engine (local or remote)

Embeddings are idempotent, so a worker that dies before answering costs nothing: the request
goes to another live worker, once per worker. The pool serves one `EmbeddingShape`; an engine
that would return other vectors (another pooling, another size) is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from armature.engines.api import EmbeddingEngine, EngineDeadError
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, EmbedResult
from armature.router.embed_policy import pick_embed_worker

__all__ = ["EmbedRouter"]

log = logging.getLogger(__name__)


class EmbedRouter:
    def __init__(self, engines: Mapping[str, EmbeddingEngine] | None = None):
        self.engines: dict[str, EmbeddingEngine] = {}
        self.shape: EmbeddingShape | None = None  # of every engine in the pool
        self._in_flight_tokens: dict[str, int] = {}  # by worker, this router's requests only
        self._started = False
        for worker, engine in (engines or {}).items():
            self.add_engine(worker, engine)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        for engine in self.engines.values():
            engine.start()

    async def stop(self) -> None:
        self._started = False
        for engine in self.engines.values():
            await engine.stop()

    def add_engine(self, worker: str, engine: EmbeddingEngine) -> None:
        """Route to `engine` from now on (started here once the router runs). ValueError for
        a worker already routed to, or one whose vectors differ from the pool's."""
        if worker in self.engines:
            raise ValueError(f"worker {worker!r} is already routed to")
        shape = engine.embedding_shape
        if self.engines and shape != self.shape:
            raise ValueError(
                f"it returns {_describe(shape)}; the pool returns {_describe(self.shape)}"
            )
        if self._started:
            engine.start()
        self.engines[worker] = engine
        self.shape = shape

    async def remove_engine(self, worker: str) -> None:
        engine = self.engines.pop(worker, None)
        if engine is None:
            return
        self._in_flight_tokens.pop(worker, None)
        if not self.engines:
            self.shape = None
        await engine.stop()

    def get_workers(self) -> list[str]:
        return [w for w, e in self.engines.items() if e.is_alive]

    def get_in_flight_tokens(self) -> dict[str, int]:
        """Prompt tokens this router has in flight on each worker (zeros left out)."""
        return {w: n for w, n in self._in_flight_tokens.items() if n}

    # ---- requests ----------------------------------------------------------------------
    def validate(self, request: EmbedRequest) -> None:
        """InvalidRequestError if the pool's workers could never serve `request`."""
        for engine in self.engines.values():
            engine.validate_embed(request)  # the workers of one model share its limits
            return

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """`request`'s vectors from the least loaded live worker; a worker found dead is
        skipped and the next one tried. EngineDeadError when none is left."""
        failed: set[str] = set()
        num_tokens = sum(len(prompt) for prompt in request.prompts)
        while True:
            live = [w for w in self.get_workers() if w not in failed]
            if not live:
                raise EngineDeadError("no embedding worker is serving")
            worker = pick_embed_worker(
                {w: self._in_flight_tokens.get(w, 0) for w in live},
                {w: self.engines[w].get_load().num_prefill_tokens_queued for w in live},
            )
            self._in_flight_tokens[worker] = self._in_flight_tokens.get(worker, 0) + num_tokens
            try:
                return await self.engines[worker].embed(request)
            except EngineDeadError as exc:
                log.warning(
                    "embedding worker %s failed %s (%s); retrying", worker, request.request_id, exc
                )
                failed.add(worker)
            finally:
                if worker in self._in_flight_tokens:
                    self._in_flight_tokens[worker] -= num_tokens


def _describe(shape: EmbeddingShape | None) -> str:
    if shape is None:
        return "nothing"
    return f"{shape.num_dimensions}-dimensional vectors pooled by {shape.pooling}"
