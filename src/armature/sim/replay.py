"""Offline replay: a trace's requests through mocker workers and the real router on a virtual
clock (`sim.simulation`; with prefill workers, `sim.replay_disagg`). The entry point, and the
settings and report it is called with (from `sim.replay_config`).

    replay_config <-- simulation <-- replay_disagg
          ^               ^               ^
          +---------------+---- replay ---+
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from armature.sim.replay_config import ReplayConfig, ReplayReport
from armature.sim.replay_disagg import DisaggSimulation
from armature.sim.simulation import Simulation
from armature.sim.timing import PolynomialTiming, TimingModel
from armature.workload.traces import TraceRequest

__all__ = ["ReplayConfig", "ReplayReport", "replay"]


def replay(
    requests: Sequence[TraceRequest], config: ReplayConfig, timing: TimingModel | None = None
) -> ReplayReport:
    """Simulate `requests` through `config.num_workers` mocker workers and the router."""
    started_s = time.perf_counter()
    kind = DisaggSimulation if config.num_prefill_workers else Simulation
    simulation = kind(
        requests, config, timing or PolynomialTiming(speedup_ratio=config.speedup_ratio)
    )
    end_ms = simulation.run()
    return simulation.report(end_ms, time.perf_counter() - started_s)
