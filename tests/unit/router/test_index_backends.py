"""The prefix index's two stores: the native C table against the pure-Python reference under
hypothesis (random worker, event, capacity and dump sequences over every tier give identical
return values, state and overlaps), worker slots past one 64-bit word, and the choice of
store: the fallback when the extension is missing, the backend argument and
ARMATURE_INDEX_BACKEND. Native cases skip (with the reason) where it was not built."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.errors import ConfigError
from armature.protocols.kv_events import (
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
)
from armature.router.holder_store import (
    BACKEND_ENV_VAR,
    IndexBackend,
    NativeHolderStore,
    PyHolderStore,
    has_native_index,
    make_holder_store,
)
from armature.router.prefix_index import MAX_WORKERS, PrefixIndex
from without_extension import run_without

NOT_BUILT = "armature.router._index was not built (no C compiler at install)"
native_only = pytest.mark.skipif(not has_native_index(), reason=NOT_BUILT)

WORKERS = ["a", "b", "c", "d"]
# a small universe so that workers share blocks and prefixes; 0 and 2**64 - 1 are the bounds
HASHES = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 2**63, 2**64 - 1])
TIERS = st.sampled_from(list(KvTier))


@dataclass(frozen=True)
class AddWorker:
    worker: str
    capacity_blocks: int


@dataclass(frozen=True)
class RemoveWorker:
    worker: str


@dataclass(frozen=True)
class Capacities:
    worker: str
    capacity_blocks: dict[KvTier, int]


@dataclass(frozen=True)
class Event:
    worker: str
    kind: str
    hashes: list[int]
    tier: KvTier
    id_skew: int  # added to the next event id: 0 in order, else a repeat or a gap


@dataclass(frozen=True)
class Dump:
    worker: str
    by_tier: dict[KvTier, list[int]]


Op = AddWorker | RemoveWorker | Capacities | Event | Dump


KINDS = ["stored", "stored", "stored", "removed", "cleared"]
SKEWS = [0] * 12 + [-1, 1]  # added to the next event id: in order, a repeat, a gap


def ops_over(
    workers: list[str],
    events_in_ten: int | None = None,
    hashes: st.SearchStrategy[int] = HASHES,
    tiers: st.SearchStrategy[KvTier] = TIERS,
    kinds: list[str] = KINDS,
    skews: list[int] = SKEWS,
) -> st.SearchStrategy[Op]:
    """Ops on `workers`: each kind of op as often, or events `events_in_ten` in ten; events
    of `hashes` in `tiers`, their kinds and id skews drawn from `kinds` and `skews`."""
    names = st.sampled_from(workers)
    events = st.builds(
        Event,
        names,
        st.sampled_from(kinds),
        st.lists(hashes, max_size=6),
        tiers,
        st.sampled_from(skews),
    )
    others = [
        st.builds(AddWorker, names, st.integers(1, 8)),
        st.builds(RemoveWorker, names),
        st.builds(Capacities, names, st.dictionaries(TIERS, st.integers(0, 8), max_size=4)),
        st.builds(Dump, names, st.dictionaries(TIERS, st.lists(HASHES, max_size=6), max_size=4)),
    ]
    if events_in_ten is None:
        return st.one_of(*others[:3], events, others[3])
    other = st.one_of(*others)
    return st.integers(0, 9).flatmap(lambda i: events if i < events_in_ten else other)


OPS = ops_over(WORKERS)
# seven of them indexed from the start, events mostly Stored, in order, of four blocks on the
# device: a block often has more holders than an entry of the C table keeps inline (four),
# and loses them again
MANY_WORKERS = [f"w{i}" for i in range(8)]
MANY_HOLDER_OPS = ops_over(
    MANY_WORKERS,
    events_in_ten=8,
    hashes=st.sampled_from([0, 1, 2, 2**64 - 1]),
    tiers=st.sampled_from([KvTier.DEVICE] * 4 + list(KvTier)),
    kinds=["stored"] * 6 + ["removed", "cleared"],
    skews=[0] * 40 + [-1, 1],
)


def make_event(op: Event, event_id: int) -> KvEvent:
    if op.kind == "stored":
        return KvStored(event_id, None, [StoredBlock(h, h) for h in op.hashes], op.tier)
    if op.kind == "removed":
        return KvRemoved(event_id, op.hashes, op.tier)
    return KvCleared(event_id)


def run(index: PrefixIndex, op: Op, next_ids: dict[str, int]) -> object:
    """Apply `op`; what it returned (or the exception's type)."""
    known = index.has_worker(op.worker)
    try:
        if isinstance(op, AddWorker):
            index.add_worker(op.worker, op.capacity_blocks)
            next_ids[op.worker] = 0
            return None
        if not known:
            return "unknown"
        if isinstance(op, RemoveWorker):
            return index.remove_worker(op.worker)
        if isinstance(op, Capacities):
            return index.set_tier_capacities(op.worker, op.capacity_blocks)
        if isinstance(op, Event):
            event_id = max(0, next_ids[op.worker] + op.id_skew)
            next_ids[op.worker] = max(next_ids[op.worker], event_id + 1)
            return index.apply(op.worker, make_event(op, event_id))
        device = op.by_tier.get(KvTier.DEVICE, [])
        last_id = next_ids[op.worker] - 1
        return index.load_dump(op.worker, device, last_id, op.by_tier)
    except ValueError as error:
        return type(error)


def state(index: PrefixIndex, queries: list[list[int]]) -> dict[str, object]:
    """Everything the index tells: per-worker blocks by tier, staleness, bounds, overlaps."""
    workers = sorted(index.get_workers())
    return {
        "workers": workers,
        "held": {w: {t: index.get_worker_hashes(w, t) for t in KvTier} for w in workers},
        "counts": {w: {t: index.get_num_worker_blocks(w, t) for t in KvTier} for w in workers},
        "stale": {w: index.is_stale(w) for w in workers},
        "entries": index.get_num_entries(),
        "capacity": index.get_capacity_blocks(),
        "external": index.get_external_hashes(),
        "overlaps": [index.find_overlaps(q) for q in queries],
        "tier_overlaps": [index.find_tier_overlaps(q) for q in queries],
    }


def tiered_pair(workers: list[str]) -> tuple[PrefixIndex, PrefixIndex]:
    """A native and a Python index, each with `workers` indexed in every tier."""
    pair = PrefixIndex(IndexBackend.NATIVE), PrefixIndex(IndexBackend.PYTHON)
    for index in pair:
        for worker in workers:
            index.add_worker(worker, 8)
            index.set_tier_capacities(worker, dict.fromkeys(KvTier, 8))
    return pair


@native_only
@settings(max_examples=400, deadline=None)
@given(st.lists(OPS, max_size=40), st.lists(st.lists(HASHES, max_size=8), min_size=1, max_size=4))
def test_native_and_python_stores_agree_on_every_sequence(
    ops: list[Op], queries: list[list[int]]
) -> None:
    agree_on(ops, queries, WORKERS[:3])


@native_only
@settings(max_examples=300, deadline=None)
@given(
    st.lists(MANY_HOLDER_OPS, min_size=30, max_size=60),
    st.lists(st.lists(HASHES, max_size=8), min_size=1, max_size=4),
)
def test_native_and_python_stores_agree_with_many_holders_a_block(
    ops: list[Op], queries: list[list[int]]
) -> None:
    agree_on(ops, queries, MANY_WORKERS[:7])


def agree_on(ops: list[Op], queries: list[list[int]], first: list[str]) -> None:
    """`ops` on a native and a Python index, each starting with `first` indexed in every
    tier: the same return values and state after each."""
    native, python = tiered_pair(first)
    native_ids = dict.fromkeys(first, 0)
    python_ids = dict(native_ids)
    queries.append(sorted({0, 1, 2, 3, 4, 5, 6, 7}))  # the universe's longest prefix
    for op in ops:
        assert run(native, op, native_ids) == run(python, op, python_ids), op
        assert state(native, queries) == state(python, queries), op


def home_slot(key: int, num_slots: int) -> int:
    """The slot _index.c's table probes first for `key` (its multiplicative hash)."""
    return ((key * 0x9E3779B97F4A7C15) % 2**64 >> 17) % num_slots


def churn(
    index: PrefixIndex, keys: list[int], num_ops: int, seed: int, workers: str | list[str] = "ab"
) -> None:
    """Random adds and removes of `keys` for `workers`, each checked against a set; then
    every remaining key must still be found and removable."""
    rng = random.Random(seed)
    model: dict[str, set[int]] = {w: set() for w in workers}
    store = index._store
    for _ in range(num_ops):
        worker = rng.choice(workers)
        batch = rng.sample(keys, rng.randint(1, min(8, len(keys))))
        if rng.random() < 0.55:
            num_new = len(set(batch) - model[worker])
            assert store.add(worker, KvTier.DEVICE, batch, len(keys)) == num_new
            model[worker] |= set(batch)
        else:
            assert store.remove(worker, KvTier.DEVICE, batch) == len(set(batch) & model[worker])
            model[worker] -= set(batch)
        for w, held in model.items():
            assert store.get_hashes(w, KvTier.DEVICE) == held
    for worker, held in model.items():
        assert all(index.find_overlaps([h]).get(worker) == 1 for h in held)
        assert store.remove(worker, KvTier.DEVICE, list(held)) == len(held)
        assert store.get_hashes(worker, KvTier.DEVICE) == set()


@native_only
@pytest.mark.parametrize("wrapping", [False, True])
def test_native_table_matches_a_set_under_churn(wrapping: bool) -> None:
    """Random adds and removes keep the C table equal to a set: over 600 random keys
    (growth, collisions), and over 30 keys whose probes start in the last four or first two
    slots of the first 64-slot table (clusters that wrap around its end, and deletions that
    shift entries back across it)."""
    rng = random.Random(7)
    if wrapping:
        keys: list[int] = []
        while len(keys) < 30:
            key = rng.getrandbits(64)
            if home_slot(key, 64) in (60, 61, 62, 63, 0, 1):
                keys.append(key)
    else:
        keys = [rng.getrandbits(64) for _ in range(600)]
    index = PrefixIndex(IndexBackend.NATIVE)
    index.add_worker("a", len(keys))
    index.add_worker("b", len(keys))
    churn(index, keys, 3000, seed=8)


@native_only
def test_native_table_matches_sets_with_many_holders_past_64_workers() -> None:
    """70 workers add and remove 6 keys at random, each checked against a set: an entry's
    holders go past the four it keeps inline (to a bit set of two words) and back, in turn."""
    index = PrefixIndex(IndexBackend.NATIVE)
    workers = [f"w{i}" for i in range(70)]
    for worker in workers:
        index.add_worker(worker, 10)
    rng = random.Random(9)
    keys = [rng.getrandbits(64) for _ in range(6)]
    holders_seen: set[int] = set()
    store = index._store
    for _ in range(40):  # a few holders, many, then few again
        churn_round = rng.sample(workers, rng.randint(1, 70))
        for worker in churn_round:
            store.add(worker, KvTier.DEVICE, keys[:3], 10)
        holders_seen.add(len(index.find_overlaps(keys[:1])))
        for worker in rng.sample(churn_round, rng.randint(0, len(churn_round))):
            assert store.remove(worker, KvTier.DEVICE, keys[:3]) == 3
        holders_seen.add(len(index.find_overlaps(keys[:1])))
    assert min(holders_seen) <= 4 < max(holders_seen)
    for worker in workers:
        store.remove(worker, KvTier.DEVICE, keys[:3])
    assert index.get_num_entries() == 0
    churn(index, keys, 1500, seed=11, workers=workers)


@native_only
def test_native_store_grows_past_64_workers_and_reuses_slots() -> None:
    """130 workers span three 64-bit words; a removed worker's slot goes to the next one."""
    indexes = [PrefixIndex(IndexBackend.NATIVE), PrefixIndex(IndexBackend.PYTHON)]
    for index in indexes:
        for w in range(130):
            index.add_worker(f"w{w}", 1000)
            # worker w holds blocks 0..w: their overlaps with a long prompt are w + 1
            assert index.apply(
                f"w{w}", KvStored(0, None, [StoredBlock(h, h) for h in range(w + 1)])
            )
        index.remove_worker("w5")
        index.add_worker("new", 1000)
        assert index.apply("new", KvStored(0, None, [StoredBlock(h, h) for h in range(3)]))
    native, python = (i.find_overlaps(list(range(200))) for i in indexes)
    assert native == python
    assert native["w129"] == 130 and native["w64"] == 65 and native["new"] == 3
    assert "w5" not in native and len(native) == 130
    assert indexes[0].get_worker_hashes("new") == {0, 1, 2}


@native_only
def test_native_table_grown_to_megabytes_then_widened() -> None:
    """A table grown through many doublings (to megabytes, past armature/kv/bigmem.h's
    threshold for arrays mapped on their own), whose blocks 0 and 1 have more holders than
    an entry keeps inline (their bit sets widened when a 65th worker comes), and emptied,
    keeps exact contents."""
    num_blocks = 200_000  # 2**19 entries of 16 bytes
    index = PrefixIndex(IndexBackend.NATIVE)
    index.add_worker("big", num_blocks)
    assert index.apply("big", KvStored(0, None, [StoredBlock(h, h) for h in range(num_blocks)]))
    for w in range(64):
        index.add_worker(f"w{w}", 10)
    for w in range(6):  # blocks 0 and 1: seven holders, in one word's bit set
        assert index.apply(f"w{w}", KvStored(0, None, [StoredBlock(0, 0), StoredBlock(1, 1)]))
    index.add_worker("w64", 10)
    assert index.apply("w64", KvStored(0, None, [StoredBlock(0, 0)]))
    small = {f"w{w}": 2 for w in range(6)}
    assert index.find_overlaps(list(range(num_blocks + 5))) == {
        "big": num_blocks,
        **small,
        "w64": 1,
    }
    assert index.get_worker_hashes("big") == set(range(num_blocks))
    assert index.apply("big", KvRemoved(1, list(range(1, num_blocks))))
    assert index.find_overlaps([0, 1]) == {"big": 1, **small, "w64": 1}
    for w in range(6):  # blocks 0 and 1 back to two holders and one, inline
        assert index.apply(f"w{w}", KvRemoved(1, [0, 1]))
    assert index.find_overlaps([0, 1]) == {"big": 1, "w64": 1}
    assert index.get_num_entries() == 2  # (worker, block) pairs: big and w64 hold block 0


@pytest.mark.parametrize(
    "backend",
    [
        IndexBackend.PYTHON,
        pytest.param(IndexBackend.NATIVE, marks=native_only),
    ],
)
def test_an_index_holds_at_most_max_workers(backend: IndexBackend) -> None:
    """Both stores refuse the worker past MAX_WORKERS (the native table's slots) alike,
    changing nothing; a worker that leaves makes room for another."""
    index = PrefixIndex(backend)
    for w in range(MAX_WORKERS):
        index.add_worker(f"w{w}", 4)
    assert index.apply("w4095", KvStored(0, None, [StoredBlock(7, 7)]))
    with pytest.raises(ValueError, match="holds at most 4,096 workers"):
        index.add_worker("extra", 4)
    assert not index.has_worker("extra") and len(index.get_workers()) == MAX_WORKERS
    index.remove_worker("w0")
    index.add_worker("extra", 4)
    assert index.apply("extra", KvStored(0, None, [StoredBlock(7, 7)]))
    assert index.find_overlaps([7]) == {"w4095": 1, "extra": 1}


@native_only
def test_native_table_is_usable_before_init_and_initialized_once() -> None:
    """A table made without __init__ is empty, not a crash; a second __init__ is refused
    (its tables' layout is the word count it has)."""
    from armature.router import _index

    assert _index is not None
    fresh = _index.HolderTable.__new__(_index.HolderTable)
    assert fresh.find_overlaps([1, 2]) == {}
    store = NativeHolderStore()
    store.add_worker("a")
    store.set_capacity("a", KvTier.DEVICE, 10)
    assert store.add("a", KvTier.DEVICE, [5], 10) == 1
    with pytest.raises(RuntimeError, match="initialized once"):
        store._table.__init__({}, (KvStored, KvRemoved, KvCleared))
    assert store.find_overlaps([5]) == {"a": 1}


@native_only
def test_native_store_refuses_hashes_outside_u64() -> None:
    index = PrefixIndex(IndexBackend.NATIVE)
    index.add_worker("a", 10)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        index.find_overlaps([-1])


def test_backend_argument_and_environment_choose_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BACKEND_ENV_VAR, "python")
    assert isinstance(make_holder_store(), PyHolderStore)
    monkeypatch.setenv(BACKEND_ENV_VAR, "fast")
    with pytest.raises(ConfigError, match=f"{BACKEND_ENV_VAR} must be one of native, python"):
        make_holder_store()
    assert isinstance(make_holder_store(IndexBackend.PYTHON), PyHolderStore)
    monkeypatch.delenv(BACKEND_ENV_VAR)
    default = NativeHolderStore if has_native_index() else PyHolderStore
    assert isinstance(make_holder_store(), default)


def test_without_the_extension_the_index_uses_the_python_store() -> None:
    """A fresh interpreter where `armature.router._index` cannot be imported (as when it was
    not built): the index falls back to the Python store and works; asking for the native
    one is a typed error."""
    script = """
from armature.protocols.kv_events import KvStored, StoredBlock
from armature.router.holder_store import (
    IndexBackend, IndexBackendUnavailableError, PyHolderStore, has_native_index)
from armature.router.prefix_index import MAX_WORKERS, PrefixIndex
index = PrefixIndex()
assert not has_native_index()
assert isinstance(index._store, PyHolderStore)
index.add_worker("a", 10)
assert index.apply("a", KvStored(0, None, [StoredBlock(1, 1), StoredBlock(2, 2)]))
assert index.find_overlaps([1, 2, 3]) == {"a": 2}
try:
    PrefixIndex(IndexBackend.NATIVE)
except IndexBackendUnavailableError as error:
    print("refused:", error)
"""
    out = run_without("armature.router._index", script)
    assert out.startswith("refused: armature.router._index was not built")
