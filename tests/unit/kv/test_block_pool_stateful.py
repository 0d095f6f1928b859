"""BlockPool (both implementations) against a naive model (plain lists, recomputed maps)
over random operation runs.

The model keeps the free queue as a list (head first), one `(seq_hash, local_hash) | None` and
one parent per block, and derives the cached map from those on every read. Hashes come from a
small alphabet so duplicates, cache hits and evictions of cached blocks are common. The pool's
eviction observer must have been told exactly the blocks the model says each allocate evicted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from armature.backends import Backend
from armature.kv.block_pool import BlockPool, NoFreeBlocksError, has_native_pool, make_block_pool
from armature.kv.eviction import EvictedBlock
from armature.protocols.kv_events import KvCleared, KvEvent, KvRemoved, KvStored, StoredBlock

# both pools where the native one was built: each is held to the same model
BACKENDS = [Backend.PYTHON, Backend.NATIVE] if has_native_pool() else [Backend.PYTHON]
ALPHABET = list(range(1, 9))  # seq hashes
MISS = 999  # a seq hash never cached


class NaivePool:
    """Obviously correct reference for BlockPool."""

    def __init__(self, num_blocks: int, enable_prefix_caching: bool):
        self.enable_prefix_caching = enable_prefix_caching
        self.ref = [0] * num_blocks
        self.free_queue = list(range(num_blocks))
        self.hash_of: list[tuple[int, int] | None] = [None] * num_blocks
        self.parent_of: list[int | None] = [None] * num_blocks
        self.hits = [0] * num_blocks  # prefix-cache hits since the block was taken
        self.events: list[KvEvent] = []
        self.evictions: list[list[EvictedBlock]] = []  # one list per allocate that evicts
        self.next_event_id = 0
        self.removals = 0  # hashes that left the cache (a reset counts one)

    def cached(self) -> dict[int, int]:
        return {h[0]: b for b, h in enumerate(self.hash_of) if h is not None}

    def _event_id(self) -> int:
        self.next_event_id += 1
        return self.next_event_id - 1

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise NoFreeBlocksError
        taken, self.free_queue = self.free_queue[:n], self.free_queue[n:]
        evicted = [
            EvictedBlock(b, h[0], h[1], self.parent_of[b], self.hits[b])
            for b in taken
            if (h := self.hash_of[b]) is not None
        ]
        for b in taken:
            self.hash_of[b] = None
            self.parent_of[b] = None
            self.hits[b] = 0
            self.ref[b] = 1
        if evicted:
            self.evictions.append(evicted)
            self.events.append(KvRemoved(self._event_id(), [e.seq_hash for e in evicted]))
            self.removals += len(evicted)
        return taken

    def free(self, ids: list[int]) -> None:
        for b in ids:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_queue.append(b)

    def touch(self, ids: list[int], is_hit: bool = False) -> None:
        for b in ids:
            if self.ref[b] == 0:
                self.free_queue.remove(b)
            self.ref[b] += 1
            self.hits[b] += is_hit

    def find_prefix(self, query: list[int]) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        cached = self.cached()
        out = []
        for h in query:
            if h not in cached:
                break
            out.append(cached[h])
        return out

    def cache_blocks(
        self, ids: list[int], hashes: list[tuple[int, int]], parent: int | None
    ) -> None:
        if not self.enable_prefix_caching:
            return
        is_new = []
        for i, (b, pair) in enumerate(zip(ids, hashes, strict=True)):
            new = self.hash_of[b] is None and pair[0] not in self.cached()
            if new:
                self.hash_of[b] = pair
                self.parent_of[b] = parent if i == 0 else hashes[i - 1][0]
            is_new.append(new)
        # One Stored event per maximal run of newly cached blocks; a run's parent is the seq
        # hash just before it in the call (or the caller's parent for the first block).
        i = 0
        while i < len(ids):
            if not is_new[i]:
                i += 1
                continue
            j = i
            while j < len(ids) and is_new[j]:
                j += 1
            run_parent = parent if i == 0 else hashes[i - 1][0]
            blocks = [StoredBlock(*pair) for pair in hashes[i:j]]
            self.events.append(KvStored(self._event_id(), run_parent, blocks))
            i = j

    def reset_prefix_cache(self) -> bool:
        if any(self.ref):
            return False
        self.hash_of = [None] * len(self.hash_of)
        self.parent_of = [None] * len(self.parent_of)
        self.hits = [0] * len(self.hits)
        self.events.append(KvCleared(self._event_id()))
        self.removals += 1
        return True


class RecordingObserver:
    def __init__(self) -> None:
        self.calls: list[list[EvictedBlock]] = []

    def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
        self.calls.append(list(blocks))


class BlockPoolMachine(RuleBasedStateMachine):
    pool: BlockPool
    model: NaivePool
    observer: RecordingObserver

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []  # one entry per reference the callers hold
        self.next_event_id = 0
        # (removals when found, query, blocks found) of each find_prefix
        self.found: list[tuple[int, list[int], list[int]]] = []

    @initialize(
        num_blocks=st.integers(min_value=1, max_value=6),
        enable_prefix_caching=st.sampled_from([True, True, True, False]),
        backend=st.sampled_from(BACKENDS),
    )
    def init_pool(self, num_blocks: int, enable_prefix_caching: bool, backend: Backend) -> None:
        self.observer = RecordingObserver()
        self.pool = make_block_pool(
            num_blocks,
            4,
            enable_prefix_caching=enable_prefix_caching,
            eviction_observer=self.observer,
            backend=backend,
        )
        self.model = NaivePool(num_blocks, enable_prefix_caching)

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(min_value=0, max_value=self.pool.num_blocks + 1), label="n")
        try:
            expected = self.model.allocate(n)
        except NoFreeBlocksError:
            before = (self.pool.get_free_block_ids(), [b.ref_count for b in self.pool.blocks])
            try:
                self.pool.allocate(n)
            except NoFreeBlocksError:
                pass
            else:
                raise AssertionError("allocate should have raised NoFreeBlocksError") from None
            after = (self.pool.get_free_block_ids(), [b.ref_count for b in self.pool.blocks])
            assert after == before
            return
        assert self.pool.allocate(n) == expected
        self.held.extend(expected)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        order = data.draw(st.permutations(self.held), label="order")
        n = data.draw(st.integers(min_value=0, max_value=len(order)), label="n")
        ids = list(order[:n])
        self.pool.free(ids)
        self.model.free(ids)
        for b in ids:
            self.held.remove(b)

    @rule(data=st.data())
    def touch_any(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.pool.num_blocks - 1), max_size=3), label="ids")
        self.pool.touch(ids)
        self.model.touch(ids)
        self.held.extend(ids)

    @rule(data=st.data())
    def find_prefix_and_touch(self, data: st.DataObject) -> None:
        candidates = [*sorted(self.model.cached()), MISS]
        query = data.draw(st.lists(st.sampled_from(candidates), max_size=4), label="query")
        hit = self.pool.find_prefix(query)
        assert hit == self.model.find_prefix(query)
        limit = data.draw(st.integers(0, len(query)), label="max_blocks")
        pairs = [(h, 0) for h in query]
        assert self.pool.find_prefix_of_pairs(pairs, limit) == self.model.find_prefix(query[:limit])
        start = data.draw(st.integers(0, len(query) + 1), label="start")
        assert self.pool.find_prefix_of_pairs(pairs, limit, start) == self.model.find_prefix(
            query[start:limit]
        )
        self.found.append((self.pool.get_num_removals(), query, hit))
        self.pool.touch(hit, is_hit=True)
        self.model.touch(hit, is_hit=True)
        self.held.extend(hit)

    @rule(data=st.data())
    def cache_blocks(self, data: st.DataObject) -> None:
        in_use = sorted(set(self.held))
        if not in_use:
            return
        ids = data.draw(st.lists(st.sampled_from(in_use), unique=True, max_size=4), label="ids")
        hashes = []
        for b in ids:
            local = data.draw(st.integers(0, 3), label="local")
            own = self.model.hash_of[b]
            # A cached block may only be re-cached under its own seq hash (else it asserts).
            seq = own[0] if own is not None else data.draw(st.sampled_from(ALPHABET), label="seq")
            hashes.append((seq, local))
        parent = data.draw(st.none() | st.sampled_from(ALPHABET), label="parent")
        self.pool.cache_blocks(ids, hashes, parent)
        self.model.cache_blocks(ids, hashes, parent)

    @rule(data=st.data())
    def run_request(self, data: st.DataObject) -> None:
        """The scheduler's pattern: take blocks, cache them as one chain, free them tail first
        (so cached blocks pile up in the queue and later allocations evict them)."""
        n = data.draw(st.integers(min_value=1, max_value=3), label="n")
        if n > len(self.model.free_queue):
            return
        ids = self.pool.allocate(n)
        assert ids == self.model.allocate(n)
        seqs = data.draw(st.lists(st.sampled_from(ALPHABET), min_size=n, max_size=n), label="seq")
        hashes = [(seq, seq + 100) for seq in seqs]
        parent = data.draw(st.none() | st.sampled_from(ALPHABET), label="parent")
        self.pool.cache_blocks(ids, hashes, parent)
        self.model.cache_blocks(ids, hashes, parent)
        self.pool.free(ids[::-1])
        self.model.free(ids[::-1])

    @rule(data=st.data())
    def reset_prefix_cache(self, data: st.DataObject) -> None:
        # One try in four: a reset wipes every hash, so frequent ones would leave little to evict.
        if data.draw(st.integers(0, 3), label="reset") == 0:
            assert self.pool.reset_prefix_cache() == self.model.reset_prefix_cache()

    @invariant()
    def same_state(self) -> None:
        pool, model = self.pool, self.model
        pool.check_integrity()
        assert pool.get_free_block_ids() == model.free_queue
        assert pool.get_num_free_blocks() == len(model.free_queue)
        assert pool.get_num_active_blocks() == sum(1 for r in model.ref if r > 0)
        assert [b.ref_count for b in pool.blocks] == model.ref
        assert Counter(self.held) == Counter({b: r for b, r in enumerate(model.ref) if r})
        cached = model.cached()
        assert pool.get_num_cached_blocks() == len(cached)
        assert pool.get_num_removals() == model.removals
        # what `KvCacheManager.find_cached_prefix` relies on: while nothing left the cache,
        # every prefix found before is still found, block for block
        for removals, query, hit in self.found:
            if removals == model.removals:
                assert self.model.find_prefix(query)[: len(hit)] == hit
        for h in [*ALPHABET, MISS]:
            assert pool.get_cached_block(h) == cached.get(h)
        for block, pair in zip(pool.blocks, model.hash_of, strict=True):
            assert (block.seq_hash, block.local_hash) == (pair or (None, None))

    @invariant()
    def same_events(self) -> None:
        events = self.pool.take_events()
        assert events == self.model.events
        self.model.events = []
        for event in events:
            assert event.event_id == self.next_event_id
            self.next_event_id += 1

    @invariant()
    def same_evictions(self) -> None:
        assert self.observer.calls == self.model.evictions
        for block in self.pool.blocks:
            assert (block.parent_hash, block.seq_hash is None, block.num_hits) == (
                self.model.parent_of[block.block_id],
                self.model.hash_of[block.block_id] is None,
                self.model.hits[block.block_id],
            )


BlockPoolMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
TestBlockPoolAgainstModel = BlockPoolMachine.TestCase
