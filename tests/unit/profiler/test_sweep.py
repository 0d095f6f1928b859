"""The sweep's timing as a client sees it, on the mocker (it sleeps its modeled step times):
bounds that hold however late the client's event loop wakes, since an output is seen no sooner
than the engine made it and the request was submitted no later than the engine took it."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.profiler.sweep import time_request, time_together
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming

SPEEDUP = 10.0
PROMPT_TOKENS = 48
MAX_TOKENS = 8


def _request(number: int) -> EngineRequest:
    """A prompt of its own (`number` in its first token): none hits another's cache."""
    return EngineRequest(
        request_id=f"r{number}",
        prompt_token_ids=[number + 1] + [(i * 7) % 50 + 1 for i in range(PROMPT_TOKENS - 1)],
        sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
    )


async def test_a_timed_request_is_never_shorter_than_its_modeled_steps(
    tiny_llama_dir: Path,
) -> None:
    model = PolynomialTiming(speedup_ratio=SPEEDUP)
    config = NativeEngineConfig(model_dir=tiny_llama_dir, block_size=16, num_kv_blocks=64)
    engine = AsyncEngine(build_mocker_core(config, timing=model))
    engine.start()
    try:
        alone = await time_request(engine, _request(0))
        together = await time_together(engine, [_request(i) for i in (1, 2, 3)])
    finally:
        await engine.stop()
    prefill_s = model.prefill_ms(PROMPT_TOKENS) / SPEEDUP / 1e3
    decode_s = model.decode_ms(0.0) / SPEEDUP / 1e3  # the cheapest decode step
    for times in (alone, *together):
        assert sum(n for _, n in times.outputs) == MAX_TOKENS
        assert times.ttft_s >= prefill_s
        last_s = times.outputs[-1][0] - times.submitted_s
        assert last_s >= prefill_s + (MAX_TOKENS - 1) * decode_s
        # the gaps (shared within merged outputs) add up to the time after the first output
        itls_s = [x for x in times.get_itls_s() if x is not None]
        assert sum(itls_s) == pytest.approx(times.outputs[-1][0] - times.outputs[0][0])
