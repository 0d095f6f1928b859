"""When the router pulls KV events: as soon as an engine has news (a worker's update arrived;
`Engine.wait_for_update`), at most every 5 ms, and otherwise every 25 ms (a steady 5 ms poll
cost CPU that a small machine's model steps pay for)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from armature.config import RouterConfig
from armature.engines.api import wait_and_clear
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
)
from armature.protocols.kv_events import KvDump, KvEvent, KvStored, StoredBlock
from armature.router import event_sync
from armature.router.service import EngineRouter
from idle_engine import idle_load

FAST_S, SLOW_S = 0.005, 0.025


class CountingEngine:
    """An engine whose KV-event polls are counted, and whose news the test sets; each request
    yields one token."""

    def __init__(self) -> None:
        self.num_polls = 0
        self.is_alive = True
        self.news = asyncio.Event()

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def take_kv_events(self) -> list[KvEvent]:
        self.num_polls += 1
        return []

    async def wait_for_update(self, timeout_s: float) -> bool:
        return await wait_and_clear(self.news, timeout_s)

    async def dump_kv_blocks(self) -> KvDump:
        return KvDump(seq_hashes=[], last_event_id=-1)

    def get_load(self) -> EngineLoad:
        return idle_load()

    def validate(self, request: EngineRequest) -> None: ...

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        yield EngineOutput(
            request_id=request.request_id, new_token_ids=[1], finish_reason=FinishReason.LENGTH
        )


async def polls_during(engine: CountingEngine, seconds: float) -> int:
    before = engine.num_polls
    await asyncio.sleep(seconds)
    return engine.num_polls - before


async def wait_for_polls(engine: CountingEngine, count: int) -> None:
    while engine.num_polls < count:
        await asyncio.sleep(0.001)


async def test_an_idle_router_polls_at_the_idle_interval() -> None:
    engine = CountingEngine()
    config = RouterConfig(event_sync_interval_s=FAST_S, event_sync_idle_interval_s=SLOW_S)
    router = EngineRouter({"w": engine}, config)  # type: ignore[dict-item]
    router.start()
    try:
        await wait_for_polls(engine, 1)
        idle = await polls_during(engine, 0.5)
        assert idle <= 0.5 / SLOW_S + 2, idle  # ~20 polls, not ~100
    finally:
        await router.stop()


async def test_news_wakes_the_router_and_nothing_else_does() -> None:
    """With an idle interval of a minute, a round runs only when an engine has news: routing a
    request does not poll (its KV events come as news), the engine's news does, at once."""
    engine = CountingEngine()
    config = RouterConfig(event_sync_interval_s=FAST_S, event_sync_idle_interval_s=60.0)
    router = EngineRouter({"w": engine}, config)  # type: ignore[dict-item]
    router.start()
    try:
        await wait_for_polls(engine, 1)  # the first round runs at start
        request = EngineRequest(
            request_id="r", prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=1)
        )
        async for _ in router.generate(request):
            pass
        assert await polls_during(engine, 0.2) == 0
        for round_ in (2, 3):
            engine.news.set()
            await asyncio.wait_for(wait_for_polls(engine, round_), 30.0)
            assert engine.num_polls == round_
    finally:
        await router.stop()


async def test_a_burst_of_news_is_one_round_an_interval() -> None:
    """Updates from many workers within one interval are pulled together."""
    engines = {f"w{i}": CountingEngine() for i in range(4)}
    config = RouterConfig(event_sync_interval_s=0.2, event_sync_idle_interval_s=60.0)
    router = EngineRouter(engines, config)  # type: ignore[arg-type]
    router.start()
    try:
        first = engines["w0"]
        await wait_for_polls(first, 1)
        await asyncio.sleep(0.25)  # past the first round's interval
        for engine in engines.values():
            engine.news.set()
        await asyncio.wait_for(wait_for_polls(first, 2), 30.0)
        await asyncio.sleep(0.05)  # within the interval: no second round
        assert [e.num_polls for e in engines.values()] == [2, 2, 2, 2]
    finally:
        await router.stop()


class DumpingEngine(CountingEngine):
    """An engine with one event queued; its dump waits for `answer` (None: never answers)."""

    def __init__(self, event: KvEvent, answer: asyncio.Event | None) -> None:
        super().__init__()
        self.events = [event]
        self.answer = answer
        self.dumping = asyncio.Event()

    def take_kv_events(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events

    async def dump_kv_blocks(self) -> KvDump:
        self.dumping.set()
        await (self.answer or asyncio.Event()).wait()
        return KvDump(seq_hashes=[7], last_event_id=9)


def stored(event_id: int, seq_hash: int) -> KvStored:
    return KvStored(event_id, None, [StoredBlock(seq_hash, seq_hash)])


async def test_a_worker_that_leaves_during_its_dump_stops_no_later_round() -> None:
    """Worker a's event is a gap (its first id is 9): the router asks for a dump, and a
    leaves meanwhile. Loading its dump raised KeyError, which ended the sync task for good:
    no worker's events were applied again. Now b's events are, this round and the next."""
    answer = asyncio.Event()
    a, b = DumpingEngine(stored(9, 7), answer), DumpingEngine(stored(0, 8), None)
    b.events.clear()
    router = EngineRouter({"a": a, "b": b}, RouterConfig())  # type: ignore[dict-item]
    sync = asyncio.ensure_future(router.sync_events())
    await a.dumping.wait()
    await router.remove_engine("a")
    answer.set()
    assert await sync == 0  # a's event went with it
    assert not router.index.has_worker("a")
    b.events.append(stored(0, 8))
    assert await router.sync_events() == 1
    assert router.index.find_overlaps([8]) == {"b": 1}


async def test_a_dump_that_never_comes_does_not_hold_the_other_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hung worker's dump held every worker's events (the stream had no timeout)."""
    monkeypatch.setattr(event_sync, "DUMP_TIMEOUT_S", 0.05)
    a, b = DumpingEngine(stored(9, 7), None), DumpingEngine(stored(0, 8), None)
    router = EngineRouter({"a": a, "b": b}, RouterConfig())  # type: ignore[dict-item]
    assert await asyncio.wait_for(router.sync_events(), 30) == 1
    assert router.index.find_overlaps([8]) == {"b": 1}
