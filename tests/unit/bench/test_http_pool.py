"""The load generator's HTTP pool against a server that closes idle keep-alive connections."""

from __future__ import annotations

import asyncio

from armature.bench.http import HttpError, HttpPool
from polling import wait_until

BODY = b'{"ok": true}'


class ClosingServer:
    """Answers one request per connection (keep-alive implied), then closes it, as a server
    whose keep-alive timeout has passed does. `mode` "drop": closes a connection without an
    answer."""

    def __init__(self, mode: str = "answer"):
        self.mode = mode
        self.num_connections = 0
        self.num_answered = 0
        self.num_closed = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            if self.mode == "answer":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
                    + BODY
                )
                await writer.drain()
                self.num_answered += 1
        finally:
            writer.close()
            self.num_closed += 1


async def _post(pool: HttpPool) -> bytes:
    response = await pool.post("/v1/completions", b'{"prompt": "x"}')
    body = await response.read()
    response.release()
    return body


async def test_a_request_after_the_server_closed_every_idle_connection_succeeds() -> None:
    server = ClosingServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}")
    try:
        assert await asyncio.gather(*(_post(pool) for _ in range(3))) == [BODY] * 3
        assert len(pool.idle) == 3  # kept alive on our side
        await wait_until(lambda: server.num_closed == 3, "closed by the server")
        assert await _post(pool) == BODY
        # the stale connection tried first, then a new one (not a second stale one)
        assert server.num_connections == 4
        assert server.num_answered == 4
        assert len(pool.idle) == 2 + 1  # two stale ones left, the new one given back
    finally:
        pool.close()
        listener.close()
        await listener.wait_closed()


async def test_a_new_connection_closed_without_an_answer_is_an_error_not_a_retry() -> None:
    server = ClosingServer(mode="drop")
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}")
    try:
        try:
            await _post(pool)
        except HttpError as exc:
            assert str(exc).startswith("connection lost")
        else:
            raise AssertionError("a dropped request must fail")
        assert server.num_connections == 1  # not sent twice
    finally:
        pool.close()
        listener.close()
        await listener.wait_closed()
