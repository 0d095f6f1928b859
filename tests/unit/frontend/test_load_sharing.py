"""Frontend replicas sharing their load over a real event plane (zmq; NATS, as across hosts)
and in-process discovery:
a replica that joins gets the others' current load, changes follow, a replica that leaves
takes its load with it, and one that goes silent (killed: its card outlives it) expires."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import msgspec
import pytest

from armature.config import ReplicaConfig
from armature.frontend.replicas import LoadSharing
from armature.protocols.replica import FrontendCard, ReplicaLoad, WorkerShare, frontend_key
from armature.router.load import ActiveLoad, WorkerLoad
from armature.runtime.discovery import MemDiscovery, MemStore, Registration
from armature.runtime.discovery_etcd import EtcdError
from armature.runtime.discovery_kubernetes import KubePodUnknownError
from armature.runtime.events import EventPlane
from polling import wait_until

NAMESPACE = "replicas-test"
CONFIG = ReplicaConfig(share_load_interval_s=0.005, share_load_ttl_s=0.6)


class Router:
    """The router's side of load sharing, over a real ActiveLoad."""

    def __init__(self) -> None:
        self.load = ActiveLoad()
        self.load_changed = asyncio.Event()

    def get_own_loads(self) -> dict[str, WorkerLoad]:
        return dict(self.load.get_own_loads())

    def set_peer_loads(self, peers: Mapping[str, WorkerLoad]) -> None:
        self.load.set_peer_loads(peers)

    def start(self, request_id: str, worker: str, tokens: int, blocks: int) -> None:
        self.load.start(request_id, worker, tokens, blocks)
        self.load_changed.set()

    def finish(self, request_id: str) -> None:
        self.load.finish(request_id)
        self.load_changed.set()

    def peers(self) -> dict[str, WorkerLoad]:
        return dict(self.load.get_peer_loads())


def start(router: Router, store: MemStore, plane: EventPlane) -> asyncio.Task[None]:
    sharing = LoadSharing(router, MemDiscovery(store), plane, NAMESPACE, CONFIG, lease_ttl_s=5.0)
    return asyncio.get_running_loop().create_task(sharing.run())


async def test_a_joining_replica_gets_the_current_load_and_follows_it(
    plane: EventPlane,
) -> None:
    store = MemStore()
    a, b = Router(), Router()
    a.start("r1", "w0", 64, 5)
    a.start("r2", "w1", 0, 3)
    task_a = start(a, store, plane)
    await wait_until(lambda: len(store.entries) == 1, "A registered")
    task_b = start(b, store, plane)  # joins while A has two requests in flight
    await wait_until(
        lambda: b.peers() == {"w0": WorkerLoad(64, 5, 1), "w1": WorkerLoad(0, 3, 1)},
        "A's load seen by B",
    )
    b.start("r3", "w0", 16, 1)
    await wait_until(lambda: a.peers() == {"w0": WorkerLoad(16, 1, 1)}, "B's load seen by A")
    assert dict(a.load.get_loads()) == {"w0": WorkerLoad(80, 6, 2), "w1": WorkerLoad(0, 3, 1)}
    a.finish("r1")
    await wait_until(lambda: b.peers() == {"w1": WorkerLoad(0, 3, 1)}, "A's finish seen by B")
    task_a.cancel()  # a clean exit: its card leaves discovery, and its load with it
    await asyncio.gather(task_a, return_exceptions=True)
    await wait_until(lambda: b.peers() == {}, "A's load gone from B")
    assert [k.rsplit("/", 1)[0] for k in store.entries] == [f"instances/{NAMESPACE}/frontend/load"]
    task_b.cancel()
    await asyncio.gather(task_b, return_exceptions=True)
    assert store.entries == {}


async def test_a_silent_replica_expires_and_comes_back(plane: EventPlane) -> None:
    """A replica killed outright publishes no more while its card stays (until its lease
    ends): its load expires after three of its heartbeats."""
    store = MemStore()
    b = Router()
    task_b = start(b, store, plane)
    dead = await plane.publisher("dead")
    card = FrontendCard(replica_id=7, namespace=NAMESPACE, events_url=dead.url, heartbeat_s=0.1)
    registration = await MemDiscovery(store).register(
        frontend_key(NAMESPACE, 7), msgspec.msgpack.encode(card), ttl_s=60.0
    )
    seq = 0

    async def report(*shares: WorkerShare) -> None:
        nonlocal seq
        snapshot = ReplicaLoad(replica_id=7, seq=seq, shares=list(shares))
        seq += 1
        await dead.publish(msgspec.msgpack.encode(snapshot))

    while b.peers() != {"w2": WorkerLoad(0, 9, 3)}:  # until B has subscribed
        await report(WorkerShare("w2", 0, 9, 3))
        await asyncio.sleep(0.02)
    heard_s = time.monotonic()
    await wait_until(lambda: b.peers() == {}, "the silent replica's load expired")
    assert time.monotonic() - heard_s >= 0.3 - 0.05  # three heartbeats of 0.1 s
    assert store.entries  # still registered: expiry, not leaving
    await report(WorkerShare("w2", 0, 2, 1))  # it was only slow
    await wait_until(lambda: b.peers() == {"w2": WorkerLoad(0, 2, 1)}, "its load back")
    await registration.close()
    await wait_until(lambda: b.peers() == {}, "its load gone with its card")
    task_b.cancel()
    await asyncio.gather(task_b, return_exceptions=True)
    await dead.close()


class FlakyPublisher:
    """A publisher whose sends fail while `failing` (a NATS client's buffer full during an
    outage raises, as any plane may)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.failing = True
        self.num_failed = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def publish(self, payload: bytes) -> None:
        if self.failing:
            self.num_failed += 1
            raise RuntimeError("outbound buffer limit exceeded")
        await self.inner.publish(payload)  # type: ignore[attr-defined]


async def test_a_failing_publish_does_not_end_the_sharing(plane: EventPlane) -> None:
    """A publish that raised ended the sharing task, and with it (the frontend stops when a
    background task fails) every replica at once during a NATS outage. It is logged, and the
    snapshots go out again once the plane takes them."""
    store = MemStore()
    a, b = Router(), Router()
    flaky: list[FlakyPublisher] = []

    class FlakyPlane:
        def __getattr__(self, name: str) -> object:
            return getattr(plane, name)

        async def publisher(self, topic: str) -> FlakyPublisher:
            flaky.append(FlakyPublisher(await plane.publisher(topic)))
            return flaky[-1]

    a.start("r1", "w0", 64, 5)
    sharing = LoadSharing(a, MemDiscovery(store), FlakyPlane(), NAMESPACE, CONFIG, lease_ttl_s=5.0)  # type: ignore[arg-type]
    task_a = asyncio.get_running_loop().create_task(sharing.run())
    task_b = start(b, store, plane)
    await wait_until(lambda: bool(flaky) and flaky[0].num_failed >= 3, "A's sends failing")
    assert not task_a.done()
    flaky[0].failing = False
    await wait_until(lambda: b.peers() == {"w0": WorkerLoad(64, 5, 1)}, "A's load seen again")
    for task in (task_a, task_b):
        task.cancel()
    # both end: a cancel that came as a heartbeat's wait ended was swallowed (3.11's
    # asyncio.wait_for), and this waited forever under a loaded machine's timing
    await asyncio.wait_for(asyncio.gather(task_a, task_b, return_exceptions=True), 30)


async def test_a_refused_registration_is_tried_again(
    plane: EventPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """Discovery refused the card once (etcd unreachable for a moment): the replica gave up
    registering for good and no other replica ever counted its load. It tries again until
    the card is in, and says so once."""
    store = MemStore()
    a, b = Router(), Router()
    refusals = 2

    class FlakyDiscovery(MemDiscovery):
        async def register(self, key: str, value: bytes, ttl_s: float) -> Registration:
            nonlocal refusals
            if refusals > 0:
                refusals -= 1
                raise EtcdError("no etcd endpoint answered /v3/lease/grant")
            return await super().register(key, value, ttl_s)

    a.start("r1", "w0", 64, 5)
    sharing = LoadSharing(a, FlakyDiscovery(store), plane, NAMESPACE, CONFIG, lease_ttl_s=5.0)
    task_a = asyncio.get_running_loop().create_task(sharing.run())
    task_b = start(b, store, plane)
    await wait_until(lambda: b.peers() == {"w0": WorkerLoad(64, 5, 1)}, "A's load seen by B")
    assert refusals == 0
    assert len([r for r in caplog.records if "do not see this one's load" in r.message]) == 1
    task_a.cancel()  # its card, registered late, leaves with it
    await asyncio.gather(task_a, return_exceptions=True)
    await wait_until(lambda: b.peers() == {}, "A's load gone from B")
    task_b.cancel()
    await asyncio.gather(task_b, return_exceptions=True)


async def test_a_registration_that_cannot_work_is_said_once_and_not_retried(
    plane: EventPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """Kubernetes discovery with no Pod of its own named: a setting to fix, not a failure to
    retry every 30 s under a warning that hid it."""
    calls = 0

    class NoPod(MemDiscovery):
        async def register(self, key: str, value: bytes, ttl_s: float) -> Registration:
            nonlocal calls
            calls += 1
            raise KubePodUnknownError("registering needs this process's own Pod: set ...")

    sharing = LoadSharing(Router(), NoPod(MemStore()), plane, NAMESPACE, CONFIG, lease_ttl_s=5.0)
    registered: list[Registration] = []
    await asyncio.wait_for(sharing._register("tcp://127.0.0.1:1", registered), 10)
    assert (calls, registered) == (1, [])
    assert "other frontends will not see this one's load" in caplog.text


async def test_the_card_names_the_replicas_own_address(plane: EventPlane) -> None:
    """Replicas that share a port are reached, each alone, at the address their card names
    (the planner reads every replica's /metrics there)."""
    store = MemStore()
    discovery = MemDiscovery(store)
    sharing = LoadSharing(
        Router(),
        discovery,
        plane,
        NAMESPACE,
        CONFIG,
        lease_ttl_s=5.0,
        replica_id=0x2A,
        http_url="http://127.0.0.1:41234",
    )
    task = asyncio.get_running_loop().create_task(sharing.run())
    key = frontend_key(NAMESPACE, 0x2A)

    async def listed() -> dict[str, bytes]:
        return await discovery.list(frontend_key(NAMESPACE, 0x2A))

    found: dict[str, bytes] = {}

    async def registered() -> bool:
        found.update(await listed())
        return key in found

    deadline_s = time.monotonic() + 30
    while not await registered():
        assert time.monotonic() < deadline_s, "the card was not registered"
        await asyncio.sleep(0.01)
    card = msgspec.msgpack.decode(found[key], type=FrontendCard)
    assert (card.replica_id, card.http_url) == (0x2A, "http://127.0.0.1:41234")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
