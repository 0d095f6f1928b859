"""The profile's load pass: the swept engine serves Poisson arrivals of mixed lengths, and its
steps' wall time is set against what the sweep's tables give for the same steps.

    plan_load(timing, sweep, limits)   -> LoadPlan   pure: lengths, rate, arrivals
    check_load(records, timing, plan)  -> LoadCheck  pure: measured over modeled
    run_load_pass(engine, ...)         -> LoadCheck  the shell: submits, waits, reads records

The sweep times uniform batches: every request at one context length, batch sizes at the
swept points, prefill alone. A served engine's batches mix contexts, land between the swept
sizes and carry prefill chunks beside decodes; the load pass measures what that costs on this
engine: the sum of the steps' wall times over the sum of their modeled times (so long steps
weigh as they weigh in latency), in all and for prompt steps and decode steps apart. The
mocker scales prompt steps by their class's ratio (`LoadCheck.prompt_step_factor`).

The rate keeps the engine busy without a growing queue: `LOAD_UTILIZATION` of what one
request costs by the tables (its prompt's prefill alone, its outputs at the largest swept
batch), so the batches the pass sees are the partly full ones of a loaded server.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from armature.config import ProfileSweepConfig
from armature.engines.api import Engine
from armature.profiler.plan import EngineLimits
from armature.profiler.sweep import ProfilerError, time_request
from armature.protocols.engine import EngineRequest, SamplingParams, StepRecord
from armature.protocols.timing_profile import LoadCheck
from armature.sim.profile_timing import ProfileTiming
from armature.sim.timing import StepWork

__all__ = [
    "LOAD_UTILIZATION",
    "LoadPlan",
    "check_load",
    "plan_load",
    "run_load_pass",
    "sum_step_times",
]

LOAD_UTILIZATION = 0.7  # of the engine's capacity by the sweep's tables


@dataclass(frozen=True)
class LoadPlan:
    """The load pass's requests: (arrival s from the start, prompt tokens, output tokens)."""

    request_rate_per_s: float
    requests: tuple[tuple[float, int, int], ...]


def plan_load(
    timing: ProfileTiming, sweep: ProfileSweepConfig, limits: EngineLimits, num_requests: int
) -> LoadPlan:
    """`num_requests` Poisson arrivals (seeded by the sweep's prompt seed): prompts uniform
    over the swept prefill lengths within the step budget (and short enough for their
    outputs to fit the context), outputs uniform in [n, 3n] for the sweep's n timed decode
    tokens, at `LOAD_UTILIZATION` of the tables' capacity. ValueError for a request count
    below one or a context too short for the shortest prompt and its outputs."""
    if num_requests < 1:
        raise ValueError("the load pass needs at least one request")
    fewest_outputs = sweep.decode_output_tokens
    most_outputs = 3 * sweep.decode_output_tokens
    shortest = int(timing.prefill_tokens[0])
    longest = min(int(timing.prefill_tokens[-1]), limits.max_model_len_tokens - most_outputs)
    if longest < shortest:
        raise ValueError(
            f"a {shortest}-token prompt and {most_outputs} outputs do not fit the engine's "
            f"{limits.max_model_len_tokens}-token context"
        )
    mean_prompt = (shortest + longest) / 2
    mean_outputs = (fewest_outputs + most_outputs) / 2
    batch = min(timing.decode_requests[-1], float(limits.max_num_seqs))
    context = mean_prompt + mean_outputs / 2
    request_ms = timing.get_prefill_ms(mean_prompt) + mean_outputs * (
        timing.get_decode_ms(batch, context) / batch
    )
    rate_per_s = LOAD_UTILIZATION * 1000.0 / request_ms
    rng = random.Random(sweep.prompt_seed)
    arrival_s = 0.0
    requests = []
    for _ in range(num_requests):
        requests.append(
            (
                arrival_s,
                rng.randint(shortest, longest),
                rng.randint(fewest_outputs, most_outputs),
            )
        )
        arrival_s += rng.expovariate(rate_per_s)
    return LoadPlan(rate_per_s, tuple(requests))


def sum_step_times(records: Sequence[StepRecord], timing: ProfileTiming) -> tuple[float, float]:
    """(the steps' wall time, the tables' time for the same work), each summed, in seconds."""
    measured_s = sum(r.step_wall_s for r in records)
    modeled_ms = sum(timing.step_ms(StepWork.of_record(r)) for r in records)
    return measured_s, modeled_ms / 1000.0


def check_load(records: Sequence[StepRecord], timing: ProfileTiming, plan: LoadPlan) -> LoadCheck:
    """The steps' summed wall time over the tables' summed times for the same work, in all
    and by class (prompt steps: any prefill tokens; decode steps). ValueError when no step
    was recorded (an engine that keeps no step records) or the tables give the steps no
    time."""
    if not records:
        raise ValueError("the engine recorded no steps")
    prompt_s = sum_step_times([r for r in records if r.num_scheduled_prefill_tokens], timing)
    decode_s = sum_step_times([r for r in records if not r.num_scheduled_prefill_tokens], timing)
    modeled_s = prompt_s[1] + decode_s[1]
    if modeled_s <= 0:
        raise ValueError("the sweep's tables give its steps no time")
    return LoadCheck(
        num_requests=len(plan.requests),
        request_rate_per_s=plan.request_rate_per_s,
        num_steps=len(records),
        measured_s=prompt_s[0] + decode_s[0],
        modeled_s=modeled_s,
        prompt_measured_s=prompt_s[0],
        prompt_modeled_s=prompt_s[1],
        decode_measured_s=decode_s[0],
        decode_modeled_s=decode_s[1],
    )


async def run_load_pass(
    engine: Engine,
    vocab_size: int,
    plan: LoadPlan,
    timing: ProfileTiming,
    seed: int,
    clock_s: Callable[[], float] = time.perf_counter,
) -> LoadCheck:
    """Serve `plan` on the started `engine` (fresh random prompts, EOS ignored) and check
    its steps against `timing`. ProfilerError when a request fails or no step was recorded."""
    rng = random.Random(seed + 1)  # not the sweep's prompts: nothing hits the prefix cache
    engine.take_step_records()  # the sweep's steps are not the pass's
    records: list[StepRecord] = []  # drained as requests finish: the engine's buffer is bounded
    started_s = clock_s()

    async def one(i: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> None:
        await asyncio.sleep(max(0.0, started_s + arrival_s - clock_s()))
        request = EngineRequest(
            request_id=f"profile-load-{i}",
            prompt_token_ids=[rng.randrange(vocab_size) for _ in range(prompt_tokens)],
            sampling=SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True),
        )
        await time_request(engine, request, clock_s)
        records.extend(engine.take_step_records())

    await asyncio.gather(*(one(i, *r) for i, r in enumerate(plan.requests)))
    records.extend(engine.take_step_records())
    try:
        return check_load(records, timing, plan)
    except ValueError as exc:
        raise ProfilerError(f"the load pass cannot be checked: {exc}") from None
