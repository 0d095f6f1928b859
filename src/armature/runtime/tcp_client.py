"""The request plane's TCP client: streams multiplexed over pooled connections.

`stream(host, port, endpoint, payload)` opens a stream on one of up to `connections_per_peer`
connections to that peer (the least busy, opened lazily) and yields response payloads. It
grants the server `window` items of credit and tops it up as items are consumed, so a slow
consumer holds back its own stream and no other. Closing the iterator early sends Cancel.
A lost connection fails every stream on it with `PeerUnavailableError`, as does a server's
refusal (Refused: the plane's secret), logged as an error with its reason; a Fail frame raises
`RemoteError` with the server's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable

from armature.protocols.framing import take_bodies
from armature.runtime.frames import (
    MAX_FRAME_BYTES,
    Cancel,
    Credit,
    Data,
    End,
    Fail,
    Frame,
    FrameError,
    Hello,
    Open,
    Refused,
    decode_frame,
    encode_frame,
)
from armature.runtime.keepalive import set_keepalive
from armature.runtime.request_plane import (
    PeerUnavailableError,
    RemoteError,
    payloads,
    take_waiting,
)

__all__ = ["RequestPlaneClient", "parse_tcp_url"]

log = logging.getLogger(__name__)

READ_BYTES = 1 << 18  # the most one read of a connection takes


def parse_tcp_url(url: str) -> tuple[str, int]:
    """tcp://host:port -> (host, port); ValueError otherwise."""
    if not url.startswith("tcp://"):
        raise ValueError(f"not a tcp url: {url!r}")
    host, sep, port = url.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a tcp url: {url!r}")
    return host.strip("[]"), int(port)


class _RefusedError(Exception):
    """The server sent Refused: the connection ends unserved, for this reason."""


class _Connection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_closed: Callable[[_Connection], None],
    ):
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.queues: dict[int, asyncio.Queue[object]] = {}
        self.closed = False
        self.close_reason = "connection closed"  # what a send on it raises once closed
        self._on_closed = on_closed
        self.reader_task = asyncio.get_running_loop().create_task(self._read_forever())

    async def _read_forever(self) -> None:
        """Route every frame as it arrives: each read takes all that has come (a worker's
        step sends a frame per stream) and routes its whole frames at once."""
        reason = "connection closed by the peer"
        buffer = bytearray()
        try:
            while data := await self.reader.read(READ_BYTES):
                buffer += data
                while bodies := take_bodies(buffer, MAX_FRAME_BYTES):
                    for body in bodies:
                        self._route(decode_frame(body))
            if buffer:
                raise FrameError("truncated frame")
        except _RefusedError as exc:
            reason = f"the server refused this client: {exc}"
            log.error("request plane client: %s %s", self.peer, reason)
        except (FrameError, ConnectionError, OSError) as exc:
            reason = f"connection lost: {exc}"
            log.warning("request plane client: %s", reason)
        finally:
            self.closed, self.close_reason = True, reason
            for queue in self.queues.values():
                queue.put_nowait(PeerUnavailableError(reason))
            self.writer.close()
            self._on_closed(self)

    def _route(self, frame: Frame) -> None:
        if isinstance(frame, Data | End | Fail):
            queue = self.queues.get(frame.stream_id)
            if queue is not None:  # a cancelled stream's late frames are dropped
                queue.put_nowait(frame)
        elif isinstance(frame, Refused):
            raise _RefusedError(frame.reason)
        else:
            raise FrameError(f"unexpected {type(frame).__name__} frame from a server")

    async def send(self, frame: Frame) -> None:
        if self.closed or self.writer.is_closing():
            raise PeerUnavailableError(self.close_reason)
        try:
            self.writer.write(encode_frame(frame))
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            # RuntimeError: uvloop's answer to a write on a transport it already closed
            self.closed = True
            raise PeerUnavailableError(f"send failed: {exc}") from None

    async def close(self) -> None:
        self.reader_task.cancel()
        await asyncio.gather(self.reader_task, return_exceptions=True)
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class RequestPlaneClient:
    def __init__(
        self,
        connections_per_peer: int = 2,
        window: int = 32,
        connect_timeout_s: float = 5.0,
        secret: str | None = None,
    ):
        self.secret = secret or None  # sent first on every connection
        if connections_per_peer <= 0 or window <= 0:
            raise ValueError("connections_per_peer and window must be > 0")
        self.connections_per_peer = connections_per_peer
        self.window = window
        self.connect_timeout_s = connect_timeout_s
        self._pools: dict[tuple[str, int], list[_Connection]] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._lock_users: dict[tuple[str, int], int] = {}  # callers holding or awaiting it
        self._ids = itertools.count(1)

    async def _connection(self, host: str, port: int) -> _Connection:
        key = (host, port)
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._lock_users[key] = self._lock_users.get(key, 0) + 1
        try:
            async with lock:
                return await self._pick_or_connect(key)
        finally:
            self._lock_users[key] -= 1
            if not self._lock_users[key]:
                del self._lock_users[key]
                if key not in self._pools:  # nothing pooled: the address is forgotten
                    del self._locks[key]

    async def _pick_or_connect(self, key: tuple[str, int]) -> _Connection:
        """Under the address's lock: the least busy open connection, or a new one."""
        host, port = key
        pool = [c for c in self._pools.get(key, []) if not c.closed]
        idle = [c for c in pool if not c.queues]
        if idle or len(pool) >= self.connections_per_peer:
            return idle[0] if idle else min(pool, key=lambda c: len(c.queues))
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise PeerUnavailableError(f"cannot connect to {host}:{port}: {exc}") from None
        set_keepalive(writer.get_extra_info("socket"))  # a dead worker host is let go
        conn = _Connection(reader, writer, functools.partial(self._forget, key))
        # as the pool is now (a connection may have closed, and left it, meanwhile)
        self._pools[key] = [*self._pools.get(key, []), conn]
        if self.secret is not None:
            await conn.send(Hello(self.secret))
        return conn

    def _forget(self, key: tuple[str, int], conn: _Connection) -> None:
        """A closed connection leaves its pool, and an address with none left is dropped
        (workers come and go at new addresses: their entries were kept for good); its lock
        goes with it unless a caller holds or awaits it (that caller drops it)."""
        pool = self._pools.get(key)
        if pool is not None and conn in pool:
            pool.remove(conn)
        if not self._pools.get(key):
            self._pools.pop(key, None)
            if key not in self._lock_users:
                self._locks.pop(key, None)

    def stream(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        """Stream `endpoint` at `url` (tcp://host:port)."""
        return payloads(self.stream_batches(url, endpoint, payload))

    async def stream_batches(
        self, url: str, endpoint: str, payload: bytes
    ) -> AsyncIterator[list[bytes]]:
        """Stream `endpoint` at `url` (tcp://host:port), every payload waiting at once."""
        host, port = parse_tcp_url(url)
        conn = await self._connection(host, port)
        sid = next(self._ids)
        queue: asyncio.Queue[object] = asyncio.Queue()
        conn.queues[sid] = queue
        finished = False
        try:
            await conn.send(Open(sid, endpoint, payload, self.window))
            consumed = 0
            held: object = None  # taken from the queue behind a batch; handled next
            while True:
                item, held = (await queue.get() if held is None else held), None
                if isinstance(item, Data):
                    batch, held = take_waiting(queue, item)
                    yield batch
                    consumed += len(batch)
                    if consumed >= self.window // 2:
                        await conn.send(Credit(sid, consumed))
                        consumed = 0
                elif isinstance(item, End):
                    finished = True
                    return
                elif isinstance(item, Fail):
                    finished = True
                    raise RemoteError(item.code, item.message)
                elif isinstance(item, PeerUnavailableError):
                    finished = True
                    raise item
        finally:
            conn.queues.pop(sid, None)
            if not finished and not conn.closed:
                with contextlib.suppress(PeerUnavailableError):
                    await conn.send(Cancel(sid))

    async def close(self) -> None:
        conns = [c for pool in self._pools.values() for c in pool]
        self._pools.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
