"""The sweep's timing as a client sees it, on the mocker (it sleeps its modeled step times):
bounds that hold however late the client's event loop wakes, since an output is seen no sooner
than the engine made it and the request was submitted no later than the engine took it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from armature.config import ProfileSweepConfig
from armature.engines.native.async_engine import AsyncEngine
from armature.engines.native.config import NativeEngineConfig
from armature.profiler.sweep import DECODE_TRIES, Sweep, time_request, time_together
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from armature.sim.mocker import build_mocker_core
from armature.sim.timing import PolynomialTiming
from armature.workload.measure import MeasureError

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


class MergingEngine:
    """A scripted engine: a request of one token answers at once; the first `merged` decode
    requests give all their tokens in one output (as an engine that outran its client does),
    later ones one token per output, 1 ms apart."""

    def __init__(self, merged: int) -> None:
        self.merged = merged
        self.num_decodes = 0

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        num_tokens = request.sampling.max_tokens
        if num_tokens > 1:
            self.num_decodes += 1
        if num_tokens == 1 or self.num_decodes <= self.merged:
            yield EngineOutput(
                request_id=request.request_id,
                new_token_ids=[7] * num_tokens,
                finish_reason=FinishReason.LENGTH,
            )
            return
        for k in range(num_tokens):
            await asyncio.sleep(0.001)
            last = k == num_tokens - 1
            yield EngineOutput(
                request_id=request.request_id,
                new_token_ids=[7],
                finish_reason=FinishReason.LENGTH if last else None,
            )


SWEEP = ProfileSweepConfig(
    decode_requests=(1,), decode_context_tokens=(16,), decode_output_tokens=4
)


async def test_a_decode_point_with_merged_outputs_is_timed_again() -> None:
    """Two tries whose tokens all came merged, then one with gaps: the point is the third
    try's (its gaps are the 1 ms sleeps or more)."""
    engine = MergingEngine(merged=DECODE_TRIES - 1)
    (point,) = await Sweep(engine, 100, SWEEP).measure_decode()  # type: ignore[arg-type]
    assert engine.num_decodes == DECODE_TRIES
    assert point.num_requests == 1 and point.itl_ms >= 1.0


async def test_a_decode_point_merged_every_time_is_an_error() -> None:
    engine = MergingEngine(merged=DECODE_TRIES)
    with pytest.raises(MeasureError, match="no gap to time"):
        await Sweep(engine, 100, SWEEP).measure_decode()  # type: ignore[arg-type]
    assert engine.num_decodes == DECODE_TRIES
