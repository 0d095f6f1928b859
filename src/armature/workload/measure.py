"""How a workload's results are measured, one definition each: percentiles, latency summaries,
the SLO a request meets, goodput. Used by `armature bench` (bench/), replay (sim/) and the
benchmark scripts. Pure.

Percentile: linear interpolation between the closest ranks (numpy's default `linear` method,
Hyndman and Fan's type 7). For n values sorted as x[0] <= ... <= x[n-1], the q-quantile sits
at rank h = q * (n - 1):

    quantile(x, q) = x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])

so q = 0 is the minimum, q = 1 the maximum and q = 0.5 the median (for even n the mean of the
two middle values, as `statistics.median`). p99 is `quantile(x, 0.99)`.

SLO: a request meets an `Slo` when it produced a first token, its TTFT <= `ttft_ms`, and its
inter-token-latency statistic <= `itl_ms`: the mean of its own ITLs, or with `itl_quantile`
their quantile (a stall bound, e.g. 0.99). A bound left None is always met; a request with
fewer than two output tokens has no ITLs and meets any ITL bound.

Goodput: the requests meeting the SLO, and their output tokens, per second of the run's span
(wall time for a load test, simulated time for a replay).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from armature.errors import ArmatureError, ConfigError

__all__ = [
    "Goodput",
    "LatencySummary",
    "MeasureError",
    "RequestTiming",
    "Slo",
    "goodput",
    "meets_targets",
    "quantile",
]


class MeasureError(ArmatureError, ValueError):
    """A statistic asked of no values, or at a quantile outside [0, 1]."""


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `values` by linear interpolation between the closest
    ranks (see the module docstring). MeasureError for no values or q outside [0, 1]."""
    if not values:
        raise MeasureError("the quantile of no values is undefined")
    if not 0.0 <= q <= 1.0:
        raise MeasureError(f"quantile {q} is outside [0, 1]")
    return _quantile_of_sorted(sorted(values), q)


def _quantile_of_sorted(ordered: Sequence[float], q: float) -> float:
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


@dataclass(frozen=True)
class LatencySummary:
    """p50, p90, p99 (by `quantile`) and mean of a sample, in the sample's unit."""

    p50: float
    p90: float
    p99: float
    mean: float

    @staticmethod
    def of(values: Sequence[float]) -> LatencySummary:
        """The summary of `values`; all zeros for no values (a run where nothing finished)."""
        if not values:
            return LatencySummary(0.0, 0.0, 0.0, 0.0)
        ordered = sorted(values)
        return LatencySummary(
            _quantile_of_sorted(ordered, 0.5),
            _quantile_of_sorted(ordered, 0.9),
            _quantile_of_sorted(ordered, 0.99),
            statistics.fmean(ordered),
        )

    @staticmethod
    def of_array(values: npt.NDArray[np.float64]) -> LatencySummary:
        """`of` a 1-D native float64 array without NaN (numpy and Python order NaN apart),
        sorted by numpy (a replay's millions of token gaps): the same figures, bit for bit
        (the same arithmetic on the same doubles, the exact mean read through a memoryview:
        no Python float kept per value)."""
        if values.size == 0:
            return LatencySummary(0.0, 0.0, 0.0, 0.0)
        ordered = np.sort(values).data  # a memoryview
        return LatencySummary(
            _quantile_of_sorted(ordered, 0.5),
            _quantile_of_sorted(ordered, 0.9),
            _quantile_of_sorted(ordered, 0.99),
            statistics.fmean(ordered),
        )


@dataclass(frozen=True)
class RequestTiming:
    """What an SLO looks at in one finished request."""

    ttft_ms: float | None  # None: no token came
    itl_ms: Sequence[float]  # the gaps between its output tokens
    num_output_tokens: int


@dataclass(frozen=True)
class Slo:
    """A service-level target (see the module docstring); ConfigError for an `itl_quantile`
    outside [0, 1]."""

    name: str
    ttft_ms: float | None = None
    itl_ms: float | None = None
    itl_quantile: float | None = None  # None: the bound applies to the mean ITL

    def __post_init__(self) -> None:
        if self.itl_quantile is not None and not 0.0 <= self.itl_quantile <= 1.0:
            raise ConfigError(f"SLO {self.name!r}: ITL quantile {self.itl_quantile} not in [0, 1]")

    def met_by(self, request: RequestTiming) -> bool:
        itl_ms = None
        if request.itl_ms:
            if self.itl_quantile is None:
                itl_ms = statistics.fmean(request.itl_ms)
            else:
                itl_ms = quantile(request.itl_ms, self.itl_quantile)
        return meets_targets(request.ttft_ms, itl_ms, self.ttft_ms, self.itl_ms)


def meets_targets(
    ttft_ms: float | None,
    itl_ms: float | None,
    ttft_target_ms: float | None,
    itl_target_ms: float | None,
) -> bool:
    """The SLO rule on one request's TTFT (None: no first token, never met) and ITL statistic
    (None: fewer than two tokens, any ITL bound met); a target left None is always met."""
    if ttft_ms is None:
        return False
    if ttft_target_ms is not None and ttft_ms > ttft_target_ms:
        return False
    return itl_ms is None or itl_target_ms is None or itl_ms <= itl_target_ms


@dataclass(frozen=True)
class Goodput:
    """The requests that met an SLO over a span, and their rate."""

    num_requests: int
    num_output_tokens: int
    requests_per_s: float
    tokens_per_s: float


def goodput(requests: Iterable[RequestTiming], slo: Slo, span_s: float) -> Goodput:
    """Requests of `requests` meeting `slo`, and their output tokens, per second of `span_s`
    (> 0, else MeasureError)."""
    if not span_s > 0:
        raise MeasureError(f"goodput over a span of {span_s} s")
    good = [r for r in requests if slo.met_by(r)]
    num_tokens = sum(r.num_output_tokens for r in good)
    return Goodput(len(good), num_tokens, len(good) / span_s, num_tokens / span_s)
