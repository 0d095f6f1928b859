"""One window's counts, as a frontend's counters give them, into the planner's
`FrontendMetrics`: the one formula for a live frontend (differences of two scrapes,
`planner.scrape`) and a simulated fleet (`sim.fleet_monitor`), so that a planner replayed on
the virtual clock sees what a live one would. Pure.

    requests     the requests that arrived
    input        prompt tokens / first tokens       (both counted once a request's prefill ends)
    output       output tokens / finished requests  (a length is known when its request ends)
    prefix hits  cached prompt tokens / prompt tokens
    TTFT         the first tokens' sum / count
    ITL          the token gaps' sum / count        (each later token one gap: tokens that
                                                     arrive together share their interval)
    queue        the admission gate's queue at the window's end
    attainment   finished requests judged against the SLO targets, and those met

A length or hit rate with no sample in the window (requests arrived, none has finished its
prefill, or none has finished) keeps the previous window's value: an unmeasured length is
not zero tokens. Before any was measured it is 0.0.
"""

from __future__ import annotations

import msgspec

from armature.planner.observation import FrontendMetrics

__all__ = ["WindowCounts", "get_metrics"]


class WindowCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What happened in one window of `window_s` seconds."""

    window_s: float
    num_requests: int  # arrivals
    num_first_tokens: float
    prompt_tokens: float  # of the requests whose first token came
    cached_tokens: float  # of those prompt tokens, served from a prefix cache
    ttft_sum_s: float
    num_finished: float  # requests whose output length is counted
    output_tokens: float  # their output tokens
    num_token_gaps: float
    itl_sum_s: float
    num_queued_requests: int = 0
    num_met_requests: float = 0.0
    num_missed_requests: float = 0.0


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _or_previous(value: float | None, previous: FrontendMetrics | None, name: str) -> float:
    if value is not None:
        return value
    if previous is None:
        return 0.0
    old: float = getattr(previous, name)
    return old


def get_metrics(counts: WindowCounts, previous: FrontendMetrics | None = None) -> FrontendMetrics:
    """The window's `FrontendMetrics`; `previous`: the last window, whose lengths and hit rate
    stand in for unmeasured ones."""
    c = counts
    ttft_s = _ratio(c.ttft_sum_s, c.num_first_tokens)
    itl_s = _ratio(c.itl_sum_s, c.num_token_gaps)
    return FrontendMetrics(
        window_s=c.window_s,
        num_requests=c.num_requests,
        mean_input_tokens=_or_previous(
            _ratio(c.prompt_tokens, c.num_first_tokens), previous, "mean_input_tokens"
        ),
        mean_output_tokens=_or_previous(
            _ratio(c.output_tokens, c.num_finished), previous, "mean_output_tokens"
        ),
        prefix_hit_rate=_or_previous(
            _ratio(c.cached_tokens, c.prompt_tokens), previous, "prefix_hit_rate"
        ),
        mean_ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
        mean_itl_ms=None if itl_s is None else itl_s * 1000.0,
        num_queued_requests=c.num_queued_requests,
        num_judged_requests=round(c.num_met_requests + c.num_missed_requests),
        num_met_requests=round(c.num_met_requests),
    )
