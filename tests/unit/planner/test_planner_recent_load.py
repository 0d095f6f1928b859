"""The load rule's recent load (planner/recent_load.py): the last windows taken together."""

from __future__ import annotations

import pytest

from armature.planner.observation import FrontendMetrics
from armature.planner.recent_load import RecentLoad, RecentWindows


def window(num_requests: int, isl: float = 1000.0, osl: float = 100.0) -> FrontendMetrics:
    return FrontendMetrics(
        window_s=5.0, num_requests=num_requests, mean_input_tokens=isl, mean_output_tokens=osl
    )


def test_bursts_and_lulls_average_over_the_window() -> None:
    """15 s of 5 s windows keeps three: arrivals 0, 30, 0 read 30 over 15 s (2 req/s), not
    0 or 6; the fourth window pushes the first out."""
    recent = RecentWindows(15.0, 5.0)
    assert recent.add(window(0)) == RecentLoad(0, 5.0, 0.0, 0.0)
    assert recent.add(window(30)).num_requests == 30
    assert recent.add(window(0)) == RecentLoad(30, 15.0, 1000.0, 100.0)
    assert recent.add(window(0)) == RecentLoad(30, 15.0, 1000.0, 100.0)
    assert recent.add(window(0)) == RecentLoad(0, 15.0, 0.0, 0.0)


def test_lengths_are_weighted_by_arrivals() -> None:
    """10 prompts of 1000 tokens and 30 of 3000: (10 000 + 90 000) / 40 = 2500."""
    recent = RecentWindows(10.0, 5.0)
    recent.add(window(10, isl=1000.0, osl=100.0))
    load = recent.add(window(30, isl=3000.0, osl=300.0))
    assert (load.num_requests, load.window_s) == (40, 10.0)
    assert load.mean_input_tokens == pytest.approx(2500.0)
    assert load.mean_output_tokens == pytest.approx(250.0)


def test_output_lengths_come_from_the_windows_that_measured_one() -> None:
    """A window whose requests had not finished (output 0.0, not measured) counts its
    arrivals and prompts, not a length of 0; none measured: 0.0."""
    recent = RecentWindows(10.0, 5.0)
    assert recent.add(window(20, osl=0.0)) == RecentLoad(20, 5.0, 1000.0, 0.0)
    load = recent.add(window(10, isl=4000.0, osl=300.0))
    assert (load.num_requests, load.mean_input_tokens) == (30, pytest.approx(2000.0))
    assert load.mean_output_tokens == pytest.approx(300.0)
    # the first length measured in a window without arrivals still counts
    recent = RecentWindows(10.0, 5.0)
    recent.add(window(0, osl=250.0))
    assert recent.add(window(20, osl=0.0)).mean_output_tokens == pytest.approx(250.0)


def test_input_lengths_come_from_the_windows_that_measured_one() -> None:
    """Arrivals whose prefill had not ended (input 0.0, not measured) dilute nothing: 20
    unmeasured then 10 of 4000 tokens read 4000, not 1333; none measured reads 0.0."""
    recent = RecentWindows(10.0, 5.0)
    assert recent.add(window(20, isl=0.0)) == RecentLoad(20, 5.0, 0.0, 100.0)
    load = recent.add(window(10, isl=4000.0))
    assert (load.num_requests, load.mean_input_tokens) == (30, pytest.approx(4000.0))


def test_a_window_shorter_than_the_interval_keeps_the_latest() -> None:
    recent = RecentWindows(1.0, 5.0)
    recent.add(window(10))
    assert recent.add(window(3)).num_requests == 3
