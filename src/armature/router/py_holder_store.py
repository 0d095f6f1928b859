"""The pure-Python `HolderStore` (`armature.router.holder_store`): the reference the native
store is tested against, and the store when the extension was not built.

    tiers[w]:         seq_hash -> bit set of the tiers w holds it in   (removal, dumps)
    holders[tier]:    seq_hash -> {workers holding it in tier}          (G1, G2, G3: lookups)
                      (frozensets, one shared per single holder: a prompt's new blocks go
                      in with one dict update)
    external:         seq_hash -> how many workers announce it in G4    (counts for every worker)
    workers[w]:       w's event state (last event id, stale), and per tier its capacity
                      (absent: not indexed) and the blocks it holds

`apply` holds the index's event rules (DESIGN §3); the native store keeps the same rules in C.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat, takewhile
from typing import cast

from armature.kv.hashing import compute_seq_hashes
from armature.protocols.kv_events import (
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
)
from armature.router.tier_overlap import (
    NO_HOLDERS,
    HolderGet,
    TierOverlap,
    WorkerId,
    find_tier_overlaps,
)

__all__ = ["PyHolderStore"]

_BIT = {KvTier.DEVICE: 1, KvTier.HOST: 2, KvTier.DISK: 4, KvTier.EXTERNAL: 8}


@dataclass(slots=True)  # read on every event
class _WorkerState:
    # tiers indexed for this worker -> capacity in blocks; events of other tiers are skipped
    capacity_blocks: dict[KvTier, int] = field(default_factory=dict)
    num_blocks: dict[KvTier, int] = field(default_factory=lambda: dict.fromkeys(KvTier, 0))
    last_event_id: int = -1
    stale: bool = False


class PyHolderStore:
    def __init__(self) -> None:
        self._holders: dict[KvTier, dict[int, frozenset[WorkerId]]] = {
            KvTier.DEVICE: {},
            KvTier.HOST: {},
            KvTier.DISK: {},
        }
        self._device = self._holders[KvTier.DEVICE]
        self._gets: tuple[HolderGet, HolderGet, HolderGet] = (
            self._device.get,
            self._holders[KvTier.HOST].get,
            self._holders[KvTier.DISK].get,
        )
        self._external: dict[int, int] = {}
        self._tiers: dict[WorkerId, dict[int, int]] = {}
        self._workers: dict[WorkerId, _WorkerState] = {}
        self._everyone: frozenset[WorkerId] = frozenset()
        self._alone: dict[WorkerId, frozenset[WorkerId]] = {}  # {worker}, shared

    def add_worker(self, worker: WorkerId) -> None:
        assert worker not in self._tiers
        self._tiers[worker] = {}
        self._workers[worker] = _WorkerState()
        self._everyone = frozenset(self._tiers)
        self._alone[worker] = frozenset([worker])

    def remove_worker(self, worker: WorkerId) -> None:
        held = self._tiers.pop(worker)
        assert not held, "worker not cleared"
        del self._workers[worker]
        self._everyone = frozenset(self._tiers)
        del self._alone[worker]

    # ---- worker state and events ---------------------------------------------------------
    def set_capacity(self, worker: WorkerId, tier: KvTier, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        capacities = self._workers[worker].capacity_blocks
        if capacity_blocks:
            capacities[tier] = capacity_blocks
        else:
            capacities.pop(tier, None)

    def get_capacity(self, worker: WorkerId, tier: KvTier) -> int:
        return self._workers[worker].capacity_blocks.get(tier, 0)

    def get_count(self, worker: WorkerId, tier: KvTier) -> int:
        return self._workers[worker].num_blocks[tier]

    def is_stale(self, worker: WorkerId) -> bool:
        return self._workers[worker].stale

    def set_synced(self, worker: WorkerId, last_event_id: int) -> None:
        state = self._workers[worker]
        state.last_event_id = last_event_id
        state.stale = False

    def apply(self, worker: WorkerId, event: KvEvent) -> bool:
        state = self._workers[worker]
        if state.stale:
            return False
        event_id = event.event_id
        if event_id != state.last_event_id + 1:
            if event_id <= state.last_event_id:
                return True  # already covered by a dump taken after it
            state.stale = True
            return False
        state.last_event_id = event_id
        kind = type(event)
        if kind is KvStored:
            stored = cast("KvStored", event)  # no isinstance: this is the hot path
            tier = stored.tier
            capacity = state.capacity_blocks.get(tier)
            if capacity is None:
                return True  # a tier this worker did not report: not indexed
            max_new = capacity - state.num_blocks[tier]
            if self.add_blocks(worker, tier, stored.blocks, max_new) < 0:
                state.stale = True  # more blocks than the tier can hold: we missed removals
                return False
        elif kind is KvRemoved:
            removed = cast("KvRemoved", event)
            if removed.tier in state.capacity_blocks:
                self.remove(worker, removed.tier, removed.seq_hashes)
        elif kind is KvCleared:
            self.clear(worker, KvTier.DEVICE)
        return True

    # ---- blocks --------------------------------------------------------------------------
    def add(self, worker: WorkerId, tier: KvTier, seq_hashes: Sequence[int], max_new: int) -> int:
        new = _get_new(self._tiers[worker], list(seq_hashes), _BIT[tier])
        if len(new) > max_new:
            return -1
        self._set(worker, new, tier)
        self._workers[worker].num_blocks[tier] += len(new)
        return len(new)

    def add_blocks(
        self, worker: WorkerId, tier: KvTier, blocks: Sequence[StoredBlock], max_new: int
    ) -> int:
        return self.add(worker, tier, [b.seq_hash for b in blocks], max_new)

    def remove(self, worker: WorkerId, tier: KvTier, seq_hashes: Iterable[int]) -> int:
        bit = _BIT[tier]
        held = self._tiers[worker]
        holders = self._holders.get(tier, {})
        num_removed = 0
        for seq_hash in seq_hashes:
            bits = held.get(seq_hash, 0)
            if not bits & bit:
                continue
            bits &= ~bit
            if bits:
                held[seq_hash] = bits
            else:
                del held[seq_hash]
            num_removed += 1
            if tier is KvTier.EXTERNAL:
                count = self._external[seq_hash] - 1
                if count:
                    self._external[seq_hash] = count
                else:
                    del self._external[seq_hash]
            else:
                _discard(holders, seq_hash, worker)
        self._workers[worker].num_blocks[tier] -= num_removed
        return num_removed

    def clear(self, worker: WorkerId, tier: KvTier) -> int:
        return self.remove(worker, tier, list(self.get_hashes(worker, tier)))

    def get_hashes(self, worker: WorkerId, tier: KvTier) -> set[int]:
        bit = _BIT[tier]
        return {h for h, bits in self._tiers[worker].items() if bits & bit}

    def get_external_hashes(self) -> set[int]:
        return set(self._external)

    def find_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, int]:
        """The walk runs at C speed while every still-matching worker holds the next block
        (lazy `map` lookups under `takewhile`); Python only runs where a worker drops out."""
        overlaps: dict[WorkerId, int] = {}
        num_blocks = len(seq_hashes)
        if not num_blocks:
            return overlaps
        get = self._device.get
        lookups = map(get, seq_hashes, repeat(NO_HOLDERS))
        active: set[WorkerId] | frozenset[WorkerId] = next(lookups)
        depth = 1
        while active:
            depth += len(list(takewhile(active.issubset, lookups)))
            if depth >= num_blocks:
                break
            # `takewhile` consumed block `depth`, the first some active worker lacks.
            still = active & get(seq_hashes[depth], NO_HOLDERS)
            for worker in active - still:
                overlaps[worker] = depth
            active = still
            depth += 1
        for worker in active:
            overlaps[worker] = num_blocks
        return overlaps

    def find_token_overlaps(
        self, token_ids: Sequence[int], block_size: int, seed: int
    ) -> dict[WorkerId, int]:
        return self.find_overlaps(compute_seq_hashes(token_ids, block_size, seed))

    def find_tier_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, TierOverlap]:
        return find_tier_overlaps(seq_hashes, self._gets, self._external, self._everyone)

    def _set(self, worker: WorkerId, new: Sequence[int], tier: KvTier) -> None:
        """Add `tier` to `worker`'s entry of each of `new` hashes: distinct, and none of them
        in `tier` for `worker` yet."""
        bit = _BIT[tier]
        held = self._tiers[worker]
        if held.keys().isdisjoint(new):
            held.update(dict.fromkeys(new, bit))
        else:
            get_bits = held.get
            held.update([(h, get_bits(h, 0) | bit) for h in new])
        if tier is KvTier.EXTERNAL:
            external = self._external
            for seq_hash in new:
                external[seq_hash] = external.get(seq_hash, 0) + 1
            return
        holders = self._holders[tier]
        alone = self._alone[worker]
        if holders.keys().isdisjoint(new):  # blocks nobody else holds: the common case
            holders.update(dict.fromkeys(new, alone))
        else:
            get_holders = holders.get
            for seq_hash in new:
                workers = get_holders(seq_hash)
                holders[seq_hash] = alone if workers is None else workers | alone


def _get_new(held: dict[int, int], hashes: list[int], bit: int) -> list[int]:
    """`hashes` without repeats and without those `held` has `bit` of, in their order."""
    if held.keys().isdisjoint(hashes) and len(set(hashes)) == len(hashes):
        return hashes  # all new (the common case, at C speed)
    return [h for h in dict.fromkeys(hashes) if not held.get(h, 0) & bit]


def _discard(
    holders_by_hash: dict[int, frozenset[WorkerId]], seq_hash: int, worker: WorkerId
) -> None:
    holders = holders_by_hash.get(seq_hash)
    if holders is None or worker not in holders:
        return
    if len(holders) == 1:
        del holders_by_hash[seq_hash]
    else:
        holders_by_hash[seq_hash] = holders - {worker}
