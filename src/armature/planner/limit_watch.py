"""Which roles a maximum holds below what the planner's rules ask for, tick after tick.

A role at its `--max-workers` (or the total budget) makes no decision when a rule asks for
more: its count does not change. Each tick's `PlannerEffects.limited` says which roles were
held; the load rule's ticks and the throughput plan's each speak for themselves, and a role
is held while the latest tick of either held it. `update` reports the changes, so that a
caller logs a line when a role becomes held and when it is released, not every tick. Pure:
the caller passes the ticks.
"""

from __future__ import annotations

from collections.abc import Iterable

from armature.planner.decisions import LimitHold
from armature.protocols.worker import WorkerRole

__all__ = ["LimitWatch"]


class LimitWatch:
    def __init__(self) -> None:
        self._by_source: dict[tuple[str, WorkerRole], LimitHold] = {}

    def update(
        self, source: str, roles: Iterable[WorkerRole], limited: Iterable[LimitHold]
    ) -> tuple[list[LimitHold], list[WorkerRole]]:
        """A tick of `source` ("load", "interval") that planned `roles` and found `limited`
        held: the holds of roles that became held, and the roles released."""
        before = self.get_held()
        for role in roles:
            self._by_source.pop((source, role), None)
        for hold in limited:
            self._by_source[(source, hold.role)] = hold
        after = self.get_held()
        entered = [hold for role, hold in after.items() if role not in before]
        released = [role for role in before if role not in after]
        return entered, released

    def get_held(self) -> dict[WorkerRole, LimitHold]:
        """Each held role's hold: of the sources that hold it, the one that asked for the most
        workers (on a tie, the first source by name)."""
        held: dict[WorkerRole, LimitHold] = {}
        for (_, role), hold in sorted(self._by_source.items(), key=lambda kv: kv[0][0]):
            kept = held.get(role)
            if kept is None or hold.wanted_workers > kept.wanted_workers:
                held[role] = hold
        return held
