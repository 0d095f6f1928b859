"""bench.replay_planner's ideal follower (the mean size of a fleet that always holds the
target at the current rate, over the fleet sized for the peak) and its reactive bound's
schedule (that size, second by second), on hand-worked shapes."""

from __future__ import annotations

import pytest

from armature.workload.rate_shapes import DiurnalShape, StepShape
from bench.replay_planner import get_ideal_share, reactive_schedule


def test_a_step_costs_the_mean_of_its_sizes_over_time() -> None:
    # x1 for 10 s, x4 for 10 s, x1 for 10 s: sizes 2, 4, 2 -> mean 8/3 of a peak of 4
    low, high = get_ideal_share(StepShape(4.0, 10.0, 10.0), 30.0, {1.0: 2, 4.0: 4})
    assert low == pytest.approx(2 / 3, abs=0.002) and high == pytest.approx(2 / 3, abs=0.002)


def test_a_day_between_grid_points_is_bounded_from_both_sides() -> None:
    # m(s) = 1 + 1.5 (1 - cos(2 pi s / 100)) is below 2.5 for half the day: at or above the
    # rate the sizes are 3 then 4 (mean 3.5), at or below it 2 then 3 (mean 2.5), of 4
    low, high = get_ideal_share(DiurnalShape(4.0, 100.0), 100.0, {1.0: 2, 2.5: 3, 4.0: 4})
    assert low == pytest.approx(2.5 / 4, abs=0.002)
    assert high == pytest.approx(3.5 / 4, abs=0.002)


def test_a_flat_load_at_the_peak_costs_the_peak() -> None:
    assert get_ideal_share(StepShape(4.0, 0.0, 1e9), 50.0, {1.0: 3, 4.0: 7}) == (1.0, 1.0)


def test_the_reactive_schedule_changes_with_the_step() -> None:
    # x1 until 10 s, x4 until 20 s, then x1: sizes 2, 4, 2, changing at the step's edges
    schedule = reactive_schedule(StepShape(4.0, 10.0, 10.0), 30.0, {1.0: 2, 4.0: 4})
    assert schedule == [(0.0, 2), (10.0, 4), (20.0, 2)]


def test_the_reactive_schedule_rounds_a_rate_up_to_the_next_grid_point() -> None:
    # a day from x1 (at 0 s and 100 s) to x4 (at 50 s): above x1 from the first second the
    # size is 3; m(s) = 1 + 1.5 (1 - cos(2 pi s / 100)) passes x2.5 at 25 s and falls below
    # it after 75 s, so 4 from 26 s (the first whole second past it) to 75 s
    schedule = reactive_schedule(DiurnalShape(4.0, 100.0), 100.0, {1.0: 2, 2.5: 3, 4.0: 4})
    assert schedule == [(0.0, 2), (1.0, 3), (26.0, 4), (75.0, 3), (100.0, 2)]


def test_the_prescient_schedule_asks_a_lead_ahead_of_the_step() -> None:
    # the same step seen 5 s ahead: 4 from 5 s (the step is within [5, 10]), back to 2 from
    # 20 s (nothing of it left ahead), so the workers are there when the step comes
    schedule = reactive_schedule(StepShape(4.0, 10.0, 10.0), 30.0, {1.0: 2, 4.0: 4}, 5.0)
    assert schedule == [(0.0, 2), (5.0, 4), (20.0, 2)]
