"""What the planner core is given each tick (`PlannerObservation`): the frontend's metrics
over the tick's window and the step records each worker sent in it. The planner service
builds it from the frontend's metrics and the event plane's `WorkerUpdate`s."""

from __future__ import annotations

import msgspec

from armature.protocols.engine import StepRecord
from armature.protocols.worker import WorkerRole

__all__ = ["FrontendMetrics", "PlannerObservation", "WorkerSteps"]


class FrontendMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """What the frontend measured over one window of `window_s` seconds.

    `num_requests` counts the requests that arrived; the lengths and latencies are means as
    a frontend measures them (`window_counts`): input lengths and TTFT over the requests whose
    first token came in the window, output lengths over those that finished in it (a length
    is not known at arrival), ITL over the token gaps streamed. A latency is None when no
    request gave one (no traffic is not "fast"); a length none gave is the last window's,
    0.0 until one was measured. `prefix_hit_rate` is the
    fraction of prompt tokens served from a prefix cache; `num_queued_requests` the requests
    waiting for a worker at the window's end (the admission gate's queue)."""

    window_s: float
    num_requests: int
    mean_input_tokens: float
    mean_output_tokens: float
    prefix_hit_rate: float = 0.0
    mean_ttft_ms: float | None = None
    mean_itl_ms: float | None = None
    num_queued_requests: int = 0
    # requests that finished in the window judged against the planner's targets, and those
    # of them with TTFT and mean ITL both within (0 judged: the frontend does not judge)
    num_judged_requests: int = 0
    num_met_requests: int = 0

    def get_request_rate_per_s(self) -> float:
        """Arrivals per second over the window."""
        return self.num_requests / self.window_s


class WorkerSteps(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's step records from the window, oldest first."""

    worker_id: str
    role: WorkerRole
    step_records: list[StepRecord] = msgspec.field(default_factory=list)


class PlannerObservation(msgspec.Struct, frozen=True, kw_only=True):
    """One tick's input: the frontend's window and each live worker's steps in it."""

    frontend: FrontendMetrics
    workers: list[WorkerSteps] = msgspec.field(default_factory=list)

    def get_workers(self, role: WorkerRole) -> list[WorkerSteps]:
        return [w for w in self.workers if w.role is role]
