"""Discovery with leases (DESIGN §2): the contract, and the in-process (`mem`) backend.

A process registers keys under a lease it keeps alive; when it stops renewing (crash, kill -9)
the lease expires after `ttl_s` and its keys vanish, with no action by anyone. Watchers get the
live keys under a prefix first (as puts), then every change, in order.

    register(key, value, ttl_s) -> Registration   (renewed in the background until closed)
    watch(prefix) -> async iterator of WatchEvent (put / delete)
    list(prefix) -> {key: value}

Backends: `MemDiscovery` (one process), `FileDiscovery` (processes on one host, no server),
`EtcdDiscovery` (many hosts) and `KubernetesDiscovery` (Pods: a Ready Pod's annotation holds
its process's keys; the Pod's readiness and deletion are the lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from armature.config import DEFAULT_LEASE_TTL_S

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "Discovery",
    "MemDiscovery",
    "MemStore",
    "Registration",
    "WatchEvent",
]


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes = b""


class Registration(Protocol):
    key: str

    async def close(self) -> None:
        """Stop renewing and delete the key now (a clean shutdown)."""
        ...


class Discovery(Protocol):
    async def register(self, key: str, value: bytes, ttl_s: float) -> Registration: ...

    def watch(self, prefix: str) -> AsyncIterator[WatchEvent]: ...

    async def list(self, prefix: str) -> dict[str, bytes]: ...

    async def close(self) -> None: ...


class MemStore:
    """The shared state of every MemDiscovery in one process. `clock` gives seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.entries: dict[str, tuple[bytes, float]] = {}  # key -> (value, expiry_s)
        self.watchers: list[tuple[str, asyncio.Queue[WatchEvent]]] = []

    def put(self, key: str, value: bytes, expiry_s: float) -> None:
        old = self.entries.get(key)
        self.entries[key] = (value, expiry_s)
        if old is None or old[0] != value:
            self._notify(WatchEvent("put", key, value))

    def renew(self, key: str, expiry_s: float) -> bool:
        entry = self.entries.get(key)
        if entry is None:
            return False
        self.entries[key] = (entry[0], expiry_s)
        return True

    def delete(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self._notify(WatchEvent("delete", key))

    def expire(self) -> None:
        now = self.clock()
        for key in [k for k, (_, expiry) in self.entries.items() if expiry <= now]:
            self.delete(key)

    def _notify(self, event: WatchEvent) -> None:
        for prefix, queue in self.watchers:
            if event.key.startswith(prefix):
                queue.put_nowait(event)


class _MemRegistration:
    def __init__(self, store: MemStore, key: str, value: bytes, ttl_s: float):
        self.store = store
        self.key = key
        self.value = value
        self.ttl_s = ttl_s
        store.put(key, value, store.clock() + ttl_s)
        self._task = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            if not self.store.renew(self.key, self.store.clock() + self.ttl_s):
                self.store.put(self.key, self.value, self.store.clock() + self.ttl_s)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.store.delete(self.key)


class MemDiscovery:
    """In-process discovery; pass one MemStore to every user in the process."""

    def __init__(self, store: MemStore | None = None, expire_interval_s: float = 0.1):
        self.store = store or MemStore()
        self.expire_interval_s = expire_interval_s
        self._expirer: asyncio.Task[None] | None = None

    def _ensure_expirer(self) -> None:
        if self._expirer is None:
            self._expirer = asyncio.get_running_loop().create_task(self._expire_forever())

    async def _expire_forever(self) -> None:
        while True:
            self.store.expire()
            await asyncio.sleep(self.expire_interval_s)

    async def register(self, key: str, value: bytes, ttl_s: float) -> Registration:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self._ensure_expirer()
        return _MemRegistration(self.store, key, value, ttl_s)

    async def list(self, prefix: str) -> dict[str, bytes]:
        self.store.expire()
        return {k: v for k, (v, _) in self.store.entries.items() if k.startswith(prefix)}

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        self._ensure_expirer()
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        entry = (prefix, queue)
        self.store.watchers.append(entry)
        try:
            for key, value in (await self.list(prefix)).items():
                yield WatchEvent("put", key, value)
            while True:
                yield await queue.get()
        finally:
            self.store.watchers.remove(entry)

    async def close(self) -> None:
        if self._expirer is not None:
            self._expirer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expirer
            self._expirer = None
