"""StallWatch on an event loop whose clock the test sets: a wait times out only when it alone
lasts the limit, the one timer re-arms at the current wait's deadline, an outside
cancellation stays a cancellation, and a closed watch leaves no timer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from armature.runtime.stall_watch import StallWatch


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it."""

    now_s = 0.0

    def time(self) -> float:
        return self.now_s


def run(test: Callable[[ClockLoop], Awaitable[None]]) -> None:
    loop = ClockLoop()
    try:
        loop.run_until_complete(test(loop))
    finally:
        loop.close()


async def settle() -> None:
    """Let every callback that is due run, and the tasks they wake. (The tests never await
    a task that is not done: on this clock, a loop with nothing ready would never wake.)"""
    for _ in range(5):
        await asyncio.sleep(0)


def pending_timers(loop: ClockLoop) -> int:
    return sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]


def test_a_stream_whose_waits_are_each_short_never_times_out() -> None:
    async def body(loop: ClockLoop) -> None:
        watch = StallWatch(10.0)
        items: asyncio.Queue[int] = asyncio.Queue()
        got: list[int] = []

        async def consume() -> None:
            for _ in range(5):
                got.append(await watch.wait(items.get()))

        task = asyncio.create_task(consume())
        for i in range(5):  # an item every 6 s: 30 s in all, each wait 6 s
            await settle()
            loop.now_s += 6.0
            await settle()  # the timer, when due, re-arms at the current wait's deadline
            items.put_nowait(i)
        await settle()
        assert task.done()
        assert got == [0, 1, 2, 3, 4]
        assert pending_timers(loop) == 1  # one timer for the stream, never one per wait
        watch.close()
        assert pending_timers(loop) == 0

    run(body)


def test_a_wait_that_lasts_the_limit_times_out() -> None:
    async def body(loop: ClockLoop) -> None:
        watch = StallWatch(10.0)
        items: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.create_task(watch.wait(items.get()))
        await settle()
        loop.now_s = 4.0
        await settle()
        items.put_nowait(1)  # the first wait ends at 4 s
        await settle()
        assert task.result() == 1
        second = asyncio.create_task(watch.wait(items.get()))
        await settle()  # the second wait begins at 4 s
        loop.now_s = 10.0  # the timer armed at 0 s is due: this wait began at 4 s
        await settle()
        assert not second.done()
        loop.now_s = 13.9
        await settle()
        assert not second.done()
        loop.now_s = 14.0
        await settle()
        with pytest.raises(TimeoutError):
            second.result()
        assert second.cancelling() == 0  # the watch took its cancellation back
        watch.close()

    run(body)


def test_an_outside_cancellation_stays_a_cancellation() -> None:
    async def body(loop: ClockLoop) -> None:
        watch = StallWatch(10.0)
        never: asyncio.Event = asyncio.Event()
        task = asyncio.create_task(watch.wait(never.wait()))
        await settle()
        loop.now_s = 10.0  # expires in the same turn as the caller cancels
        task.cancel()
        await settle()
        with pytest.raises(asyncio.CancelledError):
            task.result()
        watch.close()

    run(body)


def test_an_outside_cancellation_after_the_timer_fired_stays_a_cancellation() -> None:
    """The watch's timer cancels the wait first, the caller's cancel lands right after it in
    the same turn: two cancellations, one taken back, so the caller's is what the task sees."""

    async def body(loop: ClockLoop) -> None:
        watch = StallWatch(10.0)
        never: asyncio.Event = asyncio.Event()
        task = asyncio.create_task(watch.wait(never.wait()))
        await settle()
        loop.call_at(10.0, task.cancel)  # scheduled after the watch's timer for 10.0
        loop.now_s = 10.0
        await settle()
        with pytest.raises(asyncio.CancelledError):
            task.result()
        watch.close()

    run(body)


def test_a_watch_that_expired_once_serves_the_next_wait() -> None:
    async def body(loop: ClockLoop) -> None:
        watch = StallWatch(1.0)
        items: asyncio.Queue[int] = asyncio.Queue()

        async def consume() -> list[str]:
            seen = []
            for _ in range(2):
                try:
                    seen.append(str(await watch.wait(items.get())))
                except TimeoutError:
                    seen.append("timeout")
            return seen

        task = asyncio.create_task(consume())
        await settle()
        loop.now_s = 1.0
        await settle()
        items.put_nowait(7)
        await settle()
        assert task.result() == ["timeout", "7"]
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
        watch.close()

    run(body)


def test_a_limit_must_be_positive() -> None:
    async def body(loop: ClockLoop) -> None:
        with pytest.raises(ValueError, match="timeout_s must be > 0"):
            StallWatch(0.0)

    run(body)
