"""Tier-aware routing: a lower-tier block weighs max(0, 1 - onboard_s / prefill_s) of a device
block, per worker, from its load reports (priors until it has measured); exact choices where
the weight flips the cost, G4 blocks counting for every worker, tier-blind mode reproducing
the device-only choice, and the router shell feeding capacities, weights and tiered dumps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.config import RouterConfig
from armature.engines.api import poll_for_update
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.engine import EngineLoad
from armature.protocols.kv_events import KvDump, KvEvent, KvStored, KvTier, StoredBlock
from armature.router.load import ActiveLoad
from armature.router.policies import KvPolicy, RouteRequest
from armature.router.prefix_index import PrefixIndex, TierOverlap
from armature.router.service import EngineRouter
from armature.router.tier_weights import (
    PRIOR_TIER_WEIGHTS,
    TierWeightBook,
    TierWeights,
    measured_tier_weights,
)

HOST, DISK, EXTERNAL = KvTier.HOST, KvTier.DISK, KvTier.EXTERNAL
WORKERS = ["w0", "w1", "w2"]
BLOCK_SIZE = 4
PROMPT = list(range(100, 132))  # 8 blocks of 4
HASHES = compute_block_hashes(PROMPT, BLOCK_SIZE)


def test_weights_come_from_measured_costs_per_block() -> None:
    weights = measured_tier_weights(0.010, {HOST: 0.001, DISK: 0.006, EXTERNAL: 0.020})
    assert weights.host == pytest.approx(0.9)
    assert weights.disk == pytest.approx(0.4)
    assert weights.external == 0.0  # slower to load than to compute: worth nothing
    assert weights.weigh(TierOverlap(2, 10, 5, 7)) == pytest.approx(2 + 9 + 2)


@pytest.mark.parametrize(
    ("prefill_s", "onboard_s"),
    [
        (None, {HOST: 0.001}),  # no prefill measured yet
        (0.010, {}),  # no onboarding measured yet
        (0.0, {HOST: 0.001}),
        (math.nan, {HOST: 0.001}),
        (0.010, {HOST: math.inf}),
    ],
)
def test_weights_keep_their_priors_until_measured(
    prefill_s: float | None, onboard_s: dict[KvTier, float]
) -> None:
    assert measured_tier_weights(prefill_s, onboard_s) == PRIOR_TIER_WEIGHTS
    assert TierWeights(host=0.9, disk=0.5, external=0.3) == PRIOR_TIER_WEIGHTS


def test_only_the_measured_tier_leaves_its_prior() -> None:
    book = TierWeightBook()
    assert book.get("w") == PRIOR_TIER_WEIGHTS
    book.update("w", 0.010, {DISK: 0.002})
    assert book.get("w") == TierWeights(host=0.9, disk=pytest.approx(0.8), external=0.3)
    book.remove("w")
    assert book.get("w") == PRIOR_TIER_WEIGHTS


class Cluster:
    """Three indexed workers with every lower tier, their load and a kv policy."""

    def __init__(self, weights: TierWeightBook | None, seed: int = 0) -> None:
        self.index = PrefixIndex()
        for worker in WORKERS:
            self.index.add_worker(worker, 1000)
            self.index.set_tier_capacities(worker, {HOST: 1000, DISK: 1000, EXTERNAL: 1000})
        self.load = ActiveLoad()
        self.policy = KvPolicy(
            self.index, self.load, BLOCK_SIZE, DEFAULT_HASH_SEED, seed=seed, tier_weights=weights
        )
        self.next_event_id = dict.fromkeys(WORKERS, 0)

    def store(self, worker: str, tier: KvTier, num_blocks: int) -> None:
        """`worker` announces the prompt's first `num_blocks` blocks in `tier`."""
        blocks = [StoredBlock(s, local) for s, local in HASHES[:num_blocks]]
        assert self.index.apply(worker, KvStored(self.next_event_id[worker], None, blocks, tier))
        self.next_event_id[worker] += 1

    def choose(self) -> tuple[str, int]:
        decision = self.policy.select(RouteRequest("r", PROMPT), WORKERS)
        return decision.worker, decision.overlap_blocks


# w1 holds 6 of the 8 blocks on host, w2 4 on its device, w0 none; all idle. Each logit is
# 2 * (8 - overlap_w): w2 scores 8, w0 16, and w1 16 - 12 * weight(host), so w1 wins exactly
# when its host weight is above 2/3.
@pytest.mark.parametrize(
    ("onboard_host_s", "expected"),
    [
        (None, ("w1", 6)),  # prior 0.9: 5.2 < 8
        (0.003, ("w1", 6)),  # 1 - 0.003/0.010 = 0.7: 7.6 < 8
        (0.004, ("w2", 4)),  # 0.6: 8.8 > 8
        (0.005, ("w2", 4)),  # 0.5: 10 > 8
    ],
)
def test_a_host_hit_beats_a_shorter_device_hit_as_the_formula_says(
    onboard_host_s: float | None, expected: tuple[str, int]
) -> None:
    book = TierWeightBook()
    if onboard_host_s is not None:
        book.update("w1", 0.010, {HOST: onboard_host_s})
    cluster = Cluster(book)
    cluster.store("w1", HOST, 6)
    cluster.store("w2", KvTier.DEVICE, 4)
    assert cluster.choose() == expected


def test_tier_blind_reproduces_the_device_only_choice() -> None:
    cluster = Cluster(None)
    cluster.store("w1", HOST, 6)
    cluster.store("w2", KvTier.DEVICE, 4)
    assert cluster.choose() == ("w2", 4)  # w1's host blocks count for nothing


def test_a_shared_store_block_counts_for_every_worker() -> None:
    cluster = Cluster(TierWeightBook())
    cluster.store("w1", EXTERNAL, 6)  # announced by w1 only
    cluster.load.start("a", "w1", 0, 3)
    cluster.load.start("b", "w2", 0, 5)
    # every worker matches 6 blocks at weight 0.3; idle w0 is the cheapest
    assert cluster.choose() == ("w0", 6)
    cluster.load.start("c", "w0", 0, 4)
    assert cluster.choose() == ("w1", 6)


def test_a_worker_loading_from_its_own_host_beats_the_shared_store() -> None:
    cluster = Cluster(TierWeightBook())
    cluster.store("w0", EXTERNAL, 8)
    cluster.store("w2", HOST, 8)
    assert cluster.choose() == ("w2", 8)  # 2 * (8 - 7.2) = 1.6 against 2 * (8 - 2.4) = 11.2


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(WORKERS), st.integers(0, 8)), max_size=6),
    st.lists(st.tuples(st.sampled_from(WORKERS), st.integers(0, 40)), max_size=4),
    st.integers(0, 2**16),
)
def test_with_device_blocks_only_tier_aware_and_tier_blind_choose_alike(
    stores: list[tuple[str, int]], loads: list[tuple[str, int]], seed: int
) -> None:
    choices = []
    for weights in (TierWeightBook(), None):
        cluster = Cluster(weights, seed)
        for worker, num_blocks in stores:
            cluster.store(worker, KvTier.DEVICE, num_blocks)
        for i, (worker, num_blocks) in enumerate(loads):
            cluster.load.start(f"r{i}", worker, 0, num_blocks)
        choices.append(cluster.choose())
    assert choices[0] == choices[1]


# ---- the router shell --------------------------------------------------------------------
class TieredEngine:
    """An engine with lower tiers whose event stream has a gap: its dump lists them all."""

    def __init__(self, events: list[KvEvent], dump: KvDump, load: EngineLoad) -> None:
        self.events = events
        self.dump = dump
        self.load = load
        self.is_alive = True
        self.num_dumps = 0

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def take_kv_events(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events

    async def wait_for_update(self, timeout_s: float) -> bool:
        return await poll_for_update(timeout_s)  # the test adds events without a signal

    async def dump_kv_blocks(self) -> KvDump:
        self.num_dumps += 1
        return self.dump

    def get_load(self) -> EngineLoad:
        return self.load


async def test_the_router_rebuilds_every_tier_from_a_dump_and_reads_the_load_report() -> None:
    load = EngineLoad(
        num_active_blocks=0,
        num_total_blocks=16,
        num_waiting=0,
        num_running=0,
        num_prefill_tokens_queued=0,
        prefill_s_per_block=0.010,
        onboard_s_per_block={HOST: 0.002, DISK: 0.008},
        num_tier_total_blocks={HOST: 32, DISK: 64},
    )
    events: list[KvEvent] = [
        KvStored(0, None, [StoredBlock(1, 1)]),
        KvStored(1, 1, [StoredBlock(2, 2)], HOST),
        KvStored(3, 2, [StoredBlock(3, 3)], DISK),  # event 2 was lost
    ]
    dump = KvDump([1], 3, tier_seq_hashes={HOST: [2, 4], DISK: [3], EXTERNAL: [5]})
    engine = TieredEngine(events, dump, load)
    router = EngineRouter({"w": engine}, RouterConfig(policy="kv"))  # type: ignore[dict-item]
    assert await router.sync_events() == 3
    assert engine.num_dumps == 1
    index = router.index
    assert index.get_worker_hashes("w") == {1}
    assert index.get_worker_hashes("w", HOST) == {2, 4}
    assert index.get_worker_hashes("w", DISK) == {3}
    assert index.get_worker_hashes("w", EXTERNAL) == set()  # no external tier reported
    assert index.get_capacity_blocks() == 16 + 32 + 64
    assert index.find_tier_overlaps([1, 2, 3]) == {"w": TierOverlap(1, 1, 1)}
    assert router.tier_weights is not None
    weights = router.tier_weights.get("w")
    assert (weights.host, weights.disk) == (pytest.approx(0.8), pytest.approx(0.2))
    assert weights.external == PRIOR_TIER_WEIGHTS.external
    await router.remove_engine("w")
    assert router.tier_weights.get("w") == PRIOR_TIER_WEIGHTS  # forgotten


def test_the_tier_blind_setting_turns_the_weights_off() -> None:
    engine = TieredEngine(
        [],
        KvDump([], -1),
        EngineLoad(
            num_active_blocks=0,
            num_total_blocks=16,
            num_waiting=0,
            num_running=0,
            num_prefill_tokens_queued=0,
        ),
    )
    router = EngineRouter(
        {"w": engine},  # type: ignore[dict-item]
        RouterConfig(policy="kv", tier_aware=False),
    )
    assert router.tier_weights is None
    assert isinstance(router.policy, KvPolicy) and router.policy.tier_weights is None
    aware = EngineRouter({"w": engine}, RouterConfig(policy="kv"))  # type: ignore[dict-item]
    assert isinstance(aware.policy, KvPolicy) and aware.policy.tier_weights is aware.tier_weights
