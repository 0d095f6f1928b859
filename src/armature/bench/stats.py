"""Aggregates of a run's request records. Pure.

Percentiles, the SLO and goodput are workload.measure's: goodput counts the requests that met
both SLOs (TTFT <= slo_ttft_ms and the request's own mean inter-token latency <= slo_itl_ms; a
missing SLO is always met) per second of the run's wall time; without either SLO the goodput
fields are None (a run judged by nothing has no goodput, not its successes)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

import msgspec

from armature.bench.client import RequestRecord
from armature.workload.measure import LatencySummary, RequestTiming, Slo, goodput

__all__ = ["BenchSummary", "summarize"]


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
    # None where no request gave one (every request failed: not a latency of 0)
    ttft_ms: LatencySummary | None
    itl_ms: LatencySummary | None
    e2e_ms: LatencySummary | None
    goodput_requests: int | None  # None without an SLO: nothing was judged
    goodput_per_s: float | None
    goodput_tokens_per_s: float | None
    slo_ttft_ms: float | None
    slo_itl_ms: float | None
    client_cpu_percent: float = 0.0  # the bench process's CPU, % of one core, while measuring


def _timing(record: RequestRecord) -> RequestTiming:
    ttft_s = record.ttft_s
    return RequestTiming(
        None if ttft_s is None else ttft_s * 1000,
        [x * 1000 for x in record.itl_s()],
        record.output_tokens,
    )


def _decode_rate(record: RequestRecord) -> float | None:
    """Tokens per second a user sees after the first: the tokens of the chunks after the
    first over the time from the first chunk to the last (the gaps `itl_s` spreads; the first
    chunk's tokens came with the TTFT). None with fewer than two chunks."""
    times = record.chunk_times_s
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return sum(record.chunk_tokens[1 : len(times)]) / (times[-1] - times[0])


def _ms(values_s: Sequence[float]) -> LatencySummary | None:
    """Percentiles in ms of `values_s`; None for none."""
    return LatencySummary.of([v * 1000 for v in values_s]) if values_s else None


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
    per_user = [rate for r in ok if (rate := _decode_rate(r)) is not None]
    judged = slo_ttft_ms is not None or slo_itl_ms is not None
    good = goodput([_timing(r) for r in ok], Slo("bench", slo_ttft_ms, slo_itl_ms), wall)
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
        ttft_ms=_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_ms=_ms([x for r in ok for x in r.itl_s()]),
        e2e_ms=_ms([r.e2e_s for r in ok]),
        goodput_requests=good.num_requests if judged else None,
        goodput_per_s=good.requests_per_s if judged else None,
        goodput_tokens_per_s=good.tokens_per_s if judged else None,
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        client_cpu_percent=client_cpu_percent,
    )
