"""The KV transfer control messages (msgpack, length-prefixed) and the framing helpers.

client -> server:  u32 length | TransferRequest
server -> client:  u32 length | TransferReply | nbytes of K then V (op "pull" only)
"""

from __future__ import annotations

import socket
import struct
from typing import Literal, TypeVar

import msgspec

from armature.protocols.kv_transfer import KvLayout

__all__ = [
    "MAX_MESSAGE_BYTES",
    "TransferError",
    "TransferReply",
    "TransferRequest",
    "recv_exact_into",
    "recv_message",
    "send_message",
]

MAX_MESSAGE_BYTES = 1 << 20
_LEN = struct.Struct("<I")
T = TypeVar("T")


class TransferError(RuntimeError):
    """A KV transfer failed or was refused; the decode side recomputes instead."""


class TransferRequest(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["pull", "lookup", "release"]
    handle_id: str
    layout: KvLayout
    start_block: int = 0  # pull/lookup: the first pinned block wanted


class TransferReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    block_ids: list[int] = msgspec.field(default_factory=list)  # lookup: pinned ids wanted
    num_blocks: int = 0  # pull: blocks in the payload
    nbytes: int = 0  # pull: payload bytes after the reply (K then V, equal halves)


def send_message(sock: socket.socket, message: msgspec.Struct) -> None:
    body = msgspec.msgpack.encode(message)
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise TransferError("the peer closed the connection mid-transfer")
        view = view[n:]


def recv_message(sock: socket.socket, kind: type[T]) -> T:
    header = bytearray(_LEN.size)
    recv_exact_into(sock, memoryview(header))
    (length,) = _LEN.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise TransferError(f"transfer message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    body = bytearray(length)
    recv_exact_into(sock, memoryview(body))
    try:
        return msgspec.msgpack.decode(bytes(body), type=kind)
    except msgspec.DecodeError as exc:
        raise TransferError(f"malformed transfer message: {exc}") from None
