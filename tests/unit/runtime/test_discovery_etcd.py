"""EtcdDiscovery against a real etcd server: the discovery contract, lease expiry without
the owner, and watches and registrations that survive an etcd restart. Lease tests wait for
events (the delete, counted keepalives), never for a multiple of the lease."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from armature.runtime.discovery import WatchEvent
from armature.runtime.discovery_etcd import EtcdDiscovery, EtcdError, _EtcdRegistration
from freezing_proxy import FreezingProxy
from servers import Etcd

DEADLINE_S = 60.0  # a bound for waits on events, far beyond their time on an idle machine


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    server = Etcd(tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def discovery(etcd: Etcd) -> AsyncIterator[EtcdDiscovery]:
    d = EtcdDiscovery([etcd.url])
    yield d
    await d.close()


async def next_event(watch: AsyncIterator[WatchEvent], timeout_s: float = 10.0) -> WatchEvent:
    return await asyncio.wait_for(anext(watch), timeout_s)


async def test_register_list_watch_deregister(discovery: EtcdDiscovery) -> None:
    a = await discovery.register("t1/ns/w/1", b"card-a", ttl_s=5)
    watch = discovery.watch("t1/ns/")
    assert await next_event(watch) == WatchEvent("put", "t1/ns/w/1", b"card-a")
    b = await discovery.register("t1/ns/w/2", b"card-b", ttl_s=5)
    await discovery.register("t1/other", b"x", ttl_s=5)
    assert await next_event(watch) == WatchEvent("put", "t1/ns/w/2", b"card-b")
    assert await discovery.list("t1/ns/") == {"t1/ns/w/1": b"card-a", "t1/ns/w/2": b"card-b"}
    await a.close()
    assert await next_event(watch) == WatchEvent("delete", "t1/ns/w/1")
    await b.close()
    assert await next_event(watch) == WatchEvent("delete", "t1/ns/w/2")
    await watch.aclose()  # type: ignore[attr-defined]


async def test_a_lease_that_stops_renewing_expires(discovery: EtcdDiscovery) -> None:
    reg = await discovery.register("t2/k", b"v", ttl_s=1)
    watch = discovery.watch("t2/")
    assert (await next_event(watch)).kind == "put"
    reg._task.cancel()  # type: ignore[attr-defined]  # the owner froze or died
    assert await next_event(watch, DEADLINE_S) == WatchEvent("delete", "t2/k")  # etcd expired it
    await watch.aclose()  # type: ignore[attr-defined]


class KeepaliveCountingEtcd(EtcdDiscovery):
    """Counts, per lease id, the keepalives etcd answered with the lease still alive."""

    def __init__(self, endpoints: list[str]):
        super().__init__(endpoints)
        self.num_live_keepalives: Counter[int] = Counter()

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await super().call(path, body)
        if path == "/v3/lease/keepalive" and int(answer.get("result", {}).get("TTL", 0)) > 0:
            self.num_live_keepalives[int(body["ID"])] += 1
        return answer


async def test_watch_and_registration_survive_an_etcd_restart(etcd: Etcd) -> None:
    discovery = KeepaliveCountingEtcd([etcd.url])
    reg = await discovery.register("t3/k", b"v", ttl_s=2)
    watch = discovery.watch("t3/")
    assert await next_event(watch) == WatchEvent("put", "t3/k", b"v")
    etcd.stop()
    with pytest.raises(EtcdError):
        await discovery.list("t3/")
    etcd.start()  # same data dir: the key and its lease come back
    discovery.num_live_keepalives.clear()
    other = await discovery.register("t3/new", b"n", ttl_s=2)
    assert await next_event(watch) == WatchEvent("put", "t3/new", b"n")
    # four live keepalives each (every ttl/3) span more than a TTL since the restart: the
    # keepalive kept or re-made both registrations
    leases = [reg.lease_id, other.lease_id]  # type: ignore[attr-defined]
    deadline_s = time.monotonic() + DEADLINE_S
    while min(discovery.num_live_keepalives[lease] for lease in leases) < 4:
        assert time.monotonic() < deadline_s, (leases, discovery.num_live_keepalives)
        await asyncio.sleep(0.05)
        leases = [reg.lease_id, other.lease_id]  # type: ignore[attr-defined]  # re-granted?
    assert await discovery.list("t3/") == {"t3/k": b"v", "t3/new": b"n"}
    await reg.close()
    await other.close()
    await watch.aclose()  # type: ignore[attr-defined]
    await discovery.close()


async def test_unreachable_etcd_is_a_clear_error(tmp_path: Path) -> None:
    d = EtcdDiscovery(["http://127.0.0.1:9"], request_timeout_s=1)
    with pytest.raises(EtcdError, match="no etcd endpoint answered"):
        await d.register("k", b"v", ttl_s=1)
    await d.close()


class ScriptedEtcd:
    """The registration's seam to etcd (`call`): answers by path, a put failing while
    `puts_failing`; records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.puts_failing = 0
        self.next_lease = 100
        self.live: set[int] = set()

    async def call(self, path: str, body: Any) -> Any:
        self.calls.append((path, body))
        if path == "/v3/lease/grant":
            self.next_lease += 1
            self.live.add(self.next_lease)
            return {"ID": str(self.next_lease)}
        if path == "/v3/kv/put":
            if self.puts_failing:
                self.puts_failing -= 1
                raise EtcdError("etcdserver: leader changed")
            return {}
        if path == "/v3/lease/revoke":
            self.live.discard(int(body["ID"]))
            return {}
        if path == "/v3/lease/keepalive":
            return {"result": {"TTL": 9 if body["ID"] in self.live else 0}}
        raise AssertionError(path)


async def test_a_lease_lost_is_put_again_until_a_put_succeeds() -> None:
    """After a lapse the new lease was kept even when its put failed: renewed forever with
    no key on it, the worker never routed to again. A lease is kept only once its put
    succeeded; a failed one is revoked and the next round tries again."""
    etcd = ScriptedEtcd()
    registration = _EtcdRegistration(etcd, "k", b"v", 0.03)  # type: ignore[arg-type]
    await registration.start()
    first = registration.lease_id
    etcd.live.clear()  # the lease lapsed (a partition longer than its TTL)
    etcd.puts_failing = 2
    deadline_s = time.monotonic() + 10
    while registration.lease_id == first:
        assert time.monotonic() < deadline_s, "registered again"
        await asyncio.sleep(0.01)
    await registration.close()
    puts = [body["lease"] for path, body in etcd.calls if path == "/v3/kv/put"]
    revoked = [int(body["ID"]) for path, body in etcd.calls if path == "/v3/lease/revoke"]
    assert len(puts) == 4 and puts[-1] == registration.lease_id  # two failed, then one held
    assert revoked[:2] == puts[1:3]  # the leases whose put failed went back at once


async def test_a_watch_that_keeps_breaking_backs_off() -> None:
    """The range works and the watch breaks at once, again and again: it was tried ten
    times a second (a log line each) for as long as it lasted; it backs off as a failing
    range does."""
    discovery = EtcdDiscovery(["http://127.0.0.1:9"], retry_max_s=2.0)
    follows = 0

    async def fake_range(prefix: str) -> tuple[dict[str, bytes], int]:
        return {}, 1

    async def fake_follow(prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        nonlocal follows
        follows += 1
        raise EtcdError("watch refused")
        yield  # an async generator, as the real one

    discovery._range = fake_range  # type: ignore[method-assign]
    discovery._follow = fake_follow  # type: ignore[method-assign]
    watch = discovery.watch("k")
    pending = asyncio.ensure_future(anext(watch))
    await asyncio.sleep(1.5)
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    await discovery.close()
    assert 1 <= follows <= 6  # 0.1-0.2, 0.2-0.4, 0.4-0.8 s waits: ~4 tries (were ~15)


async def test_a_watch_whose_connection_dies_silently_resumes(etcd: Etcd) -> None:
    """The watch's connection stops carrying bytes without closing (a peer powered off): the
    watch waited for good and missed every later worker; it lists again once silent for
    watch_idle_s, on a new connection."""
    host, port = etcd.url.removeprefix("http://").split(":")
    proxy = FreezingProxy(host, int(port))
    await proxy.start()
    watcher = EtcdDiscovery([f"http://127.0.0.1:{proxy.port}"], watch_idle_s=1.0)
    writer = EtcdDiscovery([etcd.url])
    first = await writer.register("t9/w/1", b"a", ttl_s=30)
    watch = watcher.watch("t9/")
    try:
        assert await next_event(watch) == WatchEvent("put", "t9/w/1", b"a")
        pending = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.2)  # the watch request is on its way (it may still be pending)
        proxy.freeze()
        connections_at_freeze = proxy.connections
        second = await writer.register("t9/w/2", b"b", ttl_s=30)
        event = await asyncio.wait_for(pending, DEADLINE_S)
        assert event == WatchEvent("put", "t9/w/2", b"b")
        assert proxy.connections > connections_at_freeze  # found on a new connection
        await second.close()
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
        await first.close()
        await watcher.close()
        await writer.close()
        await proxy.close()


def test_watch_idle_must_be_positive() -> None:
    with pytest.raises(ValueError, match="watch_idle_s"):
        EtcdDiscovery(["http://127.0.0.1:9"], watch_idle_s=0)
