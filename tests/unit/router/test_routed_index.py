"""RoutedPrefixIndex: predictions from routing decisions, with a TTL and a size bound."""

from __future__ import annotations

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


def test_size_bound_drops_the_oldest() -> None:
    index = RoutedPrefixIndex(ttl_s=100.0, max_entries=3)
    index.record("a", [1, 2], now_s=0.0)
    index.record("b", [7, 8], now_s=1.0)
    assert index.get_num_entries() == 3
    assert index.find_overlaps([1, 2], now_s=2.0) == {}  # (1, a) went first
    assert index.find_overlaps([2], now_s=2.0) == {"a": 1}
    assert index.find_overlaps([7, 8], now_s=2.0) == {"b": 2}


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
