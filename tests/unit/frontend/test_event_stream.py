"""EventStreamResponse against a recording ASGI server: the exact messages sent, the body
ended with the [DONE] chunk, the events read to their end, and a client that leaves (while
the events wait, or while a write waits) closing the events without an error, while an
outside cancellation still propagates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from armature.frontend.event_stream import EventStreamResponse


class Client:
    """The server side of one HTTP exchange: what was sent, and a client that can leave."""

    def __init__(self, block_sends_after: int | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.left = asyncio.Event()
        self.block_sends_after = block_sends_after
        self.send_blocked = asyncio.Event()
        self.receive_error: Exception | None = None  # raised by receive when the client leaves

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        if self.receive_error is not None:
            raise self.receive_error
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if self.block_sends_after is not None and len(self.sent) > self.block_sends_after:
            self.send_blocked.set()
            await asyncio.Event().wait()  # a socket that never drains

    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent[1:]]


class Events:
    def __init__(self, items: list[str | bytes], then_wait: bool = False) -> None:
        self.items = items
        self.then_wait = then_wait
        self.finished = False  # the code after the last yield ran
        self.closed = False
        self.waiting = asyncio.Event()

    async def run(self) -> AsyncGenerator[str | bytes, None]:
        try:
            for item in self.items:
                yield item
            if self.then_wait:
                self.waiting.set()
                await asyncio.Event().wait()
            self.finished = True
        finally:
            self.closed = True


async def serve(response: EventStreamResponse, client: Client) -> None:
    await response({"type": "http"}, client.receive, client.send)  # type: ignore[arg-type]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # a client's leaving was taken back


async def test_the_done_chunk_ends_the_body_and_the_events_run_to_their_end() -> None:
    events = Events([b"data: 1\n\n", "data: \u00e9\n\n", b"data: 2\n\ndata: [DONE]\n\n"])
    client = Client()
    await serve(EventStreamResponse(events.run(), headers={"x-request-id": "r1"}), client)
    start = client.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"x-request-id"] == b"r1"
    assert b"content-length" not in headers
    assert client.bodies() == [
        (b"data: 1\n\n", True),
        ("data: \u00e9\n\n".encode(), True),
        (b"data: 2\n\ndata: [DONE]\n\n", False),
    ]
    assert events.finished and events.closed


async def test_a_stream_without_done_ends_with_an_empty_chunk() -> None:
    events = Events(["event: a\ndata: {}\n\n"])
    client = Client()
    await serve(EventStreamResponse(events.run()), client)
    assert client.bodies() == [(b"event: a\ndata: {}\n\n", True), (b"", False)]
    assert events.finished


async def test_a_client_that_leaves_while_the_events_wait_closes_them() -> None:
    events = Events([b"data: 1\n\n"], then_wait=True)
    client = Client()
    task = asyncio.create_task(serve(EventStreamResponse(events.run()), client))
    await events.waiting.wait()
    client.left.set()
    await task  # no error: the client is gone
    assert events.closed and not events.finished
    assert client.bodies() == [(b"data: 1\n\n", True)]


async def test_a_client_that_leaves_while_a_write_waits_closes_the_events() -> None:
    events = Events([b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"])
    client = Client(block_sends_after=1)  # the first body chunk's write never completes
    task = asyncio.create_task(serve(EventStreamResponse(events.run()), client))
    await client.send_blocked.wait()
    client.left.set()
    await task
    assert events.closed and not events.finished


async def test_a_client_that_cannot_be_read_ends_its_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = Events([b"data: 1\n\n"], then_wait=True)
    client = Client()
    client.receive_error = RuntimeError("transport broke")
    task = asyncio.create_task(serve(EventStreamResponse(events.run()), client))
    await events.waiting.wait()
    client.left.set()
    await task  # ended like a client that left, not with the read's error
    assert events.closed and not events.finished
    assert "reading the client failed (RuntimeError('transport broke'))" in caplog.text


async def test_a_leaving_client_and_an_outside_cancellation_together_propagate() -> None:
    """The listener's cancel and the server's land in the same turn: the server's wins."""
    events = Events([], then_wait=True)
    client = Client()
    task = asyncio.create_task(serve(EventStreamResponse(events.run()), client))
    await events.waiting.wait()
    client.left.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events.closed


async def test_an_outside_cancellation_propagates() -> None:
    events = Events([], then_wait=True)
    client = Client()
    task = asyncio.create_task(serve(EventStreamResponse(events.run()), client))
    await events.waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events.closed


async def test_a_disconnect_after_the_end_cancels_nothing() -> None:
    """The client may close as soon as it has [DONE]: the events still finish."""
    gate = asyncio.Event()

    async def run() -> AsyncGenerator[bytes, None]:
        yield b"data: [DONE]\n\n"
        client.left.set()  # the listener sees the disconnect before the events end
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        gate.set()

    client = Client()
    await serve(EventStreamResponse(run()), client)
    assert gate.is_set()
    assert client.bodies() == [(b"data: [DONE]\n\n", False)]
