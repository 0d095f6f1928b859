"""The HTTP edge's gates, as ASGI middleware (no response buffering, streams untouched).

API keys: `Authorization: Bearer <key>` on the API, checked in constant time.

`/health`, `/live`, `/openapi.json` and the docs stay open; `/metrics` is open unless
`protect_metrics`. A refused request gets 401 in OpenAI's error format; keys are never logged
(the header is compared, never formatted). Body size: bodies over the limit get 413.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any

from armature.config import SecurityConfig
from armature.errors import ConfigError
from armature.frontend.errors import error_body

__all__ = [
    "ApiKeyMiddleware",
    "ApiKeys",
    "BodyLimitMiddleware",
    "load_api_keys",
    "read_key_file",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPEN_PATHS = frozenset({"/health", "/live", "/openapi.json", "/docs", "/redoc"})


class ApiKeys:
    def __init__(self, keys: Iterable[str]):
        self._keys = [k.encode() for k in keys if k]
        if not self._keys:
            raise ValueError("no API key given")

    def accepts(self, authorization: bytes | None) -> bool:
        """Whether an Authorization header value carries one of the keys. Every key is
        compared (no early exit), each in constant time."""
        # the scheme is case-insensitive (RFC 9110): "bearer KEY" as "Bearer KEY"
        if authorization is None or authorization[:7].lower() != b"bearer ":
            return False
        offered = authorization[len(b"Bearer ") :].strip()
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(offered, key)
        return found


def _sendable(key: str) -> bool:
    """Whether a key can travel in an Authorization header as clients send it."""
    return key.isascii() and key.isprintable()


def read_key_file(path: Path) -> list[str]:
    """One key per line; blank lines and `#` comments are skipped."""
    lines = path.read_text().splitlines()
    return [s for line in lines if (s := line.strip()) and not s.startswith("#")]


class ApiKeyMiddleware:
    """ASGI middleware (no response buffering, so streams are untouched)."""

    def __init__(self, app: App, keys: ApiKeys, protect_metrics: bool = False):
        self.app = app
        self.keys = keys
        self.protect_metrics = protect_metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization")
        if self.keys.accepts(authorization):
            await self.app(scope, receive, send)
            return
        message = (
            "Missing API key: send it as 'Authorization: Bearer <key>'"
            if authorization is None
            else "Incorrect API key provided"
        )
        body = json.dumps(error_body(message, "invalid_request_error", None, "invalid_api_key"))
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})

    def _is_open(self, path: str) -> bool:
        if path in _OPEN_PATHS:
            return True
        return path == "/metrics" and not self.protect_metrics


class BodyLimitMiddleware:
    """Refuse request bodies over `max_bytes` with 413 before the app parses them: by their
    Content-Length, or (chunked bodies) by reading at most `max_bytes` + 1 of them."""

    def __init__(self, app: App, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) <= self.max_bytes:
                await self.app(scope, receive, send)
            else:
                await self._too_large(send, length.decode(errors="replace"))
            return
        messages: list[MutableMapping[str, Any]] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._too_large(send, f"more than {self.max_bytes}")
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> MutableMapping[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, size: str) -> None:
        message = f"the request body ({size} bytes) exceeds the limit of {self.max_bytes} bytes"
        body = json.dumps(error_body(message, "invalid_request_error", None, "request_too_large"))
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})


def load_api_keys(security: SecurityConfig) -> ApiKeys | None:
    """The keys of `--api-key` (and its variable) and the key file; None when there are none.
    A key file that cannot be read or holds no key, a padded key, or `--protect-metrics`
    without a key is a ConfigError."""
    keys = list(security.api_keys)
    if any(not k or k != k.strip() for k in keys):
        raise ConfigError("--api-key must not be empty or carry surrounding spaces")
    if not all(_sendable(k) for k in keys):
        raise ConfigError("--api-key must be printable ASCII (a client sends it in a header)")
    if security.api_key_file:
        path = Path(security.api_key_file)
        try:
            from_file = read_key_file(path)
        except OSError as exc:
            raise ConfigError(f"cannot read the API key file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"the API key file {path} is not UTF-8 text") from None
        if not from_file:
            raise ConfigError(f"the API key file {path} holds no key")
        if not all(_sendable(k) for k in from_file):
            raise ConfigError(f"the API key file {path} holds a key that is not printable ASCII")
        keys += from_file
    if not keys:
        if security.protect_metrics:
            raise ConfigError("--protect-metrics needs an API key")
        return None
    return ApiKeys(keys)
