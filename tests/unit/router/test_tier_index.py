"""PrefixIndex with tiers: each (worker, block) records every tier it is in and counts in its
fastest one, G4 blocks count for every worker, lower tiers are bounded by the capacities the
worker reports; exact states after scripted events, and a hypothesis test against a naive
per-tier model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.protocols.kv_events import (
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
)
from armature.router.prefix_index import PrefixIndex, TierOverlap

DEVICE, HOST, DISK, EXTERNAL = KvTier.DEVICE, KvTier.HOST, KvTier.DISK, KvTier.EXTERNAL
LOWER = {HOST: 10, DISK: 10, EXTERNAL: 10}


def stored(event_id: int, tier: KvTier, *hashes: int) -> KvStored:
    return KvStored(event_id, None, [StoredBlock(h, h) for h in hashes], tier)


def removed(event_id: int, tier: KvTier, *hashes: int) -> KvRemoved:
    return KvRemoved(event_id, list(hashes), tier)


def tiered_index(*workers: str) -> PrefixIndex:
    index = PrefixIndex()
    for worker in workers:
        index.add_worker(worker, 10)
        index.set_tier_capacities(worker, LOWER)
    return index


def held(index: PrefixIndex, worker: str) -> dict[KvTier, set[int]]:
    return {t: index.get_worker_hashes(worker, t) for t in KvTier}


def test_a_block_counts_in_its_fastest_tier_and_stays_while_any_tier_has_it() -> None:
    index = tiered_index("a")
    assert index.apply("a", stored(0, DEVICE, 1))
    assert index.apply("a", stored(1, HOST, 2))
    assert index.apply("a", stored(2, DISK, 3))
    assert index.apply("a", stored(3, EXTERNAL, 4))
    assert index.find_tier_overlaps([1, 2, 3, 4, 5]) == {"a": TierOverlap(1, 1, 1, 1)}
    assert index.find_overlaps([1, 2, 3, 4]) == {"a": 1}  # tier-blind: device only
    # block 1 copied down to host, block 2 to disk: each still counts in its fastest tier
    assert index.apply("a", stored(4, HOST, 1))
    assert index.apply("a", stored(5, DISK, 2))
    assert held(index, "a") == {DEVICE: {1}, HOST: {1, 2}, DISK: {2, 3}, EXTERNAL: {4}}
    assert index.get_num_entries() == 6
    assert index.find_tier_overlaps([1, 2, 3, 4]) == {"a": TierOverlap(1, 1, 1, 1)}
    # dropped from host while still on the device (1) and on disk (2): both stay
    assert index.apply("a", removed(6, HOST, 1, 2))
    assert held(index, "a") == {DEVICE: {1}, HOST: set(), DISK: {2, 3}, EXTERNAL: {4}}
    assert index.find_tier_overlaps([1, 2, 3, 4]) == {"a": TierOverlap(1, 0, 2, 1)}
    # evicted from the device with no lower copy: the match now stops before block 1
    assert index.apply("a", removed(7, DEVICE, 1))
    assert index.find_tier_overlaps([1, 2, 3, 4]) == {}
    assert index.find_tier_overlaps([2, 3, 4]) == {"a": TierOverlap(0, 0, 2, 1)}
    # a removal from a tier that lacks the block changes nothing
    assert index.apply("a", removed(8, HOST, 3, 4, 99))
    assert index.get_num_entries() == 3


def test_a_prefix_may_change_tier_back_and_forth() -> None:
    index = tiered_index("a", "b")
    assert index.apply("a", stored(0, DISK, 1, 2))
    assert index.apply("a", stored(1, HOST, 3))
    assert index.apply("a", stored(2, EXTERNAL, 4))
    assert index.apply("a", stored(3, DISK, 5))
    assert index.apply("a", stored(4, DEVICE, 6))
    assert index.apply("b", stored(0, DEVICE, 1, 2, 3, 5, 6))
    assert index.find_tier_overlaps([1, 2, 3, 4, 5, 6, 7]) == {
        "a": TierOverlap(1, 1, 3, 1),
        "b": TierOverlap(5, 0, 0, 1),  # 4 from the shared store
    }


def test_cleared_empties_the_device_tier_only() -> None:
    index = tiered_index("a")
    assert index.apply("a", stored(0, DEVICE, 1, 2))
    assert index.apply("a", stored(1, HOST, 2, 3))
    assert index.apply("a", KvCleared(2))
    assert held(index, "a") == {DEVICE: set(), HOST: {2, 3}, DISK: set(), EXTERNAL: set()}
    assert index.find_tier_overlaps([2, 3]) == {"a": TierOverlap(0, 2)}


def test_external_blocks_count_for_every_worker_while_anyone_announces_them() -> None:
    index = tiered_index("a", "b", "c")
    assert index.apply("a", stored(0, EXTERNAL, 10, 11))
    assert index.apply("b", stored(0, DEVICE, 10))
    assert index.apply("c", stored(0, HOST, 10))
    assert index.find_tier_overlaps([10, 11, 12]) == {
        "a": TierOverlap(0, 0, 0, 2),
        "b": TierOverlap(1, 0, 0, 1),  # 10 on its device, 11 from the shared store
        "c": TierOverlap(0, 1, 0, 1),
    }
    assert index.apply("b", stored(1, EXTERNAL, 11))  # two announcers of 11
    assert index.apply("a", removed(1, EXTERNAL, 11))
    assert index.get_external_hashes() == {10, 11}
    assert index.apply("b", removed(2, EXTERNAL, 11))  # the last one: 11 is gone
    assert index.get_external_hashes() == {10}
    assert index.find_tier_overlaps([10, 11]) == {
        "a": TierOverlap(0, 0, 0, 1),
        "b": TierOverlap(1),
        "c": TierOverlap(0, 1),
    }
    index.remove_worker("a")  # its announcements go with it
    assert index.get_external_hashes() == set()
    assert index.find_tier_overlaps([10]) == {"b": TierOverlap(1), "c": TierOverlap(0, 1)}


def test_an_unreported_tier_is_not_indexed() -> None:
    index = PrefixIndex()
    index.add_worker("a", 10)
    assert index.apply("a", stored(0, HOST, 1, 2))  # no host capacity reported: skipped
    assert index.apply("a", removed(1, HOST, 1))
    assert index.get_num_entries() == 0
    assert index.get_capacity_blocks() == 10
    index.set_tier_capacities("a", {HOST: 4, DEVICE: 999})  # device capacity stays 10
    assert index.get_capacity_blocks() == 14
    assert index.apply("a", stored(2, HOST, 3))
    assert index.get_worker_hashes("a", HOST) == {3}
    assert not index.is_stale("a")


def test_lower_tier_capacity_bounds_memory() -> None:
    index = PrefixIndex()
    index.add_worker("a", 2)
    index.set_tier_capacities("a", {HOST: 3, EXTERNAL: 2})
    assert index.apply("a", stored(0, HOST, 1, 2, 3))
    assert index.apply("a", stored(1, DEVICE, 1, 2))  # tiers have separate bounds
    assert not index.apply("a", stored(2, HOST, 4))  # a 4th host block: removals missed
    assert index.is_stale("a")
    assert index.get_num_entries() == 5 <= index.get_capacity_blocks() == 7
    with pytest.raises(ValueError, match="3 external blocks exceeds capacity"):
        index.load_dump("a", [1], 2, {EXTERNAL: [1, 2, 3]})
    assert index.get_num_entries() == 5  # a refused dump changes nothing
    # a tier that shrinks below what is held loses its entries; one no longer named too
    index.load_dump("a", [], 2, {HOST: [1, 2, 3], EXTERNAL: [7]})
    index.set_tier_capacities("a", {HOST: 2})
    assert held(index, "a") == {DEVICE: set(), HOST: set(), DISK: set(), EXTERNAL: set()}
    assert index.get_external_hashes() == set()
    assert index.get_capacity_blocks() == 4


def test_a_dump_replaces_every_tier() -> None:
    index = tiered_index("a")
    index.apply("a", stored(0, DEVICE, 1, 2))
    index.apply("a", stored(1, HOST, 3))
    index.apply("a", stored(2, EXTERNAL, 4))
    assert not index.apply("a", stored(4, DISK, 5))  # event 3 was lost
    index.load_dump("a", [1], 4, {HOST: [2, 3], DISK: [5], EXTERNAL: []})
    assert held(index, "a") == {DEVICE: {1}, HOST: {2, 3}, DISK: {5}, EXTERNAL: set()}
    assert index.get_external_hashes() == set()
    assert index.find_tier_overlaps([1, 2, 3, 5]) == {"a": TierOverlap(1, 2, 1)}
    # a dump without tiers (an older worker) leaves the lower tiers empty
    index.load_dump("a", [1, 2], 4)
    assert held(index, "a") == {DEVICE: {1, 2}, HOST: set(), DISK: set(), EXTERNAL: set()}
    assert index.apply("a", stored(5, HOST, 3))


# ---- against a naive model ---------------------------------------------------------------
WORKERS = ["w0", "w1", "w2"]
CAPACITY = 4
HASHES = st.integers(0, 5)  # few hashes: tiers overlap and queries hit often
TIERS = st.sampled_from(list(KvTier))
events = st.lists(
    st.tuples(
        st.sampled_from(WORKERS),
        st.one_of(
            st.tuples(st.just("store"), TIERS, st.lists(HASHES, min_size=1, max_size=4)),
            st.tuples(st.just("store"), TIERS, st.lists(HASHES, min_size=1, max_size=4)),
            st.tuples(st.just("remove"), TIERS, st.lists(HASHES, min_size=1, max_size=4)),
            st.tuples(st.just("clear"), st.just(DEVICE), st.just([])),
            st.tuples(st.just("leave"), st.just(DEVICE), st.just([])),
        ),
    ),
    max_size=50,
)

Model = dict[str, dict[KvTier, set[int]]]


def naive_overlaps(model: Model, query: list[int]) -> dict[str, TierOverlap]:
    """Per worker: walk the query, counting each block in the first tier (fastest first)
    that has it, G4 meaning any worker's; stop at a block in none."""
    external = set().union(*(tiers[EXTERNAL] for tiers in model.values()))
    out = {}
    for worker, tiers in model.items():
        counts = dict.fromkeys(KvTier, 0)
        for seq_hash in query:
            local = [t for t in (DEVICE, HOST, DISK) if seq_hash in tiers[t]]
            if local:
                counts[local[0]] += 1
            elif seq_hash in external:
                counts[EXTERNAL] += 1
            else:
                break
        if sum(counts.values()):
            out[worker] = TierOverlap(counts[DEVICE], counts[HOST], counts[DISK], counts[EXTERNAL])
    return out


@settings(max_examples=300, deadline=None)
@given(
    events,
    st.lists(
        st.one_of(st.permutations(range(6)), st.lists(HASHES, max_size=6)),
        min_size=1,
        max_size=4,
    ),
)
def test_matches_a_naive_per_tier_model(
    stream: list[tuple[str, tuple[str, KvTier, list[int]]]], queries: list[list[int]]
) -> None:
    index = PrefixIndex()
    model: Model = {}
    next_id: dict[str, int] = {}

    def join(worker: str) -> None:
        index.add_worker(worker, CAPACITY)
        index.set_tier_capacities(worker, dict.fromkeys((HOST, DISK, EXTERNAL), CAPACITY))
        model[worker] = {t: set() for t in KvTier}
        next_id[worker] = 0

    for worker in WORKERS:
        join(worker)
    for worker, (kind, tier, hashes) in stream:
        if kind == "leave":  # and join again at once, empty
            index.remove_worker(worker)
            join(worker)
            continue
        event: KvEvent
        if kind == "store":
            event = stored(next_id[worker], tier, *hashes)
            expected = model[worker][tier] | set(hashes)
            if len(expected) > CAPACITY:
                assert not index.apply(worker, event)
                tiers = model[worker]
                index.load_dump(worker, tiers[DEVICE], next_id[worker], tiers)
                next_id[worker] += 1
                continue
            model[worker][tier] = expected
        elif kind == "remove":
            event = removed(next_id[worker], tier, *hashes)
            model[worker][tier] -= set(hashes)
        else:
            event = KvCleared(next_id[worker])
            model[worker][DEVICE] = set()
        assert index.apply(worker, event)
        next_id[worker] += 1
    for worker in WORKERS:
        assert held(index, worker) == model[worker]
    assert index.get_num_entries() == sum(len(s) for m in model.values() for s in m.values())
    assert index.get_num_entries() <= index.get_capacity_blocks()
    external = set().union(*(m[EXTERNAL] for m in model.values()))
    assert index.get_external_hashes() == external
    for query in queries:
        assert index.find_tier_overlaps(query) == naive_overlaps(model, query)
        blind = {}
        for worker, tiers in model.items():
            depth = 0
            while depth < len(query) and query[depth] in tiers[DEVICE]:
                depth += 1
            if depth:
                blind[worker] = depth
        assert index.find_overlaps(query) == blind
