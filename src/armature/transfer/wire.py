"""The KV transfer control messages (msgpack, framed as the request plane's are: see
protocols/framing.py) and the socket helpers that send and receive them.

client -> server:  u32 length (big-endian) | TransferRequest
server -> client:  u32 length (big-endian) | TransferReply | nbytes of K then V (op "pull" only)
"""

from __future__ import annotations

import socket
from typing import Literal, TypeVar

import msgspec

from armature.errors import ArmatureError
from armature.protocols.framing import HEADER_BYTES, FrameError, frame, read_length
from armature.protocols.kv_transfer import KvLayout

__all__ = [
    "MAX_MESSAGE_BYTES",
    "TransferError",
    "TransferReply",
    "TransferRequest",
    "recv_exact_into",
    "recv_message",
    "send_all_views",
    "send_message",
]

MAX_MESSAGE_BYTES = 1 << 20
T = TypeVar("T")


class TransferError(ArmatureError, RuntimeError):
    """A KV transfer failed or was refused; the decode side recomputes instead."""


class TransferRequest(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["pull", "lookup", "release", "nixl"]
    handle_id: str
    layout: KvLayout
    start_block: int = 0  # pull/lookup: the first pinned block wanted
    secret: str = ""  # the planes' shared secret, when the server requires one


class TransferReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    block_ids: list[int] = msgspec.field(default_factory=list)  # lookup: pinned ids wanted
    num_blocks: int = 0  # pull: blocks in the payload
    nbytes: int = 0  # pull: payload bytes after the reply (K then V, equal halves)
    info: bytes = b""  # nixl: the peer's NIXL agent metadata and cache addresses


def send_message(sock: socket.socket, message: msgspec.Struct) -> None:
    sock.sendall(frame(msgspec.msgpack.encode(message)))


def send_all_views(sock: socket.socket, views: list[memoryview], max_iov: int = 512) -> None:
    """Send every view in order with scatter-gather writes (few syscalls, no joining copy)."""
    pending = [v for v in views if v.nbytes]
    while pending:
        batch = pending[:max_iov]
        sent = sock.sendmsg(batch)
        done = 0
        while done < len(batch) and sent >= batch[done].nbytes:
            sent -= batch[done].nbytes
            done += 1
        pending = pending[done:]
        if sent:
            pending[0] = pending[0][sent:]


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise TransferError("the peer closed the connection mid-transfer")
        view = view[n:]


def recv_message(sock: socket.socket, kind: type[T]) -> T:
    """One framed message of type `kind`; TransferError for a closed, oversized or malformed
    one (the body of an oversized message is never read)."""
    header = bytearray(HEADER_BYTES)
    recv_exact_into(sock, memoryview(header))
    try:
        length = read_length(header, MAX_MESSAGE_BYTES)
    except FrameError as exc:
        raise TransferError(f"transfer message refused: {exc}") from None
    body = bytearray(length)
    recv_exact_into(sock, memoryview(body))
    try:
        return msgspec.msgpack.decode(bytes(body), type=kind)
    except msgspec.DecodeError as exc:
        raise TransferError(f"malformed transfer message: {exc}") from None
