"""`NativeBlockPool`: the block pool (`armature.kv.block_pool`) on the C core of
`armature.kv._pool` (reference counts, hashes, the LRU free list and the hash -> block map in
arrays); the events and the eviction observer are handled here. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import starmap
from typing import NamedTuple, cast

from armature.backends import BackendUnavailableError
from armature.kv.eviction import EvictedBlock
from armature.kv.pool_shell import KvBlock, PoolShell, check_allocation
from armature.protocols.kv_events import KvTier, StoredBlock

try:
    from armature.kv import _pool
except ImportError:  # built without a C compiler: the pure-Python pool
    _pool = None  # type: ignore[assignment]

__all__ = ["POOL_BACKEND_ENV_VAR", "DecodeKernel", "NativeBlockPool", "has_native_pool"]

POOL_BACKEND_ENV_VAR = "ARMATURE_POOL_BACKEND"


class DecodeKernel(NamedTuple):
    """A native pool's core and the event log calls its decode stretches report to."""

    core: _pool.PoolCore
    stored: Callable[[int | None, list[StoredBlock], KvTier], None]
    removed: Callable[[list[int], KvTier], None]


def has_native_pool() -> bool:
    """Whether armature.kv._pool was built (and so is the default)."""
    return _pool is not None


class NativeBlockPool(PoolShell):
    """`BlockPool` on the C core of `armature.kv._pool`; events and the eviction observer are
    handled here. The per-block reads are the core's own (no Python frame between)."""

    def _make_state(self) -> None:
        if _pool is None:
            raise BackendUnavailableError(
                "armature.kv._pool was not built (no C compiler at install); "
                f"use {POOL_BACKEND_ENV_VAR}=python"
            )
        core = _pool.PoolCore(self.num_blocks, self.enable_prefix_caching)
        self._core = core
        self.find_prefix = core.find_prefix
        self.find_prefix_of_pairs = core.find_prefix_of_pairs
        self.get_num_unreferenced = core.get_num_unreferenced
        self.get_num_free_blocks = core.get_num_free_blocks
        self.get_num_active_blocks = core.get_num_active_blocks
        self.count_allocations_before_eviction = core.count_allocations_before_eviction
        self.get_num_cached_blocks = core.get_num_cached_blocks
        self.get_num_removals = core.get_num_removals
        self.get_free_block_ids = core.get_free_block_ids
        self.get_cached_block = core.get_cached_block
        self.get_cached_hashes = core.get_cached_hashes
        self.free = core.free

    @property
    def blocks(self) -> list[KvBlock]:
        return list(
            starmap(KvBlock, ((i, *state) for i, state in enumerate(self._core.snapshot())))
        )

    def get_decode_kernel(self) -> DecodeKernel | None:
        """What a decode run needs to run its stretches in the core (`PoolCore.run_decodes`):
        None while an eviction observer must see evictions before they happen."""
        if self._eviction_observer is not None:
            return None
        log = self.event_log
        return DecodeKernel(self._core, log.stored, log.removed)

    def touch(self, block_ids: Sequence[int], *, is_hit: bool = False) -> None:
        self._core.touch(block_ids, is_hit)

    def allocate(self, num_blocks: int) -> list[int]:
        check_allocation(num_blocks, self._core.get_num_free_blocks())
        if self._eviction_observer is not None:
            evicting = self._core.peek_evictions(num_blocks)
            if evicting:
                self._eviction_observer.on_evict(list(starmap(EvictedBlock, evicting)))
        block_ids, evicted = self._core.allocate(num_blocks)
        if evicted:
            self.event_log.removed(evicted, KvTier.DEVICE)
        return block_ids

    def cache_blocks(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[tuple[int, int]],
        parent_hash: int | None,
    ) -> None:
        if not self.enable_prefix_caching:
            return
        # each run's StoredBlocks made by the core, from the pairs' own ints
        for run_parent, blocks in self._core.cache_blocks(
            block_ids, hashes, parent_hash, StoredBlock
        ):
            self.event_log.stored(run_parent, blocks, KvTier.DEVICE)

    def reset_prefix_cache(self) -> bool:
        if not self._core.reset():
            return False
        self.event_log.cleared()
        return True

    def check_integrity(self) -> None:
        free_ids = self.get_free_block_ids()
        assert len(set(free_ids)) == len(free_ids) == self.get_num_free_blocks()
        free = set(free_ids)
        blocks = self.blocks
        for block in blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.block_id in free), block
            assert (block.seq_hash is None) == (block.local_hash is None), block
            assert block.seq_hash is not None or block.parent_hash is None, block
            if block.seq_hash is not None:
                assert self.get_cached_block(block.seq_hash) == block.block_id
        cached = self.get_cached_hashes()
        assert len(cached) == self.get_num_cached_blocks()
        assert all(blocks[cast("int", self.get_cached_block(h))].seq_hash == h for h in cached)
