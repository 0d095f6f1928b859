"""The frontend's Prometheus text as the planner's window (`FrontendMetrics`): pure, no I/O.

`parse_frontend_sample` reads one scrape into the counters and gauges the planner needs
(`FrontendSample`); `get_window_metrics` turns two scrapes into one window by differences
(`window_counts`: the formulas, which a simulated fleet's windows share):

    requests     finished requests (4xx other than 499 left out: they never reached a worker)
                 + the change in requests in flight: the requests that arrived
    output       the finished requests' output tokens (the output-length histogram; from a
                 frontend without it, tokens streamed over the streams that ended)
    the rest     the counters' differences: prompt, cached and output tokens, the TTFT and
                 ITL histograms' sums and counts, the SLO judgements; the queue's gauge

Frontend replicas (each counts only the requests it served): `get_fleet_window_metrics` sums
each replica's differences, `sum_samples` their scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from armature.errors import ArmatureError
from armature.planner.observation import FrontendMetrics
from armature.planner.window_counts import WindowCounts, get_metrics

__all__ = [
    "ZERO_SAMPLE",
    "FrontendSample",
    "ScrapeError",
    "get_fleet_window_metrics",
    "get_window_metrics",
    "judges_by",
    "parse_frontend_sample",
    "sum_samples",
]

T = TypeVar("T")


class ScrapeError(ArmatureError):
    """The frontend's metrics cannot be read (not Prometheus text, not a frontend's)."""


class FrontendSample(msgspec.Struct, frozen=True, kw_only=True):
    """One scrape: counters since the frontend started, gauges now."""

    model_name: str | None
    num_finished_requests: float
    num_in_flight_requests: float
    num_queued_requests: float
    num_prompt_tokens: float
    num_cached_tokens: float
    num_output_tokens: float
    num_first_tokens: float  # the TTFT histogram's count
    ttft_sum_s: float
    num_token_gaps: float  # the ITL histogram's count
    itl_sum_s: float
    num_finished_streams: float  # the e2e histogram's count
    # the finished requests' output tokens (the output-length histogram's sum and count;
    # None: a frontend that does not export it)
    finished_output_tokens: float = 0.0
    num_output_lengths: float | None = None
    num_slo_met: float = 0.0  # requests judged against the SLO targets: met, missed
    num_slo_missed: float = 0.0
    slo_ttft_target_s: float | None = None  # the targets they are judged against
    slo_itl_target_s: float | None = None
    num_workers: int = 0  # the workers the frontend routes to (its per-worker KV series)
    # seconds its counters have counted (None: a frontend that does not export it)
    uptime_s: float | None = None


# a frontend's counters and gauges at its start (a replica that joined since the last scrape)
ZERO_SAMPLE = FrontendSample(
    model_name=None,
    num_finished_requests=0.0,
    num_in_flight_requests=0.0,
    num_queued_requests=0.0,
    num_prompt_tokens=0.0,
    num_cached_tokens=0.0,
    num_output_tokens=0.0,
    num_first_tokens=0.0,
    ttft_sum_s=0.0,
    num_token_gaps=0.0,
    itl_sum_s=0.0,
    num_finished_streams=0.0,
    num_output_lengths=0.0,
)

# one series per worker: its KV capacity (the name before 2026-12: a frontend not yet upgraded)
_WORKER_CAPACITY_NAMES = frozenset(
    {"armature_worker_kv_capacity_blocks", "armature_worker_kv_blocks_total"}
)
_SCALARS = {
    "armature_requests_in_flight": "num_in_flight_requests",
    "armature_requests_queued": "num_queued_requests",
    "armature_prompt_tokens_total": "num_prompt_tokens",
    "armature_prefix_cache_hit_tokens_total": "num_cached_tokens",
    "armature_generation_tokens_total": "num_output_tokens",
    "armature_time_to_first_token_seconds_count": "num_first_tokens",
    "armature_time_to_first_token_seconds_sum": "ttft_sum_s",
    "armature_inter_token_latency_seconds_count": "num_token_gaps",
    "armature_inter_token_latency_seconds_sum": "itl_sum_s",
    "armature_e2e_request_latency_seconds_count": "num_finished_streams",
}
_REQUIRED = ("armature_requests_in_flight", "armature_time_to_first_token_seconds_count")


def _is_served(status: str) -> bool:
    """Whether a finished request with HTTP `status` reached a worker."""
    return not (status.startswith("4") and status != "499")


def parse_frontend_sample(text: str) -> FrontendSample:
    """One scrape of a frontend's /metrics; ScrapeError when it is not one."""
    values: dict[str, float] = dict.fromkeys(_SCALARS.values(), 0.0)
    seen: set[str] = set()
    num_finished = 0.0
    model_name = None
    slo: dict[str, float] = {}
    targets: dict[str, float] = {}
    lengths: dict[str, float] = {}
    workers: set[str] = set()
    uptime_s = None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ScrapeError(f"not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            seen.add(sample.name)
            if sample.name in _SCALARS:
                values[_SCALARS[sample.name]] = float(sample.value)
            elif sample.name == "armature_request_generation_tokens_sum":
                lengths["sum"] = float(sample.value)
            elif sample.name == "armature_request_generation_tokens_count":
                lengths["count"] = float(sample.value)
            elif sample.name in _WORKER_CAPACITY_NAMES:
                workers.add(sample.labels.get("worker", ""))
            elif sample.name == "armature_requests_total":
                if _is_served(sample.labels.get("status", "")):
                    num_finished += float(sample.value)
            elif sample.name == "armature_model_info" and sample.value == 1:
                model_name = sample.labels.get("model")
            elif sample.name == "armature_slo_requests_total":
                slo[sample.labels.get("result", "")] = float(sample.value)
            elif sample.name == "armature_slo_target_seconds":
                targets[sample.labels.get("target", "")] = float(sample.value)
            elif sample.name == "armature_frontend_uptime_seconds":
                uptime_s = float(sample.value)
    missing = [name for name in _REQUIRED if name not in seen]
    if missing:
        raise ScrapeError(f"not an armature frontend's metrics (no {', '.join(missing)})")
    return FrontendSample(
        model_name=model_name,
        num_finished_requests=num_finished,
        num_slo_met=slo.get("met", 0.0),
        num_slo_missed=slo.get("missed", 0.0),
        slo_ttft_target_s=targets.get("ttft"),
        slo_itl_target_s=targets.get("itl"),
        finished_output_tokens=lengths.get("sum", 0.0),
        num_output_lengths=lengths.get("count"),
        num_workers=len(workers),
        uptime_s=uptime_s,
        **values,
    )


def judges_by(sample: FrontendSample, ttft_ms: float, itl_ms: float) -> bool:
    """Whether the frontend judges requests against exactly these targets (both set, each
    within a microsecond: its gauges are in seconds)."""
    pairs = ((sample.slo_ttft_target_s, ttft_ms), (sample.slo_itl_target_s, itl_ms))
    return all(s is not None and abs(s * 1000.0 - ms) < 1e-3 for s, ms in pairs)


def get_window_metrics(
    before: FrontendSample,
    after: FrontendSample,
    window_s: float,
    previous: FrontendMetrics | None = None,
) -> FrontendMetrics:
    """The window from scrape `before` to scrape `after`, `window_s` seconds apart
    (`window_counts.get_metrics` of their differences). `previous`: the last window, whose
    lengths stand in for unmeasured ones. A counter that went down (the frontend restarted)
    counts from zero."""
    return get_fleet_window_metrics([(before, after)], window_s, previous)


def get_fleet_window_metrics(
    pairs: Sequence[tuple[FrontendSample, FrontendSample]],
    window_s: float,
    previous: FrontendMetrics | None = None,
) -> FrontendMetrics:
    """The window of several frontend replicas: each pair is one replica's scrapes at the
    window's two ends (`get_window_metrics` of one), their differences summed, each counter's
    reset (a restart) found in its own replica."""
    assert window_s > 0.0
    # the output lengths of the requests that finished in the window, where every replica
    # exports them; else (an older frontend) tokens streamed over the streams that ended
    by_lengths = all(
        b.num_output_lengths is not None and a.num_output_lengths is not None for b, a in pairs
    )
    tokens, finished = (
        ("finished_output_tokens", "num_output_lengths")
        if by_lengths
        else ("num_output_tokens", "num_finished_streams")
    )

    def delta(name: str) -> float:
        total = 0.0
        for before, after in pairs:
            now: float = getattr(after, name)
            then: float = getattr(before, name)
            total += now if now < then else now - then
        return total

    in_flight_change = sum(a.num_in_flight_requests - b.num_in_flight_requests for b, a in pairs)
    num_requests = max(0, math.floor(delta("num_finished_requests") + in_flight_change + 0.5))
    counts = WindowCounts(
        window_s=window_s,
        num_requests=num_requests,
        num_first_tokens=delta("num_first_tokens"),
        prompt_tokens=delta("num_prompt_tokens"),
        cached_tokens=delta("num_cached_tokens"),
        ttft_sum_s=delta("ttft_sum_s"),
        num_finished=delta(finished),
        output_tokens=delta(tokens),
        num_token_gaps=delta("num_token_gaps"),
        itl_sum_s=delta("itl_sum_s"),
        num_queued_requests=int(sum(a.num_queued_requests for _, a in pairs)),
        num_met_requests=delta("num_slo_met"),
        num_missed_requests=delta("num_slo_missed"),
    )
    return get_metrics(counts, previous)


def _common(values: Iterable[T]) -> T | None:
    """The one value all of `values` have; None when they differ (or there are none)."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def sum_samples(samples: Sequence[FrontendSample]) -> FrontendSample:
    """The replicas' scrapes as one frontend's: counters and gauges summed, the model and
    the SLO targets where they all agree (else None), the workers routed to the most any
    replica routes to (they route to one fleet). At least one sample."""
    assert samples
    summed = {name: sum(getattr(s, name) for s in samples) for name in _SCALARS.values()}
    lengths = [s.num_output_lengths for s in samples]
    return FrontendSample(
        model_name=_common(s.model_name for s in samples),
        num_finished_requests=sum(s.num_finished_requests for s in samples),
        finished_output_tokens=sum(s.finished_output_tokens for s in samples),
        num_output_lengths=None if None in lengths else sum(x for x in lengths if x is not None),
        num_slo_met=sum(s.num_slo_met for s in samples),
        num_slo_missed=sum(s.num_slo_missed for s in samples),
        slo_ttft_target_s=_common(s.slo_ttft_target_s for s in samples),
        slo_itl_target_s=_common(s.slo_itl_target_s for s in samples),
        num_workers=max(s.num_workers for s in samples),
        **summed,
    )
