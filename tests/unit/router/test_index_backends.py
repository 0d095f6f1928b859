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
from armature.router.prefix_index import PrefixIndex
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

OPS = st.one_of(
    st.builds(AddWorker, st.sampled_from(WORKERS), st.integers(1, 8)),
    st.builds(RemoveWorker, st.sampled_from(WORKERS)),
    st.builds(
        Capacities,
        st.sampled_from(WORKERS),
        st.dictionaries(TIERS, st.integers(0, 8), max_size=4),
    ),
    st.builds(
        Event,
        st.sampled_from(WORKERS),
        st.sampled_from(["stored", "stored", "stored", "removed", "cleared"]),
        st.lists(HASHES, max_size=6),
        TIERS,
        st.sampled_from([0] * 12 + [-1, 1]),
    ),
    st.builds(
        Dump,
        st.sampled_from(WORKERS),
        st.dictionaries(TIERS, st.lists(HASHES, max_size=6), max_size=4),
    ),
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


def tiered_pair() -> tuple[PrefixIndex, PrefixIndex]:
    """A native and a Python index, each with workers a, b, c indexed in every tier."""
    pair = PrefixIndex(IndexBackend.NATIVE), PrefixIndex(IndexBackend.PYTHON)
    for index in pair:
        for worker in WORKERS[:3]:
            index.add_worker(worker, 8)
            index.set_tier_capacities(worker, dict.fromkeys(KvTier, 8))
    return pair


@native_only
@settings(max_examples=400, deadline=None)
@given(st.lists(OPS, max_size=40), st.lists(st.lists(HASHES, max_size=8), min_size=1, max_size=4))
def test_native_and_python_stores_agree_on_every_sequence(
    ops: list[Op], queries: list[list[int]]
) -> None:
    native, python = tiered_pair()
    native_ids = dict.fromkeys(WORKERS[:3], 0)
    python_ids = dict(native_ids)
    queries.append(sorted({0, 1, 2, 3, 4, 5, 6, 7}))  # the universe's longest prefix
    for op in ops:
        assert run(native, op, native_ids) == run(python, op, python_ids), op
        assert state(native, queries) == state(python, queries), op


def home_slot(key: int, num_slots: int) -> int:
    """The slot _index.c's table probes first for `key` (its multiplicative hash)."""
    return ((key * 0x9E3779B97F4A7C15) % 2**64 >> 17) % num_slots


def churn(index: PrefixIndex, keys: list[int], num_ops: int, seed: int) -> None:
    """Random adds and removes of `keys` for workers a and b, each checked against a set;
    then every remaining key must still be found and removable."""
    rng = random.Random(seed)
    model: dict[str, set[int]] = {"a": set(), "b": set()}
    store = index._store
    for _ in range(num_ops):
        worker = rng.choice("ab")
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
    threshold for arrays mapped on their own), rebuilt wider when a 65th worker comes, and
    emptied keeps exact contents."""
    num_blocks = 200_000  # 2**19 entries of 16 bytes, then of 24 (two words of holders)
    index = PrefixIndex(IndexBackend.NATIVE)
    index.add_worker("big", num_blocks)
    assert index.apply("big", KvStored(0, None, [StoredBlock(h, h) for h in range(num_blocks)]))
    for w in range(65):
        index.add_worker(f"w{w}", 10)
    assert index.apply("w64", KvStored(0, None, [StoredBlock(0, 0)]))
    assert index.find_overlaps(list(range(num_blocks + 5))) == {"big": num_blocks, "w64": 1}
    assert index.get_worker_hashes("big") == set(range(num_blocks))
    assert index.apply("big", KvRemoved(1, list(range(1, num_blocks))))
    assert index.find_overlaps([0, 1]) == {"big": 1, "w64": 1}


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
from armature.router.prefix_index import PrefixIndex
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
