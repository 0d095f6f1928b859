"""Discovery backends (mem, file) against one contract: register, list, watch, clean
deregistration, and lease expiry when the owner stops renewing (crash). The lease tests wait
for events (renewals, the delete), never for a multiple of the lease: a loaded machine only
makes them slower."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from armature.runtime import discovery_file
from armature.runtime.discovery import Discovery, MemDiscovery, Registration, WatchEvent
from armature.runtime.discovery_file import FileDiscovery

DEADLINE_S = 30.0  # a bound for waits on events, far beyond their time on an idle machine


@pytest.fixture(params=["mem", "file"])
async def discovery(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Discovery]:
    d: Discovery = (
        MemDiscovery(expire_interval_s=0.05)
        if request.param == "mem"
        else FileDiscovery(tmp_path / "disc", poll_interval_s=0.05)
    )
    yield d
    await d.close()


async def next_event(watch: AsyncIterator[WatchEvent], timeout_s: float = 5.0) -> WatchEvent:
    return await asyncio.wait_for(anext(watch), timeout_s)


async def test_register_list_watch_deregister(discovery: Discovery) -> None:
    a = await discovery.register("instances/ns/worker/generate/1", b"card-a", ttl_s=5)
    watch = discovery.watch("instances/ns/")
    assert await next_event(watch) == WatchEvent("put", "instances/ns/worker/generate/1", b"card-a")
    b = await discovery.register("instances/ns/worker/generate/2", b"card-b", ttl_s=5)
    await discovery.register("other/x", b"not watched", ttl_s=5)
    assert await next_event(watch) == WatchEvent("put", "instances/ns/worker/generate/2", b"card-b")
    assert await discovery.list("instances/ns/") == {
        "instances/ns/worker/generate/1": b"card-a",
        "instances/ns/worker/generate/2": b"card-b",
    }
    await a.close()
    assert await next_event(watch) == WatchEvent("delete", "instances/ns/worker/generate/1")
    assert list(await discovery.list("instances/")) == ["instances/ns/worker/generate/2"]
    await b.close()
    await watch.aclose()  # type: ignore[attr-defined]


def renewal_stamp(discovery: Discovery, reg: Registration) -> Callable[[], float]:
    """What a renewal changes: the entry's expiry (mem) or the lease file's mtime (file)."""
    if isinstance(discovery, MemDiscovery):
        return lambda: discovery.store.entries[reg.key][1]
    lease_path: Path = reg.lease_path  # type: ignore[attr-defined]
    return lambda: lease_path.stat().st_mtime_ns


async def test_renewal_keeps_a_short_lease_alive(discovery: Discovery) -> None:
    """Four renewals (every ttl/3) span more than one lease; the key never went away."""
    reg = await discovery.register("k", b"v", ttl_s=1.0)
    watch = discovery.watch("k")
    assert await next_event(watch) == WatchEvent("put", "k", b"v")
    stamp = renewal_stamp(discovery, reg)
    seen = [stamp()]
    deadline_s = time.monotonic() + DEADLINE_S
    while len(seen) <= 4:
        assert time.monotonic() < deadline_s, f"only {len(seen) - 1} renewals"
        await asyncio.sleep(0.01)
        if stamp() != seen[-1]:
            seen.append(stamp())
    assert await discovery.list("k") == {"k": b"v"}
    with pytest.raises(TimeoutError):  # no delete (nor any other event) came meanwhile
        await next_event(watch, timeout_s=0.05)
    await reg.close()
    assert await discovery.list("k") == {}
    await watch.aclose()  # type: ignore[attr-defined]


async def test_a_lease_that_stops_renewing_expires(discovery: Discovery) -> None:
    reg = await discovery.register("k", b"v", ttl_s=0.4)
    watch = discovery.watch("k")
    assert (await next_event(watch)).kind == "put"
    reg._task.cancel()  # type: ignore[attr-defined]  # the owner froze or died
    assert await next_event(watch, DEADLINE_S) == WatchEvent("delete", "k")  # nobody deleted it
    assert await discovery.list("k") == {}
    await watch.aclose()  # type: ignore[attr-defined]


_REGISTER_AND_HANG = """
import asyncio, sys
from armature.runtime import discovery_file
from armature.runtime.discovery_file import FileDiscovery
async def main():
    d = FileDiscovery(sys.argv[1])
    await d.register("instances/crashy", b"x", ttl_s=1.0)
    print("registered", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_file_lease_of_a_killed_process_expires(tmp_path: Path) -> None:
    directory = tmp_path / "disc"
    proc = subprocess.Popen(
        [sys.executable, "-c", _REGISTER_AND_HANG, str(directory)], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"registered"
        d = FileDiscovery(directory, poll_interval_s=0.05)
        watch = d.watch("instances/")
        assert await next_event(watch) == WatchEvent("put", "instances/crashy", b"x")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        assert await next_event(watch, DEADLINE_S) == WatchEvent("delete", "instances/crashy")
        assert list((directory / "entries").iterdir()) == []  # collected
        await watch.aclose()  # type: ignore[attr-defined]
    finally:
        proc.kill()
        proc.wait()


async def test_a_file_lease_renewal_that_fails_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that failed with anything but a missing file (no space, too many open
    files) ended the renewal task unseen: the lease lapsed with its worker still running.
    It is logged and the next round renews."""
    d = FileDiscovery(tmp_path / "disc", poll_interval_s=0.05)
    reg = await d.register("k", b"v", ttl_s=0.3)
    real_utime = os.utime
    failures = [OSError(errno.ENOSPC, "No space left on device")] * 2

    def utime(path: object, *args: object) -> None:
        if failures:
            raise failures.pop()
        real_utime(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(discovery_file.os, "utime", utime)
    deadline_s = time.monotonic() + DEADLINE_S
    while failures:
        assert time.monotonic() < deadline_s
        await asyncio.sleep(0.01)
    stamp = renewal_stamp(d, reg)
    before = stamp()
    while stamp() == before:  # renewed after the failures: the task lives
        assert time.monotonic() < deadline_s, "no renewal after the failures"
        await asyncio.sleep(0.01)
    assert await d.list("k") == {"k": b"v"}
    await reg.close()
    await d.close()


async def test_a_file_discovery_directory_removed_is_made_again_and_nobody_leaves(
    tmp_path: Path,
) -> None:
    """The directory removed under a running fleet (rm -rf, a tmp cleaner): the watcher
    stopped with a FileNotFoundError (and the frontend, and serve, with it) and the worker's
    renewals failed forever. Now the watcher keeps what it knew, the registration writes its
    entry again at its next renewal, and no delete is seen."""
    import shutil

    d = FileDiscovery(tmp_path / "disc", poll_interval_s=0.05)
    reg = await d.register("instances/ns/w/1", b"card", ttl_s=0.6)
    watch = d.watch("instances/")
    assert await next_event(watch) == WatchEvent("put", "instances/ns/w/1", b"card")
    events: list[WatchEvent] = []

    async def drain() -> None:
        async for event in watch:
            events.append(event)

    reader = asyncio.ensure_future(drain())  # the watcher polls through the loss
    shutil.rmtree(tmp_path / "disc")
    deadline_s = time.monotonic() + DEADLINE_S
    while not (tmp_path / "disc" / "entries").is_dir():  # a poll found it gone
        assert time.monotonic() < deadline_s, "the directory was not made again"
        await asyncio.sleep(0.02)
    while await d.list("instances/") != {"instances/ns/w/1": b"card"}:  # registered again
        assert time.monotonic() < deadline_s, "the entry was not written again"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # a few more polls
    assert not reader.done()  # the watcher goes on (it stopped with a FileNotFoundError)
    reader.cancel()
    assert [e for e in events if e.kind == "delete"] == []
    await reg.close()
    await d.close()
