"""The router's global prefix index: which worker holds which KV blocks in which tier, fed by
the workers' KV events (DESIGN §3). Pure: no I/O, one owner.

    workers[w].tiers: seq_hash -> bit set of the tiers w holds it in   (removal, dumps, bounds)
    holders[tier]:    seq_hash -> {workers holding it in tier}          (G1, G2, G3: lookups)
                      (frozensets, one shared per single holder: a prompt's new blocks go
                      in with one dict update)
    external:         seq_hash -> how many workers announce it in G4    (counts for every worker)

A block may sit in several tiers of one worker at once (tiers are inclusive): a Stored or
Removed event sets or clears that one tier, so a block dropped from host while still on disk
stays on disk, and a device eviction keeps any lower copy. A G4 block lives in a store every
worker can read: while any worker announces it, it counts for all of them. `Cleared` (the
engine's cache reset) empties the device tier only.

A worker's events must arrive with event ids increasing by exactly one, starting at 0. A gap
(or an event stream that would make a worker hold more blocks in a tier than that tier's
capacity) marks the worker stale: `apply` returns False and the caller asks that worker for a
dump of its blocks (`load_dump`), which replaces what the index knew. Memory is bounded: a
worker never has more entries in a tier than the tier's capacity; a lower tier whose capacity
the worker has not reported (`set_tier_capacities`) is not indexed at all, its events skipped.
So the index never holds more than the workers' total capacity, and the external counts are
no more than the workers' G4 entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat, takewhile

from armature.protocols.kv_events import KvCleared, KvEvent, KvRemoved, KvStored, KvTier
from armature.router.tier_overlap import (
    NO_HOLDERS,
    HolderGet,
    TierOverlap,
    WorkerId,
    find_tier_overlaps,
)

__all__ = ["PrefixIndex", "TierOverlap", "WorkerId"]

_BIT = {KvTier.DEVICE: 1, KvTier.HOST: 2, KvTier.DISK: 4, KvTier.EXTERNAL: 8}


@dataclass
class _WorkerState:
    # tiers indexed for this worker -> capacity in blocks; events of other tiers are skipped
    capacity_blocks: dict[KvTier, int]
    tiers: dict[int, int] = field(default_factory=dict)  # seq_hash -> tier bits
    num_blocks: dict[KvTier, int] = field(default_factory=lambda: dict.fromkeys(KvTier, 0))
    last_event_id: int = -1
    stale: bool = False


class PrefixIndex:
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
        self._workers: dict[WorkerId, _WorkerState] = {}
        self._everyone: frozenset[WorkerId] = frozenset()
        self._alone: dict[WorkerId, frozenset[WorkerId]] = {}  # {worker}, shared

    # ---- workers -----------------------------------------------------------------------
    def add_worker(self, worker: WorkerId, capacity_blocks: int) -> None:
        """Index `worker`, whose device cache holds `capacity_blocks` blocks (lower tiers are
        indexed once `set_tier_capacities` names them)."""
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be > 0")
        if worker in self._workers:
            raise ValueError(f"worker {worker!r} is already indexed")
        self._workers[worker] = _WorkerState({KvTier.DEVICE: capacity_blocks})
        self._everyone = frozenset(self._workers)
        self._alone[worker] = frozenset([worker])

    def set_tier_capacities(self, worker: WorkerId, capacity_blocks: Mapping[KvTier, int]) -> None:
        """The lower tiers `worker` has, with their capacities in blocks (as in its load
        report); the device entry, if any, is ignored. A tier no longer named, or now smaller
        than what the index holds of it, loses its entries for this worker."""
        state = self._workers[worker]
        wanted = {KvTier.DEVICE: state.capacity_blocks[KvTier.DEVICE]}
        wanted |= {t: n for t, n in capacity_blocks.items() if t is not KvTier.DEVICE and n > 0}
        if wanted == state.capacity_blocks:
            return
        for tier in KvTier:
            if state.num_blocks[tier] > wanted.get(tier, 0):
                held = [h for h, bits in state.tiers.items() if bits & _BIT[tier]]
                self._clear(worker, state, held, tier)
        state.capacity_blocks = wanted

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget a worker and every block it held (its G4 announcements too)."""
        state = self._workers.pop(worker)
        self._everyone = frozenset(self._workers)
        self._clear_all(worker, state)
        del self._alone[worker]

    def get_workers(self) -> list[WorkerId]:
        return list(self._workers)

    def has_worker(self, worker: WorkerId) -> bool:
        return worker in self._workers

    def is_stale(self, worker: WorkerId) -> bool:
        return self._workers[worker].stale

    # ---- events ------------------------------------------------------------------------
    def apply(self, worker: WorkerId, event: KvEvent) -> bool:
        """Apply one event; False if the worker is (now) stale and needs a dump. Events of a
        stale worker are ignored until `load_dump`."""
        state = self._workers[worker]
        if state.stale:
            return False
        if event.event_id <= state.last_event_id:
            return True  # already covered by a dump taken after it
        if event.event_id != state.last_event_id + 1:
            state.stale = True
            return False
        state.last_event_id = event.event_id
        if isinstance(event, KvStored):
            capacity = state.capacity_blocks.get(event.tier)
            if capacity is None:
                return True  # a tier this worker did not report: not indexed
            new = _get_new(state.tiers, [b.seq_hash for b in event.blocks], _BIT[event.tier])
            if state.num_blocks[event.tier] + len(new) > capacity:
                state.stale = True  # more blocks than the tier can hold: we missed removals
                return False
            self._set(worker, state, new, event.tier)
        elif isinstance(event, KvRemoved):
            if event.tier in state.capacity_blocks:
                self._clear(worker, state, event.seq_hashes, event.tier)
        elif isinstance(event, KvCleared):
            on_device = [h for h, bits in state.tiers.items() if bits & _BIT[KvTier.DEVICE]]
            self._clear(worker, state, on_device, KvTier.DEVICE)
        return True

    def load_dump(
        self,
        worker: WorkerId,
        seq_hashes: Iterable[int],
        last_event_id: int,
        tier_seq_hashes: Mapping[KvTier, Iterable[int]] | None = None,
    ) -> None:
        """Replace everything known about `worker` with a dump of its blocks, taken after its
        event `last_event_id`: `seq_hashes` on its device, `tier_seq_hashes` in lower tiers
        (tiers left out are empty; tiers not indexed for the worker are skipped). Raises
        ValueError, changing nothing, when a tier holds more than its capacity."""
        state = self._workers[worker]
        dump = {KvTier.DEVICE: list(dict.fromkeys(seq_hashes))}
        for tier, hashes in (tier_seq_hashes or {}).items():
            if tier is not KvTier.DEVICE and tier in state.capacity_blocks:
                dump[tier] = list(dict.fromkeys(hashes))
        for tier, hashes in dump.items():
            if len(hashes) > state.capacity_blocks[tier]:
                raise ValueError(f"dump of {len(hashes)} {tier} blocks exceeds capacity")
        self._clear_all(worker, state)
        for tier, hashes in dump.items():
            self._set(worker, state, hashes, tier)
        state.last_event_id = last_event_id
        state.stale = False

    # ---- queries -----------------------------------------------------------------------
    def find_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, int]:
        """Tier-blind: for each worker holding the first block in its device cache, how many
        leading blocks of `seq_hashes` it holds there (workers holding none are absent).

        The walk runs at C speed while every still-matching worker holds the next block
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

    def find_tier_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, TierOverlap]:
        """For each worker that can get the first block from some tier: its matched prefix,
        the leading blocks of `seq_hashes` it holds in any tier (or that G4 holds), counted
        by the fastest tier (workers matching none are absent). The walk:
        `armature.router.tier_overlap`."""
        return find_tier_overlaps(seq_hashes, self._gets, self._external, self._everyone)

    def get_num_entries(self) -> int:
        """(worker, tier, block) entries held: bounded by the workers' total capacity."""
        return sum(sum(s.num_blocks.values()) for s in self._workers.values())

    def get_capacity_blocks(self) -> int:
        """The bound on `get_num_entries`: the indexed tiers' capacities, summed over workers."""
        return sum(sum(s.capacity_blocks.values()) for s in self._workers.values())

    def get_num_worker_blocks(self, worker: WorkerId, tier: KvTier = KvTier.DEVICE) -> int:
        """Blocks indexed for `worker` in `tier` (0 for an unknown worker)."""
        state = self._workers.get(worker)
        return state.num_blocks[tier] if state is not None else 0

    def get_worker_hashes(self, worker: WorkerId, tier: KvTier = KvTier.DEVICE) -> set[int]:
        """The blocks `worker` holds in `tier`."""
        bit = _BIT[tier]
        return {h for h, bits in self._workers[worker].tiers.items() if bits & bit}

    def get_external_hashes(self) -> set[int]:
        """G4 blocks: announced by at least one indexed worker, they count for every worker."""
        return set(self._external)

    # ---- bookkeeping -------------------------------------------------------------------
    def _set(self, worker: WorkerId, state: _WorkerState, new: Sequence[int], tier: KvTier) -> None:
        """Add `tier` to `worker`'s entry of each of `new` hashes: distinct, and none of them
        in `tier` for `worker` yet (callers filter)."""
        bit = _BIT[tier]
        held = state.tiers
        if held.keys().isdisjoint(new):
            held.update(dict.fromkeys(new, bit))
        else:
            get_bits = held.get
            held.update([(h, get_bits(h, 0) | bit) for h in new])
        if tier is KvTier.EXTERNAL:
            external = self._external
            for seq_hash in new:
                external[seq_hash] = external.get(seq_hash, 0) + 1
        else:
            holders = self._holders[tier]
            alone = self._alone[worker]
            if holders.keys().isdisjoint(new):  # blocks nobody else holds: the common case
                holders.update(dict.fromkeys(new, alone))
            else:
                get_holders = holders.get
                for seq_hash in new:
                    workers = get_holders(seq_hash)
                    holders[seq_hash] = alone if workers is None else workers | alone
        state.num_blocks[tier] += len(new)

    def _clear(
        self, worker: WorkerId, state: _WorkerState, hashes: Iterable[int], tier: KvTier
    ) -> None:
        """Remove `tier` from `worker`'s entry of each of `hashes` (absent ones are skipped)."""
        bit = _BIT[tier]
        held = state.tiers
        holders = self._holders.get(tier, {})
        for seq_hash in hashes:
            bits = held.get(seq_hash, 0)
            if not bits & bit:
                continue
            bits &= ~bit
            if bits:
                held[seq_hash] = bits
            else:
                del held[seq_hash]
            state.num_blocks[tier] -= 1
            if tier is KvTier.EXTERNAL:
                count = self._external[seq_hash] - 1
                if count:
                    self._external[seq_hash] = count
                else:
                    del self._external[seq_hash]
            else:
                _discard(holders, seq_hash, worker)

    def _clear_all(self, worker: WorkerId, state: _WorkerState) -> None:
        for tier in KvTier:
            if state.num_blocks[tier]:
                held = [h for h, bits in state.tiers.items() if bits & _BIT[tier]]
                self._clear(worker, state, held, tier)
        assert not state.tiers


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
