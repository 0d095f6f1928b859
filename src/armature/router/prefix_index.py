"""The router's global prefix index: which worker holds which KV blocks in which tier, fed by
the workers' KV events (DESIGN §3). Pure: no I/O, one owner.

The rules of workers, capacities and dumps live here; which worker holds which block in which
tier, each worker's event state, the event rules (`apply`) and the prefix walks live in a
`HolderStore` (`armature.router.holder_store`): the native C table when it was built, else
the pure-Python one; both give identical results.

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

from collections.abc import Callable, Iterable, Mapping, Sequence

from armature.protocols.kv_events import KvEvent, KvTier
from armature.router.holder_store import HolderStore, IndexBackend, make_holder_store
from armature.router.tier_overlap import TierOverlap, WorkerId

__all__ = ["MAX_WORKERS", "IndexBackend", "PrefixIndex", "TierOverlap", "WorkerId"]

MAX_WORKERS = 4096
"""The most workers one index holds at once: the native table's worker slots (64 words of 64
bits). The Python store keeps the same bound, so that both refuse alike."""


class PrefixIndex:
    apply: Callable[[WorkerId, KvEvent], bool]
    """apply(worker, event): apply one event of `worker`; False if the worker is (now) stale
    and needs a dump (`load_dump`); events of a stale worker are ignored until then. The
    store's own `apply` (one call per event: the native store keeps the rules in C)."""

    def __init__(self, backend: IndexBackend | None = None) -> None:
        """`backend`: which store holds the blocks (`holder_store.make_holder_store`)."""
        self._store: HolderStore = make_holder_store(backend)
        self._workers: dict[WorkerId, None] = {}  # in the order they were added
        self.apply = self._store.apply

    # ---- workers -----------------------------------------------------------------------
    def add_worker(self, worker: WorkerId, capacity_blocks: int) -> None:
        """Index `worker`, whose device cache holds `capacity_blocks` blocks (lower tiers are
        indexed once `set_tier_capacities` names them)."""
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be > 0")
        if worker in self._workers:
            raise ValueError(f"worker {worker!r} is already indexed")
        self.check_room()
        self._workers[worker] = None
        self._store.add_worker(worker)
        self._store.set_capacity(worker, KvTier.DEVICE, capacity_blocks)

    def set_tier_capacities(self, worker: WorkerId, capacity_blocks: Mapping[KvTier, int]) -> None:
        """The lower tiers `worker` has, with their capacities in blocks (as in its load
        report); the device entry, if any, is ignored. A tier no longer named, or now smaller
        than what the index holds of it, loses its entries for this worker."""
        store = self._store
        for tier in KvTier:
            if tier is KvTier.DEVICE:
                continue
            wanted = max(0, capacity_blocks.get(tier, 0))
            if store.get_count(worker, tier) > wanted:
                store.clear(worker, tier)
            store.set_capacity(worker, tier, wanted)

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget a worker and every block it held (its G4 announcements too)."""
        del self._workers[worker]
        self._clear_all(worker)
        self._store.remove_worker(worker)

    def get_workers(self) -> list[WorkerId]:
        return list(self._workers)

    def check_room(self) -> None:
        """ValueError unless one more worker may join (`MAX_WORKERS`)."""
        if len(self._workers) >= MAX_WORKERS:
            raise ValueError(f"the router's prefix index holds at most {MAX_WORKERS:,} workers")

    def has_worker(self, worker: WorkerId) -> bool:
        return worker in self._workers

    def is_stale(self, worker: WorkerId) -> bool:
        return self._store.is_stale(worker)

    # ---- dumps ---------------------------------------------------------------------------
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
        store = self._store
        capacity = {tier: store.get_capacity(worker, tier) for tier in KvTier}
        dump = {KvTier.DEVICE: list(dict.fromkeys(seq_hashes))}
        for tier, hashes in (tier_seq_hashes or {}).items():
            if tier is not KvTier.DEVICE and capacity[tier]:
                dump[tier] = list(dict.fromkeys(hashes))
        for tier, hashes in dump.items():
            if len(hashes) > capacity[tier]:
                raise ValueError(f"dump of {len(hashes)} {tier} blocks exceeds capacity")
        self._clear_all(worker)
        for tier, hashes in dump.items():
            store.add(worker, tier, hashes, len(hashes))
        store.set_synced(worker, last_event_id)

    # ---- queries -----------------------------------------------------------------------
    def find_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, int]:
        """Tier-blind: for each worker holding the first block in its device cache, how many
        leading blocks of `seq_hashes` it holds there (workers holding none are absent)."""
        return self._store.find_overlaps(seq_hashes)

    def find_token_overlaps(
        self, token_ids: Sequence[int], block_size: int, seed: int
    ) -> dict[WorkerId, int]:
        """`find_overlaps` of the prompt's block hashes (`compute_seq_hashes(token_ids,
        block_size, seed)`). The native store hashes each block only when its walk reaches
        it, so the blocks past the longest cached prefix are never hashed (nor their token
        ids read)."""
        return self._store.find_token_overlaps(token_ids, block_size, seed)

    def find_tier_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, TierOverlap]:
        """For each worker that can get the first block from some tier: its matched prefix,
        the leading blocks of `seq_hashes` it holds in any tier (or that G4 holds), counted
        by the fastest tier (workers matching none are absent). The walk:
        `armature.router.tier_overlap`."""
        return self._store.find_tier_overlaps(seq_hashes)

    def get_num_entries(self) -> int:
        """(worker, tier, block) entries held: bounded by the workers' total capacity."""
        count = self._store.get_count
        return sum(count(w, t) for w in self._workers for t in KvTier)

    def get_capacity_blocks(self) -> int:
        """The bound on `get_num_entries`: the indexed tiers' capacities, summed over workers."""
        capacity = self._store.get_capacity
        return sum(capacity(w, t) for w in self._workers for t in KvTier)

    def get_num_worker_blocks(self, worker: WorkerId, tier: KvTier = KvTier.DEVICE) -> int:
        """Blocks indexed for `worker` in `tier` (0 for an unknown worker)."""
        return self._store.get_count(worker, tier) if worker in self._workers else 0

    def get_worker_hashes(self, worker: WorkerId, tier: KvTier = KvTier.DEVICE) -> set[int]:
        """The blocks `worker` holds in `tier` (KeyError for an unknown worker)."""
        return self._store.get_hashes(worker, tier)

    def get_external_hashes(self) -> set[int]:
        """G4 blocks: announced by at least one indexed worker, they count for every worker."""
        return self._store.get_external_hashes()

    # ---- bookkeeping -------------------------------------------------------------------
    def _clear_all(self, worker: WorkerId) -> None:
        for tier in KvTier:
            if self._store.get_count(worker, tier):
                self._store.clear(worker, tier)
