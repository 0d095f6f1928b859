"""Overload control: admission with room, a bounded priority queue (FCFS within a priority),
503s when full or timed out, and a runtime change of the thresholds."""

from __future__ import annotations

import asyncio

import pytest

from armature.config import OverloadConfig
from armature.frontend.admission import AdmissionGate, Overloaded
from armature.router.pressure import OverloadThresholds, WorkerPressure, is_busy
from polling import wait_until


class Workers:
    def __init__(self) -> None:
        self.pressures = [WorkerPressure(0.99, 0), WorkerPressure(0.5, 5000)]

    def __call__(self) -> list[WorkerPressure]:
        return self.pressures


def test_busy_by_kv_usage_or_queued_prefill() -> None:
    config = OverloadConfig(busy_kv_usage=0.9, busy_prefill_tokens=4096)
    assert is_busy(config, WorkerPressure(0.95, 0))
    assert is_busy(config, WorkerPressure(0.1, 4096))
    assert not is_busy(config, WorkerPressure(0.89, 4095))
    assert not OverloadConfig().enabled and not is_busy(
        OverloadConfig(), WorkerPressure(1.0, 10**9)
    )


async def test_admits_at_once_with_room_and_queues_in_priority_order() -> None:
    workers = Workers()
    gate = AdmissionGate(
        OverloadThresholds(OverloadConfig(busy_kv_usage=0.9, busy_prefill_tokens=4096)), workers
    )
    workers.pressures = [WorkerPressure(0.95, 0), WorkerPressure(0.2, 0)]
    await asyncio.wait_for(gate.admit(), 1)  # a worker has room
    workers.pressures = [WorkerPressure(0.95, 0), WorkerPressure(0.2, 9000)]  # all busy
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        await gate.admit(priority)
        order.append(name)

    tasks = [
        asyncio.ensure_future(request(n, p)) for n, p in [("a", 0), ("b", 5), ("c", 0), ("d", -1)]
    ]
    await wait_until(lambda: gate.num_queued == 4, "all four queued")
    assert order == []
    workers.pressures = [WorkerPressure(0.1, 0)]
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["d", "a", "c", "b"]  # priority, then arrival
    assert gate.num_queued == 0
    await gate.stop()


async def test_a_full_queue_and_a_long_wait_are_overloaded() -> None:
    workers = Workers()  # both busy
    config = OverloadConfig(
        busy_kv_usage=0.9, busy_prefill_tokens=100, max_queued_requests=1, queue_timeout_s=0.1
    )
    gate = AdmissionGate(OverloadThresholds(config), workers)
    waiting = asyncio.ensure_future(gate.admit())
    await wait_until(lambda: gate.num_queued == 1, "the first request queued")
    with pytest.raises(Overloaded, match="1 requests are already waiting") as full:
        await gate.admit()
    assert full.value.code == "overloaded" and full.value.retry_after_s == 1
    with pytest.raises(Overloaded, match=r"waited 0\.1 s") as late:
        await waiting
    assert late.value.code == "queue_timeout"
    assert gate.num_queued == 0 and gate.num_rejected == 2
    gate.thresholds.config = OverloadConfig()  # thresholds cleared at runtime: everything passes
    await asyncio.wait_for(gate.admit(), 1)
    await gate.stop()


async def test_a_cancelled_waiter_gives_up_its_place() -> None:
    workers = Workers()
    gate = AdmissionGate(
        OverloadThresholds(OverloadConfig(busy_kv_usage=0.9, busy_prefill_tokens=100)), workers
    )
    first = asyncio.ensure_future(gate.admit())
    await wait_until(lambda: gate.num_queued == 1, "the waiter queued")
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert gate.num_queued == 0
    await gate.stop()


async def test_closing_answers_every_waiter_and_whoever_would_wait() -> None:
    """A shutdown's grace ends: the waiters were cut with their connections; each gets a
    503 now, and a request that would wait gets one at once (one with room still passes)."""
    workers = Workers()  # both busy
    gate = AdmissionGate(
        OverloadThresholds(OverloadConfig(busy_kv_usage=0.9, busy_prefill_tokens=100)), workers
    )
    waiters = [asyncio.ensure_future(gate.admit(priority)) for priority in (0, 1)]
    await wait_until(lambda: gate.num_queued == 2, "both queued")
    gate.close()
    for outcome in await asyncio.gather(*waiters, return_exceptions=True):
        assert isinstance(outcome, Overloaded) and outcome.code == "shutting_down"
    with pytest.raises(Overloaded, match="shutting down"):
        await gate.admit()
    assert gate.num_queued == 0 and gate.num_rejected == 2
    workers.pressures = [WorkerPressure(0.1, 0)]
    await asyncio.wait_for(gate.admit(), 1)  # room: it goes on (the service ends it)
    await gate.stop()
