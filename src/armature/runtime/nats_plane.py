"""The request plane over NATS: the same frames and stream semantics as the TCP plane.

    client -> <worker subject>          Open (reply = the client's inbox for this stream)
    server -> inbox                     Accept(control subject), then Data..., End | Fail
    client -> <control subject>         Credit, Cancel

NATS cannot tell a publisher that nobody listens, so a stream that is not accepted within
`accept_timeout_s` fails with PeerUnavailableError. A stream its caller closes before the
Accept came is cancelled when the Accept comes (its control subject is known only then).
Back-pressure is the same credit window as over TCP. A server stream whose client has gone
silent (no credit for `idle_timeout_s` while it waits for credit: the frontend died) is
cancelled with an UNAVAILABLE Fail. A NATS restart is survived by the client library's
reconnect; messages sent during the gap are lost, so a stream that was open across a reconnect
fails on both sides (PeerUnavailableError for the client, which reroutes what had not started;
cancellation on the worker, which frees the request's KV blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Mapping

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from armature.protocols.failures import FailureCode
from armature.runtime.frames import (
    Accept,
    Cancel,
    Credit,
    Data,
    End,
    Fail,
    Frame,
    FrameError,
    Open,
    decode_frame,
    encode_message,
)
from armature.runtime.nats_conn import end_quietly
from armature.runtime.request_plane import (
    CreditWindow,
    Handler,
    PeerUnavailableError,
    RemoteError,
    payloads,
    serve_stream,
    take_waiting,
)
from armature.runtime.stall_watch import StallWatch

__all__ = ["NatsRequestPlaneClient", "NatsRequestPlaneServer"]

log = logging.getLogger(__name__)

RECONNECT_CHECK_S = 1.0  # a stream waiting this long for a frame checks for a reconnect


class _ServerStream:
    def __init__(self, credit: int):
        self.window = CreditWindow(credit)
        self.task: asyncio.Task[None] | None = None
        self.control: Subscription | None = None


class NatsRequestPlaneServer:
    def __init__(
        self,
        nc: Client,
        subject: str,
        handlers: Mapping[str, Handler],
        idle_timeout_s: float = 30.0,
    ):
        self.nc = nc
        self.subject = subject
        self.handlers = dict(handlers)
        self.idle_timeout_s = idle_timeout_s
        self._subscription: Subscription | None = None
        self._streams: dict[str, _ServerStream] = {}  # by control subject
        self._ids = itertools.count()

    @property
    def url(self) -> str:
        return f"nats:{self.subject}"

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(self.subject, cb=self._on_open)
        await self.nc.flush()  # the server has the subscription before anyone is told the url

    async def stop(self) -> None:
        if self._subscription is not None:
            await end_quietly("unsubscribe", self._subscription.unsubscribe())
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_open(self, msg: Msg) -> None:
        try:
            frame = decode_frame(msg.data)
        except FrameError as exc:
            log.warning("NATS request plane: dropping a bad message on %s: %s", msg.subject, exc)
            return
        if not isinstance(frame, Open) or not msg.reply or frame.credit <= 0:
            log.warning("NATS request plane: dropping an unexpected %s", type(frame).__name__)
            return
        control_subject = f"{self.subject}.ctl.{next(self._ids)}"
        stream = _ServerStream(frame.credit)
        self._streams[control_subject] = stream
        stream.control = await self.nc.subscribe(control_subject, cb=self._on_control)
        stream.task = asyncio.get_running_loop().create_task(
            self._serve(frame, msg.reply, control_subject, stream)
        )

    async def _on_control(self, msg: Msg) -> None:
        stream = self._streams.get(msg.subject)
        if stream is None:
            return
        try:
            frame = decode_frame(msg.data)
        except FrameError as exc:
            log.warning("NATS request plane: bad control message: %s", exc)
            return
        if isinstance(frame, Credit):
            stream.window.grant(frame.n)
        elif isinstance(frame, Cancel) and stream.task is not None:
            stream.task.cancel()

    async def _serve(self, frame: Open, inbox: str, control: str, stream: _ServerStream) -> None:
        reconnects = self.nc.stats["reconnects"]

        async def send(out: Frame) -> None:
            await self._send(inbox, out)

        try:
            await send(Accept(frame.stream_id, control))
            await serve_stream(
                frame.stream_id,
                frame.endpoint,
                frame.payload,
                self.handlers,
                stream.window,
                send,
                idle_timeout_s=self.idle_timeout_s,
                lost=lambda: self.nc.stats["reconnects"] != reconnects,
            )
        except Exception as exc:  # the Accept could not be sent: the client times out
            log.warning("NATS request plane: stream %d not accepted: %s", frame.stream_id, exc)
        finally:
            self._streams.pop(control, None)
            if stream.control is not None:
                await end_quietly("unsubscribe", stream.control.unsubscribe())

    async def _send(self, subject: str, frame: Frame) -> None:
        await self.nc.publish(subject, encode_message(frame))


async def _next_frame(queue: asyncio.Queue[Frame], watch: StallWatch) -> Frame | None:
    """The next frame of a stream, or None after `watch`'s limit without one (the caller then
    checks for a reconnect). Frames already waiting are taken without a timer, and the wait
    for one arms no timer of its own (see StallWatch)."""
    if not queue.empty():
        return queue.get_nowait()
    try:
        return await watch.wait(queue.get())
    except TimeoutError:
        return None


class NatsRequestPlaneClient:
    def __init__(self, nc: Client, window: int = 32, accept_timeout_s: float = 5.0):
        self.nc = nc
        self.window = window
        self.accept_timeout_s = accept_timeout_s
        self._ids = itertools.count(1)
        # streams closed before their Accept came: each waits for it to send the Cancel
        self._late_cancels: set[asyncio.Task[None]] = set()

    def stream(self, url: str, endpoint: str, payload: bytes) -> AsyncIterator[bytes]:
        """Stream `endpoint` at `url` (nats:<subject>)."""
        return payloads(self.stream_batches(url, endpoint, payload))

    async def stream_batches(
        self, url: str, endpoint: str, payload: bytes
    ) -> AsyncIterator[list[bytes]]:
        """Stream `endpoint` at `url` (nats:<subject>), every payload waiting at once."""
        if not url.startswith("nats:"):
            raise ValueError(f"not a nats url: {url!r}")
        subject = url.removeprefix("nats:")
        sid = next(self._ids)
        inbox = self.nc.new_inbox()
        queue: asyncio.Queue[Frame] = asyncio.Queue()

        async def on_message(msg: Msg) -> None:
            with contextlib.suppress(FrameError):
                queue.put_nowait(decode_frame(msg.data))

        try:
            subscription = await self.nc.subscribe(inbox, cb=on_message)
        except Exception as exc:
            raise PeerUnavailableError(f"NATS unavailable: {exc}") from None
        control: str | None = None
        watch: StallWatch | None = None
        finished = False
        reconnects = self.nc.stats["reconnects"]
        try:
            await self._publish(subject, Open(sid, endpoint, payload, self.window), reply=inbox)
            try:
                first = await asyncio.wait_for(queue.get(), self.accept_timeout_s)
            except TimeoutError:
                raise PeerUnavailableError(f"nobody accepted the stream on {subject}") from None
            if not isinstance(first, Accept):
                raise PeerUnavailableError(f"expected Accept, got {type(first).__name__}")
            control = first.control_subject
            consumed = 0
            watch = StallWatch(RECONNECT_CHECK_S)
            held: Frame | None = None  # taken from the queue behind a batch; handled next
            while True:
                item, held = (await _next_frame(queue, watch) if held is None else held), None
                if self.nc.stats["reconnects"] != reconnects:
                    raise PeerUnavailableError("NATS reconnected; the stream's messages were lost")
                if item is None:
                    continue
                if isinstance(item, Data):
                    batch, held = take_waiting(queue, item)
                    yield batch
                    consumed += len(batch)
                    if consumed >= self.window // 2:
                        await self._publish(control, Credit(sid, consumed))
                        consumed = 0
                elif isinstance(item, End):
                    finished = True
                    return
                elif isinstance(item, Fail):
                    finished = True
                    raise RemoteError(item.code, item.message)
        finally:
            if watch is not None:
                watch.close()
            if not finished and control is None:
                # closed before the Accept (the caller left while the worker had the Open
                # in hand): the worker would serve it until its idle timeout, holding a slot
                task = asyncio.get_running_loop().create_task(
                    self._cancel_when_accepted(sid, queue, subscription)
                )
                self._late_cancels.add(task)
                task.add_done_callback(self._late_cancels.discard)
            else:
                if not finished and control is not None:
                    await end_quietly("send a Cancel", self._publish(control, Cancel(sid)))
                await end_quietly("unsubscribe", subscription.unsubscribe())

    async def _cancel_when_accepted(
        self, sid: int, queue: asyncio.Queue[Frame], subscription: Subscription
    ) -> None:
        """Cancel stream `sid` once its Accept comes (if within the accept timeout)."""
        try:
            async with asyncio.timeout(self.accept_timeout_s):
                while True:
                    frame = await queue.get()
                    if isinstance(frame, Accept):
                        cancel = self._publish(frame.control_subject, Cancel(sid))
                        await end_quietly("send a Cancel", cancel)
                        return
        except TimeoutError:
            return  # never accepted: nothing runs on a worker
        finally:
            await end_quietly("unsubscribe", subscription.unsubscribe())

    async def _publish(self, subject: str, frame: Frame, reply: str = "") -> None:
        try:
            await self.nc.publish(subject, encode_message(frame), reply=reply)
        except (msgspec.EncodeError, FrameError):
            raise
        except nats.errors.MaxPayloadError:
            # the request's own size, not the peer: every worker would refuse it alike (read
            # as unreachable, each was routed around in turn and the request failed a 503)
            raise RemoteError(
                FailureCode.INVALID_REQUEST,
                f"the request is larger than the NATS server takes in one message "
                f"(max_payload {self.nc.max_payload} bytes)",
            ) from None
        except Exception as exc:
            raise PeerUnavailableError(f"NATS publish failed: {exc}") from None

    async def close(self) -> None:
        return None
