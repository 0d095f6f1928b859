"""The one framing of every byte stream we speak (the request plane over TCP, KV transfer
control messages): a 4-byte length in network order (big-endian u32), then that many bytes of
body. Pure: no sockets; each transport reads `HEADER_BYTES`, asks `read_length` how much body
follows, and reads that.

    | length: u32, big-endian | body: `length` bytes (msgpack) |
"""

from __future__ import annotations

from armature.errors import ArmatureError

__all__ = ["HEADER_BYTES", "MAX_BODY_BYTES", "FrameError", "frame", "read_length"]

HEADER_BYTES = 4
MAX_BODY_BYTES = (1 << 32) - 1  # the most a u32 length can announce


class FrameError(ArmatureError, ValueError):
    """A frame that cannot be accepted (oversized, truncated, undecodable, unknown type)."""


def frame(body: bytes) -> bytes:
    """`body` with its length header. FrameError if no u32 can announce it."""
    if len(body) > MAX_BODY_BYTES:
        raise FrameError(f"a body of {len(body)} bytes cannot be framed")
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def read_length(header: bytes | bytearray, max_bytes: int) -> int:
    """The body length `header` announces. FrameError for a header that is not exactly
    `HEADER_BYTES` long, or a length over `max_bytes` (refused before any body is read)."""
    if len(header) != HEADER_BYTES:
        raise FrameError(f"truncated frame header: {len(header)} of {HEADER_BYTES} bytes")
    length = int.from_bytes(header, "big")
    if length > max_bytes:
        raise FrameError(f"announced frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return length
