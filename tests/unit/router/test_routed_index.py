"""RoutedPrefixIndex: predictions from routing decisions, with a TTL and a size bound."""

from __future__ import annotations

import random

import pytest

from armature.kv.hashing import DEFAULT_HASH_SEED
from armature.router.load import ActiveLoad
from armature.router.policies import KvPolicy, RouteRequest
from armature.router.routed_index import RoutedPrefixIndex


def test_records_are_found_until_they_expire() -> None:
    index = RoutedPrefixIndex(ttl_s=10.0, max_entries=100)
    index.record("a", [1, 2, 3], now_s=0.0)
    index.record("b", [1, 2], now_s=5.0)
    assert index.find_overlaps([1, 2, 3, 4], now_s=6.0) == {"a": 3, "b": 2}
    assert index.find_overlaps([1, 2, 3], now_s=12.0) == {"b": 2}  # a expired at 10
    index.prune(now_s=12.0)
    assert index.get_num_entries() == 2
    index.prune(now_s=20.0)
    assert index.get_num_entries() == 0
    assert index.find_overlaps([1], now_s=20.0) == {}


def test_a_new_record_refreshes_the_ttl() -> None:
    index = RoutedPrefixIndex(ttl_s=10.0, max_entries=100)
    index.record("a", [1], now_s=0.0)
    index.record("a", [1], now_s=8.0)
    index.prune(now_s=15.0)
    assert index.find_overlaps([1], now_s=15.0) == {"a": 1}


def test_size_bound_drops_the_oldest_decisions() -> None:
    index = RoutedPrefixIndex(ttl_s=100.0, max_entries=3)
    index.record("a", [1, 2], now_s=0.0)
    index.record("b", [7, 8], now_s=1.0)
    assert index.get_num_entries() == 2  # a's whole decision went first
    assert index.find_overlaps([1, 2], now_s=2.0) == {}
    assert index.find_overlaps([7, 8], now_s=2.0) == {"b": 2}


def test_dropping_a_refreshed_decision_keeps_the_refreshed_blocks() -> None:
    index = RoutedPrefixIndex(ttl_s=10.0, max_entries=100)
    index.record("a", [1, 2, 3], now_s=0.0)
    index.record("a", [1], now_s=0.0)  # same time: expiries stay unique
    index.prune(now_s=10.0, max_decisions=1)
    assert index.get_num_entries() == 1
    assert index.find_overlaps([1, 2, 3], now_s=10.0) == {"a": 1}


def test_depth_search_matches_a_linear_scan() -> None:
    rng = random.Random(5)
    index = RoutedPrefixIndex(ttl_s=10.0, max_entries=10**6)
    chains = [[rng.getrandbits(62) for _ in range(40)] for _ in range(4)]
    # Branches share leading blocks with their parents.
    chains += [c[: rng.randrange(1, 40)] + [rng.getrandbits(62) for _ in range(9)] for c in chains]
    live: dict[str, dict[int, float]] = {}
    for step in range(300):
        now = step * 0.1
        worker = f"w{rng.randrange(5)}"
        chain = rng.choice(chains)
        prefix = chain[: rng.randrange(1, len(chain) + 1)]
        index.record(worker, prefix, now)
        for h in prefix:
            live.setdefault(worker, {})[h] = now + 10.0
        query = rng.choice(chains)
        expected = {}
        for w, held in live.items():
            depth = 0
            while depth < len(query) and held.get(query[depth], -1.0) > now:
                depth += 1
            if depth:
                expected[w] = depth
        assert index.find_overlaps(query, now) == expected
        # with known prefixes: only the workers assumed to hold more than is known
        known = {w: rng.randrange(0, len(query) + 1) for w in live if rng.random() < 0.7}
        deeper = {w: d for w, d in expected.items() if d > known.get(w, 0)}
        assert index.find_overlaps(query, now, known) == deeper


def test_invalid_settings() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        RoutedPrefixIndex(ttl_s=0.0, max_entries=1)


def test_kv_policy_without_events_follows_its_own_decisions() -> None:
    now = [0.0]
    policy = KvPolicy(
        None,
        ActiveLoad(),
        block_size=4,
        hash_seed=DEFAULT_HASH_SEED,
        routed=RoutedPrefixIndex(60.0, 1000),
        clock=lambda: now[0],
    )
    workers = ["w0", "w1", "w2"]
    prompt = list(range(40))
    first = policy.select(RouteRequest("a", prompt), workers)
    now[0] = 1.0
    second = policy.select(RouteRequest("b", [*prompt, 99]), workers)
    assert second.worker == first.worker
    assert second.overlap_blocks == 10
    now[0] = 100.0  # the prediction expired
    third = policy.select(RouteRequest("c", prompt), workers)
    assert third.overlap_blocks == 0


def test_kv_policy_needs_some_source_of_overlaps() -> None:
    with pytest.raises(ValueError, match="needs a prefix index"):
        KvPolicy(None, ActiveLoad(), block_size=4, hash_seed=DEFAULT_HASH_SEED)


def test_first_block_filter_loses_no_worker_under_eviction() -> None:
    rng = random.Random(9)
    index = RoutedPrefixIndex(ttl_s=3.0, max_entries=120)
    chains = [[rng.getrandbits(62) for _ in range(30)] for _ in range(5)]
    for step in range(400):
        now = step * 0.05
        chain = rng.choice(chains)
        index.record(f"w{rng.randrange(6)}", chain[: rng.randrange(1, 31)], now)
        query = rng.choice(chains)
        expected = {}  # scan every worker's live entries, no filter
        for worker, entries in index._by_worker.items():
            depth = 0
            while depth < len(query) and entries.get(query[depth], -1.0) > now:
                depth += 1
            if depth:
                expected[worker] = depth
        assert index.find_overlaps(query, now) == expected
        assert index.get_num_entries() <= 120
