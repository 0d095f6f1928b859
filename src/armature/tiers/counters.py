"""What the lower KV tiers did, counted on the engine thread, and the `KvTierStats` snapshot
made of it. Shared by both `KvTiers` implementations (`armature.tiers.manager`,
`armature.sim.modeled_tiers`)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from armature.kv.tier_policy import TierHit, TierPolicy
from armature.protocols.engine import KvTierStats
from armature.protocols.kv_events import KvTier

__all__ = [
    "GENERATION",
    "MAX_LATENCY_SAMPLES",
    "ONBOARD_LATENCY_BUCKETS_S",
    "TierCounters",
    "path_name",
    "tier_stats",
]

MAX_LATENCY_SAMPLES = 4096
ONBOARD_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GENERATION = {  # the docs' names for the tiers
    KvTier.DEVICE: "g1",
    KvTier.HOST: "g2",
    KvTier.DISK: "g3",
    KvTier.EXTERNAL: "g4",
}


def path_name(src: KvTier, dst: KvTier) -> str:
    return f"{GENERATION[src]}->{GENERATION[dst]}"


@dataclass
class TierCounters:
    """What the tiers did; engine thread only (others read `KvTierManager.get_stats`)."""

    blocks_offloaded: Counter[tuple[KvTier, KvTier]] = field(default_factory=Counter)
    blocks_onboarded: Counter[KvTier] = field(default_factory=Counter)
    blocks_refused: Counter[str] = field(default_factory=Counter)
    write_failures: Counter[KvTier] = field(default_factory=Counter)
    num_lookup_blocks: int = 0  # blocks looked up below G1
    hit_blocks: Counter[KvTier] = field(default_factory=Counter)
    onboard_latencies_s: deque[float] = field(
        default_factory=lambda: deque(maxlen=MAX_LATENCY_SAMPLES)
    )
    onboard_latency_counts: list[int] = field(
        default_factory=lambda: [0] * (len(ONBOARD_LATENCY_BUCKETS_S) + 1)
    )
    onboard_latency_sum_s: float = 0.0
    # loads that completed: loader seconds and blocks per tier (get_onboard_s_per_block)
    onboard_load_s: dict[KvTier, float] = field(default_factory=dict)
    onboard_load_blocks: Counter[KvTier] = field(default_factory=Counter)

    def add_onboard_latency(self, seconds: float) -> None:
        self.onboard_latencies_s.append(seconds)
        self.onboard_latency_counts[bisect_left(ONBOARD_LATENCY_BUCKETS_S, seconds)] += 1
        self.onboard_latency_sum_s += seconds

    def add_load_time(self, tier_load_s: Mapping[KvTier, float], hits: Sequence[TierHit]) -> None:
        """A completed load: the seconds it took per tier, and the blocks it brought back."""
        for tier, seconds in tier_load_s.items():
            self.onboard_load_s[tier] = self.onboard_load_s.get(tier, 0.0) + seconds
        self.onboard_load_blocks.update(hit.tier for hit in hits)

    def get_onboard_s_per_block(self) -> dict[KvTier, float]:
        """Seconds to load one block back from each lower tier, over the loads completed so
        far (a tier not loaded from yet is absent)."""
        return {t: self.onboard_load_s[t] / n for t, n in self.onboard_load_blocks.items() if n}


def tier_stats(counters: TierCounters, policy: TierPolicy, bytes_per_block: int) -> KvTierStats:
    """A snapshot of what tiers with these counters and this policy did and hold (shared with
    the mocker's modeled tiers, `armature.sim.modeled_tiers`)."""
    c = counters
    tiers = policy.get_tiers()
    return KvTierStats(
        bytes_per_block=bytes_per_block,
        blocks_offloaded={path_name(s, d): n for (s, d), n in c.blocks_offloaded.items()},
        blocks_onboarded={path_name(t, KvTier.DEVICE): n for t, n in c.blocks_onboarded.items()},
        blocks_refused=dict(c.blocks_refused),
        write_failures={str(t): n for t, n in c.write_failures.items()},
        num_lookup_blocks=c.num_lookup_blocks,
        hit_blocks={str(t): n for t, n in c.hit_blocks.items()},
        tier_blocks={str(t): policy.get_num_blocks(t) for t in tiers},
        tier_capacity_blocks={str(t): policy.get_capacity_blocks(t) for t in tiers},
        onboard_latency_buckets_s=list(ONBOARD_LATENCY_BUCKETS_S),
        onboard_latency_counts=list(c.onboard_latency_counts),
        onboard_latency_sum_s=c.onboard_latency_sum_s,
    )
