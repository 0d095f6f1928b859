"""What the planner decided, and why: one `ScalingDecision` per change of a role's worker
count (one log line each; metrics count them by reason and limit), and a `LimitHold` for each
role whose limits keep it below what a rule asked for (no change may follow: a role at its
maximum stays there, short of the workers its targets need)."""

from __future__ import annotations

import enum

import msgspec

from armature.protocols.worker import WorkerRole

__all__ = ["DecisionReason", "LimitHold", "LimitReason", "ScalingDecision"]


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


class LimitHold(msgspec.Struct, frozen=True, kw_only=True):
    """At `at_s`, `role` was asked `wanted_workers` for `reason` but `limited_by` allows it
    `num_workers`: the fleet stays short of what the rule asked for, and its targets may be
    missed."""

    role: WorkerRole
    num_workers: int
    wanted_workers: int
    reason: DecisionReason
    limited_by: LimitReason
    at_s: float

    def get_log_line(self) -> str:
        return (
            f"planner: {self.role.value} wants {self.wanted_workers} workers "
            f"({self.reason.value}) but {self.limited_by.value} holds it at {self.num_workers}: "
            "its targets may be missed"
        )
