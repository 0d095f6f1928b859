"""A fleet sized by a fixed schedule (`ScheduledSizer`) in a replay: the sizes at each time,
the bad schedules it refuses, and a replay whose fleet follows the schedule exactly (start-up
included) at the cost the schedule implies."""

from __future__ import annotations

import pytest
from test_planned_replay import STEP, _config

from armature.protocols.worker import WorkerRole
from armature.sim.replay import replay
from armature.sim.scheduled_fleet import ScheduledSizer


def test_sizes_follow_the_schedule_from_its_start() -> None:
    sizer = ScheduledSizer([(0.0, 2), (10.0, 5), (30.0, 1)], start_s=100.0)
    assert sizer.get_num_workers() == {WorkerRole.AGG: 2}
    sizes = [sizer.get_size(t) for t in (90.0, 100.0, 109.9, 110.0, 129.9, 130.0, 1e6)]
    assert sizes == [2, 2, 2, 5, 5, 1, 1]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ([], "starts at 0"),
        ([(1.0, 2)], "starts at 0"),
        ([(0.0, 2), (5.0, 3), (5.0, 4)], "increase strictly"),
        ([(0.0, 0)], "at least 1"),
    ],
)
def test_bad_schedules_are_refused(changes: list[tuple[float, int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduledSizer(changes, start_s=0.0)


def test_a_replay_fleet_follows_the_schedule() -> None:
    """1 worker, 3 from 20 s (serving 3 s later: the config's start-up), 1 again from 50 s:
    every sample shows it; the cost is the schedule's, plus the drained workers' tails."""
    start_s = STEP[0].arrival_ms / 1000.0
    sizer = ScheduledSizer([(0.0, 1), (20.0, 3), (50.0, 1)], start_s)
    report = replay(STEP, _config(1, None), sizer=sizer)
    assert report.num_requests == len(STEP) and report.num_rejected == 0
    assert report.planner_decisions == {}
    for sample in report.timeline:
        total = sample.serving["agg"] + sample.starting["agg"]
        if sample.time_s < 20.0 or sample.time_s >= 52.0:
            assert (sample.serving["agg"], total) == (1, 1), sample
        elif 24.0 <= sample.time_s < 50.0:
            assert (sample.serving["agg"], total) == (3, 3), sample
    assert report.peak_workers == {"agg": 3}
    ideal_s = report.simulated_time_s + 2 * 30.0
    assert ideal_s <= report.worker_seconds < ideal_s + 2 * 5.0  # leaving ones drain a little
    static = replay(STEP, _config(1, None))
    assert report.sla_attainment > static.sla_attainment
