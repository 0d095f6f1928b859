"""BlockPool exact-state tests: block ids, LRU order, ref counts, prefix cache, KV events.

Every test runs on both pools (`PyBlockPool` and, where it was built, `NativeBlockPool`: the
autouse `backend` fixture sets ARMATURE_POOL_BACKEND). Every pool here is a `CheckedPool`,
which runs `check_integrity()` after every mutation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from armature.backends import Backend
from armature.kv.block_pool import (
    POOL_BACKEND_ENV_VAR,
    BlockPool,
    NativeBlockPool,
    NoFreeBlocksError,
    PyBlockPool,
    has_native_pool,
    make_block_pool,
)
from armature.kv.eviction import EvictedBlock, EvictionObserver
from armature.kv.hashing import compute_block_hashes
from armature.protocols.kv_events import KvCleared, KvRemoved, KvStored, StoredBlock

NOT_BUILT = "armature.kv._pool was not built (no C compiler at install)"
BACKENDS = [
    Backend.PYTHON,
    pytest.param(Backend.NATIVE, marks=pytest.mark.skipif(not has_native_pool(), reason=NOT_BUILT)),
]


@pytest.fixture(autouse=True, params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv(POOL_BACKEND_ENV_VAR, request.param.value)
    yield request.param.value


_MUTATIONS = {"allocate", "free", "touch", "cache_blocks", "reset_prefix_cache", "take_events"}


class CheckedPool:
    """A pool whose every mutation is followed by `check_integrity()`, also when it raises."""

    def __init__(self, pool: BlockPool):
        self.pool = pool

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.pool, name)
        if name not in _MUTATIONS:
            return attr

        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                self.pool.check_integrity()

        return checked


def make_pool(
    num_blocks: int = 8,
    enable_prefix_caching: bool = True,
    eviction_observer: EvictionObserver | None = None,
) -> CheckedPool:
    pool = CheckedPool(
        make_block_pool(
            num_blocks,
            block_size=4,
            enable_prefix_caching=enable_prefix_caching,
            eviction_observer=eviction_observer,
        )
    )
    pool.check_integrity()
    return pool


class RecordingObserver:
    """Keeps every `on_evict` call's blocks, one list per call."""

    def __init__(self) -> None:
        self.calls: list[list[EvictedBlock]] = []

    def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
        self.calls.append(list(blocks))


def evicted(block_id: int, seq_hash: int, parent_hash: int | None) -> EvictedBlock:
    """An EvictedBlock with the `hashes` convention local = seq + 1000."""
    return EvictedBlock(block_id, seq_hash, seq_hash + 1000, parent_hash)


def hashes(*seq_hashes: int) -> list[tuple[int, int]]:
    """(seq_hash, local_hash) pairs with local = seq + 1000, easy to read in assertions."""
    return [(h, h + 1000) for h in seq_hashes]


def stored(*seq_hashes: int) -> list[StoredBlock]:
    return [StoredBlock(h, h + 1000) for h in seq_hashes]


def ref_counts(pool: BlockPool) -> list[int]:
    return [b.ref_count for b in pool.blocks]


def snapshot(pool: BlockPool) -> tuple[Any, ...]:
    return (
        pool.get_free_block_ids(),
        ref_counts(pool),
        [(b.seq_hash, b.local_hash) for b in pool.blocks],
        pool.get_num_cached_blocks(),
    )


def cache_three(pool: BlockPool) -> list[int]:
    """Allocate blocks 0,1,2, cache them under 10,11,12 and drain the Stored event."""
    ids = pool.allocate(3)
    pool.cache_blocks(ids, hashes(10, 11, 12), parent_hash=None)
    assert pool.take_events() == [KvStored(0, None, stored(10, 11, 12))]
    return ids


# ---- construction and reads ----------------------------------------------------------------


def test_fresh_pool() -> None:
    pool = make_pool(5)
    assert pool.get_free_block_ids() == [0, 1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 5
    assert pool.get_num_active_blocks() == 0
    assert pool.get_num_cached_blocks() == 0
    assert ref_counts(pool) == [0] * 5
    assert pool.take_events() == []


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0), (-1, 4), (4, -1)])
def test_constructor_rejects_non_positive_sizes(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError):
        make_block_pool(num_blocks, block_size)


# ---- allocate / free: ids, LRU order, ref counts -------------------------------------------


def test_allocate_takes_from_head() -> None:
    pool = make_pool(6)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    assert pool.get_free_block_ids() == [5]
    assert ref_counts(pool) == [1, 1, 1, 1, 1, 0]
    assert pool.get_num_free_blocks() == 1
    assert pool.get_num_active_blocks() == 5
    assert pool.allocate(0) == []
    assert pool.get_free_block_ids() == [5]
    assert pool.take_events() == []


def test_allocate_rejects_negative_count() -> None:
    pool = make_pool(4)
    with pytest.raises(ValueError):
        pool.allocate(-1)
    assert pool.get_free_block_ids() == [0, 1, 2, 3]


def test_free_appends_at_tail_in_given_order() -> None:
    pool = make_pool(6)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.free([2, 0, 3])
    assert pool.get_free_block_ids() == [4, 5, 2, 0, 3]
    assert ref_counts(pool) == [0, 1, 0, 0, 0, 0]
    # LRU: the oldest free blocks go first, then the freed ones in the order they were freed.
    assert pool.allocate(3) == [4, 5, 2]
    assert pool.get_free_block_ids() == [0, 3]
    pool.free([1])
    assert pool.get_free_block_ids() == [0, 3, 1]
    assert pool.allocate(3) == [0, 3, 1]
    assert pool.get_free_block_ids() == []


def test_an_allocation_across_never_taken_and_freed_blocks() -> None:
    """The never-taken blocks are the queue's head in id order, then the freed ones."""
    pool = make_pool(6)
    assert pool.allocate(2) == [0, 1]
    pool.free([1, 0])
    assert pool.get_free_block_ids() == [2, 3, 4, 5, 1, 0]
    assert pool.allocate(5) == [2, 3, 4, 5, 1]
    assert pool.get_free_block_ids() == [0]
    assert (pool.get_num_free_blocks(), pool.get_num_active_blocks()) == (1, 5)
    pool.check_integrity()


def test_touch_of_a_never_taken_block_takes_it_out_of_the_queue() -> None:
    pool = make_pool(5)
    assert pool.allocate(1) == [0]
    pool.free([0])
    pool.touch([3])
    assert pool.get_free_block_ids() == [1, 2, 4, 0]
    assert ref_counts(pool) == [0, 0, 0, 1, 0]
    assert (pool.get_num_free_blocks(), pool.get_num_active_blocks()) == (4, 1)
    pool.check_integrity()
    assert pool.allocate(4) == [1, 2, 4, 0]
    pool.free([3])
    assert pool.get_free_block_ids() == [3]


def test_tail_first_free_evicts_prefix_last() -> None:
    pool = make_pool(4)
    ids = pool.allocate(4)
    pool.cache_blocks(ids, hashes(1, 2, 3, 4), parent_hash=None)
    pool.take_events()
    pool.free(list(reversed(ids)))
    assert pool.get_free_block_ids() == [3, 2, 1, 0]
    assert pool.allocate(1) == [3]
    assert pool.take_events() == [KvRemoved(1, [4])]
    assert pool.find_prefix([1, 2, 3, 4]) == [0, 1, 2]


def test_ref_counts_with_shared_blocks() -> None:
    pool = make_pool(4)
    assert pool.allocate(2) == [0, 1]
    pool.touch([0, 0, 1])
    assert ref_counts(pool) == [3, 2, 0, 0]
    pool.free([0, 1])
    assert ref_counts(pool) == [2, 1, 0, 0]
    assert pool.get_free_block_ids() == [2, 3]
    pool.free([1, 0])
    assert pool.get_free_block_ids() == [2, 3, 1]
    assert pool.get_num_active_blocks() == 1
    pool.free([0])
    assert pool.get_free_block_ids() == [2, 3, 1, 0]
    assert ref_counts(pool) == [0, 0, 0, 0]


def test_double_free_asserts() -> None:
    pool = make_pool(4)
    ids = pool.allocate(2)
    pool.free(ids)
    with pytest.raises(AssertionError, match="double free of block 0"):
        pool.free([0])
    assert pool.get_free_block_ids() == [2, 3, 0, 1]


def test_free_of_never_allocated_block_asserts() -> None:
    pool = make_pool(4)
    with pytest.raises(AssertionError, match="double free of block 2"):
        pool.free([2])
    assert pool.get_free_block_ids() == [0, 1, 2, 3]


def test_no_free_blocks_is_all_or_nothing() -> None:
    pool = make_pool(4)
    ids = cache_three(pool)
    pool.free([ids[2]])
    before = snapshot(pool)
    assert before[0] == [3, 2]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(3)
    assert snapshot(pool) == before
    assert pool.take_events() == []  # no Removed: nothing was evicted
    assert pool.find_prefix([10, 11, 12]) == [0, 1, 2]
    assert pool.allocate(2) == [3, 2]
    assert pool.take_events() == [KvRemoved(1, [12])]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    assert pool.get_free_block_ids() == []


# ---- prefix cache: cache_blocks, find_prefix, touch ----------------------------------------


def test_cache_blocks_emits_stored_and_registers_hashes() -> None:
    pool = make_pool(4)
    ids = pool.allocate(3)
    pool.cache_blocks(ids, hashes(10, 11, 12), parent_hash=None)
    assert pool.take_events() == [KvStored(0, None, stored(10, 11, 12))]
    assert [pool.get_cached_block(h) for h in (10, 11, 12, 13)] == [0, 1, 2, None]
    assert [(b.seq_hash, b.local_hash) for b in pool.blocks] == [
        (10, 1010),
        (11, 1011),
        (12, 1012),
        (None, None),
    ]
    assert pool.get_num_cached_blocks() == 3
    assert pool.get_free_block_ids() == [3]  # caching takes no block and no reference
    assert ref_counts(pool) == [1, 1, 1, 0]


def test_cache_blocks_incrementally_uses_parent_hash() -> None:
    pool = make_pool(4)
    first = pool.allocate(1)
    pool.cache_blocks(first, hashes(10), parent_hash=None)
    # Re-caching an already cached block with its own hash is a no-op: no event.
    more = pool.allocate(2)
    pool.cache_blocks(first + more, hashes(10, 11, 12), parent_hash=None)
    assert pool.allocate(1) == [3]
    pool.cache_blocks([3], hashes(13), parent_hash=12)  # caller passes the parent explicitly
    assert pool.take_events() == [
        KvStored(0, None, stored(10)),
        KvStored(1, 10, stored(11, 12)),
        KvStored(2, 12, stored(13)),
    ]
    assert pool.find_prefix([10, 11, 12, 13]) == [0, 1, 2, 3]


def test_cache_blocks_with_real_hashes() -> None:
    pool = make_pool(4)
    tokens = list(range(100, 110))  # block_size 4: two full blocks and a partial one
    pairs = compute_block_hashes(tokens, pool.block_size)
    ids = pool.allocate(3)
    pool.cache_blocks(ids[:2], pairs, parent_hash=None)
    assert pool.take_events() == [
        KvStored(0, None, [StoredBlock(sh, lh) for sh, lh in pairs]),
    ]
    assert pool.find_prefix([sh for sh, _ in pairs]) == [0, 1]


def test_duplicate_hash_in_the_middle_splits_the_stored_run() -> None:
    pool = make_pool(8)
    assert pool.allocate(1) == [0]
    pool.cache_blocks([0], hashes(21), parent_hash=20)
    assert pool.take_events() == [KvStored(0, 20, stored(21))]
    # Second request computes the same block 21 into its own block 2: it stays uncached.
    ids = pool.allocate(3)
    assert ids == [1, 2, 3]
    pool.cache_blocks(ids, hashes(20, 21, 22), parent_hash=None)
    assert pool.take_events() == [
        KvStored(1, None, stored(20)),
        KvStored(2, 21, stored(22)),
    ]
    assert [pool.get_cached_block(h) for h in (20, 21, 22)] == [1, 0, 3]
    assert pool.blocks[2].seq_hash is None
    assert pool.blocks[2].local_hash is None
    # The uncached duplicate is freed like any other block; it takes no Removed on eviction.
    pool.free([3, 2, 1])
    assert pool.get_free_block_ids() == [4, 5, 6, 7, 3, 2, 1]
    assert pool.allocate(6) == [4, 5, 6, 7, 3, 2]
    assert pool.take_events() == [KvRemoved(3, [22])]
    assert pool.find_prefix([20, 21, 22]) == [1, 0]


def test_duplicate_hash_at_the_ends() -> None:
    pool = make_pool(8)
    pool.cache_blocks(pool.allocate(2), hashes(1, 4), parent_hash=None)
    pool.take_events()
    # Duplicate first: one event whose parent is the duplicate's hash.
    pool.cache_blocks(pool.allocate(3), hashes(1, 2, 3), parent_hash=None)
    # Duplicate last: one event, parent as given.
    pool.cache_blocks(pool.allocate(2), hashes(5, 4), parent_hash=3)
    assert pool.take_events() == [
        KvStored(1, 1, stored(2, 3)),
        KvStored(2, 3, stored(5)),
    ]
    assert pool.blocks[2].seq_hash is None
    assert pool.blocks[6].seq_hash is None


def test_all_duplicates_emit_nothing_and_take_no_event_id() -> None:
    pool = make_pool(4)
    cache_three(pool)
    pool.cache_blocks(pool.allocate(1), hashes(11), parent_hash=10)
    assert pool.take_events() == []
    pool.cache_blocks([], [], parent_hash=None)  # empty call
    assert pool.take_events() == []
    pool.free([0, 1, 2, 3])
    assert pool.allocate(1) == [0]
    assert pool.take_events() == [KvRemoved(1, [10])]


def test_duplicate_of_a_free_cached_block_stays_uncached() -> None:
    pool = make_pool(4)
    ids = cache_three(pool)
    pool.free(ids)
    assert pool.allocate(1) == [3]
    pool.cache_blocks([3], hashes(10), parent_hash=None)
    assert pool.take_events() == []
    assert pool.get_cached_block(10) == 0
    assert pool.blocks[3].seq_hash is None


def test_recaching_a_block_under_another_hash_asserts() -> None:
    pool = make_pool(4)
    cache_three(pool)
    with pytest.raises(AssertionError, match="another hash"):
        pool.cache_blocks([0], hashes(99), parent_hash=None)
    assert pool.get_cached_block(10) == 0
    assert pool.get_cached_block(99) is None


def test_caching_a_free_block_asserts() -> None:
    pool = make_pool(4)
    with pytest.raises(AssertionError, match="only blocks in use"):
        pool.cache_blocks([0], hashes(1), parent_hash=None)
    assert pool.get_num_cached_blocks() == 0
    assert pool.take_events() == []


def test_find_prefix_stops_at_first_miss() -> None:
    pool = make_pool(4)
    cache_three(pool)
    assert pool.find_prefix([]) == []
    assert pool.find_prefix([10, 11, 12]) == [0, 1, 2]
    assert pool.find_prefix([10, 11, 12, 13]) == [0, 1, 2]
    assert pool.find_prefix([10, 99, 12]) == [0]
    assert pool.find_prefix([11, 12]) == [1, 2]  # the map is flat: no chain check here
    assert pool.find_prefix([99, 10]) == []
    assert ref_counts(pool) == [1, 1, 1, 0]  # find_prefix takes no reference


def test_find_prefix_of_pairs_reads_the_first_max_blocks_pairs() -> None:
    pool = make_pool(4)
    cache_three(pool)
    pairs = [(10, 0), (11, 0), (12, 0), (13, 0)]
    assert pool.find_prefix_of_pairs(pairs, 4) == [0, 1, 2]
    assert pool.find_prefix_of_pairs(pairs, 2) == [0, 1]
    assert pool.find_prefix_of_pairs(pairs, 0) == []
    assert pool.find_prefix_of_pairs(pairs, -1) == []
    assert pool.find_prefix_of_pairs([(10, 7), (99, 0), (12, 0)], 3) == [0]
    assert pool.find_prefix_of_pairs([], 5) == []
    assert ref_counts(pool) == [1, 1, 1, 0]  # no reference taken
    assert pool.find_prefix_of_pairs([[10, 0], [11, 0]], 2) == [0, 1]  # any pair shape
    with pytest.raises((TypeError, ValueError)):
        pool.find_prefix_of_pairs([10, 11], 2)  # seq hashes, not pairs


def test_find_prefix_of_pairs_from_a_start() -> None:
    pool = make_pool(4)
    cache_three(pool)
    pairs = [(10, 0), (11, 0), (12, 0), (13, 0)]
    assert pool.find_prefix_of_pairs(pairs, 4, 0) == [0, 1, 2]
    assert pool.find_prefix_of_pairs(pairs, 4, 1) == [1, 2]
    assert pool.find_prefix_of_pairs(pairs, 2, 1) == [1]
    assert pool.find_prefix_of_pairs(pairs, 4, 3) == []  # 13 is not cached
    assert pool.find_prefix_of_pairs(pairs, 2, 2) == []
    assert pool.find_prefix_of_pairs(pairs, 2, 5) == []  # past max_blocks: nothing
    assert pool.find_prefix_of_pairs(pairs, 9, 9) == []  # past the pairs: nothing
    assert pool.find_prefix_of_pairs(pairs, 4, -3) == [0, 1, 2]  # below 0: from the first
    assert pool.find_prefix_of_pairs([(99, 0), (11, 0)], 2, 1) == [1]  # not read before it


def test_touch_takes_free_cached_block_out_of_the_queue() -> None:
    pool = make_pool(6)
    ids = cache_three(pool)
    pool.free(list(reversed(ids)))
    assert pool.get_free_block_ids() == [3, 4, 5, 2, 1, 0]
    hit = pool.find_prefix([10, 11, 99])
    assert hit == [0, 1]
    pool.touch(hit)
    assert pool.get_free_block_ids() == [3, 4, 5, 2]
    assert ref_counts(pool) == [1, 1, 0, 0, 0, 0]
    assert pool.get_num_active_blocks() == 2
    # The new request's own blocks do not evict the hit blocks.
    assert pool.allocate(3) == [3, 4, 5]
    assert pool.take_events() == []
    assert pool.find_prefix([10, 11, 12]) == [0, 1, 2]
    # Touching an in-use block only adds a reference.
    pool.touch([0])
    assert ref_counts(pool) == [2, 1, 0, 1, 1, 1]
    assert pool.get_free_block_ids() == [2]
    # Freed again, the hit blocks rejoin at the tail.
    pool.free([1, 0, 0])
    assert pool.get_free_block_ids() == [2, 1, 0]


def test_eviction_emits_one_removed_per_allocate() -> None:
    pool = make_pool(6)
    ids = pool.allocate(4)
    pool.cache_blocks(ids[:3], hashes(10, 11, 12), parent_hash=None)
    assert pool.take_events() == [KvStored(0, None, stored(10, 11, 12))]
    pool.free([0, 3, 2, 1])
    assert pool.get_free_block_ids() == [4, 5, 0, 3, 2, 1]
    # Uncached free blocks first: nothing evicted, no event.
    assert pool.allocate(2) == [4, 5]
    assert pool.take_events() == []
    # One allocate evicting two cached blocks (and an uncached one in between): one event,
    # hashes in eviction order.
    assert pool.allocate(3) == [0, 3, 2]
    assert pool.take_events() == [KvRemoved(1, [10, 12])]
    assert [pool.get_cached_block(h) for h in (10, 11, 12)] == [None, 1, None]
    assert [(b.seq_hash, b.local_hash) for b in pool.blocks[:3]] == [
        (None, None),
        (11, 1011),
        (None, None),
    ]
    assert pool.get_num_cached_blocks() == 1
    assert pool.allocate(1) == [1]
    assert pool.take_events() == [KvRemoved(2, [11])]
    assert pool.get_num_cached_blocks() == 0


def test_removals_count_the_hashes_that_leave_the_cache() -> None:
    pool = make_pool(6)
    assert pool.get_num_removals() == 0
    ids = pool.allocate(4)
    pool.cache_blocks(ids[:3], hashes(10, 11, 12), parent_hash=None)
    pool.free([0, 3, 2, 1])
    pool.touch([1], is_hit=True)  # held until the end
    assert pool.find_prefix([10, 11, 12]) == [0, 1, 2]
    assert pool.get_num_removals() == 0  # caching, freeing, touching, finding: none left
    assert pool.allocate(2) == [4, 5]  # never cached: nothing evicted
    assert pool.get_num_removals() == 0
    assert pool.allocate(3) == [0, 3, 2]  # evicts 10 and 12 (3 held no hash)
    assert pool.get_num_removals() == 2
    pool.free([5, 4, 2, 3, 0])
    assert pool.reset_prefix_cache() is False  # block 1 is still in use: nothing removed
    assert pool.get_num_removals() == 2
    pool.free([1])
    assert pool.reset_prefix_cache() is True  # the one hash left, 11: a reset counts one
    assert pool.get_num_removals() == 3


def test_allocations_before_the_first_eviction() -> None:
    pool = make_pool(6)
    assert [pool.count_allocations_before_eviction(n) for n in (0, 4, 6, 9)] == [0, 4, 6, 6]
    ids = pool.allocate(4)
    pool.cache_blocks(ids[1:3], hashes(11, 12), parent_hash=None)
    pool.free([0, 1, 3, 2])
    assert pool.get_free_block_ids() == [4, 5, 0, 1, 3, 2]
    # the never-taken 4, 5 and uncached 0, then cached 1 would be evicted
    assert [pool.count_allocations_before_eviction(n) for n in (2, 3, 4, 6)] == [2, 3, 3, 3]
    assert pool.count_allocations_before_eviction(-1) == 0
    assert pool.allocate(3) == [4, 5, 0]
    assert pool.take_events()[-1:] == [KvStored(0, None, stored(11, 12))]
    assert pool.count_allocations_before_eviction(3) == 0
    assert pool.allocate(1) == [1]
    assert pool.take_events() == [KvRemoved(1, [11])]
    # uncached 3 is next, then cached 2
    assert pool.count_allocations_before_eviction(2) == 1
    assert pool.allocate(2) == [3, 2]
    assert pool.take_events() == [KvRemoved(2, [12])]
    assert pool.count_allocations_before_eviction(5) == 0


def test_evicted_block_can_be_cached_again_under_a_new_hash() -> None:
    pool = make_pool(1)
    pool.cache_blocks(pool.allocate(1), hashes(1), parent_hash=None)
    pool.free([0])
    pool.cache_blocks(pool.allocate(1), hashes(2), parent_hash=None)
    assert pool.take_events() == [
        KvStored(0, None, stored(1)),
        KvRemoved(1, [1]),
        KvStored(2, None, stored(2)),
    ]
    assert pool.get_cached_block(1) is None
    assert pool.get_cached_block(2) == 0


# ---- events and reset ----------------------------------------------------------------------


def test_event_ids_increase_by_exactly_one() -> None:
    pool = make_pool(2)
    pool.cache_blocks(pool.allocate(2), hashes(1, 2), parent_hash=None)
    pool.free([1, 0])
    first = pool.take_events()
    assert pool.take_events() == []  # drained
    pool.cache_blocks(pool.allocate(1), hashes(3), parent_hash=None)
    pool.free([1])
    assert pool.reset_prefix_cache()
    pool.cache_blocks(pool.allocate(2), hashes(4, 5), parent_hash=7)
    pool.free([0, 1])
    pool.allocate(1)
    second = pool.take_events()
    assert first + second == [
        KvStored(0, None, stored(1, 2)),
        KvRemoved(1, [2]),
        KvStored(2, None, stored(3)),
        KvCleared(3),
        KvStored(4, 7, stored(4, 5)),
        KvRemoved(5, [4]),
    ]
    assert [e.event_id for e in first + second] == list(range(6))


def test_reset_prefix_cache_refused_while_blocks_are_active() -> None:
    pool = make_pool(4)
    ids = cache_three(pool)
    pool.free(ids[1:])
    before = snapshot(pool)
    assert pool.reset_prefix_cache() is False
    assert snapshot(pool) == before
    assert pool.take_events() == []
    assert pool.find_prefix([10, 11, 12]) == [0, 1, 2]
    pool.free(ids[:1])
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [KvCleared(1)]


def test_reset_prefix_cache_forgets_every_hash() -> None:
    pool = make_pool(4)
    ids = cache_three(pool)
    pool.free([2, 0, 1])
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [KvCleared(1)]
    assert pool.get_num_cached_blocks() == 0
    assert pool.find_prefix([10]) == []
    assert [pool.get_cached_block(h) for h in (10, 11, 12)] == [None, None, None]
    assert all(b.seq_hash is None and b.local_hash is None for b in pool.blocks)
    assert pool.get_free_block_ids() == [3, 2, 0, 1]  # queue order is kept
    # Evicting formerly cached blocks now emits no Removed.
    assert pool.allocate(4) == [3, 2, 0, 1]
    assert pool.take_events() == []
    # The same hashes can be cached again, with fresh event ids.
    pool.cache_blocks(ids, hashes(10, 11, 12), parent_hash=None)
    assert pool.take_events() == [KvStored(2, None, stored(10, 11, 12))]


def test_reset_prefix_cache_on_empty_pool() -> None:
    pool = make_pool(2)
    assert pool.reset_prefix_cache() is True
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [KvCleared(0), KvCleared(1)]


# ---- prefix caching disabled ---------------------------------------------------------------


def test_prefix_caching_disabled() -> None:
    pool = make_pool(4, enable_prefix_caching=False)
    ids = pool.allocate(3)
    assert ids == [0, 1, 2]
    pool.cache_blocks(ids, hashes(10, 11, 12), parent_hash=None)
    assert pool.get_num_cached_blocks() == 0
    assert [pool.get_cached_block(h) for h in (10, 11, 12)] == [None, None, None]
    assert all(b.seq_hash is None for b in pool.blocks)
    assert pool.find_prefix([10, 11, 12]) == []
    pool.free([2, 1, 0])
    assert pool.get_free_block_ids() == [3, 2, 1, 0]
    assert pool.allocate(4) == [3, 2, 1, 0]
    assert ref_counts(pool) == [1, 1, 1, 1]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.free([0, 1, 2, 3])
    assert pool.take_events() == []


# ---- eviction observer ---------------------------------------------------------------------


def test_observer_is_told_each_evicted_block_in_lru_order() -> None:
    observer = RecordingObserver()
    pool = make_pool(6, eviction_observer=observer)
    ids = pool.allocate(4)
    pool.cache_blocks(ids[:3], hashes(10, 11, 12), parent_hash=None)
    pool.cache_blocks([ids[3]], hashes(13), parent_hash=12)
    pool.free([3, 0, 2, 1])
    assert pool.get_free_block_ids() == [4, 5, 3, 0, 2, 1]
    # Uncached free blocks first: no call at all.
    assert pool.allocate(2) == [4, 5]
    assert observer.calls == []
    # One allocate evicting three cached blocks: one call, in eviction order, with parents.
    assert pool.allocate(3) == [3, 0, 2]
    assert observer.calls == [[evicted(3, 13, 12), evicted(0, 10, None), evicted(2, 12, 11)]]
    assert pool.allocate(1) == [1]
    assert observer.calls[1:] == [[evicted(1, 11, 10)]]
    assert pool.take_events() == [
        KvStored(0, None, stored(10, 11, 12)),
        KvStored(1, 12, stored(13)),
        KvRemoved(2, [13, 10, 12]),
        KvRemoved(3, [11]),
    ]


def test_observer_sees_the_pool_before_the_eviction() -> None:
    seen: list[tuple[list[int | None], int, list[int]]] = []
    pool: BlockPool | None = None

    class PeekingObserver:
        def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
            assert pool is not None
            seen.append(
                (
                    [pool.get_cached_block(b.seq_hash) for b in blocks],
                    pool.get_last_event_id(),
                    pool.get_free_block_ids(),
                )
            )

    pool = make_pool(2, eviction_observer=PeekingObserver())
    pool.cache_blocks(pool.allocate(2), hashes(10, 11), parent_hash=None)
    pool.free([1, 0])
    assert pool.allocate(2) == [1, 0]
    # Still cached, still free, the Removed (event 1) not yet emitted.
    assert seen == [([1, 0], 0, [1, 0])]
    assert pool.take_events() == [KvStored(0, None, stored(10, 11)), KvRemoved(1, [11, 10])]
    assert pool.get_num_cached_blocks() == 0


def test_observer_that_raises_leaves_the_pool_unchanged() -> None:
    class FailingObserver:
        def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
            raise OSError("host tier full")

    pool = make_pool(3, eviction_observer=FailingObserver())
    ids = pool.allocate(2)
    pool.cache_blocks(ids, hashes(10, 11), parent_hash=None)
    pool.take_events()
    pool.free([1, 0])
    before = snapshot(pool)
    assert before[0] == [2, 1, 0]
    assert pool.allocate(1) == [2]  # uncached: the observer is not called
    pool.free([2])
    before = snapshot(pool)
    with pytest.raises(OSError, match="host tier full"):
        pool.allocate(2)
    assert snapshot(pool) == before
    assert pool.take_events() == []
    assert pool.find_prefix([10, 11]) == [0, 1]


def test_observer_is_not_told_about_blocks_never_cached() -> None:
    observer = RecordingObserver()
    pool = make_pool(4, eviction_observer=observer)
    pool.free(pool.allocate(4))
    assert pool.allocate(4) == [0, 1, 2, 3]
    # An uncached duplicate (block 1 computes hash 10 again) is not reported either.
    pool.cache_blocks([0], hashes(10), parent_hash=None)
    pool.cache_blocks([1], hashes(10), parent_hash=None)
    assert pool.blocks[1].seq_hash is None
    pool.free([3, 2, 1, 0])
    assert pool.get_free_block_ids() == [3, 2, 1, 0]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(5)
    assert pool.allocate(3) == [3, 2, 1]
    assert observer.calls == []
    assert pool.allocate(1) == [0]
    assert observer.calls == [[evicted(0, 10, None)]]


def test_prefix_hit_on_a_free_cached_block_is_not_an_eviction() -> None:
    observer = RecordingObserver()
    pool = make_pool(5, eviction_observer=observer)
    ids = pool.allocate(3)
    pool.cache_blocks(ids, hashes(10, 11, 12), parent_hash=None)
    pool.free(list(reversed(ids)))
    assert pool.get_free_block_ids() == [3, 4, 2, 1, 0]
    hit = pool.find_prefix([10, 11, 99])
    assert hit == [0, 1]
    pool.touch(hit)
    assert observer.calls == []
    # The rest of the queue goes; the revived blocks stay cached and unreported.
    assert pool.allocate(3) == [3, 4, 2]
    assert observer.calls == [[evicted(2, 12, 11)]]
    pool.free([1, 0])
    assert pool.allocate(2) == [1, 0]
    assert observer.calls[1:] == [[evicted(1, 11, 10), evicted(0, 10, None)]]


def test_observer_records_the_parent_the_stored_event_carried() -> None:
    observer = RecordingObserver()
    pool = make_pool(8, eviction_observer=observer)
    assert pool.allocate(1) == [0]
    pool.cache_blocks([0], hashes(21), parent_hash=20)
    # 21 again, in block 2: a duplicate; 22 after it still has parent 21.
    ids = pool.allocate(3)
    pool.cache_blocks(ids, hashes(20, 21, 22), parent_hash=None)
    assert pool.take_events() == [
        KvStored(0, 20, stored(21)),
        KvStored(1, None, stored(20)),
        KvStored(2, 21, stored(22)),
    ]
    pool.free([0, 3, 2, 1])
    assert pool.allocate(8) == [4, 5, 6, 7, 0, 3, 2, 1]
    assert observer.calls == [[evicted(0, 21, 20), evicted(3, 22, 21), evicted(1, 20, None)]]


def test_reset_prefix_cache_reports_nothing_now_or_later() -> None:
    observer = RecordingObserver()
    pool = make_pool(3, eviction_observer=observer)
    ids = pool.allocate(3)
    pool.cache_blocks(ids, hashes(10, 11, 12), parent_hash=None)
    pool.free(ids)
    assert pool.reset_prefix_cache()
    assert pool.allocate(3) == [0, 1, 2]
    assert observer.calls == []
    assert pool.take_events() == [KvStored(0, None, stored(10, 11, 12)), KvCleared(1)]


def test_no_prefix_caching_reports_nothing() -> None:
    observer = RecordingObserver()
    pool = make_pool(2, enable_prefix_caching=False, eviction_observer=observer)
    ids = pool.allocate(2)
    pool.cache_blocks(ids, hashes(10, 11), parent_hash=None)
    pool.free(ids)
    assert pool.allocate(2) == [0, 1]
    assert observer.calls == []


# ---- check_integrity can fail --------------------------------------------------------------


def _corrupt_ref_count(pool: PyBlockPool) -> None:
    pool._ref_counts[0] = 1  # in use, yet still in the free queue


def _corrupt_block_hash(pool: PyBlockPool) -> None:
    pool._seq_hashes[1] = 10  # claims a hash the map gives to block 0


def _corrupt_local_hash(pool: PyBlockPool) -> None:
    pool._local_hashes[0] = None  # cached block without its local hash


def _corrupt_cached_map(pool: PyBlockPool) -> None:
    pool._cached[99] = 3  # map entry without a block behind it


def _corrupt_parent_hash(pool: PyBlockPool) -> None:
    pool._parent_hashes[2] = 10  # an uncached block that remembers a parent


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_ref_count,
        _corrupt_block_hash,
        _corrupt_local_hash,
        _corrupt_cached_map,
        _corrupt_parent_hash,
    ],
)
def test_check_integrity_detects_corruption(
    corrupt: Callable[[PyBlockPool], None], backend: str
) -> None:
    if backend != Backend.PYTHON:
        pytest.skip("corrupts the Python pool's own lists")
    pool = PyBlockPool(4, 4)
    ids = pool.allocate(1)
    pool.cache_blocks(ids, hashes(10), parent_hash=None)
    pool.free(ids)
    pool.check_integrity()
    corrupt(pool)
    with pytest.raises(AssertionError):
        pool.check_integrity()


# ---- which pool ----------------------------------------------------------------------------


def test_the_python_pool_is_used_where_the_extension_was_not_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from armature.backends import BackendUnavailableError
    from armature.kv import native_block_pool

    monkeypatch.delenv(POOL_BACKEND_ENV_VAR)
    monkeypatch.setattr(native_block_pool, "_pool", None)
    assert not has_native_pool()
    assert isinstance(make_block_pool(4, 4), PyBlockPool)
    with pytest.raises(BackendUnavailableError, match="ARMATURE_POOL_BACKEND=python"):
        make_block_pool(4, 4, backend=Backend.NATIVE)


def test_the_environment_chooses_the_pool(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    from armature.errors import ConfigError

    expected = NativeBlockPool if backend == Backend.NATIVE else PyBlockPool
    assert type(make_block_pool(4, 4)) is expected
    monkeypatch.setenv(POOL_BACKEND_ENV_VAR, "rust")
    with pytest.raises(ConfigError, match="ARMATURE_POOL_BACKEND must be one of native, python"):
        make_block_pool(4, 4)


# ---- the C core's own guard ----------------------------------------------------------------


def test_the_core_makes_the_stored_blocks_before_it_caches_any(backend: str) -> None:
    """The C core makes each block's Stored entry by calling the block type, which may run
    code: all are made, and every block checked, before anything is cached. A type that
    shrinks the hashes gets an error, one that raises leaves the pool as it was, and one
    that replaces a later pair caches what the event says."""
    if backend != Backend.NATIVE:
        pytest.skip("the C core's argument")
    from armature.kv import _pool

    core = _pool.PoolCore(8, True)
    ids, evicted = core.allocate(3)
    assert (ids, evicted) == ([0, 1, 2], [])
    pairs = [(1, 11), (2, 12), (3, 13)]

    def clearing(seq_hash: int, local_hash: int) -> tuple[int, int]:
        pairs.clear()
        return (seq_hash, local_hash)

    with pytest.raises(RuntimeError, match="changed while read"):
        core.cache_blocks(ids, pairs, None, clearing)
    assert core.get_cached_hashes() == []

    def raising(seq_hash: int, local_hash: int) -> tuple[int, int]:
        if seq_hash == 3:
            raise KeyError(seq_hash)
        return (seq_hash, local_hash)

    with pytest.raises(KeyError):
        core.cache_blocks(ids, [(1, 11), (2, 12), (3, 13)], None, raising)
    assert core.get_cached_hashes() == []

    replaced = [(1, 11), (2, 12), (3, 13)]

    def replacing(seq_hash: int, local_hash: int) -> tuple[int, int]:
        replaced[2] = (9, 19)
        return (seq_hash, local_hash)

    made = core.cache_blocks(ids, replaced, 5, replacing)
    assert made == [(5, [(1, 11), (2, 12), (9, 19)])]
    assert sorted(core.get_cached_hashes()) == [1, 2, 9]
    assert core.snapshot()[2][:3] == (1, 9, 19)  # ref count, seq hash, local hash
    more, _ = core.allocate(2)
    assert core.cache_blocks(more, [(5, 15), (6, 16)], 9, StoredBlock) == [
        (9, [StoredBlock(5, 15), StoredBlock(6, 16)])
    ]
