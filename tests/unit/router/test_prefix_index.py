"""PrefixIndex: exact cases, gap detection and recovery, worker removal, the memory bound,
and a hypothesis property test against a naive oracle (device tier; the lower tiers are in
test_tier_index.py). Every test runs on each store that was built (the native C table keeps
the event rules in C, the Python store in Python)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.protocols.kv_events import (
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    StoredBlock,
)
from armature.router.holder_store import BACKEND_ENV_VAR, IndexBackend, has_native_index
from armature.router.prefix_index import PrefixIndex

BACKENDS = [IndexBackend.NATIVE] if has_native_index() else []
BACKENDS.append(IndexBackend.PYTHON)


@pytest.fixture(autouse=True, params=BACKENDS, ids=[b.value for b in BACKENDS])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> IndexBackend:
    """PrefixIndex() in these tests gets this store."""
    monkeypatch.setenv(BACKEND_ENV_VAR, request.param.value)
    return IndexBackend(request.param)


def stored(event_id: int, *hashes: int) -> KvStored:
    return KvStored(event_id, None, [StoredBlock(h, h) for h in hashes])


def test_overlaps_count_leading_blocks_per_worker() -> None:
    index = PrefixIndex()
    index.add_worker("a", 100)
    index.add_worker("b", 100)
    assert index.apply("a", stored(0, 1, 2, 3))
    assert index.apply("b", stored(0, 1, 2))
    assert index.apply("b", stored(1, 9))
    assert index.find_overlaps([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert index.find_overlaps([1, 9]) == {"a": 1, "b": 2}
    assert index.find_overlaps([2, 3]) == {"a": 2, "b": 1}
    assert index.find_overlaps([7]) == {}
    assert index.find_overlaps([]) == {}


class _PropertyBlock:
    """A block whose seq_hash is a property, not a slot (read the general way)."""

    def __init__(self, seq_hash: int):
        self._seq = seq_hash

    @property
    def seq_hash(self) -> int:
        return self._seq


class _SlotBlock(StoredBlock, frozen=True, gc=False):
    extra: int = 0  # another struct type: its own slot layout


def test_blocks_of_any_type_with_a_seq_hash_are_read_alike() -> None:
    """The native store reads StoredBlock's seq_hash from its slot; blocks of other types
    (another struct, a property) in between read as theirs, and StoredBlock's again after."""
    index = PrefixIndex()
    index.add_worker("w", 100)
    blocks: list[object] = [StoredBlock(1, 1), _PropertyBlock(2), _SlotBlock(3, 3, 9)]
    for event_id, block in enumerate(blocks):
        parent = event_id or None
        assert index.apply("w", KvStored(event_id, parent, [block]))  # type: ignore[list-item]
    assert index.apply("w", stored(3, 4, 5))
    assert index.find_overlaps([1, 2, 3, 4, 5, 6]) == {"w": 5}
    with pytest.raises((AttributeError, ValueError, TypeError)):
        index.apply("w", KvStored(4, 5, [object()]))  # type: ignore[list-item]


def test_a_borrowed_or_replaced_seq_hash_slot_is_read_as_the_class_says() -> None:
    """A member descriptor taken from another class is not read at its offset (the normal
    lookup refuses it), and a class whose seq_hash becomes a property after its blocks were
    read is read through the property from then on."""

    class Big:
        __slots__ = ("h", "pad")

    class Small:
        __slots__ = ()
        seq_hash = Big.h

    index = PrefixIndex()
    index.add_worker("w", 100)
    with pytest.raises((TypeError, ValueError, AttributeError)):
        index.apply("w", KvStored(0, None, [Small()]))  # type: ignore[list-item]

    class Block:
        __slots__ = ("seq_hash",)

        def __init__(self, seq_hash: int):
            self.seq_hash = seq_hash

    index = PrefixIndex()
    index.add_worker("w", 100)
    later = Block(2)
    assert index.apply("w", KvStored(0, None, [Block(1)]))  # type: ignore[list-item]
    slot = Block.seq_hash
    Block.seq_hash = property(lambda self: slot.__get__(self) + 1000)  # type: ignore[assignment,method-assign]
    assert index.apply("w", KvStored(1, 1, [later]))  # type: ignore[list-item]
    assert index.find_overlaps([1, 1002]) == {"w": 2}
    assert index.find_overlaps([1, 2]) == {"w": 1}


def test_removed_and_cleared_events() -> None:
    index = PrefixIndex()
    index.add_worker("a", 100)
    index.apply("a", stored(0, 1, 2, 3))
    assert index.apply("a", KvRemoved(1, [3, 42]))
    assert index.find_overlaps([1, 2, 3]) == {"a": 2}
    assert index.apply("a", KvCleared(2))
    assert index.find_overlaps([1]) == {}
    assert index.get_num_entries() == 0


def test_gap_marks_stale_until_a_dump() -> None:
    index = PrefixIndex()
    index.add_worker("a", 100)
    index.apply("a", stored(0, 1))
    assert not index.apply("a", stored(2, 5))  # event 1 was lost
    assert index.is_stale("a")
    assert not index.apply("a", stored(3, 6))  # ignored while stale
    assert index.get_worker_hashes("a") == {1}
    index.load_dump("a", [1, 5, 6], last_event_id=3)
    assert not index.is_stale("a")
    assert index.apply("a", stored(3, 99))  # older than the dump: ignored
    assert index.get_num_worker_blocks("a") == 3
    assert index.apply("a", stored(4, 7))
    assert index.get_worker_hashes("a") == {1, 5, 6, 7}


def test_first_event_must_be_zero() -> None:
    index = PrefixIndex()
    index.add_worker("late", 10)
    assert not index.apply("late", stored(5, 1))
    assert index.is_stale("late")


def test_capacity_bounds_memory() -> None:
    index = PrefixIndex()
    index.add_worker("a", 3)
    assert index.apply("a", stored(0, 1, 2, 3))
    assert not index.apply("a", stored(1, 4))  # a 4th block means removals were missed
    assert index.get_num_entries() == 3
    index.add_worker("b", 5)
    assert index.get_capacity_blocks() == 8
    with pytest.raises(ValueError, match="exceeds capacity"):
        index.load_dump("a", [1, 2, 3, 4], last_event_id=1)


def test_removing_a_worker_drops_its_blocks() -> None:
    index = PrefixIndex()
    index.add_worker("a", 10)
    index.add_worker("b", 10)
    index.apply("a", stored(0, 1, 2))
    index.apply("b", stored(0, 1))
    index.remove_worker("a")
    assert index.find_overlaps([1, 2]) == {"b": 1}
    assert index.get_workers() == ["b"]
    assert index.get_num_entries() == 1
    assert index.get_capacity_blocks() == 10


WORKERS = ["w0", "w1", "w2"]
HASHES = st.integers(0, 12)
events = st.lists(
    st.tuples(
        st.sampled_from(WORKERS),
        st.one_of(
            st.tuples(st.just("store"), st.lists(HASHES, min_size=1, max_size=4)),
            st.tuples(st.just("remove"), st.lists(HASHES, min_size=1, max_size=4)),
            st.tuples(st.just("clear"), st.just([])),
        ),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(events, st.lists(st.lists(HASHES, max_size=6), min_size=1, max_size=5))
def test_matches_a_naive_oracle(
    stream: list[tuple[str, tuple[str, list[int]]]], queries: list[list[int]]
) -> None:
    capacity = 8
    index = PrefixIndex()
    oracle: dict[str, set[int]] = {w: set() for w in WORKERS}
    next_id = dict.fromkeys(WORKERS, 0)
    for worker in WORKERS:
        index.add_worker(worker, capacity)
    for worker, (kind, hashes) in stream:
        event: KvEvent
        if kind == "store":
            event = stored(next_id[worker], *hashes)
            expected = oracle[worker] | set(hashes)
            if len(expected) > capacity:
                assert not index.apply(worker, event)
                index.load_dump(worker, oracle[worker], next_id[worker])
                next_id[worker] += 1
                continue
            oracle[worker] = expected
        elif kind == "remove":
            event = KvRemoved(next_id[worker], hashes)
            oracle[worker] -= set(hashes)
        else:
            event = KvCleared(next_id[worker])
            oracle[worker] = set()
        assert index.apply(worker, event)
        next_id[worker] += 1
    for worker in WORKERS:
        assert index.get_worker_hashes(worker) == oracle[worker]
    assert index.get_num_entries() == sum(len(s) for s in oracle.values())
    for query in queries:
        naive = {}
        for worker, held in oracle.items():
            depth = 0
            while depth < len(query) and query[depth] in held:
                depth += 1
            if depth:
                naive[worker] = depth
        assert index.find_overlaps(query) == naive
