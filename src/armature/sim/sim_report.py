"""What a replay keeps per request (`Tracked`) and the report made from it at the end. Pure:
the simulation hands over its records (`ReportInputs`) and the span it simulated."""

from __future__ import annotations

import statistics
from array import array
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from armature.protocols.engine import KvTierStats
from armature.sim.fleet_monitor import FinishedRequest
from armature.sim.replay_config import ReplayConfig, ReplayReport
from armature.workload.measure import LatencySummary, RequestTiming, goodput
from armature.workload.traces import TraceRequest, prefix_hit_ceiling_tokens

__all__ = ["ReportInputs", "Tracked", "build_report"]


@dataclass
class Tracked:
    arrival_ms: float
    num_prompt_tokens: int
    worker: str
    first_token_ms: float | None = None
    last_token_ms: float | None = None
    # the gaps between its tokens, as doubles (a replay's millions of gaps: no float object
    # kept per gap, and the report reads them in place)
    itl_ms: array[float] = field(default_factory=lambda: array("d"))
    num_cached_tokens: int = 0
    num_output_tokens: int = 0

    def add_tokens(self, now_ms: float, num_tokens: int, num_cached_tokens: int) -> bool:
        """`num_tokens` arrived at `now_ms` (`num_cached_tokens`: of the prompt, as the
        first output says); whether they are the first."""
        first = self.first_token_ms is None
        if first:
            self.first_token_ms = now_ms
            self.num_cached_tokens = num_cached_tokens
        else:
            assert self.last_token_ms is not None
            gap_ms = now_ms - self.last_token_ms
            if num_tokens == 1:
                self.itl_ms.append(gap_ms)
            else:  # tokens that arrive together share the interval, as a frontend counts them
                self.itl_ms.extend([gap_ms / num_tokens] * num_tokens)
        self.last_token_ms = now_ms
        self.num_output_tokens += num_tokens
        return first

    def add_later_tokens(self, ends_ms: Sequence[float], gaps_ms: Sequence[float]) -> None:
        """One token at each of `ends_ms` (non-empty, ascending), none of them the first;
        `gaps_ms` are the gaps between consecutive `ends_ms` (a batch's requests share
        them, so the caller computes them once; an `array('d')` is copied at C speed)."""
        assert self.last_token_ms is not None
        self.itl_ms.append(ends_ms[0] - self.last_token_ms)
        self.itl_ms.extend(gaps_ms)
        self.last_token_ms = ends_ms[-1]
        self.num_output_tokens += len(ends_ms)

    def get_ttft_ms(self) -> float | None:
        """From arrival to the first token (None: none came)."""
        return None if self.first_token_ms is None else self.first_token_ms - self.arrival_ms

    def as_finished(self) -> FinishedRequest:
        """What a frontend measures of it once it finished."""
        itl_ms = self.itl_ms
        return FinishedRequest(self.get_ttft_ms(), self.num_output_tokens, sum(itl_ms), len(itl_ms))

    def timing(self) -> RequestTiming:
        return RequestTiming(self.get_ttft_ms(), self.itl_ms, self.num_output_tokens)


@dataclass(frozen=True)
class ReportInputs:
    """A finished simulation's records: each routed request (`tracked`) and its trace
    (`traces`), by request id; the workers in routing at the end; each worker's lower-tier
    counters."""

    tracked: Mapping[str, Tracked]
    traces: Mapping[str, TraceRequest]
    workers: Sequence[str]
    tier_stats: Sequence[KvTierStats]
    config: ReplayConfig
    num_rejected: int
    num_remote_prefills: int
    prefill_workers: Collection[str] = ()  # every prefill worker there was


def build_report(
    inputs: ReportInputs, start_ms: float, end_ms: float, wall_time_s: float
) -> ReplayReport:
    """The report over the requests that produced a token, between the first arrival
    (`start_ms`) and the simulated end."""
    tracked = inputs.tracked
    done = [t for t in tracked.values() if t.last_token_ms is not None]
    prompt_tokens = sum(t.num_prompt_tokens for t in done)
    output_tokens = sum(t.num_output_tokens for t in done)
    per_worker = {w: 0 for w in inputs.workers}
    for t in tracked.values():
        per_worker[t.worker] = per_worker.get(t.worker, 0) + 1
    # the skew among the routed (decode or aggregated) workers: a request that ends on its
    # prefill worker (one output token) is counted there but is not theirs to balance
    routed = [n for w, n in per_worker.items() if w not in inputs.prefill_workers]
    mean = statistics.fmean(routed) if routed else 0.0
    span_s = max(end_ms - start_ms, 1e-9) / 1000.0
    timings = [t.timing() for t in done]
    config = inputs.config
    good = {slo.name: goodput(timings, slo, span_s) for slo in config.slos}
    onboarded: Counter[str] = Counter()
    offloaded: Counter[str] = Counter()
    for stats in inputs.tier_stats:
        onboarded.update(stats.blocks_onboarded)
        offloaded.update(stats.blocks_offloaded)
    onboarded_tokens = sum(onboarded.values()) * config.block_size
    return ReplayReport(
        num_requests=len(done),
        num_rejected=inputs.num_rejected,
        prefix_hit_ratio=(
            sum(t.num_cached_tokens for t in done) / prompt_tokens if prompt_tokens else 0.0
        ),
        ttft_ms=LatencySummary.of(
            [t.first_token_ms - t.arrival_ms for t in done if t.first_token_ms is not None]
        ),
        # millions of token gaps: read into one float64 array, sorted by numpy
        itl_ms=LatencySummary.of_array(
            np.concatenate([np.frombuffer(t.itl_ms, dtype=np.float64) for t in done])
            if done
            else np.empty(0, dtype=np.float64)
        ),
        e2e_ms=LatencySummary.of(
            [t.last_token_ms - t.arrival_ms for t in done if t.last_token_ms is not None]
        ),
        throughput_tokens_s=output_tokens / span_s,
        load_skew=max(routed) / mean if mean else 0.0,
        requests_per_worker=per_worker,
        goodput_requests_s={name: g.requests_per_s for name, g in good.items()},
        goodput_tokens_s={name: g.tokens_per_s for name, g in good.items()},
        num_remote_prefills=inputs.num_remote_prefills,
        simulated_time_s=span_s,
        wall_time_s=wall_time_s,
        blocks_onboarded=dict(sorted(onboarded.items())),
        blocks_offloaded=dict(sorted(offloaded.items())),
        onboarded_token_ratio=onboarded_tokens / prompt_tokens if prompt_tokens else 0.0,
        prefix_hit_ceiling=prefix_hit_ceiling_tokens(
            [inputs.traces[rid] for rid, t in tracked.items() if t.last_token_ms is not None],
            config.block_size,
        ),
    )
