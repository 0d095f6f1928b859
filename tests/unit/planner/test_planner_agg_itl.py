"""Per-request ITL in an aggregated pool (planner/agg_itl.py) against hand-worked examples."""

from __future__ import annotations

import math

import pytest

from armature.planner.agg_itl import get_itl_attainment, get_output_lengths, get_poisson_cdf


def test_poisson_cdf() -> None:
    """P(N <= 0) = e^-m; P(N <= 1) at m = 1 is 2/e; below zero events, nothing."""
    assert get_poisson_cdf(0, 0.5) == pytest.approx(math.exp(-0.5))
    assert get_poisson_cdf(1, 1.0) == pytest.approx(2.0 / math.e)
    assert get_poisson_cdf(2, 1.05) == pytest.approx(math.exp(-1.05) * (1 + 1.05 + 1.05**2 / 2))
    assert get_poisson_cdf(-1, 3.0) == 0.0
    assert get_poisson_cdf(0, 0.0) == 1.0


def test_poisson_cdf_at_means_where_exp_underflows() -> None:
    """e^-760 is 0.0 in a float: the sum is taken in log space (scipy.stats.poisson.cdf gives
    0.99999964076 and 0.01458113759 at these points)."""
    assert math.exp(-760.0) == 0.0
    assert get_poisson_cdf(900, 760.0) == pytest.approx(0.999999640764056, rel=1e-9)
    assert get_poisson_cdf(700, 760.0) == pytest.approx(0.0145811375860774, rel=1e-9)
    assert get_poisson_cdf(0, 800.0) == 0.0
    # either side of the switch to log space (scipy: 0.78264556810, 0.78040527886)
    assert get_poisson_cdf(720, 699.9) == pytest.approx(0.7826455681021226, rel=1e-9)
    assert get_poisson_cdf(720, 700.1) == pytest.approx(0.7804052788629801, rel=1e-9)


def test_output_lengths_are_bin_midpoints_of_an_exponential() -> None:
    """Two bins of mean 200: midpoints at probabilities 1/4 and 3/4, -200 ln(3/4) = 57.54 and
    -200 ln(1/4) = 277.26 tokens."""
    assert get_output_lengths(200.0, 2) == pytest.approx([57.5364, 277.2589], abs=1e-4)
    assert get_output_lengths(200.0, 1) == pytest.approx([200.0 * math.log(2.0)])


def test_itl_attainment_counts_the_short_answers_a_prefill_lands_on() -> None:
    """1 req/s per worker, prefills of 0.2 s, decode steps of 30 ms, ITL target 50 ms, two
    bins of output length (mean 200):
      57.54 tokens: 56.54 intervals may take 0.02 x 56.54 = 1.131 s of stalls, 5 prefills;
        it decodes for 57.54 x 0.05 = 2.877 s, so P(N <= 5) at m = 2.877: 0.92799;
      277.26 tokens: 5.525 s, 27 prefills, m = 13.863: 0.99945.
    Share 0.96372. The mean-ITL rule (0.03 / (1 - 0.2) = 37.5 ms) would call every one met."""
    share = get_itl_attainment(1.0, 0.2, 0.03, 200.0, 0.05, num_bins=2)
    assert share == pytest.approx((0.927988 + 0.999452) / 2.0, abs=1e-5)
    # twice the arrivals per worker: the short answers meet it less often
    assert get_itl_attainment(2.0, 0.2, 0.03, 200.0, 0.05, num_bins=2) < share


def test_itl_attainment_edges() -> None:
    """Steps slower than the target meet it for no request of two tokens or more; answers of
    under two tokens have no ITL and always meet it; with no prefill time nothing stalls."""
    assert get_itl_attainment(1.0, 0.2, 0.06, 200.0, 0.05, num_bins=4) == 0.0
    # mean 1 token, one bin: -ln(1/2) = 0.69 tokens, no interval
    assert get_itl_attainment(1.0, 0.2, 0.06, 1.0, 0.05, num_bins=1) == 1.0
    assert get_itl_attainment(5.0, 0.0, 0.03, 200.0, 0.05, num_bins=4) == 1.0
