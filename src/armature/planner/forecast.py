"""The next interval's load (`LoadForecast`): request rate and mean lengths, each from its
own predictor fed once per interval by the frontend's metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from armature.planner.observation import FrontendMetrics
from armature.planner.predictors import LoadPredictor

__all__ = ["LoadForecast", "LoadForecaster"]


@dataclass(frozen=True)
class LoadForecast:
    """The load one interval is expected to bring."""

    request_rate_per_s: float
    mean_input_tokens: float
    mean_output_tokens: float


class LoadForecaster:
    """Three predictors (rate, input length, output length) made by `make_predictor`.

    An interval with no requests feeds the rate (0) but not the lengths: its lengths are not
    measured, and the last measured ones stay the best guess. Nor does a length of 0.0 (none
    measured yet: no prefill, or no request, has ended): no forecast until both are."""

    def __init__(self, make_predictor: Callable[[], LoadPredictor]) -> None:
        self._rate = make_predictor()
        self._input = make_predictor()
        self._output = make_predictor()

    def observe(self, metrics: FrontendMetrics) -> None:
        self._rate.observe(metrics.get_request_rate_per_s())
        if metrics.num_requests > 0:
            if metrics.mean_input_tokens > 0.0:
                self._input.observe(metrics.mean_input_tokens)
            if metrics.mean_output_tokens > 0.0:
                self._output.observe(metrics.mean_output_tokens)

    def get_num_fit_failures(self) -> int:
        """Fits of the three predictors that raised a numerical error (0 for predictors
        that fit nothing)."""
        predictors = (self._rate, self._input, self._output)
        return sum(getattr(p, "num_fit_failures", 0) for p in predictors)

    def predict_next(self) -> LoadForecast | None:
        """The next interval's load; None until an interval with requests, and one with an
        output length measured, were observed."""
        rate = self._rate.predict_next()
        input_tokens = self._input.predict_next()
        output_tokens = self._output.predict_next()
        if rate is None or input_tokens is None or output_tokens is None:
            return None
        return LoadForecast(rate, input_tokens, output_tokens)
