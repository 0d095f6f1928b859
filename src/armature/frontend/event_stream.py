"""The HTTP response of a streamed completion: server-sent events, one body chunk per item.

Starlette's StreamingResponse, on an ASGI server of spec 2.3 (uvicorn's), runs each response
in an anyio task group with a second task that listens for the client leaving. This response
does the same with one plain task per response: a listener that waits on `receive` for
`http.disconnect` (or fails to read it, logged) and cancels the streaming task, whose
cancellation ends here (the client is gone). The events are closed when the response ends,
however it ends; closing them closes the engine streams and aborts their requests. An outside
cancellation (the server stopping) still propagates.

The chunk that ends with `data: [DONE]` also ends the HTTP body (one socket write less per
request); the events are still read to their end, so their own accounting runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["EventStreamResponse"]

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncGenerator[str | bytes, None], headers: Mapping[str, str] | None = None
    ):
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        state = _State()

        def on_disconnect(listener: asyncio.Task[None]) -> None:
            if listener.cancelled():
                return
            failure = listener.exception()
            if failure is not None:  # the client can no longer be read: it is as good as gone
                log.warning("reading the client failed (%r); ending its stream", failure)
            if not state.ended:
                state.left = True
                task.cancel()

        listener = asyncio.get_running_loop().create_task(_disconnect(receive))
        listener.add_done_callback(on_disconnect)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for item in self.events:
                if state.ended:
                    continue  # nothing follows [DONE]; read on so the events finish
                chunk = item if isinstance(item, bytes) else item.encode()
                last = chunk.endswith(DONE)
                state.ended = last
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if not state.ended:
                state.ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state.left or task.uncancel() > cancelling:
                raise
        finally:
            state.ended = True
            listener.cancel()
            await self.events.aclose()  # cancelled in `send`, the events are still open


class _State:
    __slots__ = ("ended", "left")

    def __init__(self) -> None:
        self.ended = False  # the body's end was sent: a disconnect now cancels nothing
        self.left = False  # the client left: the listener cancelled the streaming task


async def _disconnect(receive: Receive) -> None:
    """Returns when the client disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass
