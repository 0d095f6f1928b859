"""A minimal OpenAI-style streaming server with a fixed schedule, for testing the load
generator: first chunk after `ttft_s`, then one chunk every `itl_s`, `tokens` chunks in all.
Modes: "ok", "http_500" (every request), "malformed" (garbage after the first chunk). With
`api_key`, a request without `Authorization: Bearer KEY` gets a 401. Its model, "fixed", is
listed with `max_model_len` where one is given."""

from __future__ import annotations

import asyncio
import json
import threading


class FixedServer:
    def __init__(
        self,
        ttft_s: float,
        itl_s: float,
        tokens: int,
        mode: str = "ok",
        api_key: str = "",
        max_model_len: int | None = None,
    ):
        self.ttft_s, self.itl_s, self.tokens, self.mode = ttft_s, itl_s, tokens, mode
        self.api_key = api_key
        self.listed: dict[str, object] = {"id": "fixed"}
        if max_model_len is not None:
            self.listed["max_model_len"] = max_model_len
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                expected = f"authorization: bearer {self.api_key}".encode()
                if self.api_key and expected not in head.lower().split(b"\r\n"):
                    body = b'{"error": {"message": "a valid API key is needed"}}'
                    await _send_json(writer, b"401 Unauthorized", body)
                    continue
                if head.startswith(b"GET /v1/models"):
                    body = json.dumps({"data": [self.listed]}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    await writer.drain()
                    continue
                await self._stream(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        if self.mode == "http_500":
            await _send_json(
                writer, b"500 Internal Server Error", b'{"error": {"message": "boom"}}'
            )
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

        def chunk(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        await asyncio.sleep(self.ttft_s)
        for i in range(self.tokens):
            if i:
                await asyncio.sleep(self.itl_s)
            if self.mode == "malformed" and i == 1:
                writer.write(chunk(b"data: {not json\n\n"))
                break
            event = {"choices": [{"index": 0, "text": " word"}]}
            writer.write(chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
            await writer.drain()
        usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": self.tokens}}
        writer.write(chunk(b"data: " + json.dumps(usage).encode() + b"\n\n"))
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()


async def _send_json(writer: asyncio.StreamWriter, status: bytes, body: bytes) -> None:
    writer.write(
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
