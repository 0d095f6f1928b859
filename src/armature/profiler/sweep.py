"""Drive one engine through the `Engine` contract and time its requests: the same code for
every kind in the registry (the native engine, the mocker, vLLM), as a client sees it.

    time_request(engine, request)       -> RequestTimes  (submitted, each output's arrival)
    time_together(engine, requests)     -> [RequestTimes] all submitted at once
    Sweep(engine, ...).run()            -> (prefill points, decode points)

Prompts are random token ids from a seeded generator, a fresh one for every request that must
not hit the prefix cache (but for the prefills timed after their prompt's start was cached
on purpose). Requests ignore EOS, so each makes exactly max_tokens.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence

from armature.config import ProfileSweepConfig
from armature.engines.api import Engine
from armature.errors import ArmatureError
from armature.profiler.plan import DECODE_SKIP_TOKENS, decode_context_tokens, decode_max_tokens
from armature.profiler.points import (
    RequestTimes,
    decode_point,
    median_decode_points,
    median_prefill_points,
    prefill_after_prefix_point,
    prefill_alone_point,
    prefill_batch_point,
)
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.timing_profile import DecodePoint, PrefillPoint
from armature.workload.measure import MeasureError

__all__ = ["ProfilerError", "Sweep", "time_request", "time_together"]

log = logging.getLogger(__name__)

# times a decode point is timed when its outputs come merged (no gap to time)
DECODE_TRIES = 3

NUM_WARMUP_REQUESTS = 2  # untimed, first: lazy initialisation (allocator, kernels)


class ProfilerError(ArmatureError, RuntimeError):
    """The engine failed a request while it was being profiled."""


async def time_request(
    engine: Engine, request: EngineRequest, clock_s: Callable[[], float] = time.perf_counter
) -> RequestTimes:
    """Submit `request` now and note when each output arrives; ProfilerError if it fails."""
    submitted_s = clock_s()
    outputs: list[tuple[float, int]] = []
    num_cached_tokens = 0
    async for output in engine.generate(request):
        if output.error is not None:
            raise ProfilerError(f"request {request.request_id} failed: {output.error}")
        num_cached_tokens = max(num_cached_tokens, output.num_cached_tokens)
        if output.new_token_ids:
            outputs.append((clock_s(), len(output.new_token_ids)))
    if len(outputs) == 0:
        raise ProfilerError(f"request {request.request_id} produced no token")
    return RequestTimes(submitted_s, tuple(outputs), num_cached_tokens)


async def time_together(
    engine: Engine,
    requests: Sequence[EngineRequest],
    clock_s: Callable[[], float] = time.perf_counter,
) -> list[RequestTimes]:
    return list(await asyncio.gather(*(time_request(engine, r, clock_s) for r in requests)))


class Sweep:
    """The profile's measurements on one started engine, in order: warm-up, then each pass:
    prefill alone, prefill in batches, decode. Owns nothing but its prompt generator."""

    def __init__(
        self,
        engine: Engine,
        vocab_size: int,
        sweep: ProfileSweepConfig,
        after_prefix: Sequence[tuple[int, int]] = (),
    ):
        """`after_prefix`: (input, cached tokens) of the prefills to time after a cached
        prefix (`plan.prefill_context_points`)."""
        self.engine = engine
        self.vocab_size = vocab_size
        self.sweep = sweep
        self.after_prefix = after_prefix
        self._rng = random.Random(sweep.prompt_seed)
        self._num_requests = 0

    def _request(self, prompt: list[int], max_tokens: int) -> EngineRequest:
        self._num_requests += 1
        return EngineRequest(
            request_id=f"profile-{self._num_requests}",
            prompt_token_ids=prompt,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )

    def _prompt(self, num_tokens: int) -> list[int]:
        return [self._rng.randrange(self.vocab_size) for _ in range(num_tokens)]

    async def run(self) -> tuple[list[PrefillPoint], list[DecodePoint]]:
        """Warm up, then `passes` whole sweeps (prefill, then decode) one after another;
        each point's median over them."""
        warmup = [self._request(self._prompt(32), 4) for _ in range(NUM_WARMUP_REQUESTS)]
        await time_together(self.engine, warmup)
        prefills, decodes = [], []
        for number in range(1, self.sweep.passes + 1):
            if self.sweep.passes > 1:
                log.info("sweep pass %d of %d", number, self.sweep.passes)
            prefills.append(await self.measure_prefill())
            decodes.append(await self.measure_decode())
        return median_prefill_points(prefills), median_decode_points(decodes)

    async def measure_prefill(self) -> list[PrefillPoint]:
        points: list[PrefillPoint] = []
        sweep = self.sweep
        for length in sweep.prefill_input_tokens:
            repeats = [
                await time_request(self.engine, self._request(self._prompt(length), 1))
                for _ in range(sweep.prefill_repeats)
            ]
            points.append(prefill_alone_point(length, repeats))
            log.info("prefill %d tokens alone: %.1f ms", length, points[-1].ttft_ms)
            if sweep.prefill_batch_requests > 0:
                batch = [
                    self._request(self._prompt(length), 1)
                    for _ in range(sweep.prefill_batch_requests)
                ]
                points.append(prefill_batch_point(length, await time_together(self.engine, batch)))
                log.info(
                    "prefill %d x %d tokens: %.0f tokens/s",
                    len(batch),
                    length,
                    points[-1].tokens_per_s,
                )
        for length, context in self.after_prefix:
            repeats = []
            for _ in range(sweep.prefill_repeats):
                prompt = self._prompt(context + length)
                await time_request(self.engine, self._request(prompt[:context], 1))
                repeats.append(await time_request(self.engine, self._request(prompt, 1)))
            point = prefill_after_prefix_point(context + length, repeats)
            if point is None:
                log.info("prefill after %d cached tokens: none found cached", context)
                continue
            points.append(point)
            log.info(
                "prefill %d tokens after %d cached: %.1f ms",
                point.input_tokens,
                point.context_tokens,
                point.ttft_ms,
            )
        return points

    async def measure_decode(self) -> list[DecodePoint]:
        """Per point: cache fresh prompts (one token each), then decode them together."""
        points: list[DecodePoint] = []
        sweep = self.sweep
        for context in sweep.decode_context_tokens:
            for num_requests in sweep.decode_requests:
                prompts = [self._prompt(context) for _ in range(num_requests)]
                await time_together(self.engine, [self._request(p, 1) for p in prompts])
                point = await self._decode_point(prompts, context)
                points.append(point)
                log.info(
                    "decode %d requests over %d tokens: ITL %.1f ms",
                    num_requests,
                    point.context_tokens,
                    point.itl_ms,
                )
        return points

    async def _decode_point(self, prompts: list[list[int]], context: int) -> DecodePoint:
        """The cached `prompts` decoded together and timed; timed again (up to
        DECODE_TRIES times) when every request's tokens came in its first output: an engine
        whose steps are shorter than this client's wake-ups (a fast mocker on a loaded host)
        gives no gap to time, and another try usually does."""
        sweep = self.sweep
        attempt = 1
        while True:
            timed = [self._request(p, decode_max_tokens(sweep)) for p in prompts]
            times = await time_together(self.engine, timed)
            try:
                return decode_point(
                    decode_context_tokens(context, sweep),
                    times,
                    DECODE_SKIP_TOKENS,
                    sweep.decode_output_tokens,
                )
            except MeasureError:
                if attempt == DECODE_TRIES:
                    raise
                attempt += 1
                log.warning(
                    "no gap to time at %d requests over %d tokens: every token came in its "
                    "first output; timing them again (%d of %d)",
                    len(prompts),
                    context,
                    attempt,
                    DECODE_TRIES,
                )
