"""What a matched block is worth to the router, by the tier it would come from
(docs/architecture.md, "Tier-aware routing"). Pure.

A device (G1) block saves its prefill and costs nothing: weight 1. A block in a lower tier
saves its prefill too but must be loaded back first, so on worker w

    weight_w(tier) = max(0, 1 - onboard_s_per_block_w(tier) / prefill_s_per_block_w)

from the worker's own measurements (its load report). Until a worker has measured both
figures for a tier, that tier weighs its prior (`PRIOR_TIER_WEIGHTS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from armature.protocols.kv_events import KvTier
from armature.router.prefix_index import TierOverlap

__all__ = ["PRIOR_TIER_WEIGHTS", "TierWeightBook", "TierWeights", "measured_tier_weights"]


@dataclass(frozen=True)
class TierWeights:
    """Weights of one worker's lower-tier blocks against a device block (which weighs 1)."""

    host: float
    disk: float
    external: float

    def weigh(self, overlap: TierOverlap) -> float:
        """The weighted overlap: blocks of `overlap`, each counted at its tier's weight."""
        return (
            overlap.num_device_blocks
            + self.host * overlap.num_host_blocks
            + self.disk * overlap.num_disk_blocks
            + self.external * overlap.num_external_blocks
        )


# Priors, each replaced by a worker's measurement of its tier as soon as it has one: rough
# guesses that keep the order of the tiers (the faster the tier, the more of a prefill a block
# from it saves), not measurements.
PRIOR_TIER_WEIGHTS = TierWeights(host=0.9, disk=0.5, external=0.3)


def measured_tier_weights(
    prefill_s_per_block: float | None,
    onboard_s_per_block: Mapping[KvTier, float],
    prior: TierWeights = PRIOR_TIER_WEIGHTS,
) -> TierWeights:
    """One worker's weights from its measured costs; a tier without a usable measurement
    (missing, not finite, or no positive prefill cost) keeps its prior."""

    def weight(tier: KvTier, prior_weight: float) -> float:
        onboard_s = onboard_s_per_block.get(tier)
        if prefill_s_per_block is None or onboard_s is None:
            return prior_weight
        if not (math.isfinite(prefill_s_per_block) and prefill_s_per_block > 0):
            return prior_weight
        if not (math.isfinite(onboard_s) and onboard_s >= 0):
            return prior_weight
        return max(0.0, 1.0 - onboard_s / prefill_s_per_block)

    return TierWeights(
        host=weight(KvTier.HOST, prior.host),
        disk=weight(KvTier.DISK, prior.disk),
        external=weight(KvTier.EXTERNAL, prior.external),
    )


class TierWeightBook:
    """Each worker's tier weights, refreshed from its load reports by the router's shell and
    read by the kv policy. A worker not (yet) reported weighs the priors. One entry per
    worker: the caller removes workers that leave."""

    def __init__(self, prior: TierWeights = PRIOR_TIER_WEIGHTS) -> None:
        self.prior = prior
        self._weights: dict[str, TierWeights] = {}

    def update(
        self,
        worker: str,
        prefill_s_per_block: float | None,
        onboard_s_per_block: Mapping[KvTier, float],
    ) -> None:
        self._weights[worker] = measured_tier_weights(
            prefill_s_per_block, onboard_s_per_block, self.prior
        )

    def get(self, worker: str) -> TierWeights:
        return self._weights.get(worker, self.prior)

    def remove(self, worker: str) -> None:
        self._weights.pop(worker, None)
