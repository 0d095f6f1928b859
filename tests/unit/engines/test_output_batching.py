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
        await asyncio.sleep(0.5)  # the engine runs ahead: the other 19 tokens are waiting
        rest = [o async for o in stream]
        tokens = first.new_token_ids + [t for o in rest for t in o.new_token_ids]
        assert len(tokens) == 20
        assert len(rest) < 19 and rest[-1].finish_reason is FinishReason.LENGTH
        assert sum(len(o.new_token_ids) for o in eager) == 20
    finally:
        await engine.stop()
