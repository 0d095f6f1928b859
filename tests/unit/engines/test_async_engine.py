"""AsyncEngine: streaming from the engine thread, cancellation frees blocks, errors surface."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import CountingRunner

from armature.engines.api import InvalidRequestError
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.protocols.engine import EngineRequest, FinishReason, SamplingParams


def make_engine(num_blocks: int = 64) -> AsyncEngine:
    config = NativeEngineConfig(model_dir=Path("/unused"), block_size=4)
    return AsyncEngine(EngineCore(config, CountingRunner(), num_blocks=num_blocks))


def req(rid: str, prompt: list[int], max_tokens: int) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


async def wait_until(predicate, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_streams_tokens_concurrently() -> None:
    engine = make_engine()
    engine.start()
    try:

        async def collect(rid: str, prompt: list[int]) -> list[int]:
            out = []
            async for o in engine.generate(req(rid, prompt, 5)):
                out.extend(o.new_token_ids)
                last = o
            assert last.finish_reason is FinishReason.LENGTH
            return out

        a, b = await asyncio.gather(collect("a", [1, 2]), collect("b", [50]))
        assert a == [3, 4, 5, 6, 7]
        assert b == [51, 52, 53, 54, 55]
        await wait_until(lambda: engine.get_load().num_active_blocks == 0)
    finally:
        await engine.stop()


async def test_leaving_early_aborts_and_frees_blocks() -> None:
    engine = make_engine()
    engine.start()
    try:
        stream = engine.generate(req("long", list(range(10)), 200))
        first = await stream.__anext__()
        assert first.new_token_ids[0] == 10  # more may come merged: the engine runs ahead
        await stream.aclose()  # type: ignore[attr-defined]
        await wait_until(lambda: not engine.core.has_work())
        await wait_until(lambda: engine.get_load().num_active_blocks == 0)
        assert engine.core.pool.get_num_active_blocks() == 0
    finally:
        await engine.stop()


async def test_invalid_request_raises_before_queueing() -> None:
    engine = make_engine()
    engine.start()
    try:
        with pytest.raises(InvalidRequestError, match="context length"):
            async for _ in engine.generate(req("x", [1] * 600, 10)):
                pass
        assert not engine.core.has_work()
    finally:
        await engine.stop()


async def test_kv_events_are_drained_through_the_engine() -> None:
    engine = make_engine()
    engine.start()
    try:
        async for _ in engine.generate(req("a", list(range(8)), 1)):
            pass
        await wait_until(lambda: engine.get_load().num_active_blocks == 0)
        events = engine.take_kv_events()
        assert [e.event_id for e in events] == [0]
        assert engine.take_kv_events() == []
    finally:
        await engine.stop()


async def test_step_records_are_drained_through_the_engine() -> None:
    engine = make_engine()
    engine.start()
    try:
        async for _ in engine.generate(req("a", list(range(8)), 3)):
            pass
        await wait_until(lambda: engine.get_load().num_active_blocks == 0)
        records = engine.take_step_records()
        # one per step: the 8-token prompt (2 blocks), then 2 decodes over 9 and 10 tokens
        assert [
            (
                r.num_scheduled_prefill_tokens,
                r.num_decode_requests,
                r.num_decode_kv_tokens,
                r.num_kv_tokens_used,
            )
            for r in records
        ] == [(8, 0, 0, 8), (0, 1, 9, 12), (0, 1, 10, 12)]
        assert engine.take_step_records() == []
    finally:
        await engine.stop()
