"""The one framing of every byte stream we speak (the request plane over TCP, KV transfer
control messages): a 4-byte length in network order (big-endian u32), then that many bytes of
body. Pure: no sockets; each transport reads `HEADER_BYTES`, asks `read_length` how much body
follows, and reads that, or reads whatever has arrived and lets `take_bodies` cut it.

    | length: u32, big-endian | body: `length` bytes (msgpack) |
"""

from __future__ import annotations

import struct

from armature.errors import ArmatureError

__all__ = ["HEADER_BYTES", "MAX_BODY_BYTES", "FrameError", "frame", "read_length", "take_bodies"]

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
    return _checked(int.from_bytes(header, "big"), max_bytes)


def _checked(length: int, max_bytes: int) -> int:
    if length > max_bytes:
        raise FrameError(f"announced frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return length


_LENGTH = struct.Struct(">I")


def take_bodies(buffer: bytearray, max_bytes: int) -> list[bytes]:
    """The bodies of the whole frames at the start of `buffer`, in order, cut from it; a
    partial frame stays for more bytes. A length over `max_bytes` (refused before its body
    arrives) ends the bodies returned, and the next call, which starts at it, raises
    FrameError: the frames before it are not lost. One call per socket read (until it returns
    nothing), instead of two awaited reads per frame, is what a reader of many small frames
    wants."""
    bodies: list[bytes] = []
    start, end = 0, len(buffer)
    while end - start >= HEADER_BYTES:
        (length,) = _LENGTH.unpack_from(buffer, start)
        if length > max_bytes and bodies:
            break  # returned first; the next call refuses it
        _checked(length, max_bytes)
        body_start = start + HEADER_BYTES
        if end - body_start < length:
            break
        bodies.append(bytes(buffer[body_start : body_start + length]))
        start = body_start + length
    del buffer[:start]
    return bodies
