"""Per-request ITL in an aggregated pool: the share of requests whose own mean ITL stays within
the target while prefills share their worker's steps. Pure math.

The SLO counts a request as met when *its* mean ITL is within target, so a pool sized for the
mean ITL (step / (1 - prefill share)) misses most of the requests with few output tokens: one
prefill that lands while a 10-token answer decodes adds its whole time to 9 intervals. For a
worker that receives `rate` requests/s, each prefill taking `p` seconds (decodes wait for it),
and decode steps of `step` seconds:

    output tokens  o ~ exponential with the predicted mean (the forecast knows only the
                   mean), taken at the midpoints of `num_bins` equal-probability bins:
                   o_i = -osl ln(1 - (i + 1/2) / num_bins)
    intervals      o - 1 (a request of one token has no ITL and always meets it)
    stalls         N ~ Poisson(rate o itl): the prefills that arrive while it decodes
    met            step (o - 1) + N p <= itl (o - 1), i.e. N <= k = floor((itl - step)(o - 1) / p)
    share          the mean over the bins of P(N <= k)
"""

from __future__ import annotations

import math

__all__ = ["OUTPUT_BINS", "get_itl_attainment", "get_output_lengths", "get_poisson_cdf"]

# equal-probability bins of the output length distribution (more: finer, slower)
OUTPUT_BINS = 20


# above this mean exp(-mean) underflows a float: the terms are summed in log space
_LOG_SPACE_MEAN = 700.0


def get_poisson_cdf(num_events: int, mean: float) -> float:
    """P(N <= num_events) for N ~ Poisson(mean); 0.0 below zero events."""
    if num_events < 0:
        return 0.0
    if mean <= 0.0:
        return 1.0
    if mean > _LOG_SPACE_MEAN:
        log_mean = math.log(mean)
        logs = [k * log_mean - mean - math.lgamma(k + 1) for k in range(num_events + 1)]
        top = max(logs)
        return min(1.0, math.exp(top) * math.fsum(math.exp(x - top) for x in logs))
    term = math.exp(-mean)
    total = term
    for k in range(1, num_events + 1):
        term *= mean / k
        total += term
    return min(1.0, total)


def get_output_lengths(mean_output_tokens: float, num_bins: int = OUTPUT_BINS) -> list[float]:
    """Output lengths at the midpoints of `num_bins` equal-probability bins of an exponential
    distribution of mean `mean_output_tokens`."""
    assert num_bins >= 1
    return [-mean_output_tokens * math.log(1.0 - (i + 0.5) / num_bins) for i in range(num_bins)]


def get_itl_attainment(
    rate_per_worker: float,
    prefill_s: float,
    step_s: float,
    mean_output_tokens: float,
    itl_s: float,
    num_bins: int = OUTPUT_BINS,
) -> float:
    """The share of requests whose mean ITL is at most `itl_s` on a worker that receives
    `rate_per_worker` requests/s, each prefill stalling its decodes `prefill_s` seconds, its
    decode steps taking `step_s` (see the module docstring)."""
    lengths = get_output_lengths(mean_output_tokens, num_bins)
    met = 0.0
    for tokens in lengths:
        intervals = tokens - 1.0
        if intervals <= 0.0:
            met += 1.0
            continue
        budget_s = (itl_s - step_s) * intervals
        if budget_s < 0.0:
            continue
        stalls = math.inf if prefill_s <= 0.0 else budget_s / prefill_s
        if math.isinf(stalls):
            met += 1.0
            continue
        met += get_poisson_cdf(math.floor(stalls), rate_per_worker * tokens * itl_s)
    return met / len(lengths)
