"""The event plane (DESIGN §2): publish/subscribe for KV events and load reports.

A publisher has a `url` that it puts in its worker card; subscribers open that url.
    zmq   a PUB socket per publisher, bound on the given host (no server): tcp://host:port
    nats  a subject per publisher on a NATS server: nats:<subject>
Delivery is best-effort on both (a subscriber that joins late or falls behind misses
messages); KV events carry consecutive ids, so a consumer detects a gap and asks for a dump.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Protocol

import zmq
import zmq.asyncio
from nats.aio.client import Client
from nats.aio.msg import Msg

from armature.errors import ArmatureError
from armature.runtime.nats_conn import end_quietly

__all__ = ["EventPlane", "EventPlaneError", "NatsEventPlane", "Publisher", "ZmqEventPlane"]


class EventPlaneError(ArmatureError, RuntimeError):
    """The event plane cannot be used (bad url, server unreachable)."""


class Publisher(Protocol):
    url: str

    async def publish(self, payload: bytes) -> None: ...

    async def close(self) -> None: ...


class EventPlane(Protocol):
    async def publisher(self, name: str) -> Publisher: ...

    def subscribe(self, url: str) -> AsyncGenerator[bytes, None]: ...

    async def close(self) -> None: ...


class _ZmqPublisher:
    def __init__(self, socket: zmq.asyncio.Socket, url: str):
        self.socket = socket
        self.url = url

    async def publish(self, payload: bytes) -> None:
        await self.socket.send(payload)

    async def close(self) -> None:
        self.socket.close(linger=0)


class ZmqEventPlane:
    """No server: each publisher binds its own PUB socket on `host`."""

    def __init__(self, host: str = "127.0.0.1", high_water_mark: int = 10_000):
        self.host = host
        self.high_water_mark = high_water_mark
        self._context = zmq.asyncio.Context()

    async def publisher(self, name: str) -> Publisher:
        socket = self._context.socket(zmq.PUB)
        socket.setsockopt(zmq.SNDHWM, self.high_water_mark)
        try:
            port = socket.bind_to_random_port(f"tcp://{self.host}")
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise EventPlaneError(f"cannot bind an event publisher on {self.host}: {exc}") from None
        return _ZmqPublisher(socket, f"tcp://{self.host}:{port}")

    async def subscribe(self, url: str) -> AsyncGenerator[bytes, None]:
        if not url.startswith("tcp://"):
            raise EventPlaneError(f"not a zmq event url: {url!r}")
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.RCVHWM, self.high_water_mark)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(url)
        try:
            while True:
                yield await socket.recv()
        finally:
            socket.close(linger=0)

    async def close(self) -> None:
        self._context.destroy(linger=0)  # closes any socket still open, never blocks


class _NatsPublisher:
    def __init__(self, plane: NatsEventPlane, subject: str):
        self.plane = plane
        self.subject = subject
        self.url = f"nats:{subject}"

    async def publish(self, payload: bytes) -> None:
        await self.plane.client().publish(self.subject, payload)

    async def close(self) -> None:
        return None


class NatsEventPlane:
    """Subjects on a NATS server; `connect` first (it reconnects by itself after)."""

    def __init__(self, nats_url: str, prefix: str = "armature.events"):
        self.nats_url = nats_url
        self.prefix = prefix
        self._nc: Client | None = None

    async def connect(self) -> None:
        from armature.runtime.nats_conn import connect_nats

        self._nc = await connect_nats(self.nats_url)

    def client(self) -> Client:
        if self._nc is None:
            raise EventPlaneError("the NATS event plane is not connected")
        return self._nc

    async def publisher(self, name: str) -> Publisher:
        return _NatsPublisher(self, f"{self.prefix}.{name}")

    async def subscribe(self, url: str) -> AsyncGenerator[bytes, None]:
        if not url.startswith("nats:"):
            raise EventPlaneError(f"not a nats event url: {url!r}")
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10_000)

        async def on_message(msg: Msg) -> None:
            with contextlib.suppress(asyncio.QueueFull):  # best effort, like zmq's HWM
                queue.put_nowait(msg.data)

        subscription = await self.client().subscribe(url.removeprefix("nats:"), cb=on_message)
        try:
            while True:
                yield await queue.get()
        finally:
            await end_quietly("unsubscribe", subscription.unsubscribe())

    async def close(self) -> None:
        if self._nc is not None:
            await end_quietly("drain", self._nc.drain())
            self._nc = None
