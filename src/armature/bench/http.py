"""A small HTTP/1.1 client for the load generator: POST a JSON body, stream the response body,
keep connections alive in a pool. It does only what streaming an OpenAI-style SSE response
needs (Content-Length or chunked bodies, http and https), so that the client costs a fraction
of what a general-purpose client does per request and does not limit the load it generates.
The caller bounds a whole request's time with one `asyncio.timeout`: a timer per read costs
more than the read.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from armature.errors import ArmatureError

__all__ = ["HttpError", "HttpPool", "Response"]


class HttpError(ArmatureError, ConnectionError):
    """The connection failed or the server broke the protocol."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class Response:
    def __init__(self, pool: HttpPool, conn: _Conn, status: int, headers: dict[str, str]):
        self.pool = pool
        self.conn = conn
        self.status = status
        self.headers = headers
        self._done = False

    async def iter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked transfer decoded)."""
        reader = self.conn.reader
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size_line = await reader.readuntil(b"\r\n")
                    size = int(size_line.split(b";")[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                remaining = int(self.headers["content-length"])
                while remaining > 0:
                    data = await reader.read(min(remaining, 65536))
                    if not data:
                        raise HttpError("the connection closed mid-body")
                    remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(65536):
                    yield data
                self.headers["connection"] = "close"
            self._done = True
        except (asyncio.IncompleteReadError, ValueError) as exc:
            raise HttpError(f"malformed response body: {exc}") from None
        except (ConnectionError, OSError) as exc:
            raise HttpError(f"connection lost: {exc}") from None

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_raw()])

    def release(self) -> None:
        """Give the connection back (only a fully read, keep-alive response can be reused)."""
        if self._done and self.headers.get("connection", "").lower() != "close":
            self.pool.idle.append(self.conn)
        else:
            self.conn.close()


class HttpPool:
    def __init__(
        self,
        url: str,
        read_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
    ):
        """`api_key`: sent as `Authorization: Bearer KEY` (a server with API keys)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) url: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.base_path = parts.path.rstrip("/")
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Conn] = []
        self.auth = "" if api_key is None else f"Authorization: Bearer {api_key}\r\n"

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 20),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return _Conn(reader, writer)

    async def post(self, path: str, body: bytes) -> Response:
        request = (
            f"POST {self.base_path}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{self.auth}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        # An idle keep-alive connection may have been closed by the server (its keep-alive
        # timeout) without our having seen it yet: such a connection fails before a byte of
        # the response arrives, and the request goes again on a new connection. A retry
        # never takes another idle one, which may be just as stale.
        for attempt in range(2):
            reused = attempt == 0 and bool(self.idle)
            conn = self.idle.pop() if reused else await self._connect()
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
                conn.close()
                if reused:
                    continue
                raise HttpError(f"connection lost: {exc}") from None
            lines = head.decode("latin-1").split("\r\n")
            try:
                status = int(lines[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                conn.close()
                raise HttpError(f"malformed status line {lines[0]!r}") from None
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            return Response(self, conn, status, headers)
        raise HttpError("unreachable")

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
