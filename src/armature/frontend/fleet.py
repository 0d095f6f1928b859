"""The frontend's view of its workers: discovery puts and deletes become routers' workers.

Each worker card under the namespace's prefix becomes a RemoteEngine in the router (a card of
task embed: in the embedding router, whose vectors it must match); a deleted
card (clean exit, or a lease that expired after a crash) removes it. A card that conflicts
with the model this frontend serves (same name, other tokenizer source or block size) is
refused with a logged error and never receives traffic.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from armature.config import HealthConfig
from armature.errors import ConfigError
from armature.protocols.embedding import WorkerTask
from armature.protocols.worker import WorkerCard, worker_prefix
from armature.router.disagg import DisaggRouter
from armature.router.embedding import EmbedRouter
from armature.runtime.discovery import Discovery
from armature.runtime.events import EventPlane
from armature.runtime.remote_engine import RemoteEngine
from armature.runtime.request_plane import RequestClient

__all__ = ["WorkerFleet", "card_conflict", "served_cards"]

log = logging.getLogger(__name__)


def served_cards(cards: Mapping[str, bytes], model_name: str) -> list[WorkerCard]:
    """The readable cards of the model a frontend serves, by key: the model named, or
    (`model_name` empty) the one model they all serve; a ConfigError naming the models where
    they serve several and none is named (a frontend picking one by its key could switch
    models when it restarts)."""
    readable = []
    for _, value in sorted(cards.items()):
        try:
            readable.append(msgspec.msgpack.decode(value, type=WorkerCard))
        except msgspec.DecodeError:
            continue  # the fleet logs it when it follows the workers
    models = sorted({card.model_name for card in readable})
    if not model_name and len(models) > 1:
        raise ConfigError(
            f"the workers serve {len(models)} models ({', '.join(models)}): name the one "
            "this frontend serves with --served-model-name"
        )
    return [card for card in readable if not model_name or card.model_name == model_name]


def card_conflict(served: WorkerCard, card: WorkerCard) -> str | None:
    """Why `card` cannot serve next to `served` (None when it can)."""
    if card.model_name != served.model_name:
        return f"serves model {card.model_name!r}, this frontend serves {served.model_name!r}"
    if card.block_size != served.block_size:
        return f"block size {card.block_size} differs from the running {served.block_size}"
    if card.max_model_len != served.max_model_len:  # requests are checked against one
        return (
            f"context length {card.max_model_len} differs from the running {served.max_model_len}"
        )
    if card.model_path != served.model_path:
        return f"tokenizer source {card.model_path} differs from the running {served.model_path}"
    for plane, url, running in (
        ("request", card.request_url, served.request_url),
        ("event", card.events_url, served.events_url),
    ):
        theirs, ours = _plane(plane, url), _plane(plane, running)
        if theirs != ours:  # this frontend's client cannot reach it
            return f"its {plane} plane is {theirs}, this frontend's {ours}"
    return None


def _plane(kind: str, url: str) -> str:
    """The plane a card's url is on: tcp://host:port is tcp (requests) or zmq (events),
    nats:subject nats."""
    scheme = url.split(":", 1)[0]
    return "zmq" if kind == "event" and scheme == "tcp" else scheme


class WorkerFleet:
    def __init__(
        self,
        router: DisaggRouter,
        discovery: Discovery,
        namespace: str,
        served: WorkerCard,
        client: RequestClient,
        event_plane: EventPlane,
        *,
        health: HealthConfig = HealthConfig(),
        embedder: EmbedRouter | None = None,
    ):
        """`embedder`: where workers of task embed go (None: they are refused)."""
        self.health = health
        self.embedder = embedder
        self.router = router
        self.discovery = discovery
        self.namespace = namespace
        self.served = served
        self.client = client
        self.event_plane = event_plane
        self._workers_by_key: dict[str, str] = {}

    async def run(self) -> None:
        """Follow discovery until cancelled."""
        try:
            async for event in self.discovery.watch(worker_prefix(self.namespace)):
                if event.kind == "put":
                    await self._joined(event.key, event.value)
                else:
                    await self._left(event.key)
        finally:
            await self.client.close()

    async def _joined(self, key: str, value: bytes) -> None:
        try:
            card = msgspec.msgpack.decode(value, type=WorkerCard)
        except msgspec.DecodeError as exc:
            log.error("ignoring an unreadable worker card at %s: %s", key, exc)
            return
        conflict = card_conflict(self.served, card)
        if conflict is not None:
            log.error("refusing worker %s: it %s", card.worker_id, conflict)
            return
        previous = self._workers_by_key.get(key)
        if previous is not None:
            engine = self.router.get_engine(previous)
            if engine is None and self.embedder is not None:
                engine = self.embedder.engines.get(previous)
            same_card = isinstance(engine, RemoteEngine) and engine.card == card
            if engine is not None and engine.is_alive and same_card:
                return  # a renewal or re-registration of a worker we already route to
            # gone, or another card under its key: a worker restarted with the same id (its
            # events are on another port) is followed anew
            await self._remove(previous)
        remote = RemoteEngine(
            card,
            self.client,
            self.event_plane,
            health=self.health,
        )
        if card.task is WorkerTask.EMBED:
            if self.embedder is None or card.embedding is None:
                log.error("refusing worker %s: this frontend routes no embeddings", card.worker_id)
                return
            try:
                self.embedder.add_engine(card.worker_id, remote)
            except ValueError as exc:
                log.error("refusing embedding worker %s: %s", card.worker_id, exc)
                return
        else:
            try:
                self.router.add_engine(card.worker_id, remote, role=card.role)
            except ValueError as exc:  # the router is full
                log.error("refusing worker %s: %s", card.worker_id, exc)
                return
        self._workers_by_key[key] = card.worker_id
        log.info("worker %s joined (%s, task %s)", card.worker_id, card.request_url, card.task)

    async def _left(self, key: str) -> None:
        worker = self._workers_by_key.pop(key, None)
        if worker is not None:
            await self._remove(worker)
            log.info("worker %s left", worker)

    async def _remove(self, worker: str) -> None:
        await self.router.remove_engine(worker)
        if self.embedder is not None:
            await self.embedder.remove_engine(worker)
