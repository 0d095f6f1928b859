"""A worker publishes its engine's news when the engine says it has some: an idle worker wakes
only for its heartbeat, a busy one once a step (not every few milliseconds: those wake-ups
took its host's cores from the engines), and nothing the engine recorded is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

from armature.engines.native.async_engine import AsyncEngine
from armature.protocols.engine import EngineLoad, StepRecord
from armature.protocols.kv_events import KvEvent
from armature.runtime.discovery import MemDiscovery, MemStore
from armature.runtime.events import ZmqEventPlane
from tests.unit.runtime.test_remote_worker import mocker_engine, request, worker_service


async def test_an_idle_engine_has_no_news_until_its_timeout(tiny_llama_dir: Path) -> None:
    engine = mocker_engine(tiny_llama_dir)
    engine.start()
    try:
        await engine.wait_for_update(0.0)  # the load taken when the thread started, if any
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        assert await engine.wait_for_update(0.2) is False
        assert loop.time() - started_s >= 0.2  # it waited the whole timeout
        assert engine.take_step_records() == []
        assert engine.take_kv_events() == []
    finally:
        await engine.stop()


async def test_a_step_wakes_the_waiter_with_its_record(tiny_llama_dir: Path) -> None:
    engine = mocker_engine(tiny_llama_dir)
    engine.start()
    try:
        await engine.wait_for_update(0.0)
        outputs = [o async for o in engine.generate(request("a", list(range(1, 9)), 2))]
        assert sum(len(o.new_token_ids) for o in outputs) == 2
        # the steps already ran: the news is waiting, so this returns at once, not after 60 s
        assert await asyncio.wait_for(engine.wait_for_update(60.0), 30.0) is True
        records = engine.take_step_records()
        assert [(r.num_scheduled_prefill_tokens, r.num_decode_requests) for r in records] == [
            (8, 0),
            (0, 1),
        ]
        assert engine.take_kv_events()  # the prompt's two full blocks were stored
    finally:
        await engine.stop()


async def test_a_wait_that_starts_before_the_step_is_woken_by_it(tiny_llama_dir: Path) -> None:
    engine = mocker_engine(tiny_llama_dir)
    engine.start()
    try:
        await engine.wait_for_update(0.0)
        waiter = asyncio.create_task(engine.wait_for_update(60.0))
        await asyncio.sleep(0)  # the waiter is waiting
        assert not waiter.done()
        outputs = [o async for o in engine.generate(request("b", list(range(1, 6)), 1))]
        assert len(outputs) == 1
        assert await asyncio.wait_for(waiter, 30.0) is True
        assert len(engine.take_step_records()) == 1
    finally:
        await engine.stop()


class CountingEngine:
    """The mocker engine, counting how often the worker drains it."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.num_drains = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.engine, name)

    def take_kv_events(self) -> list[KvEvent]:
        self.num_drains += 1
        return self.engine.take_kv_events()

    def take_step_records(self) -> list[StepRecord]:
        return self.engine.take_step_records()

    def get_load(self) -> EngineLoad:
        return self.engine.get_load()


async def test_an_idle_worker_drains_its_engine_for_the_heartbeat_only(
    tiny_llama_dir: Path,
) -> None:
    plane = ZmqEventPlane()
    discovery = MemDiscovery(MemStore())
    inner = mocker_engine(tiny_llama_dir)
    engine = CountingEngine(inner)
    service = worker_service(
        engine,  # type: ignore[arg-type]
        discovery,
        plane,
        tiny_llama_dir,
        lease_ttl_s=10.0,
        instance_id=7,
        update_interval_s=0.01,
        heartbeat_s=0.25,
    )
    await service.start()
    try:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.3)  # started: the first drains are done
        drains, started_s = engine.num_drains, loop.time()
        await asyncio.sleep(1.0)
        idle_s = loop.time() - started_s
        # once a heartbeat (4 in a second, 5 at a boundary); a 10 ms poll drained ~100 times
        assert engine.num_drains - drains <= idle_s / 0.25 + 1
        # a request's steps are drained and published as they run
        drains = engine.num_drains
        outputs = [o async for o in inner.generate(request("c", list(range(1, 9)), 3))]
        assert len(outputs) == 3
        for _ in range(200):
            if engine.num_drains > drains:
                break
            await asyncio.sleep(0.01)
        assert engine.num_drains > drains
    finally:
        await service.stop()
        await discovery.close()
        await plane.close()
