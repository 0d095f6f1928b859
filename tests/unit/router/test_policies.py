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


def test_kv_routes_by_the_sequence_hashes_it_is_given() -> None:
    """A caller that hashed the prompt already (the simulator) passes its sequence hashes:
    the policy matches those, not the tokens' (here the tokens match nothing cached)."""
    _, _, policy, prompt = kv_setup()
    given = [h for h, _ in compute_block_hashes(prompt, 4)]
    unrelated = list(range(500, 532))
    assert policy.select(req(unrelated), WORKERS).overlap_blocks == 0
    decision = policy.select(RouteRequest("r", unrelated, seq_hashes=given), WORKERS)
    assert (decision.worker, decision.overlap_blocks) == ("w1", 6)
    assert policy.select(RouteRequest("r", prompt, seq_hashes=given), WORKERS) == (
        policy.select(req(prompt), WORKERS)
    )


def test_kv_trades_cached_prefix_against_load() -> None:
    _, load, policy, prompt = kv_setup()
    # w1 holds 6 of 8 blocks: logit 2 + 2 = 4 when idle; 20 active blocks make it 24, while
    # w2 (2 cached) scores 6 + 6 = 12 and idle w0 scores 8 + 8 = 16
    load.start("busy", "w1", 0, 20)
    decision = policy.select(req(prompt), WORKERS)
    assert (decision.worker, decision.overlap_blocks) == ("w2", 2)


# ---- bounded loads -------------------------------------------------------------------------


def test_bounded_workers_are_those_under_the_bound() -> None:
    from armature.router.cost import bounded_workers
    from armature.router.load import WorkerLoad

    def loads(*counts: int) -> dict[str, WorkerLoad]:
        return {w: WorkerLoad(num_requests=n) for w, n in zip(WORKERS, counts, strict=True)}

    # 5 in flight + the new one over 3 workers, x 1.5: capacity ceil(3.0) = 3
    assert bounded_workers(WORKERS, loads(3, 1, 1), 1.5) == [1, 2]
    assert bounded_workers(WORKERS, loads(2, 2, 1), 1.5) is None  # nobody at capacity
    # 7 + 1 over 3, x 1.25: ceil(3.33) = 4
    assert bounded_workers(WORKERS, loads(4, 3, 0), 1.25) == [1, 2]
    assert bounded_workers(WORKERS, loads(3, 3, 1), 1.25) is None
    # idle workers may be left out of the loads: 1 + 1 over 3, x 2: ceil(1.33) = 2
    assert bounded_workers(WORKERS, {"w0": WorkerLoad(num_requests=1)}, 2.0) is None
    assert bounded_workers(WORKERS, {"w0": WorkerLoad(num_requests=2)}, 2.0) == [1, 2]
    assert bounded_workers(WORKERS, {}, 1.25) is None


def test_kv_with_a_load_bound_skips_a_worker_at_its_bound() -> None:
    index, load, _, prompt = kv_setup()
    policy = KvPolicy(index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED, load_bound=1.5)
    # w1 holds 6 of 8 blocks and wins unbounded even with 3 short requests in flight (they
    # hold one block each: logit 4 + 3 = 7 against w2's 12); x 1.5 of (3 + 1) / 3 is 2
    for i in range(3):
        load.start(f"short-{i}", "w1", 0, 1)
    unbounded = KvPolicy(index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED)
    assert unbounded.select(req(prompt), WORKERS).worker == "w1"
    decision = policy.select(req(prompt), WORKERS)
    assert (decision.worker, decision.overlap_blocks) == ("w2", 2)
    load.finish("short-0")
    load.finish("short-1")  # 1 + 1 in flight: capacity ceil(1.5 * 2 / 3) = 1, w1 at it
    assert policy.select(req(prompt), WORKERS).worker == "w2"
    load.finish("short-2")
    assert policy.select(req(prompt), WORKERS).worker == "w1"


@pytest.mark.parametrize("bound", [0.5, 1.0, -2.0])
def test_a_load_bound_at_or_below_one_is_refused(bound: float) -> None:
    with pytest.raises(ValueError, match="load bound must be 0"):
        KvPolicy(PrefixIndex(), ActiveLoad(), block_size=4, hash_seed=0, load_bound=bound)
