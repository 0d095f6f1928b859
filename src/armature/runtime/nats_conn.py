"""One way to connect to NATS: reconnect forever with a short wait, and log the transitions,
so that a restarted NATS server is picked up again by every user."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors
from nats.aio.client import Client

from armature.errors import ArmatureError

__all__ = ["NatsUnavailableError", "connect_nats", "end_quietly"]

log = logging.getLogger(__name__)


class NatsUnavailableError(ArmatureError, ConnectionError):
    """The NATS server cannot be reached at start."""


async def end_quietly(what: str, step: Awaitable[object]) -> None:
    """Await a clean-up `step` (an unsubscribe, a drain, a last Cancel) whose failure changes
    nothing: the connection is already closed or draining. NATS's own errors are logged at
    debug level, not raised; anything else is a bug and propagates."""
    try:
        await step
    except (nats.errors.Error, OSError) as exc:
        log.debug("NATS: could not %s: %r", what, exc)


async def _probe(url: str, timeout_s: float) -> None:
    """Fail fast when nothing listens: the client would otherwise retry its first connect
    for ever (it is configured to reconnect for ever once connected)."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("nats", "tls") or not parsed.hostname:
        raise NatsUnavailableError(f"not a NATS url: {url!r}")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parsed.hostname, parsed.port or 4222), timeout_s
        )
    except (OSError, TimeoutError) as exc:
        raise NatsUnavailableError(f"cannot connect to NATS at {_redacted(url)}: {exc}") from None
    writer.close()
    try:  # one handshake without retries: refused credentials fail here, not for ever
        probe = await nats.connect(
            url, connect_timeout=timeout_s, allow_reconnect=False, max_reconnect_attempts=0
        )
    except Exception as exc:  # nats raises several unrelated types for "cannot connect"
        raise NatsUnavailableError(f"NATS at {_redacted(url)} refused us: {exc}") from None
    await probe.close()


def _redacted(url: str) -> str:
    """`url` without the credentials it may carry (they must never reach a log)."""
    parsed = urlsplit(url)
    if parsed.username is None and parsed.password is None:
        return url
    return parsed._replace(netloc=f"***@{parsed.hostname}:{parsed.port or 4222}").geturl()


async def connect_nats(url: str, connect_timeout_s: float = 5.0) -> Client:
    """Connect to `url` (credentials go in it: nats://TOKEN@host or nats://USER:PASS@host);
    NatsUnavailableError when nothing listens or the server refuses us."""
    shown = _redacted(url)
    client = Client()

    async def disconnected() -> None:
        if not client.is_closed:  # its own close calls this too: nothing reconnects then
            log.warning("NATS %s: disconnected; reconnecting", shown)

    async def reconnected() -> None:
        log.info("NATS %s: reconnected", shown)

    async def error(exc: Exception) -> None:
        log.debug("NATS %s: %s", shown, exc)

    await _probe(url, connect_timeout_s)
    # seconds, which nats-py annotates as int and uses as float (nats.connect passes them on
    # untyped)
    timing: dict[str, Any] = {"connect_timeout": connect_timeout_s, "reconnect_time_wait": 0.2}
    try:
        await client.connect(
            url,
            **timing,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
        )
    except Exception as exc:  # nats raises several unrelated types for "cannot connect"
        raise NatsUnavailableError(f"cannot connect to NATS at {shown}: {exc}") from None
    return client
