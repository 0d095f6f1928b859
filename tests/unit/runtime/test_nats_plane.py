"""The NATS request plane against a real nats-server: the TCP plane's stream semantics
(order, multiplexing, cancellation, credit, errors), a subject nobody serves, and streams cut
by a server restart failing on both sides instead of hanging."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from test_tcp_plane import Probe, check_a_backlog_comes_as_one_batch

from armature.protocols.failures import FailureCode
from armature.runtime.frames import Accept, Cancel, Open, decode_frame, encode_message
from armature.runtime.nats_conn import connect_nats
from armature.runtime.nats_plane import NatsRequestPlaneClient, NatsRequestPlaneServer
from armature.runtime.request_plane import PeerUnavailableError, RemoteError
from polling import wait_until
from servers import Nats


@pytest.fixture
async def nc(nats_server: Nats) -> AsyncIterator[Client]:
    client = await connect_nats(nats_server.url)
    yield client
    await client.close()


async def serve(
    nc: Client, probe: Probe, subject: str = "w.1", idle_timeout_s: float = 30.0
) -> NatsRequestPlaneServer:
    server = NatsRequestPlaneServer(
        nc,
        subject,
        {
            "count": probe.count,
            "endless": probe.endless,
            "slow": probe.slow_then_close,
            "fail": probe.fail,
            "gated": probe.gated,
        },
        idle_timeout_s=idle_timeout_s,
    )
    await server.start()
    return server


async def collect(client: NatsRequestPlaneClient, url: str, endpoint: str, body: bytes) -> list:
    return [item async for item in client.stream(url, endpoint, body)]


async def test_streams_arrive_whole_and_in_order(nc: Client) -> None:
    server = await serve(nc, Probe())
    client = NatsRequestPlaneClient(nc, window=4)
    results = await asyncio.gather(
        *(collect(client, server.url, "count", str(n).encode()) for n in range(20))
    )
    for n, items in enumerate(results):
        assert items == [str(i).encode() for i in range(n)]
    await server.stop()


@pytest.mark.parametrize("then_fails", [False, True])
async def test_a_backlog_comes_as_one_batch(nc: Client, then_fails: bool) -> None:
    probe = Probe()
    server = await serve(nc, probe)
    client = NatsRequestPlaneClient(nc, window=8)
    batches = client.stream_batches(server.url, "gated", b"fail" if then_fails else b"")
    await check_a_backlog_comes_as_one_batch(batches, probe, then_fails)
    await server.stop()


async def test_cancel_and_back_pressure(nc: Client) -> None:
    probe = Probe()
    server = await serve(nc, probe)
    client = NatsRequestPlaneClient(nc, window=8)
    stream = client.stream(server.url, "endless", b"")
    for _ in range(3):
        await anext(stream)
    await wait_until(lambda: probe.produced >= 8, "the window filled")
    await asyncio.sleep(0.3)  # not a wait for an event: the time it has to overrun, in vain
    assert probe.produced <= 8 + 1
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(probe.closed.wait(), 5)
    await server.stop()


async def test_a_stream_closed_before_its_accept_is_cancelled_when_it_comes(nc: Client) -> None:
    """The caller leaves while the worker holds the Open, before its Accept reached the
    client (a frontend that read its client's request late): the client still cancels the
    stream, once the Accept comes. It was served until the worker's idle timeout."""
    opens: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
    controls: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_open(msg: Any) -> None:
        await opens.put((msg.reply, msg.data))

    async def on_control(msg: Any) -> None:
        await controls.put(msg.data)

    worker = await nc.subscribe("w.late", cb=on_open)  # a worker that accepts when told
    await nc.subscribe("w.late.ctl", cb=on_control)
    await nc.flush()
    client = NatsRequestPlaneClient(nc, window=4)
    stream = client.stream("nats:w.late", "count", b"3")
    waiting = asyncio.ensure_future(anext(stream))
    inbox, data = await asyncio.wait_for(opens.get(), 5)
    assert isinstance(decode_frame(data), Open)
    waiting.cancel()  # the caller leaves before the Accept
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await nc.publish(inbox, encode_message(Accept(1, "w.late.ctl")))
    cancel = decode_frame(await asyncio.wait_for(controls.get(), 5))
    assert isinstance(cancel, Cancel)
    await worker.unsubscribe()


async def test_a_stream_cancelled_for_want_of_credit_says_so(nc: Client) -> None:
    """The server cancels a stream whose client granted no credit for idle_timeout_s (a
    dead frontend, or credit lost on the way): a live client waited out its stall timeout
    for data that never came, and blamed the worker; it hears a Fail at once."""
    probe = Probe()
    server = await serve(nc, probe, idle_timeout_s=0.3)
    client = NatsRequestPlaneClient(nc, window=4)
    stream = client.stream(server.url, "endless", b"")
    await anext(stream)  # then nothing taken: no credit goes back
    await asyncio.wait_for(probe.closed.wait(), 10)  # the server cancelled the handler
    with pytest.raises(RemoteError, match=r"no credit from the client for 0\.3 s") as failed:
        async with asyncio.timeout(10):
            while True:
                await anext(stream)
    assert failed.value.code is FailureCode.UNAVAILABLE
    await server.stop()


async def test_errors_and_nobody_listening(nc: Client) -> None:
    server = await serve(nc, Probe())
    client = NatsRequestPlaneClient(nc, accept_timeout_s=0.5)
    with pytest.raises(RemoteError) as typed:
        await collect(client, server.url, "fail", b"typed")
    assert typed.value.code is FailureCode.INVALID_REQUEST
    with pytest.raises(RemoteError) as missing:
        await collect(client, server.url, "nope", b"")
    assert missing.value.code is FailureCode.NOT_FOUND
    with pytest.raises(PeerUnavailableError, match="nobody accepted"):
        await collect(client, "nats:nobody.here", "count", b"1")
    # larger than the server's max_payload (1 MiB by default): the request's fault, not the
    # worker's (read as unreachable, every worker was routed around in turn)
    with pytest.raises(RemoteError, match=r"max_payload 1048576 bytes") as too_big:
        await collect(client, server.url, "count", b"1" * (2 << 20))
    assert too_big.value.code is FailureCode.INVALID_REQUEST
    await server.stop()


async def test_a_close_of_ours_is_not_logged_as_a_disconnection(
    nats_server: Nats, caplog: pytest.LogCaptureFixture
) -> None:
    """Every frontend start with NATS (its reachability check connects, then closes) and
    every clean stop logged "disconnected; reconnecting"; a lost server still is."""
    caplog.set_level(logging.INFO, logger="armature.runtime.nats_conn")
    nc = await connect_nats(nats_server.url)
    await nc.close()
    assert caplog.messages == []
    nc = await connect_nats(nats_server.url)
    try:
        nats_server.restart()
        await wait_until(lambda: "reconnected" in caplog.text, "reconnected")
        assert caplog.messages == [
            f"NATS {nats_server.url}: disconnected; reconnecting",
            f"NATS {nats_server.url}: reconnected",
        ]
    finally:
        await nc.close()


async def test_a_restart_fails_open_streams_on_both_sides(nats_server: Nats) -> None:
    worker_nc = await connect_nats(nats_server.url)
    frontend_nc = await connect_nats(nats_server.url)
    probe = Probe()
    server = await serve(worker_nc, probe, "w.restart")
    client = NatsRequestPlaneClient(frontend_nc, window=2)
    for _ in range(3):  # a loaded CI machine can be slow to route the very first stream
        stream = client.stream(server.url, "endless", b"")
        try:
            await anext(stream)
            break
        except PeerUnavailableError:
            continue
    else:
        pytest.fail("no stream could be opened before the restart")
    nats_server.restart()
    with pytest.raises(PeerUnavailableError, match="reconnected"):
        async for _ in stream:
            pass
    await asyncio.wait_for(probe.closed.wait(), 10)  # the worker side let go as well
    # and new streams work again once both have reconnected and re-subscribed
    client.accept_timeout_s = 0.5
    for _ in range(20):
        try:
            assert await collect(client, server.url, "count", b"2") == [b"0", b"1"]
            break
        except PeerUnavailableError:
            await asyncio.sleep(0.2)
    else:
        pytest.fail("the plane did not recover after the restart")
    await server.stop()
    await worker_nc.close()
    await frontend_nc.close()
