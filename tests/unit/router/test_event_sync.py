"""How often the router pulls KV events: every 5 ms while events flow or requests are
routed, backing off to 25 ms when nothing happens (a 5 ms poll alone costs CPU that a small
machine's model steps pay for)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from armature.config import RouterConfig
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
)
from armature.protocols.kv_events import KvDump, KvEvent
from armature.router.service import EngineRouter, next_sync_interval_s

FAST_S, SLOW_S = 0.005, 0.025


@pytest.mark.parametrize(
    ("current_s", "active", "expected_s"),
    [
        (0.005, False, 0.010),
        (0.010, False, 0.020),
        (0.020, False, 0.025),  # capped at the slowest
        (0.025, False, 0.025),
        (0.025, True, 0.005),  # events or requests: back to the fastest at once
        (0.001, False, 0.005),  # never faster than the fastest
    ],
)
def test_the_wait_doubles_while_idle_and_resets_on_activity(
    current_s: float, active: bool, expected_s: float
) -> None:
    got = next_sync_interval_s(current_s, active=active, fastest_s=FAST_S, slowest_s=SLOW_S)
    assert got == pytest.approx(expected_s)


class CountingEngine:
    """An engine whose KV-event polls are counted; each request yields one token."""

    def __init__(self) -> None:
        self.num_polls = 0
        self.is_alive = True

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def take_kv_events(self) -> list[KvEvent]:
        self.num_polls += 1
        return []

    async def dump_kv_blocks(self) -> KvDump:
        return KvDump(seq_hashes=[], last_event_id=-1)

    def get_load(self) -> EngineLoad:
        return EngineLoad(
            num_active_blocks=0,
            num_total_blocks=64,
            num_waiting=0,
            num_running=0,
            num_prefill_tokens_queued=0,
        )

    def validate(self, request: EngineRequest) -> None: ...

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        yield EngineOutput(
            request_id=request.request_id, new_token_ids=[1], finish_reason=FinishReason.LENGTH
        )


async def polls_during(engine: CountingEngine, seconds: float) -> int:
    before = engine.num_polls
    await asyncio.sleep(seconds)
    return engine.num_polls - before


async def test_an_idle_router_polls_slowly_and_a_request_speeds_it_up() -> None:
    engine = CountingEngine()
    config = RouterConfig(event_sync_interval_s=FAST_S, event_sync_idle_interval_s=SLOW_S)
    router = EngineRouter({"w": engine}, config)  # type: ignore[dict-item]
    router.start()
    try:
        while engine.num_polls < 5:  # 5, 10, 20, 25 ms: four idle rounds reach the slowest
            await asyncio.sleep(FAST_S)
        idle = await polls_during(engine, 0.5)
        assert idle <= 0.5 / SLOW_S + 2, idle  # ~20 polls, not ~100
        request = EngineRequest(
            request_id="r", prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=1)
        )
        before, started_s = engine.num_polls, time.monotonic()
        for _ in range(40):  # requests keep arriving: polls stay at the fastest
            async for _ in router.generate(request):
                pass
            await asyncio.sleep(FAST_S)
        busy_rate = (engine.num_polls - before) / (time.monotonic() - started_s)
        assert busy_rate > 2.5 * idle / 0.5, (busy_rate, idle)
    finally:
        await router.stop()
