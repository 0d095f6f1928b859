"""Arrival rates reshaped: a step load and a diurnal load, against hand-worked arrivals."""

from __future__ import annotations

import math

import pytest

from armature.workload.rate_shapes import DiurnalShape, StepShape, reshape_arrivals
from armature.workload.traces import TraceRequest


def _arrivals(times_s: list[float]) -> list[TraceRequest]:
    return [TraceRequest(1000.0 * t + 500.0, 10, 2, (i,)) for i, t in enumerate(times_s)]


def test_step_compresses_only_inside_the_step() -> None:
    # one request a second; x4 from s=10 for 5 s: 5 new seconds hold 20 original ones
    shape = StepShape(factor=4.0, start_s=10.0, duration_s=5.0)
    out = reshape_arrivals(_arrivals([float(t) for t in range(41)]), shape)
    times_s = [(r.arrival_ms - 500.0) / 1000.0 for r in out]
    assert times_s[:11] == pytest.approx([float(t) for t in range(11)])
    # original 10..30 -> 10 + (t - 10) / 4
    assert times_s[14] == pytest.approx(11.0)
    assert times_s[30] == pytest.approx(15.0)
    # after the step, one a second again, 15 s later than it began
    assert times_s[31] == pytest.approx(16.0)
    assert times_s[40] == pytest.approx(25.0)
    # everything else is kept, in order
    assert [r.hash_ids for r in out] == [(i,) for i in range(41)]


def test_diurnal_rate_follows_the_cosine() -> None:
    shape = DiurnalShape(factor=3.0, period_s=100.0)
    assert shape.get_multiplier(0.0) == pytest.approx(1.0)
    assert shape.get_multiplier(50.0) == pytest.approx(3.0)
    # M(100) = 100 + (3 - 1) / 2 * (100 - 0) = 200: a period holds twice the original time
    assert shape.get_cumulative(100.0) == pytest.approx(200.0)
    out = reshape_arrivals(_arrivals([0.0, 200.0, 400.0]), shape)
    assert [(r.arrival_ms - 500.0) / 1000.0 for r in out] == pytest.approx([0.0, 100.0, 200.0])


def test_diurnal_counts_per_window_follow_the_multiplier() -> None:
    shape = DiurnalShape(factor=4.0, period_s=1000.0)
    out = reshape_arrivals(_arrivals([t * 0.1 for t in range(25_000)]), shape)
    times_s = [(r.arrival_ms - 500.0) / 1000.0 for r in out]
    # arrivals in [450, 550) (around the peak) against [0, 50) + [950, 1000) (the troughs)
    peak = sum(1 for t in times_s if 450.0 <= t < 550.0)
    trough = sum(1 for t in times_s if t < 50.0 or 950.0 <= t < 1000.0)
    expected = [
        10 * (shape.get_cumulative(b) - shape.get_cumulative(a))
        for a, b in ((450.0, 550.0), (0.0, 50.0))
    ]
    assert peak == pytest.approx(expected[0], abs=1)
    assert trough == pytest.approx(2 * expected[1], abs=2)
    assert peak / trough > 3.5


@pytest.mark.parametrize(
    "build",
    [
        lambda: StepShape(0.5, 0.0, 1.0),
        lambda: StepShape(2.0, -1.0, 1.0),
        lambda: StepShape(2.0, 0.0, 0.0),
        lambda: DiurnalShape(0.9, 10.0),
        lambda: DiurnalShape(2.0, 0.0),
    ],
)
def test_rejects_shapes_that_are_not_rates(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


def test_empty_and_monotone() -> None:
    assert reshape_arrivals([], StepShape(2.0, 0.0, 1.0)) == []
    out = reshape_arrivals(_arrivals([0.0, 0.5, 0.5, 7.0]), DiurnalShape(2.0, math.pi))
    times = [r.arrival_ms for r in out]
    assert times == sorted(times)
