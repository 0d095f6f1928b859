"""Live latency estimates for the load rule, from the workers' latest step records and the
frontend's queue.

    TTFT (prefill, agg): a new prompt of n new tokens waits for the q tokens queued ahead of it
        on its worker, each drained at n / p tokens/s (p = k_p prefill_s(n)):
            ttft_w = p (q_w + Q n / W + n) / n
        q_w: the worker's last record's queued prefill tokens; Q n / W: the frontend's queued
        requests spread over the role's W workers. The role's estimate is the mean over them.
    ITL (decode, agg): the mean wall time of the window's steps that decoded (a step is one
        token for each decode in it), over the role's workers.

    Backlog (prefill, agg): the prompts waiting for a prefill, (sum_w q_w) / n + Q.

An estimate is None when nothing was measured (no worker of the role reported, no decode
step in the window): no measurement is not a low latency.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from armature.planner.observation import FrontendMetrics, WorkerSteps
from armature.planner.performance import PerformanceModel
from armature.protocols.worker import WorkerRole

__all__ = ["LiveEstimate", "estimate_live", "get_backlog_requests"]


@dataclass(frozen=True)
class LiveEstimate:
    """A role's live TTFT and ITL estimates, seconds (None: not measured or not its job)."""

    ttft_s: float | None
    itl_s: float | None


def _estimate_ttft_s(
    workers: list[WorkerSteps],
    frontend: FrontendMetrics,
    model: PerformanceModel,
    prefill_correction: float,
    new_tokens: float,
) -> float | None:
    if not workers or new_tokens <= 0.0:
        return None
    prefill_s = prefill_correction * model.get_prefill_s(new_tokens)
    spread_tokens = frontend.num_queued_requests * new_tokens / len(workers)
    estimates = []
    for worker in workers:
        queued = _get_queued_tokens(worker)
        estimates.append(prefill_s * (queued + spread_tokens + new_tokens) / new_tokens)
    return statistics.fmean(estimates)


def _get_queued_tokens(worker: WorkerSteps) -> int:
    return worker.step_records[-1].num_queued_prefill_tokens if worker.step_records else 0


def get_backlog_requests(
    workers: list[WorkerSteps], frontend: FrontendMetrics, new_tokens: float
) -> float:
    """The prompts waiting for a prefill, in prompts of `new_tokens`: those queued on
    `workers` (their last records' queued prefill tokens / n) and at the frontend."""
    queued_tokens = sum(_get_queued_tokens(w) for w in workers)
    on_workers = queued_tokens / new_tokens if new_tokens > 0.0 else 0.0
    return on_workers + frontend.num_queued_requests


def _estimate_itl_s(workers: list[WorkerSteps]) -> float | None:
    walls = [
        r.step_wall_s
        for w in workers
        for r in w.step_records
        if r.num_decode_requests > 0 and r.step_wall_s > 0.0
    ]
    return statistics.fmean(walls) if walls else None


def estimate_live(
    role: WorkerRole,
    workers: list[WorkerSteps],
    frontend: FrontendMetrics,
    model: PerformanceModel,
    prefill_correction: float,
    new_tokens: float,
) -> LiveEstimate:
    """`role`'s estimates from its `workers`' records; `new_tokens`: a prompt's mean tokens
    to prefill (after prefix hits)."""
    ttft_s = itl_s = None
    if role in (WorkerRole.PREFILL, WorkerRole.AGG):
        ttft_s = _estimate_ttft_s(workers, frontend, model, prefill_correction, new_tokens)
    if role in (WorkerRole.DECODE, WorkerRole.AGG):
        itl_s = _estimate_itl_s(workers)
    return LiveEstimate(ttft_s, itl_s)
