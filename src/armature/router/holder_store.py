"""Where the prefix index keeps which worker holds which block in which tier: the per-block
storage, each worker's event state and the prefix walks behind
`armature.router.prefix_index.PrefixIndex`. A store applies a worker's KV events itself (the
event rules: ids, capacities, staleness), so that an event costs one call into the native
store; the index keeps the rules of dumps and capacity changes.

Two stores give identical results (tests hold them equal under hypothesis):
- `NativeHolderStore`: the C table of `armature.router._index` (built from _index.c at
  install; per-tier hash maps of block hash -> bit set of worker slots);
- `PyHolderStore`: dicts and frozensets, always present, the reference.

`make_holder_store` picks one (`armature.router.index_backend`): the `backend` argument, else
the ARMATURE_INDEX_BACKEND environment variable (`native` or `python`), else native when the
extension was built.
Sequence hashes are unsigned 64-bit ints (the XXH3-64 block hashes of DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from armature.protocols.kv_events import (
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
)
from armature.router.index_backend import (
    BACKEND_ENV_VAR,
    IndexBackend,
    IndexBackendUnavailableError,
    resolve_backend,
)
from armature.router.py_holder_store import PyHolderStore
from armature.router.tier_overlap import TierOverlap, WorkerId

try:
    from armature.router import _index
except ImportError:  # built without a C compiler: the pure-Python store
    _index = None  # type: ignore[assignment]

__all__ = [
    "BACKEND_ENV_VAR",
    "HolderStore",
    "IndexBackend",
    "IndexBackendUnavailableError",
    "NativeHolderStore",
    "PyHolderStore",
    "has_native_index",
    "make_holder_store",
]

_TIER_NUMBER: Mapping[KvTier, int] = {
    KvTier.DEVICE: 0,
    KvTier.HOST: 1,
    KvTier.DISK: 2,
    KvTier.EXTERNAL: 3,
}


class HolderStore(Protocol):
    """Which worker holds which block in which tier, and each worker's event state. Pure;
    one owner (the PrefixIndex)."""

    def add_worker(self, worker: WorkerId) -> None:
        """Start `worker`: no event yet, no tier indexed, nothing held."""
        ...

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget `worker`: every tier of it must have been cleared."""
        ...

    def set_capacity(self, worker: WorkerId, tier: KvTier, capacity_blocks: int) -> None:
        """Index `tier` for `worker` up to `capacity_blocks`; 0 stops indexing it (its blocks
        must have been cleared). Events of a tier not indexed are skipped."""
        ...

    def get_capacity(self, worker: WorkerId, tier: KvTier) -> int:
        """0: `tier` is not indexed for `worker`."""
        ...

    def get_count(self, worker: WorkerId, tier: KvTier) -> int:
        """The blocks `worker` holds in `tier`."""
        ...

    def is_stale(self, worker: WorkerId) -> bool: ...

    def set_synced(self, worker: WorkerId, last_event_id: int) -> None:
        """`worker`'s blocks are as of its event `last_event_id` (a dump): not stale."""
        ...

    def apply(self, worker: WorkerId, event: KvEvent) -> bool:
        """`PrefixIndex.apply`: False if `worker` is (now) stale."""
        ...

    def add(self, worker: WorkerId, tier: KvTier, seq_hashes: Sequence[int], max_new: int) -> int:
        """Mark `seq_hashes` held by `worker` in `tier`: the number of them newly held
        (repeats counted once), or -1, changing nothing, when that would exceed `max_new`."""
        ...

    def add_blocks(
        self, worker: WorkerId, tier: KvTier, blocks: Sequence[StoredBlock], max_new: int
    ) -> int:
        """`add` of the blocks' sequence hashes."""
        ...

    def remove(self, worker: WorkerId, tier: KvTier, seq_hashes: Sequence[int]) -> int:
        """Unmark `seq_hashes` for `worker` in `tier`; how many were held (absent: skipped)."""
        ...

    def clear(self, worker: WorkerId, tier: KvTier) -> int:
        """Unmark every block of `worker` in `tier`; how many there were."""
        ...

    def get_hashes(self, worker: WorkerId, tier: KvTier) -> set[int]: ...

    def get_external_hashes(self) -> set[int]:
        """G4 blocks announced by at least one worker."""
        ...

    def find_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, int]:
        """See `PrefixIndex.find_overlaps`."""
        ...

    def find_token_overlaps(
        self, token_ids: Sequence[int], block_size: int, seed: int
    ) -> dict[WorkerId, int]:
        """See `PrefixIndex.find_token_overlaps`."""
        ...

    def find_tier_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, TierOverlap]:
        """See `PrefixIndex.find_tier_overlaps`."""
        ...


class NativeHolderStore:
    """`HolderStore` on the C table: workers get the lowest free slot (a bit per slot). The
    block methods are the table's own (no Python frame between the index and C)."""

    def __init__(self) -> None:
        if _index is None:
            raise IndexBackendUnavailableError(
                "armature.router._index was not built (no C compiler at install); "
                f"use {BACKEND_ENV_VAR}=python"
            )
        table = _index.HolderTable(dict(_TIER_NUMBER), (KvStored, KvRemoved, KvCleared))
        self._table = table
        self._slots: dict[WorkerId, int] = {}
        self._free_slots: list[int] = []  # below len(_slots) + len(_free_slots), reusable
        self.add = table.add
        self.add_blocks = table.add_blocks
        self.remove = table.remove
        self.clear = table.clear
        self.find_overlaps = table.find_overlaps
        self.find_token_overlaps = table.find_token_overlaps
        self.set_capacity = table.set_capacity
        self.get_capacity = table.get_capacity
        self.get_count = table.get_count
        self.is_stale = table.is_stale
        self.set_synced = table.set_synced
        self.apply = table.apply

    def add_worker(self, worker: WorkerId) -> None:
        assert worker not in self._slots
        if self._free_slots:
            slot = min(self._free_slots)
            self._free_slots.remove(slot)
        else:
            slot = len(self._slots)
        self._slots[worker] = slot
        self._table.set_name(slot, worker)

    def remove_worker(self, worker: WorkerId) -> None:
        leftover = sum(self._table.clear(worker, t) for t in KvTier)  # clears it either way
        assert not leftover, "worker not cleared"
        slot = self._slots.pop(worker)
        self._table.set_name(slot, None)
        self._free_slots.append(slot)

    def get_hashes(self, worker: WorkerId, tier: KvTier) -> set[int]:
        return self._table.get_hashes(worker, tier)

    def get_external_hashes(self) -> set[int]:
        return self._table.get_hashes(None, KvTier.EXTERNAL)

    def find_tier_overlaps(self, seq_hashes: Sequence[int]) -> dict[WorkerId, TierOverlap]:
        found = self._table.find_tier_overlaps(seq_hashes)
        return {w: TierOverlap(*counts) for w, counts in found.items()}


def has_native_index() -> bool:
    """Whether the native extension was built (and so is the default store)."""
    return _index is not None


def make_holder_store(backend: IndexBackend | None = None) -> HolderStore:
    """A store of `backend`; None: $ARMATURE_INDEX_BACKEND if set, else the fastest built."""
    if resolve_backend(backend, _index is not None) is IndexBackend.NATIVE:
        return NativeHolderStore()
    return PyHolderStore()
