"""The prompts a role has queued, as work: how long its serving workers take to clear them,
and how many workers clear them soon enough when new ones take a while to start. Pure.

    busy       u = lam work_s, the workers' worth of time the arriving load keeps busy
    backlog    b = queued prompts x work_s, worker-seconds
    drain      b / (W - u) with W serving workers (inf when W <= u: the queue grows)
    at join    b_S = max(0, b + S (u - W)): the backlog when workers asked for now start
               serving, S seconds later
    needed     ceil(u + b_S / H): enough to keep up and clear b_S within H more seconds
"""

from __future__ import annotations

import math

from armature.planner.replicas import workers_for

__all__ = ["get_drain_s", "get_workers_for_backlog"]


def get_drain_s(backlog_work_s: float, num_serving: int, busy_workers: float) -> float:
    """Seconds until `num_serving` workers clear `backlog_work_s` worker-seconds of queued
    work while the arriving load keeps `busy_workers` of them busy: 0.0 with no backlog, inf
    where it grows."""
    if backlog_work_s <= 0.0:
        return 0.0
    spare = num_serving - busy_workers
    return backlog_work_s / spare if spare > 0.0 else math.inf


def get_workers_for_backlog(
    backlog_work_s: float,
    num_serving: int,
    busy_workers: float,
    startup_s: float,
    horizon_s: float,
) -> int:
    """The fewest workers that, with those asked for now serving after `startup_s`, keep up
    with the load and clear what is queued by then within `horizon_s` more seconds."""
    at_join = max(0.0, backlog_work_s + startup_s * (busy_workers - num_serving))
    return workers_for(busy_workers + at_join / horizon_s)
