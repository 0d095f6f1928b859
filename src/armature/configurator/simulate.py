"""A deployment through the simulator: `armature replay`'s mocker workers and real router on
the virtual clock, on the same step times as the estimate, at the deployment's rate.

    SimPlan     the fleet simulated (up to `max_sim_groups` of the deployment's groups,
                the replicas the kv router balances; with fewer than all N, their arrivals
                are what that many of N groups see of a Poisson stream spread over them in
                turn, Erlang gaps), its ReplayConfig, the rate it is offered, and how many
                requests: enough that their arrivals span SPAN_E2E_MULTIPLE estimated
                end-to-end latencies (the warm-up a small share of what is measured)
    make_requests  the workload as a trace: lengths within the spread, unique prompts,
                Erlang arrivals (or a trace's own requests, their arrivals rescaled, and
                repeated when the trace is shorter than the replay)
    simulate    replay -> Prediction: TTFT median, ITL mean, and the rate served

The rate served is the rate offered (requests over the span of their arrivals) when every
request finished; the simulation judges the latencies at it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from armature.configurator.estimate import Prediction
from armature.configurator.space import Deployment, Workload
from armature.sim.replay import ReplayConfig, ReplayReport, replay
from armature.sim.timing import TimingModel
from armature.workload.traces import TRACE_BLOCK_TOKENS, TraceRequest

__all__ = ["SPAN_E2E_MULTIPLE", "SimPlan", "get_num_sim_requests", "make_requests", "simulate"]

SPAN_E2E_MULTIPLE = 5.0
MAX_SIM_REQUESTS = 1000


@dataclass(frozen=True)
class SimPlan:
    deployment: Deployment
    num_groups: int  # simulated (the deployment may replicate more)
    request_rate_per_s: float  # offered to the simulated groups together
    num_requests: int
    config: ReplayConfig
    # the simulated group's arrivals are what one of this many groups sees (make_requests)
    arrival_shape: int = 1


def get_num_sim_requests(rate_per_s: float, e2e_ms: float, minimum: int) -> int:
    """Requests whose arrivals at `rate_per_s` span SPAN_E2E_MULTIPLE x `e2e_ms`, at
    least `minimum`, at most MAX_SIM_REQUESTS."""
    needed = math.ceil(rate_per_s * SPAN_E2E_MULTIPLE * e2e_ms / 1000.0)
    return max(minimum, min(MAX_SIM_REQUESTS, needed))


def _length(rng: random.Random, mean: float, spread: float) -> int:
    return max(1, round(rng.uniform(mean * (1 - spread), mean * (1 + spread))))


def make_requests(
    workload: Workload, rate_per_s: float, num_requests: int, seed: int, num_groups: int = 1
) -> list[TraceRequest]:
    """`num_requests` requests of `workload` arriving at `rate_per_s` on average: what one
    of `num_groups` groups sees of a Poisson stream spread over them in turn (Erlang
    gaps of shape `num_groups`; Poisson for one group)."""
    rng = random.Random(seed)
    if workload.trace:
        trace = _cycled(workload.trace, num_requests)
        start_ms = trace[0].arrival_ms
        span_ms = trace[-1].arrival_ms - start_ms
        target_ms = (len(trace) - 1) / rate_per_s * 1000.0
        scale = target_ms / span_ms if span_ms > 0 else 1.0
        return [
            TraceRequest(
                (r.arrival_ms - start_ms) * scale, r.input_length, r.output_length, r.hash_ids
            )
            for r in trace
        ]
    requests: list[TraceRequest] = []
    now_ms, next_id = 0.0, 0
    for i in range(num_requests):
        if i:
            now_ms += rng.gammavariate(num_groups, 1.0 / (num_groups * rate_per_s)) * 1000.0
        isl = _length(rng, workload.isl_tokens, workload.spread)
        num_blocks = -(-isl // TRACE_BLOCK_TOKENS)
        hash_ids = tuple(range(next_id, next_id + num_blocks))  # no prompt shares a prefix
        next_id += num_blocks
        osl = _length(rng, workload.osl_tokens, workload.spread)
        requests.append(TraceRequest(now_ms, isl, osl, hash_ids))
    return requests


def _cycled(trace: Sequence[TraceRequest], num_requests: int) -> list[TraceRequest]:
    """The first `num_requests` of `trace`, repeated as often as it takes: each repetition
    arrives one mean gap after the last one's end, with hash ids of its own (the trace's
    prefix sharing within a repetition, none across them)."""
    if len(trace) >= num_requests:
        return list(trace[:num_requests])
    start_ms = trace[0].arrival_ms
    span_ms = trace[-1].arrival_ms - start_ms
    period_ms = span_ms + span_ms / (len(trace) - 1) if len(trace) > 1 else 0.0
    stride = 1 + max((h for r in trace for h in r.hash_ids), default=-1)
    out: list[TraceRequest] = []
    for k in range(-(-num_requests // len(trace))):
        out += [
            TraceRequest(
                r.arrival_ms + k * period_ms,
                r.input_length,
                r.output_length,
                tuple(h + k * stride for h in r.hash_ids),
            )
            for r in trace
        ]
    return out[:num_requests]


def _prediction(
    plan: SimPlan, requests: Sequence[TraceRequest], report: ReplayReport
) -> Prediction:
    span_s = (requests[-1].arrival_ms - requests[0].arrival_ms) / 1000.0
    rate = (len(requests) - 1) / span_s if span_s > 0 else float(len(requests))
    rate *= report.num_requests / len(requests)  # the share that finished
    osl = sum(r.output_length for r in requests) / len(requests)
    num_gpus = plan.num_groups * plan.deployment.num_gpus
    running = rate / plan.num_groups / max(1, plan.deployment.num_decode_workers)
    return Prediction(
        ttft_ms=report.ttft_ms.p50,
        itl_ms=report.itl_ms.mean,
        request_rate_per_s=rate / plan.num_groups,
        tokens_per_s_per_gpu=rate * osl / num_gpus,
        num_running=round(running * osl * report.itl_ms.mean / 1000.0),
    )


def simulate(
    plan: SimPlan,
    requests: Sequence[TraceRequest],
    timing: TimingModel,
    prefill_timing: TimingModel | None = None,
) -> Prediction:
    """The plan's fleet replaying `requests` (per group, as `Prediction` counts)."""
    report = replay(requests, plan.config, timing, prefill_timing)
    return _prediction(plan, requests, report)
