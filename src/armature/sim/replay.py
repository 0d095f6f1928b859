"""Offline replay: a trace's requests through mocker workers and the real router on a virtual
clock (`sim.simulation`; with prefill workers, `sim.replay_disagg`). The entry point, and the
settings and report it is called with (from `sim.replay_config`).

    replay_config <-- simulation <-- replay_disagg
          ^               ^               ^
          +---------------+---- replay ---+
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Iterator, Sequence

from armature.planner.core import Planner
from armature.planner.performance import PerformanceModel, RoleModels
from armature.planner.timing_performance import TimingPerformanceModel
from armature.protocols.worker import WorkerRole
from armature.sim.planned_fleet import FleetSizer, PlannedFleet, get_sla_attainment
from armature.sim.replay_config import ReplayConfig, ReplayReport
from armature.sim.replay_disagg import DisaggSimulation
from armature.sim.simulation import Simulation
from armature.sim.timing import PolynomialTiming, TimingModel
from armature.workload.traces import TraceRequest

__all__ = ["ReplayConfig", "ReplayReport", "get_performance_model", "replay"]

# A replay keeps millions of containers alive for a request's lifetime (prompts of thousands
# of token ids, their block hashes); CPython's young-generation threshold (700 allocations)
# would traverse each of them in several collections. A replay makes almost no cyclic garbage
# while it runs (its peak memory is the same with the collector off), so young collections run
# only every 1,000,000 allocations: on the first 6,000 conversation-trace requests (32,768
# blocks a worker) the collector took 7% of a replay with 8 workers and 15% with 256 at 20,000
# (the threshold before); at 1,000,000 those replays take 5% and 11% less CPU. Restored when
# the replay ends.
REPLAY_GC_THRESHOLD = 1_000_000


def replay(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    timing: TimingModel | None = None,
    prefill_timing: TimingModel | None = None,
    *,
    sizer: FleetSizer | None = None,
) -> ReplayReport:
    """Simulate `requests` through `config.num_workers` mocker workers and the router;
    `prefill_timing`: the prefill workers' step times where they differ from `timing`.
    `sizer`: what sizes the fleet instead of the planner `config.planner_rule` would build
    (a `ScheduledSizer`, for a reference fleet), by the same rule (both without one)."""
    started_s = time.perf_counter()
    timing = timing or PolynomialTiming(speedup_ratio=config.speedup_ratio)
    mode = "disagg" if config.num_prefill_workers else "agg"
    planner_config = dataclasses.replace(config.planner, mode=mode)
    planner: FleetSizer | None = sizer
    if planner is None and config.planner_rule is not None:
        fleet_size = {WorkerRole.AGG: config.num_workers}
        if config.num_prefill_workers:
            fleet_size = {
                WorkerRole.PREFILL: config.num_prefill_workers,
                WorkerRole.DECODE: config.num_workers - config.num_prefill_workers,
            }
        model = get_performance_model(config, timing, prefill_timing)
        planner = Planner(planner_config, model, num_workers=fleet_size)
    kind = DisaggSimulation if config.num_prefill_workers else Simulation
    simulation = kind(requests, config, timing, prefill_timing)
    fleet = PlannedFleet(
        simulation,
        load_interval_s=planner_config.load_interval_s,
        interval_s=planner_config.interval_s,
        planner=planner,
        rule=config.planner_rule or "both",
        worker_startup_s=config.worker_startup_s,
        targets=(planner_config.ttft_ms, planner_config.itl_ms),
    )
    if planner is not None:  # the planner's limits apply from the start
        for role, num_workers in planner.get_num_workers().items():
            fleet.resize(role, num_workers, simulation.now_ms)
    with _young_collections_every(REPLAY_GC_THRESHOLD):
        end_ms = simulation.run()
    report = simulation.report(end_ms, time.perf_counter() - started_s)
    by_role = fleet.get_worker_seconds(end_ms)
    return dataclasses.replace(
        report,
        num_engine_steps=sum(runner.num_batches for runner in simulation.runners.values()),
        worker_seconds=sum(by_role.values()),
        worker_seconds_by_role=by_role,
        peak_workers=dict(fleet.get_peak_workers()),
        sla_attainment=get_sla_attainment(
            simulation, planner_config.ttft_ms, planner_config.itl_ms
        ),
        planner_decisions=dict(sorted(fleet.decisions.items())),
        planner_limited_s=fleet.get_limited_seconds(end_ms),
        planner_most_wanted={role.value: num for role, num in fleet.most_wanted.items()},
        timeline=fleet.timeline,
    )


@contextlib.contextmanager
def _young_collections_every(num_allocations: int) -> Iterator[None]:
    """Run the cyclic collector's young generation at most every `num_allocations` container
    allocations (never more often than it was set to), then restore the thresholds, unless
    something else changed them meanwhile (so that replays overlapping in threads leave the
    first one's thresholds behind whatever order they end in)."""
    thresholds = gc.get_threshold()
    raised = (max(thresholds[0], num_allocations), *thresholds[1:])
    gc.set_threshold(*raised)
    try:
        yield
    finally:
        if gc.get_threshold() == raised:
            gc.set_threshold(*thresholds)


def get_performance_model(
    config: ReplayConfig, timing: TimingModel, prefill_timing: TimingModel | None = None
) -> PerformanceModel:
    """The planner's model of one simulated worker: the step times the mocker runs on
    (disaggregated with `prefill_timing`: the prefill workers' for prefill)."""

    def of(step_times: TimingModel) -> TimingPerformanceModel:
        return TimingPerformanceModel(
            step_times,
            block_size=config.block_size,
            num_kv_blocks=config.num_kv_blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )

    if prefill_timing is None or not config.num_prefill_workers:
        return of(timing)
    return RoleModels(prefill=of(prefill_timing), decode=of(timing))
