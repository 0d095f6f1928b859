"""etcd discovery, over etcd's v3 JSON gateway (plain HTTP: no gRPC dependency).

register: grant a lease (TTL rounded up to whole seconds), put the key under it, and keep it
alive every ttl/3; a keepalive that finds the lease gone (etcd restarted without its data, or
we stalled past the TTL) grants a new lease and puts the key again. close: revoke the lease,
which deletes the key at once.
watch: list the prefix (as puts), then follow a streaming /v3/watch from the next revision;
when the stream breaks (etcd restarted), retry with backoff, re-list, emit the difference
(puts for new or changed keys, deletes for vanished ones) and follow again. A watch that
hears nothing for `watch_idle_s` re-lists and follows anew, quietly: etcd sends nothing on an
idle watch, so silence is the only sign of a connection that died without a reset (a host
powered off, a partition), which would otherwise hang the watch for good.

Security: `EtcdAccess` carries etcd's own options. A user and password authenticate once
(/v3/auth/authenticate) and every call carries the token; a call answered 401 (the token
expired) authenticates again and is retried once. https endpoints verify the server against
`ca_file` (else the system's CAs) and present `cert_file`/`key_file` where etcd demands client
certificates. The password never appears in errors or logs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import random
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from armature.errors import ArmatureError
from armature.runtime.discovery import Registration, WatchEvent

__all__ = ["EtcdAccess", "EtcdDiscovery", "EtcdError"]

log = logging.getLogger(__name__)

# A watch silent this long is listed and followed anew (see the module's comment): one range
# a minute on an idle prefix, and a dead connection found within a minute.
WATCH_IDLE_S = 60.0


class EtcdError(ArmatureError, RuntimeError):
    """etcd answered with an error, or no endpoint could be reached."""


@dataclass(frozen=True)
class EtcdAccess:
    """etcd's authentication and TLS options (all optional)."""

    user: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.user is None) != (self.password is None):
            raise ValueError("an etcd user needs a password, and a password a user")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("an etcd client certificate needs its key file, and a key its cert")

    def __repr__(self) -> str:  # never show the password
        return f"EtcdAccess(user={self.user!r}, ca_file={self.ca_file!r})"

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for https endpoints; OSError or ssl.SSLError for unusable files."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (etcd's range_end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _message(response: httpx.Response) -> str:
    """etcd's error message from a gateway answer (its JSON `message`, else the body)."""
    try:
        return str(response.json().get("message") or response.text)
    except ValueError:
        return response.text


class _EtcdRegistration:
    def __init__(self, owner: EtcdDiscovery, key: str, value: bytes, ttl_s: float):
        self.owner = owner
        self.key = key
        self.value = value
        self.ttl_s = ttl_s
        self.lease_id = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._grant_and_put()
        self._task = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _grant_and_put(self) -> None:
        """A new lease with the key on it; the lease is kept only once the put succeeded (a
        lease kept after a failed put would be renewed forever with no key on it)."""
        ttl = max(1, math.ceil(self.ttl_s))
        granted = await self.owner.call("/v3/lease/grant", {"TTL": ttl})
        lease_id = int(granted["ID"])
        try:
            await self.owner.call(
                "/v3/kv/put",
                {"key": _b64(self.key.encode()), "value": _b64(self.value), "lease": lease_id},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await self.owner.call("/v3/lease/revoke", {"ID": lease_id})
            raise
        self.lease_id = lease_id

    async def _keep_alive(self) -> None:
        """Renew the lease every third of its TTL; once it is gone, register again (until a
        put succeeds). Any failure is logged and the next round tries again."""
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                answer = await self.owner.call("/v3/lease/keepalive", {"ID": self.lease_id})
                if int(answer.get("result", {}).get("TTL", 0)) <= 0:
                    log.warning("etcd lease for %s is gone; registering again", self.key)
                    await self._grant_and_put()
            except Exception as exc:  # an answer of an unexpected shape too: never stop
                log.warning("etcd keepalive for %s failed: %s", self.key, exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(EtcdError):
            await self.owner.call("/v3/lease/revoke", {"ID": self.lease_id})


class EtcdDiscovery:
    def __init__(
        self,
        endpoints: Sequence[str] = ("http://127.0.0.1:2379",),
        request_timeout_s: float = 5.0,
        retry_max_s: float = 2.0,
        access: EtcdAccess | None = None,
        watch_idle_s: float = WATCH_IDLE_S,
    ):
        """ValueError for unusable options, OSError or ssl.SSLError for unreadable TLS files."""
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if not watch_idle_s > 0:
            raise ValueError(f"watch_idle_s must be > 0, got {watch_idle_s}")
        self.watch_idle_s = watch_idle_s
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.retry_max_s = retry_max_s
        self.access = access or EtcdAccess()
        tls = any(e.startswith("https://") for e in self.endpoints)
        verify: ssl.SSLContext | bool = self.access.ssl_context() if tls else True
        self._client = httpx.AsyncClient(timeout=request_timeout_s, verify=verify)
        self._next = 0
        self._token: str | None = None

    async def check(self, prefix: str) -> None:
        """Reach etcd, authenticate and read under `prefix` now: EtcdError names what is
        wrong (unreachable, refused credentials, no permission)."""
        raw = prefix.encode()
        body = {"key": _b64(raw), "range_end": _b64(_prefix_end(raw)), "limit": 1}
        await self.call("/v3/kv/range", body)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the gateway, trying each endpoint once; EtcdError if none answers."""
        if self.access.user is not None and self._token is None:
            await self._authenticate()
        response = await self._post(path, body)
        if response.status_code == 401 and self.access.user is not None:
            await self._authenticate()  # the token expired
            response = await self._post(path, body)
        if response.status_code != 200:
            raise EtcdError(f"etcd {path} answered {response.status_code}: {_message(response)}")
        answer: dict[str, Any] = response.json()
        return answer

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        errors = []
        for _ in range(len(self.endpoints)):
            endpoint = self.endpoints[self._next % len(self.endpoints)]
            try:
                return await self._client.post(
                    f"{endpoint}{path}", json=body, headers=self._headers()
                )
            except (httpx.HTTPError, ssl.SSLError) as exc:  # TLS alerts may come unwrapped
                errors.append(f"{endpoint}: {exc!r}")
                self._next += 1
        raise EtcdError(f"no etcd endpoint answered {path}: {'; '.join(errors)}")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token is not None else {}

    async def _authenticate(self) -> None:
        self._token = None
        body = {"name": self.access.user, "password": self.access.password}
        response = await self._post("/v3/auth/authenticate", body)
        if response.status_code != 200:
            raise EtcdError(f"etcd refused user {self.access.user!r}: {_message(response)}")
        self._token = str(response.json()["token"])

    async def register(self, key: str, value: bytes, ttl_s: float) -> Registration:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        registration = _EtcdRegistration(self, key, value, ttl_s)
        await registration.start()
        return registration

    async def _range(self, prefix: str) -> tuple[dict[str, bytes], int]:
        raw = prefix.encode()
        answer = await self.call(
            "/v3/kv/range", {"key": _b64(raw), "range_end": _b64(_prefix_end(raw))}
        )
        revision = int(answer["header"]["revision"])
        kvs = answer.get("kvs", [])
        return {_unb64(kv["key"]).decode(): _unb64(kv.get("value", "")) for kv in kvs}, revision

    async def list(self, prefix: str) -> dict[str, bytes]:
        return (await self._range(prefix))[0]

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        known: dict[str, bytes] = {}
        backoff_s = 0.1
        broken_s = 0.1  # the wait after a watch broke: doubles while it keeps breaking
        while True:
            try:
                current, revision = await self._range(prefix)
            except EtcdError as exc:
                log.warning("etcd watch on %r waiting for etcd: %s", prefix, exc)
                await asyncio.sleep(backoff_s + random.uniform(0, backoff_s))
                backoff_s = min(self.retry_max_s, backoff_s * 2)
                continue
            backoff_s = 0.1
            for key, value in current.items():
                if known.get(key) != value:
                    yield WatchEvent("put", key, value)
            for key in known.keys() - current.keys():
                yield WatchEvent("delete", key)
            known = current
            try:
                async for event in self._follow(prefix, revision + 1):
                    broken_s = 0.1  # it works: a later break resumes at once again
                    if event.kind == "put":
                        known[event.key] = event.value
                    else:
                        known.pop(event.key, None)
                    yield event
            except httpx.ReadTimeout:
                # nothing heard for watch_idle_s: idle, or a connection dead without a reset
                log.debug(
                    "etcd watch on %r silent for %gs; listing again", prefix, self.watch_idle_s
                )
            except (httpx.HTTPError, ssl.SSLError, EtcdError, ValueError) as exc:
                # a watch that keeps failing at once (the range works, the watch does not)
                # backs off as a failing range does, not ten tries a second
                log.warning("etcd watch on %r broke (%s); resuming", prefix, exc)
                await asyncio.sleep(broken_s + random.uniform(0, broken_s))
                broken_s = min(self.retry_max_s, broken_s * 2)

    async def _follow(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        raw = prefix.encode()
        body = {
            "create_request": {
                "key": _b64(raw),
                "range_end": _b64(_prefix_end(raw)),
                "start_revision": start_revision,
            }
        }
        endpoint = self.endpoints[self._next % len(self.endpoints)]
        timeout = httpx.Timeout(5.0, read=self.watch_idle_s)
        async with self._client.stream(
            "POST", f"{endpoint}/v3/watch", json=body, timeout=timeout, headers=self._headers()
        ) as response:
            if response.status_code != 200:
                raise EtcdError(f"etcd watch answered {response.status_code}")
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                message = json.loads(line)
                if "error" in message:
                    raise EtcdError(f"etcd watch error: {message['error']}")
                result = message.get("result", {})
                if result.get("canceled"):
                    raise EtcdError(f"etcd cancelled the watch: {result.get('cancel_reason')}")
                for event in result.get("events", []):
                    kv = event["kv"]
                    key = _unb64(kv["key"]).decode()
                    if event.get("type") == "DELETE":
                        yield WatchEvent("delete", key)
                    else:
                        yield WatchEvent("put", key, _unb64(kv.get("value", "")))
        raise EtcdError("etcd closed the watch stream")

    async def close(self) -> None:
        await self._client.aclose()
