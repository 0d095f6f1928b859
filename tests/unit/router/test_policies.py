"""Routing policies: exact choices."""

from __future__ import annotations

import pytest

from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.kv_events import KvStored, StoredBlock
from armature.router.load import ActiveLoad
from armature.router.policies import (
    DirectPolicy,
    KvPolicy,
    LeastLoadedPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    RouteRequest,
    RoutingError,
)
from armature.router.prefix_index import PrefixIndex

WORKERS = ["w0", "w1", "w2"]


def req(tokens: list[int] | None = None, target: str | None = None) -> RouteRequest:
    return RouteRequest("r", tokens or [1, 2, 3], target)


def test_round_robin_cycles() -> None:
    policy = RoundRobinPolicy()
    assert [policy.select(req(), WORKERS).worker for _ in range(5)] == [
        "w0",
        "w1",
        "w2",
        "w0",
        "w1",
    ]


def test_random_is_seeded() -> None:
    def picks(seed: int) -> list[str]:
        policy = RandomPolicy(seed)
        return [policy.select(req(), WORKERS).worker for _ in range(20)]

    assert picks(3) == picks(3)
    assert picks(3) != picks(4)
    assert set(picks(3)) == set(WORKERS)


def test_least_loaded_prefers_fewest_blocks_then_requests_then_order() -> None:
    load = ActiveLoad()
    policy = LeastLoadedPolicy(load)
    assert policy.select(req(), WORKERS).worker == "w0"
    load.start("a", "w0", 10, 5)
    load.start("b", "w1", 10, 2)
    load.start("c", "w2", 10, 2)
    load.start("d", "w2", 0, 0)
    assert policy.select(req(), WORKERS).worker == "w1"


def test_direct_needs_a_known_target() -> None:
    policy = DirectPolicy()
    assert policy.select(req(target="w2"), WORKERS).worker == "w2"
    with pytest.raises(RoutingError, match="unknown worker 'w9'"):
        policy.select(req(target="w9"), WORKERS)
    with pytest.raises(RoutingError, match="needs a target"):
        policy.select(req(), WORKERS)


def test_every_policy_refuses_an_empty_pool() -> None:
    with pytest.raises(RoutingError, match="no workers"):
        RoundRobinPolicy().select(req(), [])


def kv_setup() -> tuple[PrefixIndex, ActiveLoad, KvPolicy, list[int]]:
    index = PrefixIndex()
    for w in WORKERS:
        index.add_worker(w, 1000)
    load = ActiveLoad()
    policy = KvPolicy(index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED)
    prompt = list(range(100, 132))  # 8 blocks of 4
    hashes = compute_block_hashes(prompt, 4)
    index.apply("w1", KvStored(0, None, [StoredBlock(s, loc) for s, loc in hashes[:6]]))
    index.apply("w2", KvStored(0, None, [StoredBlock(s, loc) for s, loc in hashes[:2]]))
    return index, load, policy, prompt


def test_kv_routes_to_the_longest_cached_prefix() -> None:
    _, _, policy, prompt = kv_setup()
    decision = policy.select(req([*prompt, 7, 7]), WORKERS)
    assert (decision.worker, decision.overlap_blocks) == ("w1", 6)


def test_kv_trades_cached_prefix_against_load() -> None:
    _, load, policy, prompt = kv_setup()
    # w1 holds 6 of 8 blocks: logit 2 + 2 = 4 when idle; 20 active blocks make it 24, while
    # w2 (2 cached) scores 6 + 6 = 12 and idle w0 scores 8 + 8 = 16
    load.start("busy", "w1", 0, 20)
    decision = policy.select(req(prompt), WORKERS)
    assert (decision.worker, decision.overlap_blocks) == ("w2", 2)
