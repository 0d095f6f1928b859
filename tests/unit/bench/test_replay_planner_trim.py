"""bench.replay_planner_trim: the rule that picks the SLO feedback's step on the tuning
windows, and its refusal of the report's windows."""

from __future__ import annotations

import pytest

from bench.replay_planner_trim import choose, parse_args


def test_the_lowest_mean_cost_within_a_point_of_the_untrimmed_attainment() -> None:
    """Step 0.3 is cheapest but loses 1.5 points on the day: out. 0.1 and 0.2 both keep
    within a point; 0.2 costs less on the mean (80% against 85%)."""
    results = {
        ("step", 0, 0.0): (0.960, 0.90),
        ("diurnal", 0, 0.0): (0.975, 0.95),
        ("step", 0, 0.1): (0.958, 0.85),
        ("diurnal", 0, 0.1): (0.974, 0.85),
        ("step", 0, 0.2): (0.955, 0.75),
        ("diurnal", 0, 0.2): (0.966, 0.85),
        ("step", 0, 0.3): (0.958, 0.60),
        ("diurnal", 0, 0.3): (0.960, 0.70),
    }
    assert choose(results) == 0.2


def test_ties_go_to_the_higher_attainment_and_step_0_always_qualifies() -> None:
    results = {
        ("step", 0, 0.0): (0.960, 0.90),
        ("step", 0, 0.3): (0.955, 0.80),
        ("step", 0, 0.5): (0.952, 0.80),
    }
    assert choose(results) == 0.3
    assert choose({("step", 0, 0.0): (0.5, 1.0)}) == 0.0


def test_it_tunes_on_the_first_half_only() -> None:
    assert parse_args([]).windows == [0, 1]
    assert parse_args(["--trim-steps", "0.3"]).trim_steps == [0.0, 0.3]
    with pytest.raises(SystemExit):
        parse_args(["--windows", "2"])
