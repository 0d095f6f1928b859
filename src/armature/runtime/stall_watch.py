"""Waits on a stream that give up when it stalls, for the cost of a clock read per item.

`asyncio.wait_for` runs every wait in a new task (about 7 us), and `asyncio.timeout` arms and
cancels a timer per wait (about 5 us): per streamed token, that is more than the rest of the
frontend's per-token path. A StallWatch keeps at most one timer per stream and re-arms it
lazily. Each wait records when it began. When the timer is due it finds either no wait (it
stays unarmed until the next one), a wait older than the limit (it cancels the waiting task,
and the wait raises TimeoutError), or a younger wait (it re-arms at that wait's deadline).

The cancellation is asyncio.timeout's: a task also cancelled from outside sees
CancelledError, not TimeoutError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["StallWatch"]

T = TypeVar("T")


class StallWatch:
    """TimeoutError from `wait` when one wait lasts more than `timeout_s`. One stream's
    waits, one at a time; `close` when the stream ends."""

    def __init__(self, timeout_s: float):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[object] | None = None
        self._began_s: float | None = None  # the current wait's start on the loop's clock
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._gone = False  # expired from outside: every wait gives up

    async def wait(self, awaitable: Awaitable[T]) -> T:
        task = asyncio.current_task()
        assert task is not None, "StallWatch.wait runs in a task"
        assert self._began_s is None, "one wait at a time"
        if self._gone:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never awaited
            raise TimeoutError
        cancelling = task.cancelling()
        self._task = task
        self._began_s = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(self._began_s + self.timeout_s, self._due)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                if task.uncancel() <= cancelling:
                    raise TimeoutError from None
            raise
        finally:
            self._began_s = None
            if self._expired:  # the awaitable swallowed the cancellation: take it back
                self._expired = False
                task.uncancel()

    @property
    def expired_from_outside(self) -> bool:
        """`expire` was called (a TimeoutError since is its, not a stall's)."""
        return self._gone

    def expire(self) -> None:
        """Give up now, as if the wait had stalled: the wait in progress raises TimeoutError
        (or the next one does, at once)."""
        self._gone = True
        if self._began_s is not None and self._task is not None and not self._expired:
            self._expired = True
            self._task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> None:
        self._timer = None
        if self._began_s is None or self._task is None:
            return  # not waiting: the next wait arms the timer again
        deadline_s = self._began_s + self.timeout_s
        if self._loop.time() >= deadline_s:
            self._expired = True
            self._task.cancel()
        else:
            self._timer = self._loop.call_at(deadline_s, self._due)
