"""A worker seen from a frontend: the Engine contract over the request and event planes.

`generate` streams the worker's `generate` endpoint (closing it cancels the request on the
worker); a subscription to its event-plane url buffers KV events for the router and keeps the
latest load. A worker that cannot be reached counts as dead for `unreachable_backoff_s` (the
router routes around it); discovery removes it for good when its lease ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec

from armature.engine.interface import EngineDeadError, InvalidRequestError
from armature.engine.validation import validate_request
from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest
from armature.protocols.kv_events import KvDump, KvEvent
from armature.protocols.worker import WorkerCard, WorkerUpdate
from armature.runtime.events import EventPlane, EventPlaneError
from armature.runtime.request_plane import PeerUnavailableError, RemoteError, RequestClient

__all__ = ["RemoteEngine"]

log = logging.getLogger(__name__)

_MAX_BUFFERED_EVENTS = 100_000  # beyond this the oldest go, and the id gap asks for a dump


class RemoteEngine:
    def __init__(
        self,
        card: WorkerCard,
        client: RequestClient,
        event_plane: EventPlane,
        unreachable_backoff_s: float = 2.0,
    ):
        self.card = card
        self.client = client
        self.event_plane = event_plane
        self.unreachable_backoff_s = unreachable_backoff_s
        self._unreachable_until_s = 0.0
        self._events: deque[KvEvent] = deque(maxlen=_MAX_BUFFERED_EVENTS)
        self._load = EngineLoad(
            num_active_blocks=0,
            num_total_blocks=card.num_kv_blocks,
            num_waiting=0,
            num_running=0,
            num_prefill_tokens_queued=0,
        )
        self._alive = True
        self._subscription: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._subscription = asyncio.get_running_loop().create_task(self._subscribe())

    async def stop(self) -> None:
        self._alive = False
        if self._subscription is not None:
            self._subscription.cancel()
            await asyncio.gather(self._subscription, return_exceptions=True)

    @property
    def is_alive(self) -> bool:
        return self._alive and time.monotonic() >= self._unreachable_until_s

    def validate(self, request: EngineRequest) -> None:
        validate_request(
            request,
            vocab_size=self.card.vocab_size,
            max_model_len=self.card.max_model_len,
            block_size=self.card.block_size,
            num_kv_blocks=self.card.num_kv_blocks,
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if not self._alive:
            raise EngineDeadError(f"{self.card.worker_id} is gone")
        stream = self._stream("generate", msgspec.msgpack.encode(request))
        try:
            async for payload in stream:
                yield msgspec.msgpack.decode(payload, type=EngineOutput)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def get_load(self) -> EngineLoad:
        return self._load

    def take_kv_events(self) -> list[KvEvent]:
        events = list(self._events)
        self._events.clear()
        return events

    async def dump_kv_blocks(self) -> KvDump:
        async for payload in self._stream("dump", b""):
            return msgspec.msgpack.decode(payload, type=KvDump)
        raise EngineDeadError(f"{self.card.worker_id} sent no dump")

    async def _stream(self, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        stream = self.client.stream(self.card.request_url, endpoint, payload)
        try:
            async for item in stream:
                yield item
        except RemoteError as exc:
            if exc.code == "invalid_request":
                raise InvalidRequestError(exc.message) from None
            raise EngineDeadError(f"{self.card.worker_id}: {exc}") from None
        except PeerUnavailableError as exc:
            self._unreachable_until_s = time.monotonic() + self.unreachable_backoff_s
            raise EngineDeadError(f"{self.card.worker_id} is unreachable: {exc}") from None
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def _subscribe(self) -> None:
        try:
            async with aclosing(self.event_plane.subscribe(self.card.events_url)) as updates:
                async for payload in updates:
                    try:
                        update = msgspec.msgpack.decode(payload, type=WorkerUpdate)
                    except msgspec.DecodeError as exc:
                        log.warning("bad update from %s: %s", self.card.worker_id, exc)
                        continue
                    self._events.extend(update.kv_events)
                    self._load = update.load
        except EventPlaneError as exc:
            log.error("no events from %s: %s", self.card.worker_id, exc)
