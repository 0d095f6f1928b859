"""The native embedding engine (a worker started with `--task embed`): an embedding runner
(the model's, or the mocker's pseudo-embeddings) on its own thread, fed batches from an
EmbedQueue, so the event loop stays responsive while the model computes.

    caller task --embed--> EmbedQueue (under the lock) --> engine thread: take_batch, forward,
    caller task <--vectors-- future <--call_soon_threadsafe-- complete

It holds no KV cache: no KV events, no blocks, nothing to transfer. A caller that leaves (its
task cancelled) drops its prompts not yet computed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Protocol

from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.engines.embedding_only import EmbeddingOnly
from armature.engines.native.embed_queue import EmbedItem, EmbedQueue
from armature.engines.validation import validate_embed_request
from armature.model.arch import ModelArch
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, EmbedResult
from armature.protocols.engine import (
    EngineLoad,
    StepRecord,
)

__all__ = ["NOT_GENERATING", "EmbeddingModelRunner", "NativeEmbeddingEngine"]

log = logging.getLogger(__name__)

NOT_GENERATING = "this worker computes embeddings (task embed); it generates no text"
MAX_BUFFERED_STEP_RECORDS = 4096


class EmbeddingModelRunner(Protocol):
    """What computes the vectors: the model (`EmbeddingRunner`) or the mocker's
    pseudo-embeddings (`sim.mock_embedding`). Called on the engine's thread."""

    @property
    def arch(self) -> ModelArch: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def shape(self) -> EmbeddingShape: ...

    def embed(self, prompts: list[list[int]]) -> list[bytes]:
        """Each prompt's unit vector, float32 little-endian bytes, in order."""
        ...


class NativeEmbeddingEngine(EmbeddingOnly):
    not_generating = NOT_GENERATING
    what = "embedding"

    def __init__(self, runner: EmbeddingModelRunner, queue: EmbedQueue):
        self.runner = runner
        self._queue = queue  # guarded by _lock
        self._lock = threading.Condition()
        self._stopping = False
        self._running_ids: set[str] = set()  # requests with prompts in the batch computing
        self._num_steps = 0
        self._step_records: deque[StepRecord] = deque(maxlen=MAX_BUFFERED_STEP_RECORDS)
        self._futures: dict[str, asyncio.Future[list[bytes]]] = {}  # event loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="armature-embed", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self._thread is None:
            return
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        self._fail_all(EngineDeadError("the engine stopped"))

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def embedding_shape(self) -> EmbeddingShape:
        return self.runner.shape

    # ---- embeddings --------------------------------------------------------------------
    def validate_embed(self, request: EmbedRequest) -> None:
        validate_embed_request(
            request, vocab_size=self.runner.arch.vocab_size, max_model_len=self.runner.max_model_len
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        if self._dead is not None or self._loop is None:
            raise EngineDeadError("the engine is not running")
        self.validate_embed(request)
        if request.request_id in self._futures:
            raise InvalidRequestError(f"duplicate request id {request.request_id!r}")
        future: asyncio.Future[list[bytes]] = self._loop.create_future()
        self._futures[request.request_id] = future
        with self._lock:
            self._queue.add(request)
            self._lock.notify()
        try:
            vectors = await future
        finally:
            self._futures.pop(request.request_id, None)
            if not future.done() or future.cancelled():
                with self._lock:
                    self._queue.abort(request.request_id)
        num_tokens = sum(len(prompt) for prompt in request.prompts)
        return EmbedResult(
            request_id=request.request_id, vectors=vectors, num_prompt_tokens=num_tokens
        )

    # ---- the Engine contract (the rest: EmbeddingOnly) ------------------------------------

    def get_load(self) -> EngineLoad:
        with self._lock:
            num_requests = self._queue.get_num_requests()
            num_running = len(self._running_ids)
            return EngineLoad(
                num_active_blocks=0,
                num_total_blocks=0,
                num_waiting=max(0, num_requests - num_running),
                num_running=num_running,
                num_prefill_tokens_queued=self._queue.get_num_waiting_tokens(),
                num_steps=self._num_steps,
            )

    def take_step_records(self) -> list[StepRecord]:
        with self._lock:
            records = list(self._step_records)
            self._step_records.clear()
        return records

    # ---- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                started_s = time.perf_counter()
                vectors = self.runner.embed([item.token_ids for item in batch])
                self._finish(batch, vectors, time.perf_counter() - started_s)
        except BaseException as exc:
            log.exception("embedding engine thread died")
            self._dead = exc
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._fail_all, EngineDeadError(f"engine died: {exc}"))

    def _next_batch(self) -> list[EmbedItem] | None:
        """Wait for prompts and take a batch (None: stop)."""
        with self._lock:
            while not self._stopping and not self._queue.has_waiting():
                self._lock.wait()
            if self._stopping:
                return None
            batch = self._queue.take_batch()
            self._running_ids = {item.request_id for item in batch}
            return batch

    def _finish(self, batch: list[EmbedItem], vectors: list[bytes], wall_s: float) -> None:
        with self._lock:
            done = self._queue.complete(batch, vectors)
            self._running_ids = set()
            self._num_steps += 1
            self._step_records.append(
                StepRecord(
                    num_scheduled_prefill_requests=len(batch),
                    num_scheduled_prefill_tokens=sum(len(i.token_ids) for i in batch),
                    num_queued_prefill_requests=self._queue.get_num_requests(),
                    num_queued_prefill_tokens=self._queue.get_num_waiting_tokens(),
                    step_wall_s=wall_s,
                )
            )
        assert self._loop is not None
        for request, request_vectors in done:
            self._loop.call_soon_threadsafe(self._resolve, request.request_id, request_vectors)

    # ---- event-loop side ---------------------------------------------------------------
    def _resolve(self, request_id: str, vectors: list[bytes]) -> None:
        future = self._futures.get(request_id)
        if future is not None and not future.done():
            future.set_result(vectors)

    def _fail_all(self, exc: BaseException) -> None:
        for future in self._futures.values():
            if not future.done():
                future.set_exception(exc)
