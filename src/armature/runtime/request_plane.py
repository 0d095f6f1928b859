"""The request plane's contract and its transport-independent part.

TCP (tcp_server/tcp_client) and NATS (nats_plane) implement the two sides below; urls say
which: tcp://host:port or nats:<subject>. `serve_stream` is the server side of one stream on
either transport: the handler's items go out as Data frames, never more than the stream's
credit ahead of the client, then End, or Fail with a code the client can act on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from armature.engines.api import wait_for_event
from armature.errors import ArmatureError
from armature.protocols.failures import FailureCode
from armature.runtime.frames import Data, End, Fail, Frame

__all__ = [
    "ClientGoneError",
    "CreditTimeoutError",
    "CreditWindow",
    "Handler",
    "HandlerError",
    "PeerUnavailableError",
    "RemoteError",
    "RequestClient",
    "RequestServer",
    "ServerFactory",
    "payloads",
    "serve_stream",
    "take_waiting",
]

log = logging.getLogger(__name__)

Handler = Callable[[bytes], AsyncIterator[bytes]]


class HandlerError(ArmatureError):
    """Raised by a handler to fail its stream with a code the client can act on."""

    def __init__(self, code: FailureCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class ClientGoneError(ArmatureError):
    """A server could not send on a stream: its client (or the connection) is gone."""


class PeerUnavailableError(ArmatureError, ConnectionError):
    """The peer cannot be reached, or the connection carrying the stream was lost."""


class RemoteError(ArmatureError, RuntimeError):
    """The server failed the stream (a Fail frame) with `code`."""

    def __init__(self, code: FailureCode, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RequestServer(Protocol):
    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class RequestClient(Protocol):
    def stream(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        """Response payloads; closing early cancels. PeerUnavailableError if the peer is
        gone, RemoteError for a failure the server reports."""
        ...

    def stream_batches(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[list[bytes]]:
        """As `stream`, but each item is every payload that had arrived when the consumer
        asked (at least one, in order): a consumer that fell behind catches up in one step."""
        ...

    async def close(self) -> None: ...


async def payloads(batches: AsyncIterator[list[bytes]]) -> AsyncIterator[bytes]:
    """The payloads of a `stream_batches` stream one by one; closing this closes it."""
    try:
        async for batch in batches:
            for payload in batch:
                yield payload
    finally:
        await batches.aclose()  # type: ignore[attr-defined]


def take_waiting(queue: asyncio.Queue[Any], first: Data) -> tuple[list[bytes], Any]:
    """`first`'s payload and those of the Data frames queued right behind it, and the first
    other item taken from `queue` (None if the queue ran empty): the caller handles it next."""
    batch = [first.payload]
    while not queue.empty():
        item = queue.get_nowait()
        if not isinstance(item, Data):
            return batch, item
        batch.append(item.payload)
    return batch, None


ServerFactory = Callable[[Mapping[str, Handler]], RequestServer]


class CreditTimeoutError(ArmatureError):
    """A stream's client granted no credit for the idle timeout (a handler's own timeouts
    are not this)."""


class CreditWindow:
    """How many more items the client will take; the client's Credit frames add to it."""

    def __init__(self, credit: int):
        self.credit = credit
        self._changed = asyncio.Event()

    def grant(self, n: int) -> None:
        if n > 0:
            self.credit += n
            self._changed.set()

    async def take(self, timeout_s: float | None) -> None:
        """Wait for credit (CreditTimeoutError after `timeout_s`), then use one."""
        while self.credit <= 0:
            self._changed.clear()
            if timeout_s is None:
                await self._changed.wait()
            elif not await wait_for_event(self._changed, timeout_s):  # keeps a cancel
                raise CreditTimeoutError(
                    f"no credit from the client for {timeout_s:g} s: the stream was cancelled"
                )
        self.credit -= 1


async def serve_stream(
    stream_id: int,
    endpoint: str,
    payload: bytes,
    handlers: Mapping[str, Handler],
    window: CreditWindow,
    send: Callable[[Frame], Awaitable[None]],
    *,
    idle_timeout_s: float | None = None,
    lost: Callable[[], bool] = lambda: False,
) -> None:
    """Run `endpoint`'s handler on `payload` and send its stream. Cancellation (the client's
    Cancel, or its connection closing) stops it silently; so does `lost()` turning true (the
    transport dropped messages) and a client that grants no credit for `idle_timeout_s`."""

    async def send_quietly(frame: Frame) -> None:
        try:
            await send(frame)
        except Exception as exc:  # the peer is gone: nobody to tell
            log.debug("request plane: could not send %s: %s", type(frame).__name__, exc)

    handler = handlers.get(endpoint)
    try:
        if handler is None:
            await send(Fail(stream_id, FailureCode.NOT_FOUND, f"no endpoint {endpoint!r}"))
            return
        items = handler(payload)
        try:
            async for item in items:
                await window.take(idle_timeout_s)
                if lost():
                    log.warning("request plane: stream %d lost in a reconnect", stream_id)
                    return
                await send(Data(stream_id, item))
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        await send(End(stream_id))
    except asyncio.CancelledError:
        pass  # cancelled by the client or the connection closing: nothing to send
    except CreditTimeoutError as exc:
        log.warning("request plane: the client of stream %d went silent; cancelled", stream_id)
        # a client that is alive after all (its credit lost on the way) hears why at once,
        # where it waited out its stall timeout for data that would never come
        await send_quietly(Fail(stream_id, FailureCode.UNAVAILABLE, str(exc)))
    except HandlerError as exc:
        await send_quietly(Fail(stream_id, exc.code, exc.message))
    except ClientGoneError as exc:  # nobody to answer
        log.info("request plane: stream %d: the client left (%s)", stream_id, exc)
    except Exception as exc:
        log.exception("request plane: handler %r failed", endpoint)
        await send_quietly(Fail(stream_id, FailureCode.INTERNAL, f"{type(exc).__name__}: {exc}"))
