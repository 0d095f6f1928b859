"""The TCP request plane against a real server on 127.0.0.1: streaming, multiplexing,
cancellation both ways, back-pressure, and bad peers."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from armature.protocols.failures import FailureCode
from armature.protocols.framing import frame
from armature.runtime.frames import Data, End, FrameError, Open, encode_frame
from armature.runtime.keepalive import KEEPALIVE_IDLE_S, set_keepalive
from armature.runtime.request_plane import HandlerError, PeerUnavailableError, RemoteError
from armature.runtime.tcp_client import RequestPlaneClient, _Connection
from armature.runtime.tcp_server import RequestPlaneServer, read_frame
from polling import wait_until


class Probe:
    """Handlers that record what the server side saw."""

    def __init__(self) -> None:
        self.produced = 0
        self.closed = asyncio.Event()
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    async def count(self, payload: bytes) -> AsyncIterator[bytes]:
        for i in range(int(payload)):
            yield str(i).encode()

    async def endless(self, payload: bytes) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            while True:
                self.produced += 1
                yield b"x"
        finally:
            self.closed.set()

    async def slow_then_close(self, payload: bytes) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            await asyncio.sleep(3600)
            yield b""
        finally:
            self.closed.set()

    async def gated(self, payload: bytes) -> AsyncIterator[bytes]:
        """b"0", then (once `gate` is set) b"1".."3"; then the end, or a typed failure if
        `payload` is b"fail"."""
        yield b"0"
        await self.gate.wait()
        for item in (b"1", b"2", b"3"):
            yield item
        if payload == b"fail":
            raise HandlerError(FailureCode.INVALID_REQUEST, "bad")

    async def times_out(self, payload: bytes) -> AsyncIterator[bytes]:
        raise TimeoutError("the handler's own wait")
        yield b""  # an async generator, as a handler is

    async def fail(self, payload: bytes) -> AsyncIterator[bytes]:
        yield b"one"
        if payload == b"typed":
            raise HandlerError(FailureCode.INVALID_REQUEST, "prompt too long")
        raise RuntimeError("boom")


async def start(probe: Probe, **kwargs: float) -> RequestPlaneServer:
    kwargs.setdefault("frame_timeout_s", 0.5)
    server = RequestPlaneServer(
        {
            "count": probe.count,
            "endless": probe.endless,
            "slow": probe.slow_then_close,
            "fail": probe.fail,
            "gated": probe.gated,
            "times_out": probe.times_out,
        },
        **kwargs,  # type: ignore[arg-type]
    )
    await server.start()
    return server


async def collect(client: RequestPlaneClient, port: int, endpoint: str, body: bytes) -> list[bytes]:
    return [item async for item in client.stream(f"tcp://127.0.0.1:{port}", endpoint, body)]


async def check_a_backlog_comes_as_one_batch(
    batches: AsyncIterator[list[bytes]], probe: Probe, then_fails: bool
) -> None:
    """`batches` streams Probe.gated: what arrived while the consumer was away is taken in
    one step, and an end or failure queued behind it comes after it."""
    assert await anext(batches) == [b"0"]  # the handler waits on its gate: nothing else sent
    probe.gate.set()
    # The stream's queue (a local of the suspended generator) holds 1, 2, 3 and End or Fail.
    queue = batches.ag_frame.f_locals["queue"]  # type: ignore[attr-defined]
    await wait_until(lambda: queue.qsize() == 4, "the rest of the stream queued")
    assert await anext(batches) == [b"1", b"2", b"3"]
    if then_fails:
        with pytest.raises(RemoteError, match="bad"):
            await anext(batches)
    else:
        with pytest.raises(StopAsyncIteration):
            await anext(batches)
    await batches.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("then_fails", [False, True])
async def test_a_backlog_comes_as_one_batch(then_fails: bool) -> None:
    probe = Probe()
    server = await start(probe)
    client = RequestPlaneClient(window=8)
    body = b"fail" if then_fails else b""
    batches = client.stream_batches(f"tcp://127.0.0.1:{server.port}", "gated", body)
    await check_a_backlog_comes_as_one_batch(batches, probe, then_fails)
    await client.close()
    await server.stop()


async def test_streams_arrive_whole_and_in_order_over_few_connections() -> None:
    probe = Probe()
    server = await start(probe)
    client = RequestPlaneClient(connections_per_peer=2, window=4)
    try:
        results = await asyncio.gather(
            *(collect(client, server.port, "count", str(n).encode()) for n in range(30))
        )
        for n, items in enumerate(results):
            assert items == [str(i).encode() for i in range(n)]
        assert len(client._pools[("127.0.0.1", server.port)]) <= 2
    finally:
        await client.close()
        await server.stop()


async def test_closing_the_stream_cancels_the_handler() -> None:
    probe = Probe()
    server = await start(probe)
    client = RequestPlaneClient()
    try:
        stream = client.stream(server.url, "endless", b"")
        assert await anext(stream) == b"x"
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(probe.closed.wait(), 5)
        # the connection stays usable for other streams
        assert await collect(client, server.port, "count", b"3") == [b"0", b"1", b"2"]
    finally:
        await client.close()
        await server.stop()


async def test_a_client_disconnect_cancels_its_handlers() -> None:
    probe = Probe()
    server = await start(probe)
    client = RequestPlaneClient()
    stream = client.stream(server.url, "slow", b"")
    task = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(probe.started.wait(), 5)
    await client.close()
    await asyncio.wait_for(probe.closed.wait(), 5)
    with pytest.raises(PeerUnavailableError):
        await asyncio.wait_for(task, 5)
    await server.stop()


async def test_a_slow_consumer_holds_back_its_producer() -> None:
    probe = Probe()
    server = await start(probe)
    client = RequestPlaneClient(window=8)
    try:
        stream = client.stream(server.url, "endless", b"")
        for _ in range(3):
            await anext(stream)
        await wait_until(lambda: probe.produced >= 8, "the window filled")
        await asyncio.sleep(0.3)  # not a wait for an event: the time it has to overrun, in vain
        assert probe.produced <= 8 + 1  # the window, plus the item the handler is holding
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await client.close()
        await server.stop()


async def test_errors_reach_the_client_with_their_code() -> None:
    probe = Probe()
    server = await start(probe)
    client = RequestPlaneClient()
    try:
        with pytest.raises(RemoteError) as typed:
            await collect(client, server.port, "fail", b"typed")
        assert typed.value.code is FailureCode.INVALID_REQUEST
        assert typed.value.message == "prompt too long"
        with pytest.raises(RemoteError) as internal:
            await collect(client, server.port, "fail", b"")
        assert internal.value.code is FailureCode.INTERNAL and "boom" in internal.value.message
        with pytest.raises(RemoteError) as missing:
            await collect(client, server.port, "nope", b"")
        assert missing.value.code is FailureCode.NOT_FOUND
    finally:
        await client.close()
        await server.stop()


async def test_unreachable_peer() -> None:
    server = await start(Probe())
    port = server.port
    await server.stop()
    client = RequestPlaneClient(connect_timeout_s=2)
    with pytest.raises(PeerUnavailableError, match="cannot connect"):
        await collect(client, port, "count", b"1")
    await client.close()


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    got = await asyncio.wait_for(reader.read(), 5)  # b"" once the server closes
    writer.close()
    return got


@pytest.mark.parametrize(
    "garbage",
    [
        (2**31).to_bytes(4, "big"),  # oversized announced length
        frame(bytes(100))[:9],  # truncated body
        frame(b"\xc1\xc1\xc1"),  # not msgpack
        encode_frame(Open(1, "count", b"1", 4))[:2],  # truncated header
    ],
)
async def test_bad_frames_close_only_that_connection(
    garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start(Probe())
    client = RequestPlaneClient()
    try:
        assert await _raw(server.port, garbage) == b""
        assert await collect(client, server.port, "count", b"2") == [b"0", b"1"]
    finally:
        await client.close()
        await server.stop()


async def test_unknown_frame_types_are_rejected(caplog: pytest.LogCaptureFixture) -> None:
    server = await start(Probe())
    try:
        body = msgspec.msgpack.encode({"type": "launch_missiles", "stream_id": 1})
        assert await _raw(server.port, frame(body)) == b""
        assert "undecodable frame" in caplog.text
    finally:
        await server.stop()


async def test_a_silent_peer_times_out(caplog: pytest.LogCaptureFixture) -> None:
    server = await start(Probe(), first_frame_timeout_s=0.2)
    try:
        assert await _raw(server.port, b"") == b""
        assert "sent nothing" in caplog.text
    finally:
        await server.stop()


def test_sends_on_a_connection_the_loop_already_closed_fail_as_peer_unavailable() -> None:
    """uvloop (the frontend's loop under uvicorn) raises RuntimeError for a write on a
    transport it closed, e.g. when a killed worker reset the connection: the client must see
    PeerUnavailableError (the router then migrates), never a RuntimeError (an HTTP 500)."""
    uvloop = pytest.importorskip("uvloop")
    from armature.runtime.frames import Cancel
    from armature.runtime.tcp_client import _Connection

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = _Connection(reader, writer, lambda closed: None)
        writer.transport.abort()
        for _ in range(2):  # and the cancel sent after the failed send fails the same way
            with pytest.raises(PeerUnavailableError):
                await conn.send(Cancel(1))
        await conn.close()
        server.close()
        await server.wait_closed()

    uvloop.run(main())


async def test_a_handler_whose_client_left_ends_quietly(caplog: pytest.LogCaptureFixture) -> None:
    from armature.runtime.frames import Frame
    from armature.runtime.request_plane import ClientGoneError, CreditWindow, serve_stream

    caplog.set_level(logging.INFO, logger="armature.runtime.request_plane")
    sent: list[Frame] = []

    async def send(frame: Frame) -> None:
        sent.append(frame)
        raise ClientGoneError("the connection is closed")

    async def handler(payload: bytes) -> AsyncIterator[bytes]:
        yield b"x"

    await serve_stream(7, "gen", b"", {"gen": handler}, CreditWindow(4), send)
    assert len(sent) == 1  # the first Data frame; no Fail for a client that is gone
    assert "the client left" in caplog.text and "failed" not in caplog.text


BAD_BYTES = [
    (encode_frame(Open(1, "count", b"1", 4))[:2], "truncated frame"),
    (frame(bytes(100))[:9], "truncated frame"),
    ((2**31).to_bytes(4, "big"), "exceeds the"),
    (frame(b"\xc1"), "undecodable frame"),
]


@pytest.mark.parametrize(("data", "error"), [(b"", "EOFError"), *BAD_BYTES])
async def test_read_frame_refuses_what_is_not_a_whole_frame(data: bytes, error: str) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    with pytest.raises((EOFError, FrameError)) as caught:
        await read_frame(reader, 1 << 20, 5.0)
    assert error in f"{type(caught.value).__name__}: {caught.value}"


async def test_read_frame_reads_frames_back_to_back() -> None:
    frames = [Open(1, "count", b"3", 4), Open(2, "endless", b"", 8)]
    reader = asyncio.StreamReader()
    reader.feed_data(b"".join(encode_frame(f) for f in frames))
    reader.feed_eof()
    assert [await read_frame(reader, 1 << 20, 5.0) for _ in frames] == frames
    with pytest.raises(EOFError):
        await read_frame(reader, 1 << 20, 5.0)


async def client_routes(*pieces: bytes) -> dict[int, list[object]]:
    """What a client connection routes to its streams 1 and 2 from a server that sends
    `pieces` (each a read of its own) and closes: their frames, then the error that ended
    them."""
    reader = asyncio.StreamReader()
    left, right = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=left)
    conn = _Connection(reader, writer, lambda closed: None)
    queues: dict[int, asyncio.Queue[object]] = {1: asyncio.Queue(), 2: asyncio.Queue()}
    conn.queues.update(queues)
    for piece in pieces:
        reader.feed_data(piece)
        await asyncio.sleep(0)  # the connection reads it before the next comes
    reader.feed_eof()
    await conn.reader_task
    right.close()
    return {sid: [q.get_nowait() for _ in range(q.qsize())] for sid, q in queues.items()}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "connection closed by the peer"),
        *BAD_BYTES,
        (encode_frame(Open(1, "count", b"1", 4)), "unexpected Open frame from a server"),
    ],
)
async def test_the_client_fails_its_streams_on_what_is_not_a_whole_frame(
    data: bytes, error: str
) -> None:
    good = encode_frame(Data(1, b"a"))
    for pieces in ((good, data), (good + data,)):  # in a read of its own, or in the same one
        routed = await client_routes(*pieces)
        assert routed[1][0] == Data(1, b"a")  # what came whole before it is delivered
        for items in routed.values():
            assert isinstance(items[-1], PeerUnavailableError) and error in str(items[-1])


async def test_the_client_routes_frames_cut_across_reads() -> None:
    frames = [Data(1, b"a" * 300), Data(2, b"b"), End(2), Data(1, b"c"), End(1)]
    data = b"".join(encode_frame(f) for f in frames)
    pieces = [data[:3], data[3:200], data[200:311], data[311:]]  # inside a header, a body
    routed = await client_routes(*pieces)
    assert routed[1][:-1] == [Data(1, b"a" * 300), Data(1, b"c"), End(1)]
    assert routed[2][:-1] == [Data(2, b"b"), End(2)]


def keepalive_timers(port: int) -> dict[str, tuple[int, int]]:
    """The kernel's timer on each end of the loopback connections to `port`: "server" and
    "client" -> (timer kind, centiseconds to its next firing); kind 2 is keepalive."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        remote_port = int(fields[2].split(":")[1], 16)
        if fields[3] != "01":  # established only
            continue
        kind, when = fields[5].split(":")
        if local_port == port:
            found["server"] = (int(kind, 16), int(when, 16))
        elif remote_port == port:
            found["client"] = (int(kind, 16), int(when, 16))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
async def test_both_ends_keep_an_idle_connection_alive() -> None:
    """An idle connection to a host that died without a reset stayed open on both ends
    (a worker held a dead frontend's engine slots): the kernel now probes it within
    KEEPALIVE_IDLE_S of silence, on the worker's end and the frontend's."""
    server = await start(Probe())
    client = RequestPlaneClient()
    try:
        assert await collect(client, server.port, "count", b"2") == [b"0", b"1"]
        timers: dict[str, tuple[int, int]] = {}

        def armed() -> bool:
            timers.update(keepalive_timers(server.port))
            return all(timers.get(end, (0, 0))[0] == 2 for end in ("server", "client"))

        await wait_until(armed, "a keepalive timer on both ends")
        assert all(when <= KEEPALIVE_IDLE_S * 100 for _, when in timers.values())
    finally:
        await client.close()
        await server.stop()


def test_keepalive_options_on_a_socket() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as sock,
    ):
        set_keepalive(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
    set_keepalive(None)  # no socket (a transport without one): nothing to do
    closed = socket.socket()
    closed.close()
    set_keepalive(closed)  # refused (EBADF here; a reset peer, a sandbox): nothing raised


async def test_many_streams_at_once_leave_no_entry_once_closed() -> None:
    """Connects race for one address's lock (two connections, twenty streams): once the
    server is gone, neither a pool, a lock nor a waiter count is left."""
    server = await start(Probe())
    client = RequestPlaneClient(connections_per_peer=2)
    try:
        results = await asyncio.gather(
            *(collect(client, server.port, "count", b"3") for _ in range(20))
        )
        assert results == [[b"0", b"1", b"2"]] * 20
        assert [len(pool) for pool in client._pools.values()] == [2]
        await server.stop()
        await wait_until(lambda: not client._pools, "the pool emptied")
        assert (client._pools, client._locks, client._lock_users) == ({}, {}, {})
    finally:
        await client.close()
        await server.stop()


async def test_a_handler_s_own_timeout_is_a_failure_not_a_silent_client() -> None:
    """A handler that raises TimeoutError itself was taken for a client granting no credit:
    on TCP (no idle timeout) the stream died formatting the message, and the client waited
    out its stall timeout; it fails as any handler error does."""
    server = await start(Probe())
    client = RequestPlaneClient()
    try:
        with pytest.raises(RemoteError, match="TimeoutError") as failed:
            await asyncio.wait_for(collect(client, server.port, "times_out", b""), 10)
        assert failed.value.code is FailureCode.INTERNAL
    finally:
        await client.close()
        await server.stop()


async def test_a_closed_connection_leaves_no_entry_for_its_address() -> None:
    """Workers come and go at new addresses: the client kept a pool and a lock for every
    address it had ever reached; once its connections close, the address is forgotten."""
    server = await start(Probe())
    client = RequestPlaneClient()
    try:
        assert await collect(client, server.port, "count", b"1") == [b"0"]
        assert list(client._pools) == [("127.0.0.1", server.port)]
        await server.stop()
        await wait_until(lambda: not client._pools and not client._locks, "forgotten")
        assert client._pools == {} and client._locks == {} and client._lock_users == {}
        await server.start()  # the address again: a new connection, as before
        assert await collect(client, server.port, "count", b"1") == [b"0"]
        assert [len(pool) for pool in client._pools.values()] == [1]
    finally:
        await client.close()
        await server.stop()
