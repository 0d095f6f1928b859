"""LimitWatch: a role is held while the latest tick of either source held it; changes are
reported once, when a role becomes held and when it is released."""

from __future__ import annotations

from armature.planner.decisions import DecisionReason, LimitHold, LimitReason
from armature.planner.limit_watch import LimitWatch
from armature.protocols.worker import WorkerRole

P, D = WorkerRole.PREFILL, WorkerRole.DECODE
ROLES = (P, D)


def hold(role: WorkerRole, wanted: int, at_s: float, limit: int = 4) -> LimitHold:
    return LimitHold(
        role=role,
        num_workers=limit,
        wanted_workers=wanted,
        reason=DecisionReason.QUEUE_PREDICTED,
        limited_by=LimitReason.MAX_WORKERS,
        at_s=at_s,
    )


def test_a_role_is_held_while_either_source_last_held_it() -> None:
    watch = LimitWatch()
    assert watch.update("load", ROLES, [hold(D, 6, 5.0)]) == ([hold(D, 6, 5.0)], [])
    assert watch.update("load", ROLES, [hold(D, 7, 10.0)]) == ([], [])  # still held: no line
    assert watch.get_held() == {D: hold(D, 7, 10.0)}
    # the throughput plan holds it too, asking for more: still one hold, the larger ask
    assert watch.update("interval", ROLES, [hold(D, 9, 12.0)]) == ([], [])
    assert watch.get_held() == {D: hold(D, 9, 12.0)}
    # the load rule lets go; the interval's last tick still holds it
    assert watch.update("load", ROLES, []) == ([], [])
    assert watch.get_held() == {D: hold(D, 9, 12.0)}
    assert watch.update("interval", ROLES, [hold(P, 5, 72.0)]) == ([hold(P, 5, 72.0)], [D])
    assert watch.get_held() == {P: hold(P, 5, 72.0)}


def test_a_tick_that_plans_other_roles_leaves_a_hold_alone() -> None:
    watch = LimitWatch()
    watch.update("load", ROLES, [hold(P, 5, 0.0)])
    assert watch.update("load", (D,), []) == ([], [])
    assert watch.update("load", (P,), []) == ([], [P])
    assert watch.get_held() == {}
