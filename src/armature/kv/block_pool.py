"""Paged KV block pool with prefix caching and KV events.

Owns every block's reference count and hash. Free blocks sit in an LRU queue: `allocate`
takes from the head (least recently freed first), `free` appends at the tail. A freed block
keeps its hash and stays findable by `find_prefix` until it is taken again (evicted), which
emits a Removed event after telling the pool's `EvictionObserver` (a lower KV tier copying the
block out). Callers free a request's blocks tail-first, so prefix blocks, the most reusable,
are evicted last.

    free queue:  head [b7, b3, b9, ...] tail      allocate -> b7 first
    cached map:  seq_hash -> block id (blocks in use and evictable free ones)

A block's state is kept in arrays indexed by block id (reference counts, hashes, hits), not
an object per block: a pool of 131,072 blocks is made in milliseconds, and the per-block
loops index lists. Blocks never taken yet are the queue's head in id order and are counted,
not listed (`_next_fresh`): the queue holds only blocks that were freed (a fleet of hundreds of
simulated workers need not build a queue entry per block up front). `blocks` gives `KvBlock`
snapshots for tests and dumps.

    queue = [_next_fresh, ..., num_blocks - 1]  (never taken)  +  _free  (freed, LRU order)

Two implementations keep these rules (tests hold them equal under hypothesis, events and
evictions included): `PyBlockPool`, the reference, in Python lists and dicts, and
`NativeBlockPool`, whose per-block state is the C core of `armature.kv._pool` (a pool's
per-block loops, hundreds of blocks a prompt, at C speed; the events and the eviction observer
stay here). `make_block_pool` picks one: its `backend` argument, else ARMATURE_POOL_BACKEND
(`native` or `python`), else native when the extension was built.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice, starmap
from typing import Protocol, cast

from armature.backends import Backend, BackendUnavailableError, resolve_backend
from armature.errors import ArmatureError
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock, EvictionObserver
from armature.protocols.kv_events import KvEvent, KvTier, StoredBlock

try:
    from armature.kv import _pool
except ImportError:  # built without a C compiler: the pure-Python pool
    _pool = None  # type: ignore[assignment]

__all__ = [
    "POOL_BACKEND_ENV_VAR",
    "BlockPool",
    "KvBlock",
    "NativeBlockPool",
    "NoFreeBlocksError",
    "PyBlockPool",
    "has_native_pool",
    "make_block_pool",
]

POOL_BACKEND_ENV_VAR = "ARMATURE_POOL_BACKEND"


class NoFreeBlocksError(ArmatureError, RuntimeError):
    """Raised by `allocate` when fewer free blocks exist than asked for (nothing is taken)."""


@dataclass
class KvBlock:
    """One block's state (a snapshot: see `BlockPool.blocks`)."""

    block_id: int
    ref_count: int = 0
    seq_hash: int | None = None
    local_hash: int | None = None
    parent_hash: int | None = None  # seq_hash of the block before it (only while cached)
    num_hits: int = 0  # prefix-cache hits since it was cached (tier offload policy reads it)


class BlockPool(Protocol):
    """Fixed set of `num_blocks` blocks of `block_size` tokens (see the module's comment).
    Pure: no I/O, no locks; one owner (the scheduler) calls it from one thread."""

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool
    event_log: KvEventLog

    @property
    def blocks(self) -> list[KvBlock]:
        """Every block's state, by block id (a snapshot)."""
        ...

    def get_num_unreferenced(self, block_ids: Sequence[int]) -> int:
        """How many of `block_ids` no request holds (free, though maybe cached)."""
        ...

    def get_num_free_blocks(self) -> int:
        """Blocks that `allocate` can hand out (free, including cached-but-unused ones)."""
        ...

    def get_num_active_blocks(self) -> int: ...

    def get_free_block_ids(self) -> list[int]:
        """Free queue in eviction order (head first)."""
        ...

    def get_cached_block(self, seq_hash: int) -> int | None: ...

    def get_cached_hashes(self) -> list[int]:
        """Sequence hashes of every cached block (in use or evictable): what a KV dump holds."""
        ...

    def get_last_event_id(self) -> int:
        """Id of the newest event emitted so far (-1 before the first)."""
        ...

    def get_num_cached_blocks(self) -> int: ...

    def find_prefix(self, seq_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of `seq_hashes` (takes no reference)."""
        ...

    def touch(self, block_ids: Sequence[int], *, is_hit: bool = False) -> None:
        """Take one more reference on each block; a free one leaves the queue. `is_hit`: the
        blocks are a request's prefix-cache hit (counted in each block's `num_hits`)."""
        ...

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks from the queue head, each with one reference. Evicted
        cached blocks are first reported to the eviction observer (one call, pool untouched),
        then lose their hash (one Removed event). All or nothing, also when the observer
        raises."""
        ...

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block, in the given order; a block that reaches zero
        joins the queue tail (so pass a request's blocks tail-first)."""
        ...

    def cache_blocks(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[tuple[int, int]],
        parent_hash: int | None,
    ) -> None:
        """Register full blocks under their (seq_hash, local_hash); emits one Stored event per
        run of newly cached ones. A hash already cached under another block is left alone (the
        duplicate block stays uncached and is freed like any other)."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (Cleared event). Refused (False) while blocks are in use."""
        ...

    def take_events(self) -> list[KvEvent]:
        """Drain the events emitted since the last call (by this pool and whatever shares
        its event log), oldest first."""
        ...

    def check_integrity(self) -> None:
        """Assert the pool's invariants (tests and debug builds)."""
        ...


def has_native_pool() -> bool:
    """Whether armature.kv._pool was built (and so is the default)."""
    return _pool is not None


def make_block_pool(
    num_blocks: int,
    block_size: int,
    enable_prefix_caching: bool = True,
    *,
    eviction_observer: EvictionObserver | None = None,
    event_log: KvEventLog | None = None,
    backend: Backend | None = None,
) -> BlockPool:
    """A block pool of `backend` (None: $ARMATURE_POOL_BACKEND, else native when built)."""
    chosen = resolve_backend(backend, _pool is not None, POOL_BACKEND_ENV_VAR)
    maker = NativeBlockPool if chosen is Backend.NATIVE else PyBlockPool
    return maker(
        num_blocks,
        block_size,
        enable_prefix_caching,
        eviction_observer=eviction_observer,
        event_log=event_log,
    )


def _check_sizes(num_blocks: int, block_size: int) -> None:
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError("num_blocks and block_size must be positive")


def _check_allocation(num_blocks: int, num_free: int) -> None:
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be non-negative, got {num_blocks}")
    if num_blocks > num_free:
        raise NoFreeBlocksError(f"asked for {num_blocks} blocks, {num_free} free")


class _PoolShell:
    """What both pools share: the sizes, the eviction observer and the event log (shared with
    the lower KV tiers so that one worker's event ids stay one sequence; a private one if
    None)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        *,
        eviction_observer: EvictionObserver | None = None,
        event_log: KvEventLog | None = None,
    ):
        _check_sizes(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._eviction_observer = eviction_observer
        self.event_log = event_log if event_log is not None else KvEventLog()
        self._make_state()

    def _make_state(self) -> None:
        """The implementation's per-block state, empty (called once, by __init__)."""
        raise NotImplementedError

    def get_last_event_id(self) -> int:
        """Id of the newest event emitted so far (-1 before the first)."""
        return self.event_log.get_last_event_id()

    def take_events(self) -> list[KvEvent]:
        """Drain the events emitted since the last call (by this pool and whatever shares
        its event log), oldest first."""
        return self.event_log.take()


class NativeBlockPool(_PoolShell):
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
        self.get_num_unreferenced = core.get_num_unreferenced
        self.get_num_free_blocks = core.get_num_free_blocks
        self.get_num_active_blocks = core.get_num_active_blocks
        self.get_num_cached_blocks = core.get_num_cached_blocks
        self.get_free_block_ids = core.get_free_block_ids
        self.get_cached_block = core.get_cached_block
        self.get_cached_hashes = core.get_cached_hashes
        self.free = core.free

    @property
    def blocks(self) -> list[KvBlock]:
        return list(
            starmap(KvBlock, ((i, *state) for i, state in enumerate(self._core.snapshot())))
        )

    def touch(self, block_ids: Sequence[int], *, is_hit: bool = False) -> None:
        self._core.touch(block_ids, is_hit)

    def allocate(self, num_blocks: int) -> list[int]:
        _check_allocation(num_blocks, self._core.get_num_free_blocks())
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
        for run_parent, start, stop in self._core.cache_blocks(block_ids, hashes, parent_hash):
            blocks = list(starmap(StoredBlock, hashes[start:stop]))
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


class PyBlockPool(_PoolShell):
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

    def find_prefix(self, seq_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of `seq_hashes` (takes no reference)."""
        if not self.enable_prefix_caching:
            return []
        found = list(map(self._cached.get, seq_hashes))  # at C speed; past a miss is cheap
        if None in found:
            del found[found.index(None) :]
        return cast("list[int]", found)  # the misses are cut

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
        _check_allocation(num_blocks, self.get_num_free_blocks())
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
