"""`TierPolicyShell`: what both `KvTiers` implementations (listed in `armature.tiers.api`) do
alike around the one `TierPolicy`: its calls, and their counting in `TierCounters`. A subclass
carries out the ops the policy returns (`_run`) and runs the loads (`submit`, `take_finished`...).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from armature.kv.block_key import BlockKey
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import TierHit, TierOp, TierPolicy
from armature.protocols.engine import KvTierStats
from armature.protocols.kv_events import KvTier
from armature.tiers.counters import TierCounters, tier_stats

__all__ = ["TierPolicyShell"]


class TierPolicyShell(ABC):
    """Owns `counters`; the policy's calls and their counting. Engine thread only."""

    def __init__(self, policy: TierPolicy, *, bytes_per_block: int, max_inflight_bytes: int):
        self.policy = policy
        self.bytes_per_block = bytes_per_block
        self.max_inflight_bytes = max_inflight_bytes
        self.counters = TierCounters()
        self._inflight_bytes = 0  # bytes of the loads in flight (the subclass keeps it)

    @abstractmethod
    def _run(self, ops: list[TierOp]) -> None:
        """Carry out the policy's `ops`, in order."""

    @abstractmethod
    def get_num_inflight(self) -> int: ...

    # ---- offload -----------------------------------------------------------------------
    def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
        """The pool's eviction hook: copy the blocks down before the pool reuses them."""
        self._run(self.policy.on_evict(blocks))

    def on_written(self, blocks: Sequence[tuple[int, BlockKey]]) -> None:
        """Blocks just completed in G1 (copied down at once in write-through mode)."""
        self._run(self.policy.on_written(blocks))

    def add_existing(self, tier: KvTier, keys: Sequence[BlockKey]) -> None:
        self._run(self.policy.add_existing(tier, keys))

    # ---- onboarding --------------------------------------------------------------------
    def find(self, seq_hashes: Sequence[int]) -> list[TierHit]:
        """What the tiers hold of `seq_hashes` (counted apart: `count_lookup`)."""
        return self.policy.find(seq_hashes)

    def count_lookup(self, num_blocks: int, hits: Sequence[TierHit]) -> None:
        """One lookup of `num_blocks` prompt blocks, which `hits` answered: counted once
        per admission decision (a request waiting for room looks again each step)."""
        self.counters.num_lookup_blocks += num_blocks
        self.counters.hit_blocks.update(hit.tier for hit in hits)

    def can_load(self, num_blocks: int) -> bool:
        """Whether a load of `num_blocks` fits the in-flight bound (one load always may)."""
        num_bytes = num_blocks * self.bytes_per_block
        return (
            self.get_num_inflight() == 0
            or self._inflight_bytes + num_bytes <= self.max_inflight_bytes
        )

    def reserve(self, hits: Sequence[TierHit]) -> None:
        """Pin `hits` before G1 blocks are allocated for them (an allocation can evict down
        into the tiers, and must not push these out)."""
        self.policy.pin(hits)

    def _onboarded(
        self,
        loaded: Sequence[TierHit],
        elapsed_s: float,
        tier_load_s: Mapping[KvTier, float] | None,
    ) -> list[TierOp]:
        """A load taken back: `loaded` (its hits now in G1) go to the policy and are counted;
        the policy's ops are returned for `_run`. `tier_load_s` None: a failed load, whose
        time is not a block's."""
        ops = self.policy.on_onboarded(loaded)
        self.counters.blocks_onboarded.update(hit.tier for hit in loaded)
        self.counters.add_onboard_latency(elapsed_s)
        if tier_load_s is not None:
            self.counters.add_load_time(tier_load_s, loaded)
        return ops

    # ---- observation -------------------------------------------------------------------
    def get_stats(self) -> KvTierStats:
        """A snapshot of the counters (engine thread; the copy is safe to hand to others)."""
        return tier_stats(self.counters, self.policy, self.bytes_per_block)
