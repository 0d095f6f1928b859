"""The frontend's WorkerFleet: discovery puts and deletes become router workers; conflicting
or unreadable cards are refused."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import msgspec
import pytest

from armature.config import RouterConfig
from armature.frontend.fleet import WorkerFleet, card_conflict
from armature.protocols.worker import WorkerCard, worker_key
from armature.router.disagg import DisaggRouter
from armature.router.prefix_index import MAX_WORKERS
from armature.runtime.discovery import MemDiscovery, MemStore
from armature.runtime.events import ZmqEventPlane
from armature.runtime.tcp_client import RequestPlaneClient
from idle_engine import IdleEngine


def card(instance: int, **changes: object) -> WorkerCard:
    base = WorkerCard(
        instance_id=instance,
        namespace="ns",
        model_name="m",
        model_path="/models/m",
        block_size=16,
        num_kv_blocks=100,
        max_model_len=512,
        vocab_size=1000,
        request_url="tcp://127.0.0.1:1",
        events_url="tcp://127.0.0.1:2",
    )
    return msgspec.structs.replace(base, **changes)


def test_card_conflicts_name_the_difference() -> None:
    served = card(1)
    assert card_conflict(served, card(2)) is None
    assert "block size 32" in (card_conflict(served, card(2, block_size=32)) or "")
    assert "tokenizer source /other" in (card_conflict(served, card(2, model_path="/other")) or "")
    assert "serves model 'x'" in (card_conflict(served, card(2, model_name="x")) or "")
    # requests are checked against one context length (a shorter one refused them)
    assert "context length 100 differs from the running 512" in (
        card_conflict(served, card(2, max_model_len=100)) or ""
    )
    # another plane: this frontend's client cannot reach it (500s and cut streams before)
    nats_requests = card(2, request_url="nats:armature.rp.mx.2")
    assert card_conflict(served, nats_requests) == "its request plane is nats, this frontend's tcp"
    nats_events = card(2, events_url="nats:armature.ev.2")
    assert card_conflict(served, nats_events) == "its event plane is nats, this frontend's zmq"


async def wait_for(condition, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met")


@contextlib.asynccontextmanager
async def following(router: DisaggRouter) -> AsyncIterator[MemDiscovery]:
    """A fleet of `router` following the discovery it yields; all stopped after."""
    discovery = MemDiscovery(MemStore(), expire_interval_s=0.02)
    plane = ZmqEventPlane()
    fleet = WorkerFleet(router, discovery, "ns", card(1), RequestPlaneClient(), plane)
    task = asyncio.ensure_future(fleet.run())
    try:
        yield discovery
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await router.stop()
        await discovery.close()
        await plane.close()


async def test_fleet_follows_discovery_and_refuses_conflicts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = DisaggRouter({}, RouterConfig(policy="round-robin", block_size_tokens=16))
    async with following(router) as discovery:
        a = await discovery.register(worker_key("ns", 1), msgspec.msgpack.encode(card(1)), 5)
        await wait_for(lambda: list(router.engines) == ["worker-1"])
        with caplog.at_level(logging.ERROR):
            bad = card(2, block_size=32)
            await discovery.register(worker_key("ns", 2), msgspec.msgpack.encode(bad), 5)
            await discovery.register(worker_key("ns", 3), b"\x00garbage", 5)
            await wait_for(lambda: "refusing worker worker-2" in caplog.text)
            await wait_for(lambda: "unreadable worker card" in caplog.text)
        assert list(router.engines) == ["worker-1"]
        # a prefill worker joins the prefill pool, not the decode pool
        p = await discovery.register(
            worker_key("ns", 4), msgspec.msgpack.encode(card(4, role="prefill")), 5
        )
        await wait_for(lambda: list(router.prefill.engines) == ["worker-4"])
        assert list(router.engines) == ["worker-1"]
        assert router.get_engine("worker-4") is router.prefill.engines["worker-4"]
        await a.close()
        await p.close()
        await wait_for(lambda: not router.engines and not router.prefill.engines)


async def test_fleet_refuses_a_worker_the_full_router_cannot_index(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the router's prefix index one short of full, the first worker to join is routed
    to and the next is refused with the reason, the fleet still following discovery."""
    router = DisaggRouter({}, RouterConfig(policy="round-robin", block_size_tokens=16))
    for i in range(MAX_WORKERS - 1):
        router.add_engine(f"idle-{i}", IdleEngine())  # type: ignore[arg-type]
    async with following(router) as discovery:
        a = await discovery.register(worker_key("ns", 1), msgspec.msgpack.encode(card(1)), 5)
        await wait_for(lambda: "worker-1" in router.engines)
        with caplog.at_level(logging.ERROR):
            b = await discovery.register(worker_key("ns", 2), msgspec.msgpack.encode(card(2)), 5)
            await wait_for(lambda: "refusing worker worker-2" in caplog.text)
        assert "holds at most 4,096 workers" in caplog.text
        assert "worker-2" not in router.engines and len(router.engines) == MAX_WORKERS
        await a.close()  # worker-1 leaves: the fleet goes on following discovery
        await wait_for(lambda: "worker-1" not in router.engines)
        await b.close()


async def test_a_worker_restarted_under_its_key_is_followed_anew() -> None:
    """A worker restarted with the same instance id re-registers another card (its events
    on another port): the frontend kept the old engine while it looked alive, listening to
    the dead address, and never routed to the worker again once that lapsed."""
    router = DisaggRouter({}, RouterConfig(policy="round-robin", block_size_tokens=16))
    async with following(router) as discovery:
        key = worker_key("ns", 1)
        first = await discovery.register(key, msgspec.msgpack.encode(card(1)), 5)
        await wait_for(lambda: list(router.engines) == ["worker-1"])
        old = router.engines["worker-1"]
        again = await discovery.register(key, msgspec.msgpack.encode(card(1)), 5)  # renewal
        await asyncio.sleep(0.1)
        assert router.engines["worker-1"] is old
        restarted = card(1, events_url="tcp://127.0.0.1:3")
        third = await discovery.register(key, msgspec.msgpack.encode(restarted), 5)
        await wait_for(lambda: router.engines.get("worker-1") not in (None, old))
        assert router.engines["worker-1"].card.events_url == "tcp://127.0.0.1:3"  # type: ignore[attr-defined]
        for registration in (first, again, third):
            await registration.close()
