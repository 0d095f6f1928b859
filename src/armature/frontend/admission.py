"""Overload control at the frontend: when every worker is busy, requests wait in a bounded
queue (priority first, then arrival order) instead of piling onto the engines; a full queue or
a wait past the timeout answers 503 with Retry-After.

A worker is busy when its KV usage or its prompt tokens waiting to be prefilled reach the
thresholds (`OverloadConfig`, changeable at runtime). With no threshold set the gate admits at once.

    request -> admit(priority) --capacity--> routed
                   |  no capacity: waiters heap (priority, seq) -- pump admits the head
                   +- queue full / timed out: Overloaded -> 503 + Retry-After
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Iterable

from armature.errors import ArmatureError
from armature.router.pressure import OverloadThresholds, WorkerPressure

__all__ = ["SHUTTING_DOWN", "AdmissionGate", "Overloaded"]

SHUTTING_DOWN = "the server is shutting down and its grace ended: retry the request"
# turns of the event loop an admitted request takes to reach the router (its prompt then
# counts in the pressure the next request is weighed by)
SETTLE_TURNS = 3


class Overloaded(ArmatureError):
    def __init__(self, message: str, code: str, retry_after_s: int):
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


class AdmissionGate:
    def __init__(
        self,
        thresholds: OverloadThresholds,
        pressures: Callable[[], Iterable[WorkerPressure]],
        poll_interval_s: float = 0.005,
    ):
        self.thresholds = thresholds
        self.pressures = pressures
        self.poll_interval_s = poll_interval_s
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()
        self._pump: asyncio.Task[None] | None = None
        self.num_rejected = 0
        self.closed = False  # a shutdown's grace is ending: nobody waits any more
        # held from one request's admission until it has reached the router
        self._weighing = asyncio.Lock()

    @property
    def num_queued(self) -> int:
        return sum(1 for *_, f in self._waiters if not f.done())

    def has_capacity(self) -> bool:
        return any(not self.thresholds.is_busy(p) for p in self.pressures())

    def admits_now(self) -> bool:
        """Whether `admit` returns at once: no threshold is set, or nobody waits, no request
        just admitted is on its way to the router, and a worker has room."""
        config = self.thresholds.config
        if not config.enabled:
            return True
        return not self._waiters and not self._weighing.locked() and self.has_capacity()

    async def admit(self, priority: int = 0) -> None:
        """Return when the request may be routed; Overloaded when it may not. A caller
        cancelled while it waits (its client gone) gives its place up at once.

        Requests are weighed one at a time: one admitted holds the scale for a few turns of
        the event loop, until it has reached the router and its prompt counts in the
        workers' pressure (a burst weighed at once all saw the room one of them had, and
        all went through)."""
        config = self.thresholds.config
        if not config.enabled:
            return
        await self._weighing.acquire()
        if not self._waiters and self.has_capacity():
            self._release_after_turns(SETTLE_TURNS)
            return
        self._weighing.release()
        if self.closed:
            raise self._shutting_down()
        if self.num_queued >= config.max_queued_requests:
            self.num_rejected += 1
            raise Overloaded(
                f"every worker is busy and {config.max_queued_requests} requests are "
                "already waiting; retry later",
                "overloaded",
                self._retry_after_s(),
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._sequence), future))
        self._ensure_pump()
        try:
            await asyncio.wait_for(asyncio.shield(future), config.queue_timeout_s)
        except TimeoutError:
            future.cancel()
            self.num_rejected += 1
            raise Overloaded(
                f"waited {config.queue_timeout_s:g} s for a free worker; retry later",
                "queue_timeout",
                self._retry_after_s(),
            ) from None
        finally:
            if not future.done():
                future.cancel()  # the caller left (client gone): its place is given up

    def _release_after_turns(self, turns: int) -> None:
        """Release `_weighing` once the event loop has run `turns` more times."""
        if turns <= 0:
            self._weighing.release()
            return
        asyncio.get_running_loop().call_soon(self._release_after_turns, turns - 1)

    def close(self) -> None:
        """A shutdown's grace is about to end: every waiter, and any request that would
        wait, gets a 503 now (they were cut with the connection, with no answer)."""
        self.closed = True
        for *_, future in self._waiters:
            if not future.done():
                self.num_rejected += 1
                future.set_exception(self._shutting_down())
        self._waiters.clear()

    def _shutting_down(self) -> Overloaded:
        return Overloaded(SHUTTING_DOWN, "shutting_down", 1)  # another replica may serve it

    def _retry_after_s(self) -> int:
        return max(1, math.ceil(min(self.thresholds.config.queue_timeout_s, 5.0)))

    def _ensure_pump(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _run_pump(self) -> None:
        """Admit the head waiter whenever a worker has room; one at a time, so that each
        admitted request is routed (and counted in the load) before the next is weighed."""
        while self._waiters:
            _, _, head = self._waiters[0]
            if head.done():  # timed out or cancelled
                heapq.heappop(self._waiters)
                continue
            enabled = self.thresholds.config.enabled
            if not enabled or (not self._weighing.locked() and self.has_capacity()):
                heapq.heappop(self._waiters)
                head.set_result(None)
                for _ in range(SETTLE_TURNS):  # let the admitted request reach the router
                    await asyncio.sleep(0)
                continue
            await asyncio.sleep(self.poll_interval_s)

    async def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
