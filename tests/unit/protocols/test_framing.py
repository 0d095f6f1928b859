"""The one framing (protocols/framing.py): exact bytes, refused headers, and both byte-stream
protocols (request plane, KV transfer) framing the same way."""

from __future__ import annotations

import itertools
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.protocols.framing import HEADER_BYTES, FrameError, frame, read_length, take_bodies
from armature.runtime.frames import End, encode_frame
from armature.transfer.wire import TransferError, TransferReply, recv_message, send_message


def test_a_frame_is_a_big_endian_u32_length_then_the_body() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert frame(bytes(258))[:HEADER_BYTES] == b"\x00\x00\x01\x02"


def test_read_length_reads_network_order_up_to_the_limit() -> None:
    assert read_length(b"\x00\x00\x01\x02", max_bytes=258) == 258
    assert read_length(bytearray(b"\x00\x00\x00\x00"), max_bytes=0) == 0
    with pytest.raises(FrameError, match="frame of 259 bytes exceeds the 258-byte limit"):
        read_length(b"\x00\x00\x01\x03", max_bytes=258)


@pytest.mark.parametrize("header", [b"", b"\x00", b"\x00\x00\x01", b"\x00\x00\x00\x01\x00"])
def test_a_header_of_the_wrong_size_is_refused(header: bytes) -> None:
    with pytest.raises(FrameError, match=f"truncated frame header: {len(header)} of 4 bytes"):
        read_length(header, max_bytes=1 << 20)


def test_take_bodies_cuts_whole_frames_and_keeps_a_partial_one() -> None:
    buffer = bytearray(frame(b"ab") + frame(b"") + frame(b"xyz")[:5])
    assert take_bodies(buffer, max_bytes=16) == [b"ab", b""]
    assert buffer == frame(b"xyz")[:5]
    buffer += frame(b"xyz")[5:]
    assert take_bodies(buffer, max_bytes=16) == [b"xyz"]
    assert buffer == bytearray()


def test_take_bodies_refuses_a_length_over_the_limit_after_the_frames_before_it() -> None:
    buffer = bytearray(frame(b"ok") + b"\x00\x00\x01\x03")
    assert take_bodies(buffer, max_bytes=258) == [b"ok"]  # not lost with the bad header
    with pytest.raises(FrameError, match="frame of 259 bytes exceeds the 258-byte limit"):
        take_bodies(buffer, max_bytes=258)


@given(
    bodies=st.lists(st.binary(max_size=40), max_size=6),
    cuts=st.lists(st.integers(0, 300), max_size=8),
)
def test_take_bodies_gives_the_bodies_however_the_bytes_are_cut(
    bodies: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(frame(b) for b in bodies)
    points = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    buffer, got = bytearray(), []
    for start, end in itertools.pairwise(points):
        buffer += data[start:end]
        got += take_bodies(buffer, max_bytes=64)
    assert got == bodies
    assert buffer == bytearray()


def test_a_request_plane_frame_has_exact_bytes() -> None:
    body = b"\x82\xa4type\xa3end\xa9stream_id\x07"  # msgpack {"type": "end", "stream_id": 7}
    assert encode_frame(End(7)) == b"\x00\x00\x00\x15" + body


def test_a_transfer_message_is_framed_like_the_request_plane() -> None:
    body = (  # msgpack of TransferReply(ok=True), its fields in order
        b"\x86\xa2ok\xc3\xa5error\xa0\xa9block_ids\x90\xaanum_blocks\x00"
        b"\xa6nbytes\x00\xa4info\xc4\x00"
    )
    left, right = socket.socketpair()
    with left, right:
        send_message(left, TransferReply(ok=True))
        left.shutdown(socket.SHUT_WR)
        assert right.recv(100) == frame(body) == b"\x00\x00\x00\x32" + body


def test_a_transfer_message_over_the_limit_is_refused_unread() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"\x00\x10\x00\x01")  # 1 MiB + 1: no body follows, none is awaited
        right.settimeout(5)
        with pytest.raises(TransferError, match="1048577 bytes exceeds the 1048576-byte limit"):
            recv_message(right, TransferReply)


def test_a_truncated_transfer_header_is_refused() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"\x00\x00")
        left.shutdown(socket.SHUT_WR)
        right.settimeout(5)
        with pytest.raises(TransferError, match="closed the connection"):
            recv_message(right, TransferReply)
