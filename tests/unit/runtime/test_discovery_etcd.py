"""EtcdDiscovery against a real etcd server: the discovery contract, lease expiry without
the owner, and watches and registrations that survive an etcd restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from armature.runtime.discovery import WatchEvent
from armature.runtime.discovery_etcd import EtcdDiscovery, EtcdError
from servers import Etcd


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
    started = time.monotonic()
    assert await next_event(watch) == WatchEvent("delete", "t2/k")
    assert time.monotonic() - started < 1 + 2.5  # TTL plus etcd's expiry granularity
    await watch.aclose()  # type: ignore[attr-defined]


async def test_watch_and_registration_survive_an_etcd_restart(
    etcd: Etcd, discovery: EtcdDiscovery
) -> None:
    reg = await discovery.register("t3/k", b"v", ttl_s=2)
    watch = discovery.watch("t3/")
    assert await next_event(watch) == WatchEvent("put", "t3/k", b"v")
    etcd.stop()
    with pytest.raises(EtcdError):
        await discovery.list("t3/")
    etcd.start()  # same data dir: the key and its lease come back
    other = await discovery.register("t3/new", b"n", ttl_s=2)
    assert await next_event(watch) == WatchEvent("put", "t3/new", b"n")
    await asyncio.sleep(3)  # beyond the TTL: the keepalive kept or re-made the registration
    assert await discovery.list("t3/") == {"t3/k": b"v", "t3/new": b"n"}
    await reg.close()
    await other.close()
    await watch.aclose()  # type: ignore[attr-defined]


async def test_unreachable_etcd_is_a_clear_error(tmp_path: Path) -> None:
    d = EtcdDiscovery(["http://127.0.0.1:9"], request_timeout_s=1)
    with pytest.raises(EtcdError, match="no etcd endpoint answered"):
        await d.register("k", b"v", ttl_s=1)
    await d.close()
