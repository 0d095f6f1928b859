"""A simulated fleet that a planner sizes on the virtual clock (`armature replay --planner`),
and what any replay's fleet cost and how it held its targets.

    every load_interval_s    sample the fleet (the timeline); with the load rule, plan_load
    every interval_s         with the throughput plan, plan_interval
    a decision               the role's target: new workers start, and join routing
                             `worker_startup_s` later; surplus ones leave (a starting one
                             first, then the least loaded), finish what they hold, then stop

A worker costs from the moment it is asked for until it has stopped (or the replay ends):
`worker_seconds` is that time summed. The time a maximum held a role below what the planner
asked for (`LimitWatch`) is summed too, with the most workers it asked for. Without a
planner the fleet only samples, so a static replay reports the same numbers. The planner
sees what it would see in production: the frontend's windows (`FrontendWindows`) and the
step records of the workers in routing.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from armature.errors import ArmatureError
from armature.planner.core import PlannerEffects
from armature.planner.limit_watch import LimitWatch
from armature.planner.observation import PlannerObservation, WorkerSteps
from armature.protocols.engine import StepRecord
from armature.protocols.worker import WorkerRole
from armature.sim.fleet_monitor import FrontendWindows
from armature.sim.replay_config import PLANNER_RULES, FleetSample
from armature.sim.replay_disagg import DisaggSimulation
from armature.sim.simulation import Simulation
from armature.workload.measure import Slo

__all__ = [
    "MAX_FLEET_SAMPLES",
    "MAX_PLANNED_SAMPLES",
    "FleetSizer",
    "PlannedFleet",
    "ReplayTooLongError",
    "WorkerSpan",
    "get_max_samples",
    "get_sla_attainment",
]

# fleet samples a replay takes at most (one a load interval of simulated time, kept in its
# timeline): more is a replay of hours, a workload spanning years or steps far slower than
# its arrivals; with a planner, whose load rule runs at each (~1-10 ms here), fewer
MAX_FLEET_SAMPLES = 50_000
MAX_PLANNED_SAMPLES = 10_000
_LOAD, _INTERVAL = "load", "interval"


def get_max_samples(planned: bool) -> int:
    """The fleet samples a replay may take (`planned`: with a planner)."""
    return MAX_PLANNED_SAMPLES if planned else MAX_FLEET_SAMPLES


class ReplayTooLongError(ArmatureError, ValueError):
    """The replay's simulated time passed MAX_FLEET_SAMPLES load intervals with work left."""


# step records kept per worker between two interval ticks (older ones are dropped)
_MAX_RECORDS_PER_WORKER = 4096


class FleetSizer(Protocol):
    """What sizes a planned fleet: the planner (`Planner`), or a fixed schedule
    (`scheduled_fleet.ScheduledSizer`). Each tick gives every role's count."""

    def get_num_workers(self) -> dict[WorkerRole, int]: ...

    def plan_load(self, observation: PlannerObservation, now_s: float) -> PlannerEffects: ...

    def plan_interval(self, observation: PlannerObservation, now_s: float) -> PlannerEffects: ...


@dataclass
class WorkerSpan:
    """One worker's cost: from when it was asked for until it stopped (None: not yet)."""

    role: WorkerRole
    provisioned_ms: float
    stopped_ms: float | None = None


@dataclass
class _Pool:
    serving: list[str] = field(default_factory=list)
    starting: list[str] = field(default_factory=list)


class PlannedFleet:
    """Watches `simulation`'s fleet (all of it at start is `roles`' workers) and, with a
    `planner`, resizes it by `rule` (`PLANNER_RULES`). With `targets` (TTFT ms, mean ITL ms)
    the planner's windows judge each finished request against them, as a frontend would."""

    def __init__(
        self,
        simulation: Simulation,
        *,
        load_interval_s: float,
        interval_s: float,
        planner: FleetSizer | None = None,
        rule: str = "both",
        worker_startup_s: float = 0.0,
        targets: tuple[float, float] | None = None,
    ) -> None:
        if rule not in PLANNER_RULES:
            raise ValueError(f"unknown planner rule {rule!r}")
        self._sim = simulation
        self._planner = planner
        self._rule = rule
        self._startup_ms = worker_startup_s * 1000.0
        self._load_ms = load_interval_s * 1000.0
        self._interval_ms = interval_s * 1000.0
        self._windows = FrontendWindows((_LOAD, _INTERVAL), targets)
        self._records: dict[str, dict[str, list[StepRecord]]] = {_LOAD: {}, _INTERVAL: {}}
        self._start_ms = simulation.requests[0].arrival_ms if simulation.requests else 0.0
        self._pools: dict[WorkerRole, _Pool] = {}
        self.spans: dict[str, WorkerSpan] = {}
        if simulation.prefill_workers:
            self._add_initial(WorkerRole.PREFILL, simulation.prefill_workers)
            self._add_initial(WorkerRole.DECODE, simulation.workers)
        else:
            self._add_initial(WorkerRole.AGG, simulation.workers)
        self._names = itertools.count()
        self.timeline: list[FleetSample] = []
        self.decisions: Counter[str] = Counter()
        self._limits = LimitWatch()
        self._held_since_ms: dict[WorkerRole, float] = {}
        self._held_ms: dict[WorkerRole, float] = {}
        self.most_wanted: dict[WorkerRole, int] = {}  # by a rule a maximum held back
        simulation.monitor = self._windows
        simulation.on_drained = self._on_drained
        simulation.call_at(self._start_ms + self._load_ms, "fleet:load", self._on_load_tick)
        if planner is not None and rule != "load":
            simulation.call_at(
                self._start_ms + self._interval_ms, "fleet:interval", self._on_interval_tick
            )

    def _add_initial(self, role: WorkerRole, workers: list[str]) -> None:
        self._pools[role] = _Pool(serving=list(workers))
        for worker in workers:
            self.spans[worker] = WorkerSpan(role, self._start_ms)

    # ---- ticks ---------------------------------------------------------------------------
    def _on_load_tick(self, now_ms: float) -> None:
        max_samples = get_max_samples(self._planner is not None)
        if len(self.timeline) >= max_samples:
            raise ReplayTooLongError(
                f"the replay passed {max_samples:,} fleet samples of --load-interval-s "
                f"{self._load_ms / 1000:g} ({(now_ms - self._start_ms) / 1000:.3g} s of "
                "simulated time) with work left: steps far slower than the arrivals (a timing "
                "profile's?) or a load interval too short for the workload"
            )
        if self._planner is not None:  # nobody else reads step records
            self._collect_records()
        frontend = self._windows.take(_LOAD, self._load_ms / 1000.0)
        self.timeline.append(
            FleetSample(
                time_s=(now_ms - self._start_ms) / 1000.0,
                serving={r.value: len(p.serving) for r, p in self._pools.items()},
                starting={r.value: len(p.starting) for r, p in self._pools.items()},
                arrival_rate_per_s=frontend.get_request_rate_per_s(),
                mean_ttft_ms=frontend.mean_ttft_ms,
                mean_itl_ms=frontend.mean_itl_ms,
            )
        )
        if self._planner is not None and self._rule != "sla":
            observation = PlannerObservation(frontend=frontend, workers=self._take(_LOAD))
            self._act(self._planner.plan_load(observation, now_ms / 1000.0), now_ms, _LOAD)
        else:
            self._take(_LOAD)
        if self._sim.has_work_left():
            self._sim.call_at(now_ms + self._load_ms, "fleet:load", self._on_load_tick)

    def _on_interval_tick(self, now_ms: float) -> None:
        assert self._planner is not None
        self._collect_records()
        frontend = self._windows.take(_INTERVAL, self._interval_ms / 1000.0)
        observation = PlannerObservation(frontend=frontend, workers=self._take(_INTERVAL))
        self._act(self._planner.plan_interval(observation, now_ms / 1000.0), now_ms, _INTERVAL)
        if self._sim.has_work_left():
            self._sim.call_at(now_ms + self._interval_ms, "fleet:interval", self._on_interval_tick)

    def _collect_records(self) -> None:
        """Every serving worker's new step records, into both windows."""
        for pool in self._pools.values():
            for worker in pool.serving:
                records = self._sim.cores[worker].take_step_records()
                for window in self._records.values():
                    kept = window.setdefault(worker, [])
                    kept.extend(records)
                    del kept[:-_MAX_RECORDS_PER_WORKER]

    def _take(self, window: str) -> list[WorkerSteps]:
        """The window's records of the workers in routing now; the window starts again."""
        records, self._records[window] = self._records[window], {}
        return [
            WorkerSteps(worker_id=worker, role=role, step_records=records.get(worker, []))
            for role, pool in self._pools.items()
            for worker in pool.serving
        ]

    # ---- the fleet follows -----------------------------------------------------------------
    def _act(self, effects: PlannerEffects, now_ms: float, source: str) -> None:
        for decision in effects.decisions:
            self.decisions[decision.reason.value] += 1
        entered, released = self._limits.update(source, effects.num_workers, effects.limited)
        for hold in entered:
            self._held_since_ms[hold.role] = now_ms
        for role in released:
            held_ms = now_ms - self._held_since_ms.pop(role)
            self._held_ms[role] = self._held_ms.get(role, 0.0) + held_ms
        for hold in effects.limited:
            self.most_wanted[hold.role] = max(
                self.most_wanted.get(hold.role, 0), hold.wanted_workers
            )
        for role, num_workers in effects.num_workers.items():
            self.resize(role, num_workers, now_ms)

    def resize(self, role: WorkerRole, num_workers: int, now_ms: float) -> None:
        """Make `role`'s pool (serving and starting) `num_workers` workers."""
        pool = self._pools[role]
        while len(pool.serving) + len(pool.starting) < num_workers:
            self._start(role, now_ms)
        while len(pool.serving) + len(pool.starting) > num_workers:
            if pool.starting:
                worker = pool.starting.pop()
                self.spans[worker].stopped_ms = now_ms
            else:
                self._retire(role, now_ms)

    def _start(self, role: WorkerRole, now_ms: float) -> None:
        worker = f"{role.value}-new-{next(self._names)}"
        self._sim.make_worker(worker)
        self.spans[worker] = WorkerSpan(role, now_ms)
        self._pools[role].starting.append(worker)
        self._sim.call_at(now_ms + self._startup_ms, f"fleet:up:{worker}", self._up(worker, role))

    def _up(self, worker: str, role: WorkerRole) -> Callable[[float], None]:
        def callback(now_ms: float) -> None:
            pool = self._pools[role]
            if worker not in pool.starting:
                return  # cancelled while starting
            pool.starting.remove(worker)
            pool.serving.append(worker)
            self._sim.join(worker, role)

        return callback

    def _retire(self, role: WorkerRole, now_ms: float) -> None:
        """The serving worker with the fewest requests in flight leaves routing and drains."""
        pool = self._pools[role]
        sim = self._sim
        load = (
            sim.prefill_load
            if isinstance(sim, DisaggSimulation) and role is WorkerRole.PREFILL
            else sim.load
        )
        worker = min(reversed(pool.serving), key=lambda w: load.get(w).num_requests)
        pool.serving.remove(worker)
        self._sim.leave(worker, role)

    def _on_drained(self, worker: str, now_ms: float) -> None:
        self.spans[worker].stopped_ms = now_ms

    # ---- what it cost ----------------------------------------------------------------------
    def get_worker_seconds(self, end_ms: float) -> dict[str, float]:
        """Each role's worker-seconds from the first arrival to `end_ms`."""
        seconds: dict[str, float] = {role.value: 0.0 for role in self._pools}
        for span in self.spans.values():
            stopped_ms = end_ms if span.stopped_ms is None else min(span.stopped_ms, end_ms)
            seconds[span.role.value] += max(0.0, stopped_ms - span.provisioned_ms) / 1000.0
        return seconds

    def get_limited_seconds(self, end_ms: float) -> dict[str, float]:
        """Each role's seconds, to `end_ms`, that a maximum held it below what the planner
        asked for (roles never held: none)."""
        held_ms = dict(self._held_ms)
        for role, since_ms in self._held_since_ms.items():
            held_ms[role] = held_ms.get(role, 0.0) + max(0.0, end_ms - since_ms)
        return {role.value: ms / 1000.0 for role, ms in held_ms.items()}

    def get_peak_workers(self) -> Mapping[str, int]:
        """The most workers of each role in routing at any sample."""
        peak = {role.value: len(pool.serving) for role, pool in self._pools.items()}
        for sample in self.timeline:
            for role, num in sample.serving.items():
                peak[role] = max(peak[role], num)
        return peak


def get_sla_attainment(simulation: Simulation, ttft_ms: float, itl_ms: float) -> float:
    """The share of `simulation`'s requests, rejected ones included, that got their first
    token within `ttft_ms` and then tokens `itl_ms` apart on average (within a request)."""
    slo = Slo("sla", ttft_ms, itl_ms)
    num_met = sum(1 for t in simulation.tracked.values() if slo.met_by(t.timing()))
    num_requests = len(simulation.tracked) + simulation.num_rejected
    return num_met / num_requests if num_requests else 0.0
