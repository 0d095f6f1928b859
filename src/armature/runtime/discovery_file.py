"""File discovery: processes on one host share a directory, no server.

    DIR/leases/<lease id>        an empty file; its mtime is the lease's last renewal
    DIR/entries/<quoted key>     msgpack {value, lease, ttl_s}; written atomically

An entry is live while its lease file exists and was renewed less than `ttl_s` ago; a process
that dies stops renewing and its entries expire, and whoever next looks deletes them. Watchers
poll (every `poll_interval_s`) and diff. The default directory is per user:
$XDG_RUNTIME_DIR/armature/discovery, else /tmp/armature-<uid>/discovery.

A directory removed under the fleet (a tmp cleaner, an operator) is made again: each
registration writes its entry again at its next renewal, and a watcher keeps what it knew
for `DIRECTORY_LOSS_GRACE_S` meanwhile (as through a discovery outage) instead of seeing
every worker leave, or stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote, unquote

import msgspec

from armature.runtime.discovery import Registration, WatchEvent

__all__ = ["FileDiscovery", "default_discovery_dir"]

log = logging.getLogger(__name__)

# how long a watcher keeps the entries it knew after the directory went missing: longer than
# a registration takes to renew (a third of its lease's TTL) at the usual TTLs
DIRECTORY_LOSS_GRACE_S = 30.0


class _Entry(msgspec.Struct, frozen=True):
    value: bytes
    lease: str
    ttl_s: float


def default_discovery_dir() -> Path:
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime_dir)
        if runtime_dir
        else Path(tempfile.gettempdir()) / f"armature-{os.getuid()}"
    )
    return (base / "armature" / "discovery") if runtime_dir else (base / "discovery")


class _FileRegistration:
    def __init__(self, owner: FileDiscovery, key: str, value: bytes, ttl_s: float):
        self.owner = owner
        self.key = key
        self.value = value
        self.ttl_s = ttl_s
        self.lease_path = owner.leases_dir / uuid.uuid4().hex
        self.lease_path.touch()
        owner.write_entry(key, _Entry(value, self.lease_path.name, ttl_s))
        self._task = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        """Touch the lease every third of its TTL; one collected meanwhile (we were stalled)
        is registered again. A failure (no space, too many open files) is logged and the
        next round tries again: the renewal never stops while the registration lives."""
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                try:
                    os.utime(self.lease_path)
                except FileNotFoundError:
                    self.owner.make_dirs()  # the directory may be gone too
                    self.lease_path.touch()
                    self.owner.write_entry(
                        self.key, _Entry(self.value, self.lease_path.name, self.ttl_s)
                    )
            except OSError as exc:
                log.warning("renewing the lease of %s failed: %s", self.key, exc)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(FileNotFoundError):
            self.owner.entry_path(self.key).unlink()
        with contextlib.suppress(FileNotFoundError):
            self.lease_path.unlink()


class FileDiscovery:
    def __init__(self, directory: Path | None = None, poll_interval_s: float = 0.1):
        self.directory = Path(directory) if directory is not None else default_discovery_dir()
        self.poll_interval_s = poll_interval_s
        self.entries_dir = self.directory / "entries"
        self.leases_dir = self.directory / "leases"
        self.make_dirs()

    def make_dirs(self) -> None:
        self.entries_dir.mkdir(parents=True, exist_ok=True)
        self.leases_dir.mkdir(parents=True, exist_ok=True)

    def entry_path(self, key: str) -> Path:
        return self.entries_dir / quote(key, safe="")

    def write_entry(self, key: str, entry: _Entry) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.entries_dir, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.msgpack.encode(entry))
        os.replace(tmp, self.entry_path(key))

    async def register(self, key: str, value: bytes, ttl_s: float) -> Registration:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        return _FileRegistration(self, key, value, ttl_s)

    async def list(self, prefix: str) -> dict[str, bytes]:
        return self._scan(prefix) or {}

    def _scan(self, prefix: str) -> dict[str, bytes] | None:
        """The live entries under `prefix`; None when the directory was gone (made again)."""
        live: dict[str, bytes] = {}
        now = time.time()
        try:
            paths = list(self.entries_dir.iterdir())
        except FileNotFoundError:
            self.make_dirs()
            return None
        for path in paths:
            if path.name.startswith(".tmp-"):
                continue
            key = unquote(path.name)
            if not key.startswith(prefix):
                continue
            try:
                entry = msgspec.msgpack.decode(path.read_bytes(), type=_Entry)
            except FileNotFoundError:
                continue
            except msgspec.DecodeError:
                continue  # a foreign or corrupt file: not ours to interpret
            lease = self.leases_dir / entry.lease
            try:
                renewed = lease.stat().st_mtime
            except FileNotFoundError:
                renewed = 0.0
            if now - renewed < entry.ttl_s:
                live[key] = entry.value
            else:  # expired: collect it so that it does not linger
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                with contextlib.suppress(FileNotFoundError):
                    lease.unlink()
        return live

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        known: dict[str, bytes] = {}
        hold_until_s = 0.0  # after the directory went missing: keep what was known till then
        while True:
            current = self._scan(prefix)
            if current is None:
                log.warning(
                    "the discovery directory %s was gone: made again; keeping the %d entries "
                    "known while they register again",
                    self.directory,
                    len(known),
                )
                hold_until_s = time.monotonic() + DIRECTORY_LOSS_GRACE_S
                current = {}
            for key, value in current.items():
                if known.get(key) != value:
                    yield WatchEvent("put", key, value)
            if time.monotonic() < hold_until_s:
                known = {**known, **current}
            else:
                for key in known.keys() - current.keys():
                    yield WatchEvent("delete", key)
                known = current
            await asyncio.sleep(self.poll_interval_s)

    async def close(self) -> None:
        return None
