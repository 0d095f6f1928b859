"""This frontend as one replica among the frontends of its namespace: it tells the others the
in-flight load it adds to each worker, and counts theirs in its own routing cost.

    discovery:   registers a FrontendCard (its event-plane url, and the url where it alone
                 serves HTTP); watches the others' cards
    event plane: publishes ReplicaLoad snapshots of its own load (on change, at most every
                 share_load_interval_s; at least every heartbeat_s); subscribes to each
                 peer's, into PeerLoads (router/shared_load.py, the pure core)
    router:      set_peer_loads(totals) whenever they change; its load_changed event says
                 when to publish

A peer's load goes when its card leaves discovery, or when it has not been heard from for
three of its heartbeats (killed outright: its lease may outlive it). A replica that joins has
every peer's state with their next snapshot: at once when they see it (each publishes when it
first hears from a new peer), within a heartbeat at worst.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from contextlib import aclosing
from typing import Protocol

import msgspec
from prometheus_client import CollectorRegistry, Gauge

from armature.config import ReplicaConfig
from armature.engines.api import wait_for_event
from armature.errors import ArmatureError, ConfigError
from armature.protocols.replica import (
    FrontendCard,
    ReplicaLoad,
    frontend_key,
    frontend_prefix,
    replica_name,
)
from armature.router.load import WorkerLoad
from armature.router.shared_load import PeerLoads, get_shares
from armature.runtime.discovery import Discovery, Registration
from armature.runtime.events import EventPlane, EventPlaneError, Publisher

__all__ = ["LoadSharing", "SharedRouter"]

log = logging.getLogger(__name__)

_MISSED_HEARTBEATS = 3  # a peer not heard from for this many of its heartbeats has expired
REGISTER_RETRY_S = 0.5  # the first wait after discovery refused the card; doubles
REGISTER_RETRY_MAX_S = 30.0


class SharedRouter(Protocol):
    """What load sharing needs of the router (EngineRouter, DisaggRouter)."""

    load_changed: asyncio.Event

    def get_own_loads(self) -> dict[str, WorkerLoad]: ...

    def set_peer_loads(self, peers: Mapping[str, WorkerLoad]) -> None: ...


class LoadSharing:
    def __init__(
        self,
        router: SharedRouter,
        discovery: Discovery,
        event_plane: EventPlane,
        namespace: str,
        config: ReplicaConfig,
        *,
        lease_ttl_s: float,
        registry: CollectorRegistry | None = None,
        replica_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        http_url: str | None = None,
    ):
        """`registry`: where the gauge of peers heard from goes (armature_frontend_peers);
        `http_url`: where this replica alone serves HTTP, for its card."""
        self.router = router
        self.discovery = discovery
        self.event_plane = event_plane
        self.namespace = namespace
        self.config = config
        self.lease_ttl_s = lease_ttl_s
        self.replica_id = secrets.randbits(64) if replica_id is None else replica_id
        self.clock = clock
        self.http_url = http_url
        self.peers = PeerLoads()
        self._subscriptions: dict[int, asyncio.Task[None]] = {}
        self._peer_urls: dict[int, str] = {}  # peers' own addresses, from their cards
        self._heard: set[int] = set()  # peers a snapshot came from
        self._peer_joined = asyncio.Event()
        self._encoder = msgspec.msgpack.Encoder()
        if registry is not None:
            Gauge(
                "armature_frontend_peers",
                "Other frontend replicas of the namespace whose load this one counts",
                registry=registry,
            ).set_function(lambda: len(self._heard))

    @property
    def name(self) -> str:
        return replica_name(self.replica_id)

    def get_peer_urls(self) -> dict[str, str]:
        """The other replicas in discovery that name their own address: name -> its url."""
        return {replica_name(i): url for i, url in self._peer_urls.items()}

    async def run(self) -> None:
        """Share load until cancelled; on the way out leave discovery and unsubscribe."""
        publisher = await self.event_plane.publisher(f"{self.namespace}.{self.name}")
        registered: list[Registration] = []
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._register(publisher.url, registered))
                group.create_task(self._publish_forever(publisher))
                group.create_task(self._follow_peers())
        finally:
            for task in self._subscriptions.values():
                task.cancel()
            await asyncio.gather(*self._subscriptions.values(), return_exceptions=True)
            for registration in registered:
                await registration.close()
            await publisher.close()

    async def _register(self, events_url: str, registered: list[Registration]) -> None:
        """Register this replica's card (into `registered`), retrying with backoff while
        discovery refuses: one transient failure (etcd unreachable for a moment) kept the
        replica's load unseen by the others for good."""
        card = FrontendCard(
            replica_id=self.replica_id,
            namespace=self.namespace,
            events_url=events_url,
            heartbeat_s=self.config.heartbeat_s,
            http_url=self.http_url,
        )
        key = frontend_key(self.namespace, self.replica_id)
        wait_s = REGISTER_RETRY_S
        while True:
            try:
                registration = await self.discovery.register(
                    key, msgspec.msgpack.encode(card), self.lease_ttl_s
                )
            except ConfigError as exc:  # e.g. Kubernetes discovery without this Pod's name
                log.warning("%s: other frontends will not see this one's load: %s", self.name, exc)
                return
            except ArmatureError as exc:  # unreachable: it may answer later
                if wait_s == REGISTER_RETRY_S:  # said once a streak
                    log.warning(
                        "%s: other frontends do not see this one's load (retrying): %s",
                        self.name,
                        exc,
                    )
                await asyncio.sleep(wait_s)
                wait_s = min(REGISTER_RETRY_MAX_S, wait_s * 2)
                continue
            registered.append(registration)
            log.info("%s shares its load on %s", self.name, events_url)
            return

    # ---- own load -> peers -------------------------------------------------------------
    async def _publish_forever(self, publisher: Publisher) -> None:
        """Publish on every change while there are peers (at most every interval), and a
        heartbeat otherwise: a replica alone costs one message a heartbeat, and one that
        appears gets a snapshot at once (`_peer_joined`)."""
        changed = self.router.load_changed
        seq = 0
        failing = False  # the last publish failed (say so once a streak)
        while True:
            news = changed if self._subscriptions else self._peer_joined
            # no news: a heartbeat (not asyncio.wait_for: on 3.11 it can swallow the cancel
            # that stops the sharing, and whoever cancelled it waited forever)
            await wait_for_event(news, self.config.heartbeat_s)
            changed.clear()
            self._peer_joined.clear()
            shares = get_shares(self.router.get_own_loads())
            snapshot = ReplicaLoad(replica_id=self.replica_id, seq=seq, shares=shares)
            seq += 1
            try:
                await publisher.publish(self._encoder.encode(snapshot))
            except Exception as exc:  # a snapshot is best effort: the next one may go
                if not failing:
                    log.warning("%s: its load snapshots do not go out: %s", self.name, exc)
                failing = True
            else:
                failing = False
            self._expire()
            await asyncio.sleep(self.config.share_load_interval_s)  # changes meanwhile: one

    def _expire(self) -> None:
        expired = self.peers.expire(self.clock())
        if expired:
            self.router.set_peer_loads(self.peers.get_totals())
            for replica_id in expired:
                name = replica_name(replica_id)
                log.warning("%s: no load report for too long; its load expires", name)

    # ---- peers -> routing --------------------------------------------------------------
    async def _follow_peers(self) -> None:
        """Follow the other replicas' cards until cancelled; if discovery refuses (etcd
        permissions that cover only the workers' keys), say so once and count no peers."""
        try:
            await self._watch_peers()
        except ArmatureError as exc:
            log.error(
                "%s cannot see the other frontends, their load is not counted: %s", self.name, exc
            )

    async def _watch_peers(self) -> None:
        ids_by_key: dict[str, int] = {}
        async for event in self.discovery.watch(frontend_prefix(self.namespace)):
            if event.kind == "delete":
                replica_id = ids_by_key.pop(event.key, None)
                if replica_id is not None:
                    await self._forget(replica_id)
                continue
            try:
                card = msgspec.msgpack.decode(event.value, type=FrontendCard)
            except msgspec.DecodeError as exc:
                log.error("ignoring an unreadable frontend card at %s: %s", event.key, exc)
                continue
            if card.replica_id == self.replica_id or card.replica_id in self._subscriptions:
                continue
            ids_by_key[event.key] = card.replica_id
            if card.http_url is not None:
                self._peer_urls[card.replica_id] = card.http_url
            ttl_s = _MISSED_HEARTBEATS * card.heartbeat_s
            self.peers.watch(card.replica_id, ttl_s, self.clock())
            task = asyncio.get_running_loop().create_task(self._subscribe(card))
            self._subscriptions[card.replica_id] = task
            self._peer_joined.set()
            log.info("frontend %s joined (%s)", replica_name(card.replica_id), card.events_url)

    async def _forget(self, replica_id: int) -> None:
        self._peer_urls.pop(replica_id, None)
        task = self._subscriptions.pop(replica_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._heard.discard(replica_id)
        self.peers.remove(replica_id)
        self.router.set_peer_loads(self.peers.get_totals())
        log.info("frontend %s left", replica_name(replica_id))

    async def _subscribe(self, card: FrontendCard) -> None:
        decoder = msgspec.msgpack.Decoder(ReplicaLoad)
        try:
            async with aclosing(self.event_plane.subscribe(card.events_url)) as snapshots:
                async for payload in snapshots:
                    try:
                        snapshot = decoder.decode(payload)
                    except msgspec.DecodeError as exc:
                        name = replica_name(card.replica_id)
                        log.warning("bad load report from %s: %s", name, exc)
                        continue
                    if snapshot.replica_id != card.replica_id:
                        continue  # not the replica this url belongs to
                    self._take(snapshot)
        except EventPlaneError as exc:
            log.error("no load reports from %s: %s", replica_name(card.replica_id), exc)

    def _take(self, snapshot: ReplicaLoad) -> None:
        if not self.peers.apply(snapshot, self.clock()):
            return
        self.router.set_peer_loads(self.peers.get_totals())
        if snapshot.replica_id not in self._heard:
            self._heard.add(snapshot.replica_id)
            self.router.load_changed.set()  # it has just subscribed: tell it our state now
