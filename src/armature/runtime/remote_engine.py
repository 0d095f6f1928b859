"""A worker seen from a frontend: the Engine contract over the request and event planes.

`generate` streams the worker's `generate` endpoint (closing it cancels the request on the
worker), `embed` calls its `embed` endpoint (workers whose card says task embed); a
subscription to its event-plane url buffers KV events for the router and the
worker's step records (for a planner), and keeps the latest load. A worker that cannot be
reached counts as dead for `unreachable_backoff_s` (the router routes around it); discovery
removes it for good when its lease ends.

Hung workers: a worker that sends no update (it sends one at least every second) for
`liveness_timeout_s` is not routed to, and its streams in flight fail then (the router moves
their requests elsewhere: a worker killed on a request plane with no connection per stream,
NATS, would otherwise hold them until the stall timeout); a stream that brings nothing for
`stall_timeout_s` fails too, and the worker is not routed to again until its reported engine
steps advance (or it reports no work at all). A worker that leaves discovery keeps its
streams: it drains them while it still sends updates, which are heard (and their silence
watched) until its last stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

import msgspec

from armature.config import HealthConfig
from armature.engines.api import EngineDeadError, InvalidRequestError, wait_and_clear
from armature.engines.validation import (
    check_structured_output,
    validate_embed_request,
    validate_request,
)
from armature.protocols.embedding import EmbeddingShape, EmbedRequest, EmbedResult
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    EngineStats,
    StepRecord,
    coalesce_outputs,
)
from armature.protocols.failures import FailureCode
from armature.protocols.kv_events import KvDump, KvEvent, merge_dumps
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.lora import LoadLora, LoraAdapter, LoraNotFoundError, LoraState, UnloadLora
from armature.protocols.worker import WorkerCard, WorkerUpdate
from armature.runtime.events import EventPlane
from armature.runtime.request_plane import (
    PeerUnavailableError,
    RemoteError,
    RequestClient,
    payloads,
)
from armature.runtime.stall_watch import StallWatch

__all__ = ["RemoteEngine"]

log = logging.getLogger(__name__)

_MAX_BUFFERED_EVENTS = 100_000  # beyond this the oldest go, and the id gap asks for a dump
_MAX_BUFFERED_STEP_RECORDS = 4096  # beyond this the oldest go (nobody may be draining them)


class RemoteEngine:
    def __init__(
        self,
        card: WorkerCard,
        client: RequestClient,
        event_plane: EventPlane,
        unreachable_backoff_s: float = 2.0,
        health: HealthConfig = HealthConfig(),
    ):
        self.card = card
        self.client = client
        self.event_plane = event_plane
        self.unreachable_backoff_s = unreachable_backoff_s
        self._unreachable_until_s = 0.0
        self._events: deque[KvEvent] = deque(maxlen=_MAX_BUFFERED_EVENTS)
        self._step_records: deque[StepRecord] = deque(maxlen=_MAX_BUFFERED_STEP_RECORDS)
        self._load = EngineLoad.idle(card.num_kv_blocks)
        self._alive = True
        self._subscription: asyncio.Task[None] | None = None
        self.liveness_timeout_s = health.worker_liveness_timeout_s
        self.stall_timeout_s = health.worker_stall_timeout_s
        self._last_update_s = time.monotonic()
        self._updated = asyncio.Event()  # set by each WorkerUpdate (`wait_for_update`)
        self._stalled_at_steps: int | None = None  # engine steps when a stream stalled
        self._lora = LoraState(0, list(card.lora_adapters))  # the newest state heard
        self._watches: set[StallWatch] = set()  # of the streams in flight
        self._liveness: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._subscription = loop.create_task(self._subscribe())
        self._liveness = loop.create_task(self._watch_liveness())

    async def stop(self) -> None:
        """No new requests; its updates are heard until its streams in flight end (a worker
        that left discovery drains them, one that crashed falls silent)."""
        self._alive = False
        if self._watches:
            return  # the last stream's end stops the tasks (`_stop_tasks`)
        tasks = self._stop_tasks()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_tasks(self) -> list[asyncio.Task[None]]:
        tasks = [t for t in (self._subscription, self._liveness) if t is not None]
        for task in tasks:
            task.cancel()
        self._subscription = self._liveness = None
        return tasks

    def _is_silent(self) -> bool:
        return time.monotonic() - self._last_update_s > self.liveness_timeout_s

    async def _watch_liveness(self) -> None:
        """Fail the streams in flight once the worker has sent no update for
        `liveness_timeout_s` (checked again every second while it stays silent)."""
        while True:
            due_s = self._last_update_s + self.liveness_timeout_s
            await asyncio.sleep(max(due_s - time.monotonic(), 0.0) + 0.01)
            if not self._is_silent():
                continue
            if self._watches:
                log.warning(
                    "%s sent no update for %g s: its %d streams move to other workers",
                    self.card.worker_id,
                    self.liveness_timeout_s,
                    len(self._watches),
                )
                for watch in list(self._watches):
                    watch.expire()
            await asyncio.sleep(1.0)

    @property
    def is_alive(self) -> bool:
        now_s = time.monotonic()
        return (
            self._alive
            and now_s >= self._unreachable_until_s
            and now_s - self._last_update_s <= self.liveness_timeout_s
            and self._stalled_at_steps is None
        )

    def validate(self, request: EngineRequest) -> None:
        validate_request(
            request,
            vocab_size=self.card.vocab_size,
            max_model_len=self.card.max_model_len,
            block_size=self.card.block_size,
            num_kv_blocks=self.card.num_kv_blocks,
        )
        check_structured_output(
            request, engine=self.card.engine, supported=self.card.structured_output
        )

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """The worker's outputs for `request`. Outputs that arrived while the consumer was
        busy come merged into one (as the worker merges those its stream's window held
        back): a consumer that fell behind catches up in one step."""
        if not self._alive:
            raise EngineDeadError(f"{self.card.worker_id} is gone")
        batches = self._batches("generate", msgspec.msgpack.encode(request))
        watch = StallWatch(self.stall_timeout_s)
        self._watches.add(watch)
        try:
            while True:
                try:
                    batch = await watch.wait(anext(batches))
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if watch.expired_from_outside:  # the worker fell silent, not this stream
                        raise EngineDeadError(
                            f"{self.card.worker_id} sent no update for "
                            f"{self.liveness_timeout_s:g} s"
                        ) from None
                    self._stalled_at_steps = self._load.num_steps
                    log.warning(
                        "%s sent nothing for %.0f s; not routing to it until it makes progress",
                        self.card.worker_id,
                        self.stall_timeout_s,
                    )
                    raise EngineDeadError(
                        f"{self.card.worker_id} sent nothing for {self.stall_timeout_s:g} s"
                    ) from None
                outputs = [msgspec.msgpack.decode(p, type=EngineOutput) for p in batch]
                for output in coalesce_outputs(outputs):
                    yield output
        finally:
            self._watches.discard(watch)
            if not self._alive and not self._watches:  # stopped: its last stream is done
                self._stop_tasks()
            watch.close()
            await batches.aclose()  # type: ignore[attr-defined]

    @property
    def embedding_shape(self) -> EmbeddingShape:
        """The vectors the worker embeds into (only for a card of task embed)."""
        assert self.card.embedding is not None, f"{self.card.worker_id} computes no embeddings"
        return self.card.embedding

    def validate_embed(self, request: EmbedRequest) -> None:
        validate_embed_request(
            request, vocab_size=self.card.vocab_size, max_model_len=self.card.max_model_len
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        """The worker's vectors for `request`; EngineDeadError if it is gone or sends nothing
        for `stall_timeout_s`, InvalidRequestError if it refuses the request."""
        if not self._alive:
            raise EngineDeadError(f"{self.card.worker_id} is gone")
        stream = self._stream("embed", msgspec.msgpack.encode(request))
        try:
            payload = await asyncio.wait_for(anext(stream), self.stall_timeout_s)
        except StopAsyncIteration:
            raise EngineDeadError(f"{self.card.worker_id} sent no embeddings") from None
        except TimeoutError:
            raise EngineDeadError(
                f"{self.card.worker_id} sent nothing for {self.stall_timeout_s:g} s"
            ) from None
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return msgspec.msgpack.decode(payload, type=EmbedResult)

    def get_load(self) -> EngineLoad:
        return self._load

    def take_kv_events(self) -> list[KvEvent]:
        events = list(self._events)
        self._events.clear()
        return events

    def take_step_records(self) -> list[StepRecord]:
        """The worker's step records received since the last call, oldest first."""
        records = list(self._step_records)
        self._step_records.clear()
        return records

    async def wait_for_update(self, timeout_s: float) -> bool:
        """True once a WorkerUpdate (KV events, step records, load) arrived since the last
        return; False after `timeout_s` without."""
        return await wait_and_clear(self._updated, timeout_s)

    async def dump_kv_blocks(self) -> KvDump:
        parts = [
            msgspec.msgpack.decode(payload, type=KvDump)
            async for payload in self._stream("dump", b"")
        ]
        if not parts:
            raise EngineDeadError(f"{self.card.worker_id} sent no dump")
        return merge_dumps(parts)  # it comes in parts (a large one passed a message's size)

    def stats(self) -> EngineStats:
        """A remote worker's counters are on its own /metrics endpoint."""
        return EngineStats()

    async def release_kv(self, handle: KvHandle) -> None:
        async with self._answer_within("release"):
            async for _ in self._stream("release", msgspec.msgpack.encode(handle)):
                return

    @contextlib.asynccontextmanager
    async def _answer_within(self, endpoint: str) -> AsyncIterator[None]:
        """EngineDeadError when the worker has not answered `endpoint` within the stall
        timeout (a worker whose engine hangs held a LoRA load, or a release, forever)."""
        try:
            async with asyncio.timeout(self.stall_timeout_s):
                yield
        except TimeoutError:
            raise EngineDeadError(
                f"{self.card.worker_id} did not answer {endpoint} within {self.stall_timeout_s:g} s"
            ) from None

    # ---- LoRA adapters: the worker's newest state, from its card, updates and answers ----
    def get_lora_adapters(self) -> list[LoraAdapter]:
        return self._lora.adapters

    def _set_lora(self, state: LoraState) -> None:
        if state.version >= self._lora.version:
            self._lora = state

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        """Load on the worker (`path` is read there); InvalidRequestError if it refuses."""
        state = await self._call("load_lora", msgspec.msgpack.encode(LoadLora(name, path)))
        self._set_lora(state)
        return next(a for a in state.adapters if a.name == name)

    async def unload_lora(self, name: str) -> None:
        if all(a.name != name for a in self._lora.adapters):
            raise LoraNotFoundError(f"{self.card.worker_id} serves no LoRA adapter {name!r}")
        self._set_lora(await self._call("unload_lora", msgspec.msgpack.encode(UnloadLora(name))))

    async def _call(self, endpoint: str, payload: bytes) -> LoraState:
        async with self._answer_within(endpoint):
            async for answer in self._stream(endpoint, payload):
                return msgspec.msgpack.decode(answer, type=LoraState)
        raise EngineDeadError(f"{self.card.worker_id} did not answer {endpoint}")

    def _stream(self, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        return payloads(self._batches(endpoint, payload))

    async def _batches(self, endpoint: str, payload: bytes) -> AsyncIterator[list[bytes]]:
        """The client's batches of `endpoint`'s answers, its failures as engine errors."""
        stream = self.client.stream_batches(self.card.request_url, endpoint, payload)
        try:
            async for batch in stream:
                yield batch
        except RemoteError as exc:
            if exc.code is FailureCode.INVALID_REQUEST:
                raise InvalidRequestError(exc.message) from None
            raise EngineDeadError(f"{self.card.worker_id}: {exc}") from None
        except PeerUnavailableError as exc:
            self._unreachable_until_s = time.monotonic() + self.unreachable_backoff_s
            raise EngineDeadError(f"{self.card.worker_id} is unreachable: {exc}") from None
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def _subscribe(self) -> None:
        """Hear the worker's updates until cancelled; a subscription that fails is logged
        and made again (it ended unseen, and the worker looked silent for good)."""
        while True:
            try:
                await self._follow_updates()
            except Exception as exc:  # EventPlaneError, or its client's own
                log.error("no events from %s: %s; subscribing again", self.card.worker_id, exc)
            await asyncio.sleep(1.0)

    async def _follow_updates(self) -> None:
        async with aclosing(self.event_plane.subscribe(self.card.events_url)) as updates:
            async for payload in updates:
                try:
                    update = msgspec.msgpack.decode(payload, type=WorkerUpdate)
                except msgspec.DecodeError as exc:
                    log.warning("bad update from %s: %s", self.card.worker_id, exc)
                    continue
                self._events.extend(update.kv_events)
                self._step_records.extend(update.step_records)
                self._load = update.load
                if update.lora is not None:
                    self._set_lora(update.lora)
                self._last_update_s = time.monotonic()
                self._updated.set()
                stalled, load = self._stalled_at_steps, update.load
                idle = load.num_running == 0 and load.num_waiting == 0
                if stalled is not None and (load.num_steps > stalled or idle):
                    log.info("%s is making progress again", self.card.worker_id)
                    self._stalled_at_steps = None
