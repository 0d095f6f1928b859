"""The lower tiers' metrics of several in-process engines, summed into one set of series
(serve's own /metrics: its in-process workers have no metrics endpoint of their own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from armature.protocols.engine import EngineStats, KvTierStats
from armature.worker.metrics import add_tier_metrics, sum_tier_stats


def tiers(offloaded: int, hits: int, counts: list[int]) -> KvTierStats:
    return KvTierStats(
        bytes_per_block=100,
        blocks_offloaded={"g1->g2": offloaded},
        blocks_onboarded={"g2->g1": hits},
        blocks_refused={},
        write_failures={},
        num_lookup_blocks=10,
        hit_blocks={"host": hits},
        tier_blocks={"host": offloaded},
        tier_capacity_blocks={"host": 64},
        onboard_latency_buckets_s=[0.01, 0.1],
        onboard_latency_counts=counts,
        onboard_latency_sum_s=0.5,
    )


def test_several_engines_tiers_sum() -> None:
    total = sum_tier_stats([tiers(3, 2, [1, 0, 0]), tiers(5, 4, [0, 2, 1])])
    assert total is not None
    assert (total.blocks_offloaded, total.blocks_onboarded) == ({"g1->g2": 8}, {"g2->g1": 6})
    assert (total.num_lookup_blocks, total.hit_blocks) == (20, {"host": 6})
    assert (total.tier_blocks, total.tier_capacity_blocks) == ({"host": 8}, {"host": 128})
    assert (total.onboard_latency_counts, total.onboard_latency_sum_s) == ([1, 2, 1], 1.0)
    assert sum_tier_stats([]) is None


def test_the_sum_is_exported_in_the_workers_families() -> None:
    registry = CollectorRegistry()
    engines = [
        lambda: EngineStats(tiers=tiers(3, 2, [1, 0, 0])),
        lambda: EngineStats(tiers=None),  # an engine without tiers adds nothing
        lambda: EngineStats(tiers=tiers(5, 4, [0, 2, 1])),
    ]
    add_tier_metrics(registry, engines)
    text = generate_latest(registry).decode()
    assert 'armature_worker_kv_offloaded_blocks_total{path="g1->g2"} 8.0' in text
    assert 'armature_worker_kv_offloaded_bytes_total{path="g1->g2"} 800.0' in text
    assert 'armature_worker_kv_tier_hit_ratio{tier="host"} 0.3' in text
    assert "armature_worker_kv_onboard_seconds_count 4.0" in text
