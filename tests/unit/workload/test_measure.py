"""The one percentile, SLO and goodput definition: hand-computed values, edge cases, and numpy's
default (linear) quantile as an oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.errors import ArmatureError, ConfigError
from armature.workload.measure import (
    Goodput,
    LatencySummary,
    MeasureError,
    RequestTiming,
    Slo,
    goodput,
    quantile,
)


def test_quantile_interpolates_linearly_between_the_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4, ranks 0..3; rank h = q * 3
    assert quantile(values, 0.0) == 1.0  # p0: the minimum
    assert quantile(values, 0.25) == 1.75  # h = 0.75: 1 + 0.75 * (2 - 1)
    assert quantile(values, 0.5) == 2.5  # h = 1.5: the mean of the two middle values
    assert quantile(values, 0.75) == 3.25  # h = 2.25
    assert quantile(values, 0.9) == pytest.approx(3.7, abs=1e-12)  # h = 2.7
    assert quantile(values, 1.0) == 4.0  # p100: the maximum
    assert quantile([10.0, 20.0, 40.0], 0.75) == 30.0  # h = 1.5: halfway from 20 to 40
    assert values == [4.0, 1.0, 3.0, 2.0]  # the input is not sorted in place


def test_quantile_of_one_value_is_that_value_and_of_none_is_an_error() -> None:
    assert [quantile([7.0], q) for q in (0.0, 0.5, 0.99, 1.0)] == [7.0, 7.0, 7.0, 7.0]
    with pytest.raises(MeasureError, match="no values"):
        quantile([], 0.5)
    for q in (-0.01, 1.01):
        with pytest.raises(MeasureError, match="outside"):
            quantile([1.0, 2.0], q)
    assert issubclass(MeasureError, ArmatureError)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(0.0, 1.0),
)
def test_quantile_is_numpys_default(values: list[float], q: float) -> None:
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)), rel=1e-9, abs=1e-6)


def test_latency_summary() -> None:
    summary = LatencySummary.of([float(x) for x in range(100, 0, -1)])  # 1..100, reversed
    # ranks 0..99: p50 at 49.5, p90 at 89.1, p99 at 98.01
    assert (summary.p50, summary.mean) == (50.5, 50.5)
    assert summary.p90 == pytest.approx(90.1, abs=1e-9)
    assert summary.p99 == pytest.approx(99.01, abs=1e-9)
    assert LatencySummary.of([3.0]) == LatencySummary(3.0, 3.0, 3.0, 3.0)
    assert LatencySummary.of([]) == LatencySummary(0.0, 0.0, 0.0, 0.0)


@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), max_size=300))
def test_summary_of_an_array_is_the_summary_of_the_list(values: list[float]) -> None:
    """numpy's sort and the memoryview's exact mean give the list path's figures to the bit,
    as Python floats (a replay's report is compared field by field)."""
    summary = LatencySummary.of_array(np.array(values, dtype=np.float64))
    assert summary == LatencySummary.of(values)
    assert {type(x) for x in (summary.p50, summary.p90, summary.p99, summary.mean)} == {float}


def timing(ttft_ms: float | None, *itl_ms: float, num_output_tokens: int = 0) -> RequestTiming:
    return RequestTiming(ttft_ms, list(itl_ms), num_output_tokens or len(itl_ms) + 1)


def test_slo_bounds_ttft_and_mean_itl_inclusively() -> None:
    slo = Slo("tpot", ttft_ms=200.0, itl_ms=20.0)
    assert slo.met_by(timing(200.0, 10.0, 30.0))  # on both bounds: mean ITL 20
    assert not slo.met_by(timing(200.5, 10.0))  # TTFT over
    assert not slo.met_by(timing(100.0, 10.0, 31.0))  # mean ITL 20.5
    assert slo.met_by(timing(100.0))  # one token: no ITLs, any ITL bound is met
    assert not slo.met_by(timing(None))  # no first token: never met
    assert Slo("any").met_by(timing(1e9, 1e9))  # no bounds


def test_slo_with_an_itl_quantile_bounds_that_quantile() -> None:
    itl_ms = [10.0] * 9 + [100.0]  # ranks 0..9; p90 at 8.1: 10 + 0.1 * 90 = 19
    assert Slo("p90", itl_ms=19.0, itl_quantile=0.9).met_by(timing(1.0, *itl_ms))
    assert not Slo("p90", itl_ms=18.9, itl_quantile=0.9).met_by(timing(1.0, *itl_ms))
    assert Slo("p0", itl_ms=10.0, itl_quantile=0.0).met_by(timing(1.0, *itl_ms))
    assert not Slo("p100", itl_ms=99.0, itl_quantile=1.0).met_by(timing(1.0, *itl_ms))
    with pytest.raises(ConfigError, match="not in"):
        Slo("bad", itl_ms=10.0, itl_quantile=1.5)


def test_goodput_counts_requests_and_their_tokens_per_second() -> None:
    requests = [
        timing(100.0, 10.0, 10.0),  # meets: 3 tokens
        timing(300.0, 10.0),  # TTFT over
        timing(150.0, 50.0),  # ITL over
        timing(200.0, num_output_tokens=1),  # meets: 1 token, no ITLs
        timing(None),  # no token
    ]
    slo = Slo("sla", ttft_ms=200.0, itl_ms=20.0)
    assert goodput(requests, slo, span_s=2.0) == Goodput(2, 4, 1.0, 2.0)
    assert goodput([], slo, span_s=2.0) == Goodput(0, 0, 0.0, 0.0)
    assert goodput(requests, Slo("none"), span_s=4.0) == Goodput(4, 8, 1.0, 2.0)
    with pytest.raises(MeasureError):
        goodput(requests, slo, span_s=0.0)
