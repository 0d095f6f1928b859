"""Outputs that wait for a slow consumer arrive merged: same tokens, fewer items."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.protocols.engine import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    SamplingParams,
    TokenLogprob,
    merge_outputs,
)
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming


def test_merge_outputs_concatenates_and_keeps_the_ends() -> None:
    lp = [TokenLogprob(t, -1.0, []) for t in (5, 6, 7)]
    merged = merge_outputs(
        [
            EngineOutput(
                request_id="r", new_token_ids=[5], logprobs=lp[:1], num_prompt_tokens=9,
                num_cached_tokens=4,
            ),
            EngineOutput(request_id="r", new_token_ids=[6, 7], logprobs=lp[1:]),
            EngineOutput(request_id="r", new_token_ids=[], finish_reason=FinishReason.LENGTH),
        ]
    )  # fmt: skip
    assert merged == EngineOutput(
        request_id="r",
        new_token_ids=[5, 6, 7],
        logprobs=lp,
        finish_reason=FinishReason.LENGTH,
        num_prompt_tokens=9,
        num_cached_tokens=4,
    )
    with pytest.raises(ValueError, match="different requests"):
        merge_outputs([EngineOutput(request_id="a", new_token_ids=[1]), merged])


async def test_a_consumer_that_falls_behind_gets_merged_outputs(tiny_llama_dir: Path) -> None:
    config = NativeEngineConfig(model_dir=tiny_llama_dir, block_size=4, num_kv_blocks=64)
    engine = AsyncEngine(build_mocker_core(config, timing=PolynomialTiming(speedup_ratio=1e9)))
    engine.start()
    try:
        request = EngineRequest(
            request_id="r",
            prompt_token_ids=[1, 2, 3],
            sampling=SamplingParams(max_tokens=20, ignore_eos=True),
        )
        prompt_only = EngineRequest(
            request_id="eager",
            prompt_token_ids=[1, 2, 3],
            sampling=SamplingParams(max_tokens=20, ignore_eos=True),
        )
        eager = [o async for o in engine.generate(prompt_only)]
        stream = engine.generate(request)
        first = await anext(stream)
        await engine_idle(engine)  # the engine ran ahead: every later token is waiting
        outputs = [first, *[o async for o in stream]]
        assert sum(len(o.new_token_ids) for o in outputs) == 20
        # unmerged, one item per token; merged, what waits comes as one (the last step's
        # output may be handed to the loop just after the load reads idle: a third item)
        assert len(outputs) <= 3 and outputs[-1].finish_reason is FinishReason.LENGTH
        assert sum(len(o.new_token_ids) for o in eager) == 20
    finally:
        await engine.stop()


async def engine_idle(engine: AsyncEngine) -> None:
    """Until the engine has no request waiting or running (bounded)."""
    async with asyncio.timeout(10.0):
        while (load := engine.get_load()).num_running or load.num_waiting:
            await asyncio.sleep(0.01)
