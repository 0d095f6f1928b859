"""The throughput plan: how many workers each role needs for a predicted load, from the
performance model (times multiplied by the correction factors). Pure; docs/architecture.md,
"Planner", works the formulas through.

    new tokens     n = isl (1 - prefix hit rate)
    prefill        p = k_p prefill_s(n)                 one prompt, batch 1
    prefill pool   ceil(lam n / (n / p)) = ceil(lam p)  prompt tokens/s over one worker's
    decode batch   B = the largest B with k_d decode_step_s(B, isl + osl/2) <= itl target
    decode pool    ceil(lam osl step / B)               Little: lam x residence osl*step, / B
    agg pool       ceil(lam p + lam osl step / B)       each worker's time shared by both,
                   and at least what keeps the decodes' ITL (the mean, and slo_attainment of
                   requests their own: agg_itl.py) while prefills share their steps

With the queueing model (queue-aware), a pool is also at least the fewest servers for which
`slo_attainment` of arrivals wait no longer than the target leaves after service (Erlang C,
`queueing.py`): prefill servers are workers; decode servers are B slots per worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from armature.planner.agg_itl import get_itl_attainment
from armature.planner.forecast import LoadForecast
from armature.planner.performance import PerformanceModel
from armature.planner.queueing import get_min_servers

__all__ = [
    "QUEUE_SEARCH_PAST_MAX",
    "DecodeBatch",
    "PoolPlan",
    "Targets",
    "get_agg_workers_for_itl",
    "get_decode_batch",
    "plan_agg",
    "plan_decode",
    "plan_prefill",
    "workers_for",
]

# a computed load of 2.0000000001 workers is 2 workers, not 3 (float error, not demand)
_CEIL_TOLERANCE = 1e-9
# how far past --max-workers the queueing model looks for the size a load needs (a want
# beyond it is reported as one more than the search reached)
QUEUE_SEARCH_PAST_MAX = 4


def workers_for(load: float) -> int:
    """ceil(load), forgiving float error."""
    return max(0, math.ceil(load - _CEIL_TOLERANCE))


@dataclass(frozen=True)
class Targets:
    """The SLO the planner holds: per-request TTFT and mean ITL, met by a fraction."""

    ttft_s: float
    itl_s: float
    slo_attainment: float


@dataclass(frozen=True)
class DecodeBatch:
    """The largest decode batch within the ITL target at a context length (`num_requests`
    1 with `meets_itl` False when even one request is too slow), and its step time."""

    context_tokens: float
    num_requests: int
    step_s: float
    meets_itl: bool


@dataclass(frozen=True)
class PoolPlan:
    """One pool's size for a predicted load, and why.

    `service_s`: the time one request holds a server (a prefill; a decode residence);
    `work_s`: the worker-seconds one request costs the pool (a prefill, p; a decode's share
    of its steps, osl step / B; both in an aggregated pool), so lam work_s workers are busy;
    `num_by_throughput`: the capacity formula; `num_by_queue`: the queueing model's fewest
    workers (None when queue-blind, with no load, or when service alone misses the target;
    it may pass `max_workers`, which the limits then cap);
    `meets_target`: whether service alone fits the target (else no pool size will)."""

    num_workers: int
    num_by_throughput: int
    num_by_queue: int | None
    service_s: float
    meets_target: bool
    work_s: float


def get_decode_batch(
    model: PerformanceModel, context_tokens: float, itl_s: float, correction: float
) -> DecodeBatch:
    """The largest batch B (up to the model's limit at this context) whose corrected step
    time is within `itl_s`."""
    best: DecodeBatch | None = None
    for num_requests in range(1, model.get_max_decode_requests(context_tokens) + 1):
        step_s = correction * model.get_decode_step_s(num_requests, context_tokens)
        if step_s <= itl_s:
            best = DecodeBatch(context_tokens, num_requests, step_s, True)
    if best is None:
        step_s = correction * model.get_decode_step_s(1, context_tokens)
        return DecodeBatch(context_tokens, 1, step_s, False)
    return best


def _queue_workers(
    load: LoadForecast,
    service_s: float,
    slack_s: float,
    attainment: float,
    slots_per_worker: int,
    max_workers: int,
) -> int | None:
    """The queueing model's fewest workers, searched up to QUEUE_SEARCH_PAST_MAX x
    `max_workers`: a pool the maximum leaves short asks for what it needs (the limits cap
    it, and report the role held) instead of the throughput count, which can be below the
    maximum. Past the search: one more than it reached (at least that many)."""
    if load.request_rate_per_s <= 0.0 or slack_s < 0.0:
        return None
    searched = QUEUE_SEARCH_PAST_MAX * max_workers
    num_servers = get_min_servers(
        load.request_rate_per_s,
        service_s,
        slack_s,
        attainment,
        max_servers=searched * slots_per_worker,
    )
    if num_servers is None:
        return searched + 1
    return workers_for(num_servers / slots_per_worker)


def _pool(
    by_throughput: int, by_queue: int | None, service_s: float, meets: bool, work_s: float
) -> PoolPlan:
    num_workers = max(by_throughput, by_queue or 0)
    return PoolPlan(num_workers, by_throughput, by_queue, service_s, meets, work_s)


def plan_prefill(
    load: LoadForecast,
    prefix_hit_rate: float,
    model: PerformanceModel,
    correction: float,
    targets: Targets,
    *,
    queue_aware: bool,
    max_workers: int,
) -> PoolPlan:
    """Prefill workers: predicted prompt tokens/s (after prefix hits) over what one worker
    sustains, n / p tokens/s, which is ceil(lam p); with the queue, at least the fewest
    workers for which `slo_attainment` of prompts wait at most ttft - p."""
    new_tokens = load.mean_input_tokens * (1.0 - prefix_hit_rate)
    service_s = correction * model.get_prefill_s(new_tokens)
    by_throughput = workers_for(load.request_rate_per_s * service_s)
    slack_s = targets.ttft_s - service_s
    by_queue = (
        _queue_workers(load, service_s, slack_s, targets.slo_attainment, 1, max_workers)
        if queue_aware
        else None
    )
    return _pool(by_throughput, by_queue, service_s, slack_s >= 0.0, service_s)


def plan_decode(
    load: LoadForecast,
    model: PerformanceModel,
    correction: float,
    targets: Targets,
    *,
    queue_aware: bool,
    max_workers: int,
) -> PoolPlan:
    """Decode workers: B requests per worker within ITL at context isl + osl/2; by Little's
    law a worker finishes B / (osl step) requests/s. With the queue: B slots per worker, and a
    request may wait for a slot what its ITL budget leaves, (itl - step)(osl - 1)."""
    batch = get_decode_batch(
        model, load.mean_input_tokens + load.mean_output_tokens / 2.0, targets.itl_s, correction
    )
    residence_s = load.mean_output_tokens * batch.step_s
    by_throughput = workers_for(load.request_rate_per_s * residence_s / batch.num_requests)
    slack_s = (targets.itl_s - batch.step_s) * max(load.mean_output_tokens - 1.0, 1.0)
    by_queue = (
        _queue_workers(
            load, residence_s, slack_s, targets.slo_attainment, batch.num_requests, max_workers
        )
        if queue_aware and batch.meets_itl
        else None
    )
    return _pool(
        by_throughput, by_queue, residence_s, batch.meets_itl, residence_s / batch.num_requests
    )


def get_agg_workers_for_itl(
    load: LoadForecast,
    prefill_s: float,
    model: PerformanceModel,
    decode_correction: float,
    context_tokens: float,
    itl_s: float,
    max_workers: int,
    *,
    attainment: float | None = None,
) -> int | None:
    """The fewest aggregated workers whose decodes keep `itl_s` while prefills share their
    steps (None: not within `max_workers`). A worker of W prefills for a share f = lam p / W
    of its time; the decodes advance one token a step in the rest, so their ITL is
    step(B) / (1 - f), where B = lam osl itl / W requests decode at once (Little's law at the
    target ITL). With `attainment`, also that share of requests keep their own mean ITL
    within target (`agg_itl.get_itl_attainment`: short answers that a prefill lands on)."""
    rate = load.request_rate_per_s
    if rate <= 0.0:
        return 0
    max_batch = model.get_max_decode_requests(context_tokens)
    for num_workers in range(1, max_workers + 1):
        prefill_share = rate * prefill_s / num_workers
        num_decoding = max(1, workers_for(rate * load.mean_output_tokens * itl_s / num_workers))
        if prefill_share >= 1.0 or num_decoding > max_batch:
            continue
        step_s = decode_correction * model.get_decode_step_s(num_decoding, context_tokens)
        if step_s / (1.0 - prefill_share) > itl_s:
            continue
        if attainment is None or (
            get_itl_attainment(
                rate / num_workers, prefill_s, step_s, load.mean_output_tokens, itl_s
            )
            >= attainment
        ):
            return num_workers
    return None


def plan_agg(
    load: LoadForecast,
    prefix_hit_rate: float,
    model: PerformanceModel,
    corrections: tuple[float, float],
    targets: Targets,
    *,
    queue_aware: bool,
    max_workers: int,
) -> PoolPlan:
    """Aggregated workers: each spends lam_w p s/s on prefill and lam_w osl step / B on
    decode, so the pool is ceil(lam p + lam osl step / B), and at least what keeps the
    decodes' ITL within target while prefills share their steps (`get_agg_workers_for_itl`).
    With the queue: B slots per worker, each held p + osl step, waits within ttft - p."""
    prefill_correction, decode_correction = corrections
    new_tokens = load.mean_input_tokens * (1.0 - prefix_hit_rate)
    prefill_s = prefill_correction * model.get_prefill_s(new_tokens)
    batch = get_decode_batch(
        model,
        load.mean_input_tokens + load.mean_output_tokens / 2.0,
        targets.itl_s,
        decode_correction,
    )
    decode_s = load.mean_output_tokens * batch.step_s
    rate = load.request_rate_per_s
    by_throughput = workers_for(rate * prefill_s + rate * decode_s / batch.num_requests)
    by_itl = get_agg_workers_for_itl(
        load,
        prefill_s,
        model,
        decode_correction,
        batch.context_tokens,
        targets.itl_s,
        max_workers,
        attainment=targets.slo_attainment,
    )
    by_throughput = max(by_throughput, max_workers if by_itl is None else by_itl)
    slack_s = targets.ttft_s - prefill_s
    meets = slack_s >= 0.0 and batch.meets_itl and by_itl is not None
    by_queue = (
        _queue_workers(
            load,
            prefill_s + decode_s,
            slack_s,
            targets.slo_attainment,
            batch.num_requests,
            max_workers,
        )
        if queue_aware and meets
        else None
    )
    work_s = prefill_s + decode_s / batch.num_requests
    return _pool(by_throughput, by_queue, prefill_s + decode_s, meets, work_s)
