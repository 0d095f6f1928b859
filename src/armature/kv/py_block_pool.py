"""`PyBlockPool`: the block pool (`armature.kv.block_pool`) in Python lists and dicts, the
reference the native pool is held to, and the fallback where it was not built. Pure."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice, starmap
from typing import cast

from armature.kv.eviction import EvictedBlock, EvictionObserver
from armature.kv.pool_shell import KvBlock, PoolShell, check_allocation
from armature.protocols.kv_events import KvTier, StoredBlock

__all__ = ["PyBlockPool"]


class PyBlockPool(PoolShell):
    """The reference pool, in Python lists and dicts. `eviction_observer` is told about every
    cached block before `allocate` reuses it."""

    def _make_state(self) -> None:
        num_blocks = self.num_blocks
        # by block id; a hash is None while the block is not cached
        self._ref_counts = [0] * num_blocks
        self._seq_hashes: list[int | None] = [None] * num_blocks
        self._local_hashes: list[int | None] = [None] * num_blocks
        self._parent_hashes: list[int | None] = [None] * num_blocks  # only while cached
        self._num_hits = [0] * num_blocks  # prefix-cache hits since it was cached
        # the free queue: blocks [_next_fresh, num_blocks) never taken (its head), then _free
        self._next_fresh = 0
        self._free: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[int, int] = {}  # seq_hash -> block id
        self._num_removals = 0  # hashes that left _cached (a reset counts one)

    # ---- reads -------------------------------------------------------------------------
    @property
    def blocks(self) -> list[KvBlock]:
        """Every block's state, by block id (a snapshot)."""
        return [
            KvBlock(i, *state)
            for i, state in enumerate(
                zip(
                    self._ref_counts,
                    self._seq_hashes,
                    self._local_hashes,
                    self._parent_hashes,
                    self._num_hits,
                    strict=True,
                )
            )
        ]

    def get_num_unreferenced(self, block_ids: Sequence[int]) -> int:
        """How many of `block_ids` no request holds (free, though maybe cached)."""
        ref_counts = self._ref_counts
        return [ref_counts[b] for b in block_ids].count(0)

    def get_num_free_blocks(self) -> int:
        """Blocks that `allocate` can hand out (free, including cached-but-unused ones)."""
        return self.num_blocks - self._next_fresh + len(self._free)

    def get_num_active_blocks(self) -> int:
        return self._next_fresh - len(self._free)

    def count_allocations_before_eviction(self, limit: int) -> int:
        """How many blocks `allocate` hands out, up to `limit`, before it would evict a cached
        one (the never-taken blocks, then the free queue's head that holds no hash)."""
        count = self.num_blocks - self._next_fresh
        seq_hashes = self._seq_hashes
        for block_id in self._free:
            if count >= limit or seq_hashes[block_id] is not None:
                break
            count += 1
        return max(0, min(count, limit))

    def get_free_block_ids(self) -> list[int]:
        """Free queue in eviction order (head first)."""
        return [*range(self._next_fresh, self.num_blocks), *self._free]

    def get_cached_block(self, seq_hash: int) -> int | None:
        return self._cached.get(seq_hash)

    def get_cached_hashes(self) -> list[int]:
        """Sequence hashes of every cached block (in use or evictable): what a KV dump holds."""
        return list(self._cached)

    def get_num_cached_blocks(self) -> int:
        return len(self._cached)

    def get_num_removals(self) -> int:
        return self._num_removals

    def find_prefix(self, seq_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of `seq_hashes` (takes no reference)."""
        if not self.enable_prefix_caching:
            return []
        found = list(map(self._cached.get, seq_hashes))  # at C speed; past a miss is cheap
        if None in found:
            del found[found.index(None) :]
        return cast("list[int]", found)  # the misses are cut

    def find_prefix_of_pairs(
        self, block_hashes: Sequence[tuple[int, int]], max_blocks: int, start: int = 0, /
    ) -> list[int]:
        """`find_prefix` of the seq hashes of pairs `start` to `max_blocks`, up to the first
        miss."""
        found: list[int] = []
        if not self.enable_prefix_caching:
            return found
        cached = self._cached
        stop = max(0, max_blocks)
        for seq_hash, _ in islice(block_hashes, min(max(0, start), stop), stop):
            block_id = cached.get(seq_hash)
            if block_id is None:
                break
            found.append(block_id)
        return found

    # ---- mutations ---------------------------------------------------------------------
    def touch(self, block_ids: Sequence[int], *, is_hit: bool = False) -> None:
        """Take one more reference on each block; a free one leaves the queue. `is_hit`: the
        blocks are a request's prefix-cache hit (counted in each block's `num_hits`)."""
        ref_counts = self._ref_counts
        for block_id in block_ids:
            if ref_counts[block_id] == 0:
                if block_id >= self._next_fresh:
                    self._list_fresh_blocks()
                del self._free[block_id]
            ref_counts[block_id] += 1
            if is_hit:
                self._num_hits[block_id] += 1

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks from the queue head, each with one reference. Evicted
        cached blocks are first reported to the eviction observer (one call, pool untouched),
        then lose their hash (one Removed event). All or nothing, also when the observer
        raises."""
        check_allocation(num_blocks, self.get_num_free_blocks())
        fresh = range(self._next_fresh, min(self.num_blocks, self._next_fresh + num_blocks))
        num_queued = num_blocks - len(fresh)  # taken from _free: freed before, maybe cached
        if self._eviction_observer is not None and num_queued:
            self._report_evictions(num_queued, self._eviction_observer)
        self._next_fresh = fresh.stop
        ref_counts, num_hits = self._ref_counts, self._num_hits
        for block_id in fresh:  # never cached, never hit
            ref_counts[block_id] = 1
        if not num_queued:
            return list(fresh)
        popitem = self._free.popitem
        queued = [popitem(last=False)[0] for _ in range(num_queued)]
        seq_hashes = self._seq_hashes
        evicted: list[int] = []
        for block_id in queued:
            assert ref_counts[block_id] == 0
            seq_hash = seq_hashes[block_id]
            if seq_hash is not None:
                del self._cached[seq_hash]
                evicted.append(seq_hash)
                seq_hashes[block_id] = None
                self._local_hashes[block_id] = None
                self._parent_hashes[block_id] = None
            num_hits[block_id] = 0
            ref_counts[block_id] = 1
        if evicted:
            self._num_removals += len(evicted)
            self.event_log.removed(evicted, KvTier.DEVICE)
        return [*fresh, *queued]

    def _list_fresh_blocks(self) -> None:
        """Put the never-taken blocks into `_free`, at its head in id order (for a caller
        that takes a reference on one of them without allocating it)."""
        fresh = range(self._next_fresh, self.num_blocks)
        self._free = OrderedDict.fromkeys([*fresh, *self._free])
        self._next_fresh = self.num_blocks

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block, in the given order; a block that reaches zero
        joins the queue tail (so pass a request's blocks tail-first)."""
        ref_counts, free = self._ref_counts, self._free
        for block_id in block_ids:
            ref_count = ref_counts[block_id] - 1
            assert ref_count >= 0, f"double free of block {block_id}"
            ref_counts[block_id] = ref_count
            if ref_count == 0:
                free[block_id] = None

    def cache_blocks(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[tuple[int, int]],
        parent_hash: int | None,
    ) -> None:
        """Register full blocks under their (seq_hash, local_hash); emits one Stored event for
        the newly cached ones. A hash already cached under another block is left alone (the
        duplicate block stays uncached and is freed like any other)."""
        if not self.enable_prefix_caching:
            return
        assert len(block_ids) == len(hashes)
        if self._cache_new_blocks(block_ids, hashes, parent_hash):
            return
        run: list[StoredBlock] = []  # consecutive newly cached blocks, one event per run
        run_parent: int | None = None
        prev_hash = parent_hash
        cached, seq_hashes = self._cached, self._seq_hashes
        for block_id, (seq_hash, local_hash) in zip(block_ids, hashes, strict=True):
            assert self._ref_counts[block_id] > 0, "only blocks in use can be cached"
            newly_cached = False
            old_hash = seq_hashes[block_id]
            if old_hash is not None:
                assert old_hash == seq_hash, "block re-cached under another hash"
            elif seq_hash not in cached:
                seq_hashes[block_id] = seq_hash
                self._local_hashes[block_id] = local_hash
                self._parent_hashes[block_id] = prev_hash
                cached[seq_hash] = block_id
                newly_cached = True
            if newly_cached:
                if not run:
                    run_parent = prev_hash
                run.append(StoredBlock(seq_hash, local_hash))
            elif run:
                self.event_log.stored(run_parent, run, KvTier.DEVICE)
                run = []
            prev_hash = seq_hash
        if run:
            self.event_log.stored(run_parent, run, KvTier.DEVICE)

    def _cache_new_blocks(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[tuple[int, int]],
        parent_hash: int | None,
    ) -> bool:
        """`cache_blocks` when every block is uncached and no hash is cached (a prompt's new
        blocks: the common case), in bulk; False (nothing done) otherwise."""
        seq_hashes = self._seq_hashes
        if [seq_hashes[b] for b in block_ids].count(None) != len(block_ids):
            return False
        seqs = [h for h, _ in hashes]
        cached = self._cached
        if not cached.keys().isdisjoint(seqs) or len(set(seqs)) != len(seqs):
            return False
        if not seqs:
            return True
        ref_counts = self._ref_counts
        assert 0 not in map(ref_counts.__getitem__, block_ids), "only blocks in use can be cached"
        parents = [parent_hash, *seqs[:-1]]
        local_hashes, parent_hashes = self._local_hashes, self._parent_hashes
        for block_id, (seq_hash, local_hash), parent in zip(
            block_ids, hashes, parents, strict=True
        ):
            seq_hashes[block_id] = seq_hash
            local_hashes[block_id] = local_hash
            parent_hashes[block_id] = parent
        cached.update(zip(seqs, block_ids, strict=True))
        self.event_log.stored(parent_hash, list(starmap(StoredBlock, hashes)), KvTier.DEVICE)
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (Cleared event). Refused (False) while blocks are in use."""
        if self.get_num_active_blocks() > 0:
            return False
        n = self.num_blocks
        self._seq_hashes, self._local_hashes = [None] * n, [None] * n
        self._parent_hashes, self._num_hits = [None] * n, [0] * n
        self._cached.clear()
        self._num_removals += 1
        self.event_log.cleared()
        return True

    def check_integrity(self) -> None:
        """Assert the pool's invariants (tests and debug builds)."""
        free_ids = set(self.get_free_block_ids())
        assert len(free_ids) == self.get_num_free_blocks()
        assert all(b < self._next_fresh for b in self._free)  # freed blocks were taken
        assert all(h is None for h in self._seq_hashes[self._next_fresh :])  # never cached
        for block in self.blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.block_id in free_ids), block
            assert (block.seq_hash is None) == (block.local_hash is None), block
            assert block.seq_hash is not None or block.parent_hash is None, block
            if block.seq_hash is not None:
                assert self._cached[block.seq_hash] == block.block_id
        assert all(self._seq_hashes[b] == h for h, b in self._cached.items())

    def _report_evictions(self, num_blocks: int, observer: EvictionObserver) -> None:
        """Tell `observer` which cached blocks the next `allocate(num_blocks)` takes."""
        evicted: list[EvictedBlock] = []
        for block_id in islice(self._free, num_blocks):
            seq_hash, local_hash = self._seq_hashes[block_id], self._local_hashes[block_id]
            if seq_hash is not None:
                assert local_hash is not None
                evicted.append(
                    EvictedBlock(
                        block_id,
                        seq_hash,
                        local_hash,
                        self._parent_hashes[block_id],
                        self._num_hits[block_id],
                    )
                )
        if evicted:
            observer.on_evict(evicted)
