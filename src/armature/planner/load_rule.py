"""The load rule's choice for one role on one tick (the planner's short loop): pure, no I/O,
no clock (the caller passes `now_s`).

    up     queue-aware: the queueing model at the window's rising rate, or what the prompt
           backlog needs to drain before a new worker could serve, whichever is more;
           otherwise (and below that) +1 when a live TTFT or ITL estimate is above its
           target, unless a worker is already starting or the queue drains before a new one
           could serve
    down   once every live estimate has been below `scale_down_ratio` of its target (or the
           SLO feedback has room) for the scale-down cool-down: -1, or queue-aware half the
           way to the model's size at the window's high rate; never below the floor (the
           throughput plan)

`LoadRule` keeps, per role, since when it has been calm; `Planner` (core.py) owns the counts,
floors, cool-downs and limits, and applies what the rule wants.
"""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.planner import PlannerConfig
from armature.planner.backlog import get_drain_s, get_workers_for_backlog
from armature.planner.decisions import DecisionReason
from armature.planner.live import LiveEstimate
from armature.planner.replicas import PoolPlan, Targets
from armature.protocols.worker import WorkerRole

__all__ = ["LoadRule", "Pending", "RoleState", "Want", "describe_live", "get_halfway"]


@dataclass(frozen=True)
class Want:
    """A size a rule asks for a role, and why."""

    num_workers: int
    reason: DecisionReason
    detail: str


@dataclass(frozen=True)
class Pending:
    """What a role has serving, starting and queued: `backlog_requests` prompts wait for a
    prefill (None: the role has no prompt queue); `busy_*` the workers the window's arrival
    rate keeps busy and `work_*_s` one request's worker-seconds, at the rate's low (up) and
    high (down) bound."""

    num_serving: int
    num_starting: int
    backlog_requests: float | None
    busy_up: float
    busy_down: float
    work_up_s: float
    work_down_s: float


@dataclass(frozen=True)
class RoleState:
    """A role as the planner stands: its count as last decided (`current`) and its floor
    (the throughput plan within the limits)."""

    current: int
    floor: int


class LoadRule:
    """The load rule with the planner's `config` and `targets`; remembers since when each
    role has been calm."""

    def __init__(self, config: PlannerConfig, targets: Targets) -> None:
        self._config = config
        self._targets = targets
        # since when each role's live estimates have all been below scale_down_ratio of
        # their targets (absent: they are not): the rule scales down only after
        # scale_down_cooldown_s of that, so one quiet window does not remove a worker
        self._calm_since_s: dict[WorkerRole, float] = {}

    def is_calm(self, role: WorkerRole, now_s: float) -> bool:
        """Whether the rule has seen every live estimate of `role` below the scale-down
        ratio of its target for the down cool-down."""
        since_s = self._calm_since_s.get(role)
        return since_s is not None and now_s - since_s >= self._config.scale_down_cooldown_s

    def decide(
        self,
        role: WorkerRole,
        state: RoleState,
        live: LiveEstimate,
        plans: tuple[PoolPlan, PoolPlan] | None,
        pending: Pending,
        trim_has_room: bool,
        now_s: float,
    ) -> Want | None:
        """What `role` should have now (None: stay). `plans`: queue-aware, the queueing
        model's plan at the window's rising rate and at its high bound; `trim_has_room`:
        the SLO feedback allows a scale-down although a live estimate is not quiet."""
        current = state.current
        detail = describe_live(live)
        startup_s = self._config.worker_startup_s
        held = False  # the queue model needs every worker the role has: it is not calm
        if plans is not None:
            up_plan = plans[0]
            by_backlog = 0
            if pending.backlog_requests:
                by_backlog = get_workers_for_backlog(
                    pending.backlog_requests * pending.work_up_s,
                    pending.num_serving,
                    pending.busy_up,
                    startup_s,
                    max(startup_s, self._config.load_interval_s),
                )
            held = max(up_plan.num_workers, by_backlog) >= current
            if max(up_plan.num_workers, by_backlog) > current:
                self._calm_since_s.pop(role, None)
                reason = DecisionReason.QUEUE_PREDICTED
                if by_backlog > up_plan.num_workers:
                    reason = DecisionReason.QUEUE_BACKLOG
                return Want(
                    max(up_plan.num_workers, by_backlog),
                    reason,
                    f"{detail}; queue model needs {up_plan.num_workers} (by queue "
                    f"{up_plan.num_by_queue}, by throughput {up_plan.num_by_throughput}), "
                    f"{pending.backlog_requests or 0:.0f} prompts queued (the backlog needs "
                    f"{by_backlog})",
                )
        up = max(current + 1, state.floor)
        drain_s = None
        if pending.backlog_requests is not None:
            drain_s = get_drain_s(
                pending.backlog_requests * pending.work_down_s,
                pending.num_serving,
                pending.busy_down,
            )
        # a worker added for a live latency helps only if none is starting already; for TTFT,
        # only if the queue would still be there when it serves
        ttft_s, itl_s = self._targets.ttft_s, self._targets.itl_s
        idle_start = pending.num_starting == 0
        outlasts = drain_s is None or drain_s > startup_s
        if idle_start and outlasts and live.ttft_s is not None and live.ttft_s > ttft_s:
            return Want(up, DecisionReason.TTFT_ABOVE_TARGET, detail)
        if idle_start and live.itl_s is not None and live.itl_s > itl_s:
            return Want(up, DecisionReason.ITL_ABOVE_TARGET, detail)
        ratio = self._config.scale_down_ratio
        pairs = ((live.ttft_s, ttft_s), (live.itl_s, itl_s))
        measured = [(v, t) for v, t in pairs if v is not None]
        quiet = bool(measured) and all(v < ratio * t for v, t in measured)
        if held or (not quiet and not trim_has_room):
            # (a quiet role the queue model sized as it is was lowered by the throughput
            # plan once calm, and raised again by the queue model at the next tick)
            self._calm_since_s.pop(role, None)
            return None
        self._calm_since_s.setdefault(role, now_s)
        if not self.is_calm(role, now_s):
            return None
        down = current - 1 if plans is None else get_halfway(current, plans[1].num_workers)
        down = max(down, state.floor)
        if down < current:
            return Want(down, DecisionReason.BELOW_TARGET, detail)
        return None


def get_halfway(current: int, target: int) -> int:
    """A scale-down's next size: half the way from `current` down to `target`, rounded down
    (7 -> 6 reaches 6; 14 -> 6 stops at 10). The model behind `target` is least sure far
    from where the fleet runs, so each step down is measured before the next."""
    if target >= current:
        return current
    return (current + target) // 2


def describe_live(live: LiveEstimate) -> str:
    parts = []
    if live.ttft_s is not None:
        parts.append(f"live ttft {live.ttft_s * 1000.0:.0f} ms")
    if live.itl_s is not None:
        parts.append(f"live itl {live.itl_s * 1000.0:.1f} ms")
    return ", ".join(parts) or "no live estimate"
