"""The router's global prefix index: which worker holds which KV blocks, fed by the workers'
KV events (DESIGN §3). Pure: no I/O, one owner.

    by_hash:   seq_hash  -> {worker ids holding that block}
    by_worker: worker id -> {seq_hashes it holds}     (removal, dumps, the memory bound)

A worker's events must arrive with event ids increasing by exactly one, starting at 0. A gap
(or an event stream that would make a worker hold more blocks than its capacity) marks the
worker stale: `apply` returns False and the caller asks that worker for a dump of its blocks
(`load_dump`), which replaces what the index knew. Memory is bounded: a worker never has more
entries than its capacity, so the index never holds more than the workers' total capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat, takewhile

from armature.protocols.kv_events import KvCleared, KvEvent, KvRemoved, KvStored

__all__ = ["PrefixIndex", "WorkerId"]

WorkerId = str
_NO_HOLDERS: frozenset[WorkerId] = frozenset()


@dataclass
class _WorkerState:
    capacity_blocks: int
    hashes: set[int] = field(default_factory=set)
    last_event_id: int = -1
    stale: bool = False


class PrefixIndex:
    def __init__(self) -> None:
        self._by_hash: dict[int, set[WorkerId]] = {}
        self._workers: dict[WorkerId, _WorkerState] = {}

    # ---- workers -----------------------------------------------------------------------
    def add_worker(self, worker: WorkerId, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be > 0")
        if worker in self._workers:
            raise ValueError(f"worker {worker!r} is already indexed")
        self._workers[worker] = _WorkerState(capacity_blocks)

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget a worker and every block it held."""
        state = self._workers.pop(worker)
        self._drop(worker, state.hashes)

    def get_workers(self) -> list[WorkerId]:
        return list(self._workers)

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
            new = {b.seq_hash for b in event.blocks if b.seq_hash not in state.hashes}
            if len(state.hashes) + len(new) > state.capacity_blocks:
                state.stale = True  # more blocks than the worker can hold: we missed removals
                return False
            state.hashes.update(new)
            for seq_hash in new:
                self._by_hash.setdefault(seq_hash, set()).add(worker)
        elif isinstance(event, KvRemoved):
            gone = [h for h in event.seq_hashes if h in state.hashes]
            state.hashes.difference_update(gone)
            self._drop(worker, gone)
        elif isinstance(event, KvCleared):
            self._drop(worker, state.hashes)
            state.hashes = set()
        return True

    def load_dump(self, worker: WorkerId, seq_hashes: Iterable[int], last_event_id: int) -> None:
        """Replace everything known about `worker` with a dump of its blocks, taken after its
        event `last_event_id`."""
        state = self._workers[worker]
        hashes = set(seq_hashes)
        if len(hashes) > state.capacity_blocks:
            raise ValueError(f"dump of {len(hashes)} blocks exceeds capacity")
        self._drop(worker, state.hashes)
        state.hashes = hashes
        for seq_hash in hashes:
            self._by_hash.setdefault(seq_hash, set()).add(worker)
        state.last_event_id = last_event_id
        state.stale = False

    # ---- queries -----------------------------------------------------------------------
    def find_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, int]:
        """For each worker holding the first block: how many leading blocks of `seq_hashes`
        it holds (workers holding none are absent).

        The walk runs at C speed while every still-matching worker holds the next block
        (lazy `map` lookups under `takewhile`); Python only runs where a worker drops out."""
        overlaps: dict[WorkerId, int] = {}
        num_blocks = len(seq_hashes)
        if not num_blocks:
            return overlaps
        get = self._by_hash.get
        lookups = map(get, seq_hashes, repeat(_NO_HOLDERS))
        active: set[WorkerId] | frozenset[WorkerId] = next(lookups)
        depth = 1
        while active:
            depth += len(list(takewhile(active.issubset, lookups)))
            if depth >= num_blocks:
                break
            # `takewhile` consumed block `depth`, the first some active worker lacks.
            still = active & get(seq_hashes[depth], _NO_HOLDERS)
            for worker in active - still:
                overlaps[worker] = depth
            active = still
            depth += 1
        for worker in active:
            overlaps[worker] = num_blocks
        return overlaps

    def get_num_entries(self) -> int:
        """(worker, block) pairs held: bounded by the workers' total capacity."""
        return sum(len(s.hashes) for s in self._workers.values())

    def get_capacity_blocks(self) -> int:
        """The bound on `get_num_entries`: the indexed workers' capacities, summed."""
        return sum(s.capacity_blocks for s in self._workers.values())

    def get_num_worker_blocks(self, worker: WorkerId) -> int:
        """Blocks indexed for `worker` (0 for an unknown worker)."""
        state = self._workers.get(worker)
        return len(state.hashes) if state is not None else 0

    def get_worker_hashes(self, worker: WorkerId) -> set[int]:
        return set(self._workers[worker].hashes)

    def _drop(self, worker: WorkerId, hashes: Iterable[int]) -> None:
        for seq_hash in hashes:
            holders = self._by_hash.get(seq_hash)
            if holders is None:
                continue
            holders.discard(worker)
            if not holders:
                del self._by_hash[seq_hash]
