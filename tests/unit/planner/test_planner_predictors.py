"""The load predictors on synthetic series: constant, ramp, step, seasonal."""

from __future__ import annotations

import math

import pytest

from armature.errors import ConfigError
from armature.planner import FrontendMetrics, LoadForecast, LoadForecaster, make_predictor
from armature.planner.core import PlannerEffects
from armature.planner.metrics import PlannerMetrics
from armature.planner.predictors import (
    ConstantPredictor,
    HoltWintersPredictor,
    LoadPredictor,
    MovingAveragePredictor,
)
from armature.protocols.worker import WorkerRole


def feed(predictor: LoadPredictor, series: list[float]) -> float | None:
    for value in series:
        predictor.observe(value)
    return predictor.predict_next()


CONSTANT = [7.0] * 20
RAMP = [10.0 + 0.5 * i for i in range(30)]  # next: 25.0
STEP = [10.0] * 20 + [30.0] * 6  # next: 30.0
SEASON = 8
SEASONAL = [10.0 + 5.0 * math.sin(2 * math.pi * i / SEASON) for i in range(5 * SEASON)]
SEASONAL_NEXT = 10.0 + 5.0 * math.sin(2 * math.pi * (5 * SEASON) / SEASON)  # 10.0


def test_nothing_observed_predicts_nothing() -> None:
    for predictor in (ConstantPredictor(), MovingAveragePredictor(3), HoltWintersPredictor(10)):
        assert predictor.predict_next() is None


def test_constant_predicts_the_last_value() -> None:
    assert feed(ConstantPredictor(), CONSTANT) == 7.0
    assert feed(ConstantPredictor(), RAMP) == 24.5  # a ramp: always one step behind
    assert feed(ConstantPredictor(), STEP) == 30.0


def test_moving_average_of_the_last_window() -> None:
    assert feed(MovingAveragePredictor(3), CONSTANT) == 7.0
    assert feed(MovingAveragePredictor(3), RAMP) == pytest.approx(24.0)  # (23.5 + 24 + 24.5) / 3
    assert feed(MovingAveragePredictor(4), [10.0, 10.0, 30.0, 30.0]) == 20.0  # a step, halfway


def test_holt_winters_on_constant_ramp_and_step() -> None:
    assert feed(HoltWintersPredictor(96), CONSTANT) == 7.0
    # the trend is followed (damped, so a little short of 25), unlike the constant's 24.5
    assert feed(HoltWintersPredictor(96), RAMP) == pytest.approx(25.0, abs=0.2)
    assert feed(HoltWintersPredictor(96), STEP) == pytest.approx(30.0, abs=1.0)
    # too short to fit: the last value
    assert feed(HoltWintersPredictor(96), [3.0, 5.0, 4.0]) == 4.0


def test_holt_winters_learns_a_season() -> None:
    """Five seasons of a sine of period 8: the next value (10.0) within 0.5, where the last
    value, 10 + 5 sin(2 pi 39/8) = 6.46, misses by 3.5."""
    predicted = feed(HoltWintersPredictor(96, season_length=SEASON), SEASONAL)
    assert predicted == pytest.approx(SEASONAL_NEXT, abs=0.5)
    assert abs(feed(ConstantPredictor(), SEASONAL) - SEASONAL_NEXT) > 3.0  # type: ignore[operator]


def test_holt_winters_never_predicts_a_negative_rate() -> None:
    assert feed(HoltWintersPredictor(96), [float(20 - 2 * i) for i in range(11)]) == 0.0


def test_make_predictor_by_name_and_bad_settings() -> None:
    made = [
        make_predictor(name, window=3, history=16, season_length=None)
        for name in ("constant", "moving-average", "holt-winters")
    ]
    assert [type(p) for p in made] == [
        ConstantPredictor,
        MovingAveragePredictor,
        HoltWintersPredictor,
    ]
    with pytest.raises(ConfigError, match="unknown predictor 'arima'"):
        make_predictor("arima", window=3, history=16, season_length=None)
    with pytest.raises(ConfigError, match="cannot fit a season of 12"):
        HoltWintersPredictor(16, season_length=12)


def test_forecaster_keeps_lengths_through_idle_intervals() -> None:
    forecaster = LoadForecaster(ConstantPredictor)
    assert forecaster.predict_next() is None
    forecaster.observe(
        FrontendMetrics(
            window_s=60.0, num_requests=120, mean_input_tokens=900.0, mean_output_tokens=150.0
        )
    )
    forecaster.observe(
        FrontendMetrics(
            window_s=60.0, num_requests=0, mean_input_tokens=0.0, mean_output_tokens=0.0
        )
    )
    assert forecaster.predict_next() == LoadForecast(0.0, 900.0, 150.0)


def test_no_forecast_until_an_output_length_is_measured() -> None:
    """A live frontend's first windows have arrivals but no finished request (output length
    0.0: not measured): sizing on 0 output tokens would shrink the fleet."""
    forecaster = LoadForecaster(ConstantPredictor)
    forecaster.observe(
        FrontendMetrics(
            window_s=60.0, num_requests=40, mean_input_tokens=256.0, mean_output_tokens=0.0
        )
    )
    assert forecaster.predict_next() is None
    forecaster.observe(
        FrontendMetrics(
            window_s=60.0, num_requests=30, mean_input_tokens=256.0, mean_output_tokens=400.0
        )
    )
    assert forecaster.predict_next() == LoadForecast(0.5, 256.0, 400.0)


def test_an_unmeasured_input_length_is_not_observed() -> None:
    """Arrivals none of whose prefills ended (input 0.0) leave the last measured length."""
    forecaster = LoadForecaster(ConstantPredictor)  # the last value observed
    for isl in (300.0, 0.0):
        forecaster.observe(
            FrontendMetrics(
                window_s=60.0, num_requests=60, mean_input_tokens=isl, mean_output_tokens=100.0
            )
        )
    assert forecaster.predict_next() == LoadForecast(1.0, 300.0, 100.0)


class _FailingFits:
    """A predictor whose every fit fails, counted as HoltWintersPredictor counts them (the
    last value predicted instead)."""

    def __init__(self) -> None:
        self.num_fit_failures = 0
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = value

    def predict_next(self) -> float | None:
        if self._last is not None:
            self.num_fit_failures += 1
        return self._last


def test_failed_fits_are_counted_and_exported() -> None:
    forecaster = LoadForecaster(_FailingFits)
    forecaster.observe(
        FrontendMetrics(
            window_s=60.0, num_requests=60, mean_input_tokens=100.0, mean_output_tokens=50.0
        )
    )
    forecaster.predict_next()
    forecaster.predict_next()
    assert forecaster.get_num_fit_failures() == 6  # three predictors, twice
    assert LoadForecaster(ConstantPredictor).get_num_fit_failures() == 0
    metrics = PlannerMetrics((WorkerRole.AGG,))

    def read() -> float | None:
        return metrics.registry.get_sample_value("armature_planner_forecast_fit_failures_total")

    assert read() == 0.0
    for total in (6, 6, 9):  # each tick reports the total since the start
        metrics.observe(PlannerEffects([], [], {}, num_fit_failures=total), {})
    assert read() == 9.0
