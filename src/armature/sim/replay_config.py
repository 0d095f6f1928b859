"""What a replay takes and gives: its settings (`ReplayConfig`, with SLAs for goodput) and its
report (`ReplayReport`, with latency percentiles). Plain values, shared by the simulations
and their entry point (`sim.replay`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["REPLAY_POLICIES", "LatencySummary", "ReplayConfig", "ReplayReport", "Slo"]

REPLAY_POLICIES = ("round-robin", "random", "least-loaded", "kv", "kv-approx")


@dataclass(frozen=True)
class Slo:
    """A service-level target: TTFT and inter-token latency bounds (None: unbounded). The ITL
    bound applies to each request's mean ITL, or with `itl_quantile` (e.g. 0.99) to that
    quantile of its ITLs (a stall bound)."""

    name: str
    ttft_ms: float | None = None
    itl_ms: float | None = None
    itl_quantile: float | None = None

    def met_by(self, ttft_ms: float, itl_ms: Sequence[float]) -> bool:
        if self.ttft_ms is not None and ttft_ms > self.ttft_ms:
            return False
        if self.itl_ms is None or not itl_ms:
            return True
        if self.itl_quantile is None:
            return statistics.fmean(itl_ms) <= self.itl_ms
        ordered = sorted(itl_ms)
        index = min(len(ordered) - 1, int(self.itl_quantile * (len(ordered) - 1) + 0.5))
        return ordered[index] <= self.itl_ms


@dataclass(frozen=True)
class ReplayConfig:
    num_workers: int = 8
    router: str = "kv"
    block_size: int = 16
    num_kv_blocks: int = 16384
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    speedup_ratio: float = 1.0
    overlap_weight: float = 1.0
    decode_weight: float = 1.0
    router_temperature: float = 0.0
    vocab_size: int = 32000
    routed_ttl_s: float = 120.0
    seed: int = 0
    # disaggregation: the first `num_prefill_workers` of `num_workers` are prefill workers
    num_prefill_workers: int = 0
    max_local_prefill_tokens: int = 0
    max_prefill_queue_tokens: int = 1 << 30
    transfer_bandwidth_bytes_s: float = 25e9
    kv_bytes_per_block: int = 2 * 1024 * 1024  # Llama-3-8B in bfloat16, 16-token blocks
    # goodput: requests meeting an SLA, for each SLA given
    slos: tuple[Slo, ...] = ()


@dataclass(frozen=True)
class LatencySummary:
    p50: float
    p90: float
    p99: float
    mean: float

    @staticmethod
    def of(values: Sequence[float]) -> LatencySummary:
        if not values:
            return LatencySummary(0.0, 0.0, 0.0, 0.0)
        ordered = sorted(values)

        def pct(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

        return LatencySummary(pct(0.5), pct(0.9), pct(0.99), statistics.fmean(ordered))


@dataclass(frozen=True)
class ReplayReport:
    num_requests: int
    num_rejected: int
    prefix_hit_ratio: float
    ttft_ms: LatencySummary
    itl_ms: LatencySummary
    e2e_ms: LatencySummary
    throughput_tokens_s: float
    load_skew: float
    requests_per_worker: dict[str, int]
    goodput_requests_s: dict[str, float]  # by SLA name
    goodput_tokens_s: dict[str, float]
    num_remote_prefills: int
    simulated_time_s: float
    wall_time_s: float
