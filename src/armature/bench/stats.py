"""Aggregates of a run's request records. Pure.

Goodput counts the requests that met both SLOs: TTFT <= slo_ttft_ms and mean inter-token
latency (the request's own) <= slo_itl_ms; a missing SLO is always met."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

import msgspec

from armature.bench.client import RequestRecord

__all__ = ["BenchSummary", "Latency", "summarize"]


class Latency(msgspec.Struct, frozen=True):
    p50: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of_ms(cls, values_s: Sequence[float]) -> Latency:
        if not values_s:
            return cls(0.0, 0.0, 0.0, 0.0)
        ordered = sorted(v * 1000 for v in values_s)

        def pct(q: float) -> float:
            pos = q * (len(ordered) - 1)
            low = int(pos)
            high = min(low + 1, len(ordered) - 1)
            return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

        return cls(pct(0.5), pct(0.9), pct(0.99), statistics.fmean(ordered))


class BenchSummary(msgspec.Struct, frozen=True):
    num_requests: int
    num_ok: int
    errors: dict[str, int]
    wall_time_s: float
    requests_per_s: float
    output_tokens_per_s: float
    output_tokens_per_s_per_user: float
    prompt_tokens: int
    output_tokens: int
    ttft_ms: Latency
    itl_ms: Latency
    e2e_ms: Latency
    goodput_requests: int
    goodput_per_s: float
    slo_ttft_ms: float | None
    slo_itl_ms: float | None
    client_cpu_percent: float = 0.0  # the bench process's CPU, % of one core, while measuring


def _meets(record: RequestRecord, slo_ttft_ms: float | None, slo_itl_ms: float | None) -> bool:
    ttft = record.ttft_s
    if ttft is None:
        return False
    if slo_ttft_ms is not None and ttft * 1000 > slo_ttft_ms:
        return False
    itl = record.itl_s()
    return slo_itl_ms is None or not itl or statistics.fmean(itl) * 1000 <= slo_itl_ms


def summarize(
    records: Sequence[RequestRecord],
    wall_time_s: float,
    slo_ttft_ms: float | None = None,
    slo_itl_ms: float | None = None,
    client_cpu_percent: float = 0.0,
) -> BenchSummary:
    ok = [r for r in records if r.error is None]
    wall = max(wall_time_s, 1e-9)
    output_tokens = sum(r.output_tokens for r in ok)
    per_user = [
        r.output_tokens / (r.e2e_s - (r.ttft_s or 0.0))
        for r in ok
        if r.output_tokens > 1 and r.e2e_s - (r.ttft_s or 0.0) > 0
    ]
    good = sum(1 for r in ok if _meets(r, slo_ttft_ms, slo_itl_ms))
    return BenchSummary(
        num_requests=len(records),
        num_ok=len(ok),
        errors=dict(Counter(r.error for r in records if r.error is not None)),
        wall_time_s=wall_time_s,
        requests_per_s=len(ok) / wall,
        output_tokens_per_s=output_tokens / wall,
        output_tokens_per_s_per_user=statistics.fmean(per_user) if per_user else 0.0,
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens=output_tokens,
        ttft_ms=Latency.of_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_ms=Latency.of_ms([x for r in ok for x in r.itl_s()]),
        e2e_ms=Latency.of_ms([r.e2e_s for r in ok]),
        goodput_requests=good,
        goodput_per_s=good / wall,
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        client_cpu_percent=client_cpu_percent,
    )
