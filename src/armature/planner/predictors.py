"""One-step-ahead forecasts of a series observed once per interval (request rate, input and
output lengths): the last value, a moving average, or exponential smoothing.

Exponential smoothing is statsmodels' `ExponentialSmoothing` (Holt-Winters): an additive
damped trend, and an additive season when a season length is given, refitted by maximum
likelihood on the most recent `history` values at every prediction. Until the series is long
enough to fit (see `HoltWintersPredictor.get_min_values`) it predicts the last value.
Forecasts are never negative.
"""

from __future__ import annotations

import collections
import statistics
import warnings
from typing import Protocol

import numpy as np

from armature.errors import ConfigError

__all__ = [
    "ConstantPredictor",
    "HoltWintersPredictor",
    "LoadPredictor",
    "MovingAveragePredictor",
    "make_predictor",
]


class LoadPredictor(Protocol):
    """Observes a series one value per interval and predicts the next value."""

    def observe(self, value: float) -> None: ...

    def predict_next(self) -> float | None:
        """The next interval's value; None before any observation."""
        ...


class ConstantPredictor:
    """The next value is the last one."""

    def __init__(self) -> None:
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = value

    def predict_next(self) -> float | None:
        return self._last


class MovingAveragePredictor:
    """The next value is the mean of the last `window` values."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ConfigError("a moving average needs a window of at least 1")
        self._values: collections.deque[float] = collections.deque(maxlen=window)

    def observe(self, value: float) -> None:
        self._values.append(value)

    def predict_next(self) -> float | None:
        return statistics.fmean(self._values) if self._values else None


class HoltWintersPredictor:
    """statsmodels' exponential smoothing (damped additive trend, optional additive season of
    `season_length` values), fitted on the last `history` values at each prediction.

    `num_fit_failures` counts fits that raised a numerical error (then the last value is
    predicted); the service exports it so that a failing forecaster is seen, not hidden."""

    def __init__(self, history: int, season_length: int | None = None) -> None:
        if season_length is not None and history < 2 * season_length:
            raise ConfigError(
                f"holt-winters: {history} intervals of history cannot fit a season of "
                f"{season_length} (two seasons are needed)"
            )
        self._values: collections.deque[float] = collections.deque(maxlen=history)
        self._season_length = season_length
        self.num_fit_failures = 0

    def get_min_values(self) -> int:
        """How many values a fit needs: two seasons, or 4 for the trend alone."""
        return 2 * self._season_length if self._season_length else 4

    def observe(self, value: float) -> None:
        self._values.append(value)

    def predict_next(self) -> float | None:
        if not self._values:
            return None
        if len(self._values) < self.get_min_values():
            return self._values[-1]
        series = np.asarray(self._values, dtype=float)
        if float(np.ptp(series)) == 0.0:  # a flat series: the fit has nothing to estimate
            return float(series[-1])
        try:
            forecast = self._fit_and_forecast(series)
        except (ValueError, np.linalg.LinAlgError):
            self.num_fit_failures += 1
            return float(series[-1])
        return max(0.0, forecast)

    def _fit_and_forecast(self, series: np.ndarray) -> float:
        # imported here: statsmodels (and pandas under it) take ~2 s to import, which a
        # process that never predicts this way should not pay
        from statsmodels.tools.sm_exceptions import ConvergenceWarning
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        model = ExponentialSmoothing(
            series,
            trend="add",
            damped_trend=True,
            seasonal="add" if self._season_length else None,
            seasonal_periods=self._season_length,
            initialization_method="estimated",
        )
        with warnings.catch_warnings():
            # a fit that stops short of convergence still forecasts; the optimizer's
            # complaint is not actionable once per interval
            warnings.simplefilter("ignore", ConvergenceWarning)
            fitted = model.fit()
        return float(fitted.forecast(1)[0])


def make_predictor(
    name: str, *, window: int, history: int, season_length: int | None
) -> LoadPredictor:
    """The predictor `--predictor` names (see config.planner.PREDICTORS)."""
    if name == "constant":
        return ConstantPredictor()
    if name == "moving-average":
        return MovingAveragePredictor(window)
    if name == "holt-winters":
        return HoltWintersPredictor(history, season_length)
    raise ConfigError(f"unknown predictor {name!r}")
