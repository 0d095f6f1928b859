"""Fuzzing the wire decoders with hypothesis: malformed request-plane frames and KV transfer
messages raise their own error types only, and a live worker server survives any garbage."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from armature.protocols.framing import frame
from armature.runtime.frames import FrameError, decode_frame
from armature.runtime.tcp_client import RequestPlaneClient
from armature.runtime.tcp_server import RequestPlaneServer
from armature.transfer.wire import TransferError, TransferRequest, recv_message

TAGS = ["open", "credit", "cancel", "data", "end", "accept", "fail", "other"]
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)
FRAME_LIKE = st.builds(
    lambda tag, fields: msgspec.msgpack.encode({"type": tag, **fields}),
    st.sampled_from(TAGS),
    st.dictionaries(
        st.sampled_from(["stream_id", "endpoint", "payload", "credit", "code", "message", "x"]),
        VALUES,
        max_size=5,
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256) | FRAME_LIKE)
def test_frame_decoder_raises_only_frame_errors(body: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode_frame(body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=128))
def test_transfer_messages_raise_only_transfer_errors(data: bytes) -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(data)
        left.shutdown(socket.SHUT_WR)
        right.settimeout(5)
        with contextlib.suppress(TransferError):
            recv_message(right, TransferRequest)


async def _echo(payload: bytes):  # type: ignore[no-untyped-def]
    yield payload


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.binary(min_size=1, max_size=64) | FRAME_LIKE, min_size=1, max_size=3))
@example([msgspec.msgpack.encode({"type": "cancel", "stream_id": 7})])  # valid: no answer
@example([msgspec.msgpack.encode({"type": "credit", "stream_id": 7, "n": 1})])
def test_a_server_survives_garbage_connections(chunks: list[bytes]) -> None:
    async def scenario() -> None:
        server = RequestPlaneServer({"echo": _echo}, frame_timeout_s=0.2)
        await server.start()
        client = RequestPlaneClient()
        try:
            for chunk in chunks:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(frame(chunk))
                writer.write_eof()  # a well-formed frame (a Cancel, say) keeps it open
                await writer.drain()
                await asyncio.wait_for(reader.read(), 5)  # the server answers and closes
                writer.close()
            items = [
                i async for i in client.stream(f"tcp://127.0.0.1:{server.port}", "echo", b"ok")
            ]
            assert items == [b"ok"]
        finally:
            await client.close()
            await server.stop()

    asyncio.run(scenario())
