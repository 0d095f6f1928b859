"""The event plane's backends, zmq (no server) and nats (a real nats-server): messages arrive
in order once a subscriber is connected, and NATS traffic resumes after a server restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from armature.runtime.events import EventPlane, EventPlaneError, NatsEventPlane, ZmqEventPlane
from servers import Nats


async def connected(plane: EventPlane, publisher_url: str, publish) -> AsyncIterator[bytes]:  # type: ignore[no-untyped-def]
    """Subscribe and wait out the subscription's start (pub/sub drops what comes before)."""
    sub = plane.subscribe(publisher_url)
    first = asyncio.ensure_future(anext(sub))
    while not first.done():
        await publish(b"hello")
        await asyncio.sleep(0.02)
    assert first.result() == b"hello"
    return sub


async def test_messages_arrive_in_order(plane: EventPlane) -> None:
    pub = await plane.publisher("worker-1")
    sub = await connected(plane, pub.url, pub.publish)
    for i in range(200):
        await pub.publish(f"m{i}".encode())
    got = []
    while len(got) < 200:
        item = await asyncio.wait_for(anext(sub), 5)
        if item != b"hello":
            got.append(item)
    assert got == [f"m{i}".encode() for i in range(200)]
    await sub.aclose()  # type: ignore[attr-defined]
    await pub.close()


async def test_urls_of_the_other_backend_are_refused(plane: EventPlane) -> None:
    url = "nats:x" if isinstance(plane, ZmqEventPlane) else "tcp://127.0.0.1:1"
    with pytest.raises(EventPlaneError, match="not a"):
        await anext(plane.subscribe(url))


async def test_nats_traffic_resumes_after_a_server_restart(nats_server: Nats) -> None:
    plane = NatsEventPlane(nats_server.url)
    await plane.connect()
    pub = await plane.publisher("worker-2")
    sub = await connected(plane, pub.url, pub.publish)
    nats_server.restart()  # same port; the client reconnects and re-subscribes
    seen: list[bytes] = []

    async def wait_for_after() -> None:
        while (item := await anext(sub)) != b"after":
            seen.append(item)

    waiting = asyncio.ensure_future(wait_for_after())
    for _ in range(200):
        if waiting.done():
            break
        await pub.publish(b"after")
        await asyncio.sleep(0.05)
    assert waiting.done(), "no message arrived after the restart"
    assert set(seen) <= {b"hello"}
    await sub.aclose()  # type: ignore[attr-defined]
    await plane.close()
