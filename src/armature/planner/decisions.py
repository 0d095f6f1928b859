"""What the planner decided, and why: one `ScalingDecision` per change of a role's worker
count (one log line each; metrics count them by reason and limit)."""

from __future__ import annotations

import enum

import msgspec

from armature.protocols.worker import WorkerRole

__all__ = ["DecisionReason", "LimitReason", "ScalingDecision"]


class DecisionReason(enum.StrEnum):
    """Which rule asked for the change."""

    THROUGHPUT = "throughput"  # the throughput plan for the predicted load
    QUEUE_PREDICTED = "queue_predicted"  # the queueing model: waits would pass the target
    QUEUE_BACKLOG = "queue_backlog"  # queued prompts would outlast a new worker's start
    TTFT_ABOVE_TARGET = "ttft_above_target"  # load rule: live TTFT estimate above target
    ITL_ABOVE_TARGET = "itl_above_target"  # load rule: live ITL estimate above target
    BELOW_TARGET = "below_target"  # load rule: live estimates well below their targets


class LimitReason(enum.StrEnum):
    """Which limit cut the change short."""

    MIN_WORKERS = "min_workers"
    MAX_WORKERS = "max_workers"
    TOTAL_WORKERS = "total_workers"  # --max-total-workers or the GPU budget


class ScalingDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A role goes from `from_workers` to `to_workers` at `at_s`. `wanted_workers` is what
    the rule asked before limits (`limited_by` names the limit when they differ); `detail`
    the numbers behind it, for the log line."""

    role: WorkerRole
    from_workers: int
    to_workers: int
    wanted_workers: int
    reason: DecisionReason
    at_s: float
    limited_by: LimitReason | None = None
    detail: str = ""

    def get_log_line(self) -> str:
        limit = f" (limited by {self.limited_by.value})" if self.limited_by else ""
        detail = f": {self.detail}" if self.detail else ""
        return (
            f"planner: {self.role.value} {self.from_workers} -> {self.to_workers} workers, "
            f"{self.reason.value}{limit}{detail}"
        )
