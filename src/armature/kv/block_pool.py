"""Paged KV block pool with prefix caching and KV events.

Owns every block's reference count and hash. Free blocks sit in an LRU queue: `allocate`
takes from the head (least recently freed first), `free` appends at the tail. A freed block
keeps its hash and stays findable by `find_prefix` until it is taken again (evicted), which
emits a Removed event after telling the pool's `EvictionObserver` (a lower KV tier copying the
block out). Callers free a request's blocks tail-first, so prefix blocks, the most reusable,
are evicted last.

    free queue:  head [b7, b3, b9, ...] tail      allocate -> b7 first
    cached map:  seq_hash -> block id (blocks in use and evictable free ones)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

from armature.errors import ArmatureError
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock, EvictionObserver
from armature.protocols.kv_events import KvEvent, KvTier, StoredBlock

__all__ = ["BlockPool", "KvBlock", "NoFreeBlocksError"]


class NoFreeBlocksError(ArmatureError, RuntimeError):
    """Raised by `allocate` when fewer free blocks exist than asked for (nothing is taken)."""


@dataclass
class KvBlock:
    block_id: int
    ref_count: int = 0
    seq_hash: int | None = None
    local_hash: int | None = None
    parent_hash: int | None = None  # seq_hash of the block before it (only while cached)
    num_hits: int = 0  # prefix-cache hits since it was cached (tier offload policy reads it)


class BlockPool:
    """Fixed set of `num_blocks` blocks of `block_size` tokens. Pure: no I/O, no locks;
    one owner (the scheduler) calls it from one thread. `eviction_observer` is told about
    every cached block before `allocate` reuses it. Events go to `event_log` (shared with the
    lower KV tiers so that one worker's event ids stay one sequence), a private one if None."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        *,
        eviction_observer: EvictionObserver | None = None,
        event_log: KvEventLog | None = None,
    ):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._eviction_observer = eviction_observer
        self.blocks = [KvBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # seq_hash -> block id
        self.event_log = event_log if event_log is not None else KvEventLog()

    # ---- reads -------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        """Blocks that `allocate` can hand out (free, including cached-but-unused ones)."""
        return len(self._free)

    def get_num_active_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def get_free_block_ids(self) -> list[int]:
        """Free queue in eviction order (head first)."""
        return list(self._free)

    def get_cached_block(self, seq_hash: int) -> int | None:
        return self._cached.get(seq_hash)

    def get_cached_hashes(self) -> list[int]:
        """Sequence hashes of every cached block (in use or evictable): what a KV dump holds."""
        return list(self._cached)

    def get_last_event_id(self) -> int:
        """Id of the newest event emitted so far (-1 before the first)."""
        return self.event_log.get_last_event_id()

    def get_num_cached_blocks(self) -> int:
        return len(self._cached)

    def find_prefix(self, seq_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of `seq_hashes` (takes no reference)."""
        out: list[int] = []
        if not self.enable_prefix_caching:
            return out
        for h in seq_hashes:
            block_id = self._cached.get(h)
            if block_id is None:
                break
            out.append(block_id)
        return out

    # ---- mutations ---------------------------------------------------------------------
    def touch(self, block_ids: Sequence[int], *, is_hit: bool = False) -> None:
        """Take one more reference on each block; a free one leaves the queue. `is_hit`: the
        blocks are a request's prefix-cache hit (counted in each block's `num_hits`)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            if is_hit:
                block.num_hits += 1

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks from the queue head, each with one reference. Evicted
        cached blocks are first reported to the eviction observer (one call, pool untouched),
        then lose their hash (one Removed event). All or nothing, also when the observer
        raises."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be non-negative, got {num_blocks}")
        if num_blocks > len(self._free):
            raise NoFreeBlocksError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        if self._eviction_observer is not None:
            self._report_evictions(num_blocks, self._eviction_observer)
        out: list[int] = []
        evicted: list[int] = []
        for _ in range(num_blocks):
            block_id, _none = self._free.popitem(last=False)
            block = self.blocks[block_id]
            assert block.ref_count == 0
            if block.seq_hash is not None:
                del self._cached[block.seq_hash]
                evicted.append(block.seq_hash)
                block.seq_hash = None
                block.local_hash = None
                block.parent_hash = None
            block.num_hits = 0
            block.ref_count = 1
            out.append(block_id)
        if evicted:
            self.event_log.removed(evicted, KvTier.DEVICE)
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block, in the given order; a block that reaches zero
        joins the queue tail (so pass a request's blocks tail-first)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"double free of block {block_id}"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

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
        run: list[StoredBlock] = []  # consecutive newly cached blocks, one event per run
        run_parent: int | None = None
        prev_hash = parent_hash
        for block_id, (seq_hash, local_hash) in zip(block_ids, hashes, strict=True):
            block = self.blocks[block_id]
            assert block.ref_count > 0, "only blocks in use can be cached"
            newly_cached = False
            if block.seq_hash is not None:
                assert block.seq_hash == seq_hash, "block re-cached under another hash"
            elif seq_hash not in self._cached:
                block.seq_hash = seq_hash
                block.local_hash = local_hash
                block.parent_hash = prev_hash
                self._cached[seq_hash] = block_id
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

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (Cleared event). Refused (False) while blocks are in use."""
        if self.get_num_active_blocks() > 0:
            return False
        for block in self.blocks:
            block.seq_hash = None
            block.local_hash = None
            block.parent_hash = None
            block.num_hits = 0
        self._cached.clear()
        self.event_log.cleared()
        return True

    def take_events(self) -> list[KvEvent]:
        """Drain the events emitted since the last call (by this pool and whatever shares
        its event log), oldest first."""
        return self.event_log.take()

    def check_integrity(self) -> None:
        """Assert the pool's invariants (tests and debug builds)."""
        free_ids = set(self._free)
        assert len(free_ids) == len(self._free)
        for block in self.blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.block_id in free_ids), block
            assert (block.seq_hash is None) == (block.local_hash is None), block
            assert block.seq_hash is not None or block.parent_hash is None, block
            if block.seq_hash is not None:
                assert self._cached[block.seq_hash] == block.block_id
        assert all(self.blocks[b].seq_hash == h for h, b in self._cached.items())

    def _report_evictions(self, num_blocks: int, observer: EvictionObserver) -> None:
        """Tell `observer` which cached blocks the next `allocate(num_blocks)` takes."""
        evicted: list[EvictedBlock] = []
        for block_id in islice(self._free, num_blocks):
            block = self.blocks[block_id]
            if block.seq_hash is not None:
                assert block.local_hash is not None
                evicted.append(
                    EvictedBlock(
                        block_id,
                        block.seq_hash,
                        block.local_hash,
                        block.parent_hash,
                        block.num_hits,
                    )
                )
        if evicted:
            observer.on_evict(evicted)
