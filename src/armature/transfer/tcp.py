"""The TCP KV transfer backend, plus the control channel every backend uses (lookup and
release). One blocking server thread per connection on the prefill side; the decode side
opens one connection per call (from a worker thread, never the event loop).

Payloads go straight from the prefill cache's staging copy to the socket and from the socket
into one preallocated tensor: no intermediate bytes objects.
"""

from __future__ import annotations

import hmac
import logging
import socket
import socketserver
import threading
from typing import TYPE_CHECKING

import msgspec

from armature.protocols.kv_transfer import KvHandle, KvLayout, layout_mismatch
from armature.transfer.blocks import KvBlocks, KvBlockStore
from armature.transfer.pins import PinTable, UnknownHandleError
from armature.transfer.wire import (
    TransferError,
    TransferReply,
    TransferRequest,
    recv_exact_into,
    recv_message,
    send_all_views,
    send_message,
)

if TYPE_CHECKING:
    import torch

__all__ = ["TcpTransferClient", "TcpTransferServer", "parse_tcp_url"]

log = logging.getLogger(__name__)


def parse_tcp_url(url: str) -> tuple[str, int]:
    if not url.startswith("tcp://"):
        raise TransferError(f"not a tcp transfer url: {url!r}")
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise TransferError(f"bad tcp transfer url: {url!r}") from None


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    import torch  # loaded already: `tensor` is one

    return tensor.contiguous().view(torch.uint8).numpy().data.cast("B")


class TcpTransferServer:
    """Serves a prefill worker's pinned blocks: pull, lookup, release."""

    def __init__(
        self,
        pins: PinTable,
        store: KvBlockStore,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_s: float = 30.0,
        secret: str | None = None,
    ):
        self.secret = secret or None
        self.pins = pins
        self.store = store
        self.timeout_s = timeout_s
        self.nixl_info: bytes | None = None  # set when this worker offers NIXL
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve_connection(self.request)

        self._server = socketserver.ThreadingTCPServer(
            (host, port), Handler, bind_and_activate=False
        )
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        self._server.server_bind()
        self._server.server_activate()
        self._thread: threading.Thread | None = None
        self.num_pulls = 0
        self.bytes_sent = 0

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"tcp://{host!s}:{port}"

    def start(self) -> str:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="armature-kv-transfer", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def _serve_connection(self, sock: socket.socket) -> None:
        sock.settimeout(self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    request = recv_message(sock, TransferRequest)
                except TransferError:
                    return  # closed or malformed: drop this connection only
                self._answer(sock, request)
        except OSError as exc:
            log.debug("KV transfer connection ended: %s", exc)

    def _answer(self, sock: socket.socket, request: TransferRequest) -> None:
        if self.secret is not None and not hmac.compare_digest(
            request.secret.encode(), self.secret.encode()
        ):
            send_message(sock, TransferReply(ok=False, error="KV transfer refused: bad secret"))
            return
        if request.op == "release":  # always honoured: it only frees our blocks
            self.pins.release(request.handle_id)
            send_message(sock, TransferReply(ok=True))
            return
        mismatch = layout_mismatch(self.store.layout, request.layout)
        if mismatch is not None:
            send_message(sock, TransferReply(ok=False, error=mismatch))
            return
        if request.op == "nixl":
            if self.nixl_info is None:
                send_message(sock, TransferReply(ok=False, error="this worker offers no NIXL"))
            else:
                send_message(sock, TransferReply(ok=True, info=self.nixl_info))
            return
        try:
            block_ids = self.pins.begin_read(request.handle_id)
        except UnknownHandleError as exc:
            send_message(sock, TransferReply(ok=False, error=str(exc)))
            return
        try:
            wanted = block_ids[request.start_block :]
            if request.op == "lookup":
                send_message(sock, TransferReply(ok=True, block_ids=wanted))
                return
            try:
                views = [_as_bytes(t) for t in self.store.wire_views(wanted)]
            except Exception as exc:  # refuse this pull, keep serving
                log.exception("reading pinned KV blocks failed")
                send_message(sock, TransferReply(ok=False, error=f"reading blocks failed: {exc}"))
                return
            nbytes = sum(v.nbytes for v in views)
            send_message(sock, TransferReply(ok=True, num_blocks=len(wanted), nbytes=nbytes))
            send_all_views(sock, views)
            self.num_pulls += 1
            self.bytes_sent += nbytes
        finally:
            self.pins.end_read(request.handle_id)


class TcpTransferClient:
    """The decode side's calls to a prefill worker's transfer server."""

    def __init__(self, timeout_s: float = 30.0, secret: str | None = None):
        self.timeout_s = timeout_s
        self.secret = secret or ""

    def _call(self, url: str, request: TransferRequest) -> tuple[socket.socket, TransferReply]:
        host, port = parse_tcp_url(url)
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
        except OSError as exc:
            raise TransferError(f"cannot reach the KV transfer server {url}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.secret:
            request = msgspec.structs.replace(request, secret=self.secret)
        try:
            send_message(sock, request)
            reply = recv_message(sock, TransferReply)
        except (OSError, TransferError) as exc:
            sock.close()
            raise TransferError(f"KV transfer with {url} failed: {exc}") from None
        if not reply.ok:
            sock.close()
            raise TransferError(reply.error)
        return sock, reply

    def pull(self, url: str, handle: KvHandle, start_block: int, layout: KvLayout) -> KvBlocks:
        """Blocks `start_block..` of `handle`, received into one contiguous tensor."""
        request = TransferRequest(
            op="pull", handle_id=handle.handle_id, layout=layout, start_block=start_block
        )
        sock, reply = self._call(url, request)
        with sock:
            n = reply.num_blocks
            if reply.nbytes == 0:
                return KvBlocks(list(range(n)), None, None)
            expected = n * layout.bytes_per_block
            if reply.nbytes != expected:
                raise TransferError(
                    f"peer sent {reply.nbytes} bytes for {n} blocks, not {expected}"
                )
            import torch  # only where data moves: a mocker's agent never loads it

            from armature.model.dtypes import torch_dtype

            buffer = torch.empty(reply.nbytes, dtype=torch.uint8)
            try:
                recv_exact_into(sock, buffer.numpy().data.cast("B"))
            except OSError as exc:
                raise TransferError(f"KV transfer with {url} failed: {exc}") from None
        shape = (layout.num_layers, n, layout.block_size, layout.num_kv_heads, layout.head_dim)
        k, v = buffer.view(torch_dtype(layout.dtype)).view(2, *shape).unbind(0)
        return KvBlocks(list(range(n)), k, v)

    def lookup(self, url: str, handle: KvHandle, start_block: int, layout: KvLayout) -> list[int]:
        request = TransferRequest(
            op="lookup", handle_id=handle.handle_id, layout=layout, start_block=start_block
        )
        sock, reply = self._call(url, request)
        sock.close()
        return reply.block_ids

    def nixl_info(self, url: str, layout: KvLayout) -> bytes:
        sock, reply = self._call(url, TransferRequest(op="nixl", handle_id="", layout=layout))
        sock.close()
        return reply.info

    def release(self, url: str, handle: KvHandle, layout: KvLayout) -> None:
        request = TransferRequest(op="release", handle_id=handle.handle_id, layout=layout)
        sock, _ = self._call(url, request)
        sock.close()
