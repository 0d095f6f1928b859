"""A fleet sized by a fixed schedule instead of a planner: the reference a planner is judged
against (what a fleet that knew the right size for each moment would cost and hold). Pure.

    ScheduledSizer([(0.0, 4), (305.0, 7), (605.0, 4)], start_s)
        from start_s + 0 s the fleet is 4 workers, from + 305 s 7, from + 605 s 4 again

It answers `PlannedFleet` as a planner does (`FleetSizer`): every tick, each role's count; a
replay then starts, drains and stops workers exactly as it does for the planner's decisions
(new ones join routing `--worker-startup-s` after they are asked for).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from armature.planner.core import PlannerEffects
from armature.planner.observation import PlannerObservation
from armature.protocols.worker import WorkerRole

__all__ = ["ScheduledSizer"]


class ScheduledSizer:
    """One role's size as a step function of the seconds since `start_s` (the first
    arrival): `changes` are (seconds, workers), the first at 0, times strictly increasing."""

    def __init__(
        self,
        changes: Sequence[tuple[float, int]],
        start_s: float,
        role: WorkerRole = WorkerRole.AGG,
    ) -> None:
        if not changes or changes[0][0] != 0.0:
            raise ValueError("a schedule starts at 0 s")
        times = [at_s for at_s, _ in changes]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError("a schedule's times must increase strictly")
        if any(num < 1 for _, num in changes):
            raise ValueError("a schedule's sizes must be at least 1 worker")
        self._times = times
        self._sizes = [num for _, num in changes]
        self._start_s = start_s
        self._role = role

    def get_size(self, now_s: float) -> int:
        """The size the schedule gives at `now_s` (before the start: its first)."""
        index = bisect.bisect_right(self._times, now_s - self._start_s) - 1
        return self._sizes[max(index, 0)]

    def get_num_workers(self) -> dict[WorkerRole, int]:
        return {self._role: self._sizes[0]}

    def plan_load(self, observation: PlannerObservation, now_s: float) -> PlannerEffects:
        return PlannerEffects([], [], {self._role: self.get_size(now_s)})

    def plan_interval(self, observation: PlannerObservation, now_s: float) -> PlannerEffects:
        return self.plan_load(observation, now_s)
