"""Offline replay: deterministic reports, routing quality on a prefix-heavy workload, rejects."""

from __future__ import annotations

from dataclasses import asdict, replace

from armature.sim.replay import LatencySummary, ReplayConfig, replay
from armature.workload.traces import TraceRequest, synthetic_prefix_groups

WORKLOAD = synthetic_prefix_groups(
    num_requests=120,
    num_groups=6,
    shared_prefix_tokens=2048,
    unique_tokens=256,
    output_length=16,
    rate_rps=40.0,
    seed=5,
)
CONFIG = ReplayConfig(num_workers=4, block_size=16, num_kv_blocks=2048, seed=1)


def without_wall_time(report: object) -> dict[str, object]:
    data = asdict(report)  # type: ignore[call-overload]
    data.pop("wall_time_s")
    return data


def test_same_seed_same_report() -> None:
    a = replay(WORKLOAD, CONFIG)
    b = replay(WORKLOAD, CONFIG)
    assert without_wall_time(a) == without_wall_time(b)
    assert a.num_requests == 120 and a.num_rejected == 0
    assert sum(a.requests_per_worker.values()) == 120


def test_kv_routing_beats_round_robin_on_shared_prefixes() -> None:
    # 6 groups' prefixes (128 blocks each) do not fit in one worker's 400 blocks: round-robin
    # spreads every group over every worker and evicts; kv keeps each group on few workers
    tight = replace(CONFIG, num_kv_blocks=400)
    kv = replay(WORKLOAD, tight)
    rr = replay(WORKLOAD, replace(tight, router="round-robin"))
    assert kv.prefix_hit_ratio > rr.prefix_hit_ratio + 0.05
    assert kv.ttft_ms.p50 < rr.ttft_ms.p50
    assert rr.load_skew == 1.0  # 120 requests / 4 workers exactly


def test_requests_larger_than_a_worker_are_rejected_not_lost() -> None:
    huge = TraceRequest(
        arrival_ms=0.0, input_length=5000, output_length=4, hash_ids=tuple(range(10))
    )
    small = TraceRequest(arrival_ms=1.0, input_length=100, output_length=4, hash_ids=(99,))
    report = replay([huge, small], replace(CONFIG, num_kv_blocks=64))
    assert (report.num_requests, report.num_rejected) == (1, 1)


def test_latency_summary_percentiles() -> None:
    summary = LatencySummary.of([float(x) for x in range(1, 101)])
    assert (summary.p50, summary.p90, summary.p99, summary.mean) == (51.0, 90.0, 99.0, 50.5)
    assert LatencySummary.of([]) == LatencySummary(0.0, 0.0, 0.0, 0.0)
