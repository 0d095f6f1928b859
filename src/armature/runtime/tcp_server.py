"""The request plane's TCP server: streaming handlers, many streams per connection.

A handler takes a request payload and returns an async iterator of response payloads. Each
Open frame starts one handler task; its items go out as Data frames, never more than the
stream's credit ahead of the client, then End (or Fail). Cancel, or the connection closing,
cancels the handler task, and closing its iterator is how a generation is aborted on the
worker. A peer that sends nothing within `first_frame_timeout_s`, or a malformed, truncated,
oversized or unexpected frame, or one that stalls half-sent for `frame_timeout_s`, loses its
connection with a logged reason; other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Mapping

from armature.protocols.framing import HEADER_BYTES, read_length
from armature.runtime.frames import (
    MAX_FRAME_BYTES,
    Cancel,
    Credit,
    Frame,
    FrameError,
    Hello,
    Open,
    Refused,
    decode_frame,
    encode_frame,
)
from armature.runtime.keepalive import set_keepalive
from armature.runtime.request_plane import ClientGoneError, CreditWindow, Handler, serve_stream

__all__ = ["RequestPlaneServer", "read_frame"]

log = logging.getLogger(__name__)

SECRET_REFUSAL = (
    "its request plane secret differs from this server's (--plane-secret, ARMATURE_PLANE_SECRET)"
)


async def read_frame(reader: asyncio.StreamReader, max_bytes: int, rest_timeout_s: float) -> Frame:
    """One frame; EOFError at a clean end of stream, FrameError for anything malformed or for
    a frame whose rest does not arrive within `rest_timeout_s` of its first byte."""
    try:
        first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        raise EOFError from None
    try:
        async with asyncio.timeout(rest_timeout_s):
            header = first + await reader.readexactly(HEADER_BYTES - 1)
            length = read_length(header, max_bytes)
            body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError("truncated frame") from None
    except TimeoutError:
        raise FrameError(f"frame incomplete after {rest_timeout_s} s") from None
    return decode_frame(body)


class _Stream:
    def __init__(self, credit: int):
        self.window = CreditWindow(credit)
        self.task: asyncio.Task[None] | None = None


class _Connection:
    def __init__(
        self,
        server: RequestPlaneServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.streams: dict[int, _Stream] = {}
        self.peer = writer.get_extra_info("peername")
        # frames the streams sent in this turn of the event loop, written together at its end
        self._unwritten: list[bytes] = []
        self._write_error: BaseException | None = None

    async def run(self) -> None:
        try:
            first = True
            while True:
                timeout = self.server.first_frame_timeout_s if first else None
                try:
                    frame = await asyncio.wait_for(
                        read_frame(
                            self.reader,
                            self.server.max_frame_bytes,
                            self.server.frame_timeout_s,
                        ),
                        timeout,
                    )
                except TimeoutError:
                    log.warning("request plane: %s sent nothing; closing", self.peer)
                    return
                if first and not self._authenticated(frame):
                    log.warning("request plane: %s gave no valid secret; closing", self.peer)
                    self.writer.write(encode_frame(Refused(SECRET_REFUSAL)))
                    return
                first = False
                if not isinstance(frame, Hello):
                    self._dispatch(frame)
        except EOFError:
            return
        except FrameError as exc:
            log.warning("request plane: closing %s: %s", self.peer, exc)
        except (ConnectionError, OSError) as exc:
            log.info("request plane: connection from %s lost: %s", self.peer, exc)
        finally:
            await self._close()

    def _authenticated(self, first: Frame) -> bool:
        """With a shared secret set, a connection must open with Hello(secret)."""
        secret = self.server.secret
        if secret is None:
            return True
        offered = first.secret if isinstance(first, Hello) else ""
        return hmac.compare_digest(offered.encode(), secret.encode())

    def _dispatch(self, frame: Frame) -> None:
        if isinstance(frame, Open):
            if frame.stream_id in self.streams:
                raise FrameError(f"stream {frame.stream_id} opened twice")
            if frame.credit <= 0:
                raise FrameError(f"stream {frame.stream_id} opened with credit {frame.credit}")
            stream = _Stream(frame.credit)
            self.streams[frame.stream_id] = stream
            stream.task = asyncio.get_running_loop().create_task(self._serve(frame, stream))
        elif isinstance(frame, Credit):
            credited = self.streams.get(frame.stream_id)
            if credited is not None:
                credited.window.grant(frame.n)
        elif isinstance(frame, Cancel):
            cancelled = self.streams.get(frame.stream_id)
            if cancelled is not None and cancelled.task is not None:
                cancelled.task.cancel()
        else:
            raise FrameError(f"unexpected {type(frame).__name__} frame from a client")

    async def _serve(self, frame: Open, stream: _Stream) -> None:
        try:
            await serve_stream(
                frame.stream_id,
                frame.endpoint,
                frame.payload,
                self.server.handlers,
                stream.window,
                self._send,
            )
        finally:
            self.streams.pop(frame.stream_id, None)

    async def _send(self, frame: Frame) -> None:
        """Queue `frame`; the frames every stream sends in one turn of the event loop (the
        outputs of one engine step) leave in one write. Waits while the socket's buffer is
        full (back-pressure); ClientGoneError once the connection is closed or broken."""
        if self._write_error is not None or self.writer.is_closing():
            raise ClientGoneError(f"the connection is closed ({self._write_error})")
        self._unwritten.append(encode_frame(frame, self.server.max_frame_bytes))
        if len(self._unwritten) == 1:
            asyncio.get_running_loop().call_soon(self._write)
        try:
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            raise ClientGoneError(str(exc)) from None

    def _write(self) -> None:
        data = b"".join(self._unwritten)
        self._unwritten.clear()
        try:
            self.writer.write(data)
        except (ConnectionError, OSError, RuntimeError) as exc:
            # RuntimeError: uvloop's answer to a write on a transport it already closed; the
            # streams learn of it on their next send, and the reader sees the connection end
            self._write_error = exc

    async def _close(self) -> None:
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class RequestPlaneServer:
    def __init__(
        self,
        handlers: Mapping[str, Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        first_frame_timeout_s: float = 10.0,
        frame_timeout_s: float = 10.0,
        secret: str | None = None,
    ):
        self.secret = secret or None  # clients must open with Hello(secret)
        self.handlers = dict(handlers)
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.first_frame_timeout_s = first_frame_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        set_keepalive(writer.get_extra_info("socket"))  # a dead client host is let go
        try:
            await _Connection(self, reader, writer).run()
        except asyncio.CancelledError:
            pass  # the server is stopping
        finally:
            self._connections.discard(task)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
