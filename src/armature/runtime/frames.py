"""Request-plane wire frames (DESIGN §3: msgspec msgpack, never pickle), framed on byte
streams as every stream is (protocols/framing.py: a 4-byte big-endian length, then the
msgpack body). Pure.

Client -> server: Open (start a stream on an endpoint, with an initial credit), Credit (the
client consumed n more items), Cancel. Server -> client: Data (one item), End, Fail; on TCP,
Refused (why the connection closes unserved: its Hello lacked the plane's secret). A
server sends at most `credit` Data frames ahead of what the client has acknowledged: that is
the per-stream back-pressure; TCP's own flow control covers the connection.
"""

from __future__ import annotations

import msgspec

from armature.protocols import framing
from armature.protocols.failures import FailureCode
from armature.protocols.framing import FrameError

__all__ = [
    "MAX_FRAME_BYTES",
    "Accept",
    "Cancel",
    "Credit",
    "Data",
    "End",
    "Fail",
    "Frame",
    "FrameError",
    "Hello",
    "Open",
    "Refused",
    "decode_frame",
    "encode_frame",
    "encode_message",
]

MAX_FRAME_BYTES = 16 * 1024 * 1024


class Hello(msgspec.Struct, tag="hello", frozen=True):
    """TCP only: a client's first frame, carrying the plane's shared secret ("" for none)."""

    secret: str


class Open(msgspec.Struct, tag="open", frozen=True):
    stream_id: int
    endpoint: str
    payload: bytes
    credit: int


class Credit(msgspec.Struct, tag="credit", frozen=True):
    stream_id: int
    n: int


class Cancel(msgspec.Struct, tag="cancel", frozen=True):
    stream_id: int


class Data(msgspec.Struct, tag="data", frozen=True):
    stream_id: int
    payload: bytes


class End(msgspec.Struct, tag="end", frozen=True):
    stream_id: int


class Accept(msgspec.Struct, tag="accept", frozen=True):
    """NATS only: the server took the stream (NATS cannot tell a sender nobody listens)."""

    stream_id: int
    control_subject: str  # where the client sends Credit and Cancel


class Fail(msgspec.Struct, tag="fail", frozen=True):
    stream_id: int
    code: FailureCode
    message: str


class Refused(msgspec.Struct, tag="refused", frozen=True):
    """TCP only: the server closes the connection unserved, and says why (the plane's
    secret: the client would otherwise see a worker that hangs up, as a dead one does)."""

    reason: str


Frame = Hello | Open | Credit | Cancel | Data | End | Fail | Accept | Refused

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


def encode_message(frame: Frame, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """A frame's msgpack body (message transports such as NATS frame it themselves)."""
    body = _encoder.encode(frame)
    if len(body) > max_bytes:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {max_bytes}-byte limit")
    return body


def encode_frame(frame: Frame, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Length-prefixed, for byte streams (TCP)."""
    return framing.frame(encode_message(frame, max_bytes))


def decode_frame(body: bytes) -> Frame:
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise FrameError(f"undecodable frame: {exc}") from None
