"""`KvTiers`: what the engine asks of its lower KV tiers (G2 host, G3 disk, G4 shared store).

Two implementations keep the one `TierPolicy` (which block sits in which tier) and differ in
how its copies happen:

    armature.tiers.manager.KvTierManager     real bytes: host tensors, disk and S3 stores,
                                             writer and loader threads
    armature.sim.modeled_tiers.ModeledTiers  no bytes: a load of n blocks takes
                                             n x bytes per block / the tier's bandwidth
                                             on the mocker's clock

Both share `armature.tiers.policy_shell.TierPolicyShell` (the policy's calls and their
counting) and differ in `_run` (the ops) and in how loads run.

The engine (`EngineCore`, `Onboarding`) types against this protocol only. Every method is
called on the engine's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from armature.kv.block_key import BlockKey
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import TierHit, TierPolicy
from armature.protocols.engine import KvTierStats
from armature.protocols.kv_events import KvTier
from armature.tiers.counters import TierCounters

__all__ = ["KvTiers", "LoadResult", "TierCounters"]


@dataclass(frozen=True)
class LoadResult:
    job_id: int
    hits: list[TierHit]
    g1_ids: list[int]
    num_loaded: int  # hits[:num_loaded] are in their G1 blocks
    failure: str | None  # why hits[num_loaded] was not loaded (a refusal reason, "missing"...)
    elapsed_s: float
    # loader seconds per tier: its runs, plus the final wait for copies shared out per block
    tier_load_s: dict[KvTier, float] = field(default_factory=dict)
    error: str | None = None  # with `failure`: what the store or the block check said


class KvTiers(Protocol):
    policy: TierPolicy
    counters: TierCounters

    def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
        """The pool's eviction hook (`EvictionObserver`): the blocks go down a tier."""
        ...

    def on_written(self, blocks: Sequence[tuple[int, BlockKey]]) -> None:
        """(G1 block id, key) of blocks just completed in G1 (copied down in write-through)."""
        ...

    def add_existing(self, tier: KvTier, keys: Sequence[BlockKey]) -> None:
        """Blocks `tier`'s storage already holds: known from now on, with no copy."""
        ...

    def find(self, seq_hashes: Sequence[int]) -> list[TierHit]:
        """The longest prefix of `seq_hashes` held below G1 (no pin taken; not counted)."""
        ...

    def count_lookup(self, num_blocks: int, hits: Sequence[TierHit]) -> None:
        """Count one admission's lookup of `num_blocks` blocks, answered by `hits` (the
        tier hit ratio's numbers): once per decision, not per retry of a waiting request."""
        ...

    def can_load(self, num_blocks: int) -> bool:
        """Whether a load of `num_blocks` fits the in-flight bound (one load always may)."""
        ...

    def reserve(self, hits: Sequence[TierHit]) -> None:
        """Pin `hits` before G1 blocks are allocated for them."""
        ...

    def submit(self, hits: list[TierHit], g1_ids: list[int]) -> int:
        """Start loading reserved `hits` into `g1_ids`; the job id `take_finished` reports."""
        ...

    def get_num_inflight(self) -> int:
        """Loads submitted and not yet taken by `take_finished`."""
        ...

    def wait_for_loads(self, timeout_s: float) -> None:
        """Wait until a load finishes or `timeout_s` passes (an engine with nothing else to
        do). The modeled tiers wait on the mocker's clock: a virtual clock never sleeps."""
        ...

    def take_finished(self) -> list[LoadResult]:
        """Settle finished loads with the policy (pins released); their results, oldest
        first. Each submitted job is reported exactly once."""
        ...

    def get_stats(self) -> KvTierStats:
        """A snapshot of the counters and tier sizes."""
        ...

    def flush(self) -> None:
        """Wait until every write submitted so far has landed."""
        ...

    def finish_loads(self) -> None:
        """Finish the loads in flight (`take_finished` reports them); writes go on until
        `close`, which settling them may still need (a refused block's drop)."""
        ...

    def close(self) -> None:
        """Finish loads and writes in flight (`take_finished` reports the loads), then stop."""
        ...
