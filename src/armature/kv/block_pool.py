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
stay in Python). `make_block_pool` picks one: its `backend` argument, else ARMATURE_POOL_BACKEND
(`native` or `python`), else native when the extension was built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from armature.backends import Backend, resolve_backend
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictionObserver
from armature.kv.native_block_pool import POOL_BACKEND_ENV_VAR, NativeBlockPool, has_native_pool
from armature.kv.pool_shell import KvBlock, NoFreeBlocksError
from armature.kv.py_block_pool import PyBlockPool
from armature.protocols.kv_events import KvEvent

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

    def count_allocations_before_eviction(self, limit: int) -> int:
        """How many blocks `allocate` hands out, up to `limit`, before it would evict a cached
        one (the never-taken blocks, then the free queue's head that holds no hash)."""
        ...

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

    def get_num_removals(self) -> int:
        """How many hashes have left the prefix cache so far (evictions; a reset counts
        one). While it stays the same, every prefix found before is still cached, block for
        block, and can only have grown."""
        ...

    def find_prefix(self, seq_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached prefix of `seq_hashes` (takes no reference)."""
        ...

    def find_prefix_of_pairs(
        self, block_hashes: Sequence[tuple[int, int]], max_blocks: int, start: int = 0, /
    ) -> list[int]:
        """`find_prefix` of the seq hashes of the first `max_blocks` (seq, local) pairs of
        `block_hashes`, read from the pairs as far as the first miss (a request's hashes: no
        list of its seq hashes is made); from pair `start` on (the pairs before it known
        cached)."""
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
    chosen = resolve_backend(backend, has_native_pool(), POOL_BACKEND_ENV_VAR)
    maker = NativeBlockPool if chosen is Backend.NATIVE else PyBlockPool
    return maker(
        num_blocks,
        block_size,
        enable_prefix_caching,
        eviction_observer=eviction_observer,
        event_log=event_log,
    )
