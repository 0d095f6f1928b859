"""Bounded shares: the kv router's recent decisions per worker, the capacity a bound gives,
and a hot prefix sent to a second worker once its first holds its share."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies import WORKERS, kv_setup, req

from armature.kv.hashing import DEFAULT_HASH_SEED
from armature.router.policies import KvPolicy, make_policy
from armature.router.shares import RecentShares


def test_the_window_keeps_the_last_decisions_per_worker() -> None:
    shares = RecentShares(window_per_worker=2)
    for worker in ["w0", "w0", "w1", "w0", "w2", "w2", "w2"]:
        shares.record(worker, num_workers=3)  # a window of 6: the first w0 leaves
    assert [shares.get_count(w) for w in WORKERS] == [2, 1, 3]
    # a request whose candidates were filtered to one worker does not shrink the window (6):
    # the oldest w0 leaves
    shares.record("w1", num_workers=1)
    assert [shares.get_count(w) for w in WORKERS] == [1, 2, 3]
    with pytest.raises(ValueError, match="window_per_worker must be >= 1"):
        RecentShares(0)


def test_a_worker_at_its_capacity_is_left_out() -> None:
    shares = RecentShares(window_per_worker=10)
    assert shares.bounded(WORKERS, 1.5) is None  # nothing routed yet
    for worker in ["w0"] * 3 + ["w1"]:
        shares.record(worker, num_workers=3)
    # 4 + 1 over 3 workers, x 1.5: capacity ceil(2.5) = 3, w0 at it
    assert shares.bounded(WORKERS, 1.5) == [1, 2]
    # x 2: capacity ceil(3.33) = 4: nobody at it
    assert shares.bounded(WORKERS, 2.0) is None
    # decisions to a worker that has left count for nobody: w0's 3 are not among w1, w2
    assert shares.bounded(["w1", "w2"], 1.5) is None
    # a worker not routed over before joins with the others' mean count, round(4 / 3) = 1:
    # capacity ceil(1.5 x 6 / 4) = 3, w0 still at it
    assert shares.bounded([*WORKERS, "w3"], 1.5) == [1, 2, 3]
    assert [shares.get_count(w) for w in [*WORKERS, "w3"]] == [3, 1, 0, 1]


def test_a_joining_worker_keeps_the_windows_history() -> None:
    """A fleet of 2 after 100 even decisions grows to 3: the newcomer counts 50, so the holder
    of a prefix may take its next requests (a fresh window would leave it out after 2: its
    capacity would be ceil(1.08 x 3 / 3) = 2)."""
    shares = RecentShares(window_per_worker=100)
    for _ in range(50):
        shares.record("w0", num_workers=2)
        shares.record("w1", num_workers=2)
    assert shares.bounded(WORKERS, 1.08) is None
    assert shares.get_count("w2") == 50
    shares.record("w0", num_workers=3)
    shares.record("w0", num_workers=3)
    # capacity ceil(1.08 x 153 / 3) = 56
    assert shares.bounded(WORKERS, 1.08) is None


def test_a_joining_workers_credit_leaves_the_window_first() -> None:
    shares = RecentShares(window_per_worker=2)
    shares.record("w0", num_workers=2)
    shares.record("w1", num_workers=2)
    shares.bounded(WORKERS, 1.5)  # w2 joins with 1, the window's oldest
    assert [shares.get_count(w) for w in WORKERS] == [1, 1, 1]
    for _ in range(4):  # 7 decisions in a window of 6: the oldest leaves
        shares.record("w1", num_workers=3)
    assert [shares.get_count(w) for w in WORKERS] == [1, 5, 0]


def test_a_hot_prefix_gets_a_second_worker_once_its_first_holds_its_share() -> None:
    index, load, _, prompt = kv_setup()  # w1 holds 6 of the prompt's 8 blocks, w2 2
    policy = KvPolicy(
        index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED, share_bound=1.5, share_window=4
    )
    chosen = []
    for i in range(6):  # every request still in flight: the workers are busy
        chosen.append(policy.select(req(prompt), WORKERS).worker)
        load.start(f"r{i}", chosen[-1], prefill_tokens=0, blocks=0)
    # 1st: capacity ceil(1.5 * 1 / 3) = 1, nobody at it: w1; 2nd: ceil(1.5 * 2 / 3) = 1,
    # w1 at it: w2 (the next cheapest); 3rd: ceil(1.5 * 3 / 3) = 2, nobody at it: w1; 4th:
    # 2, w1 at it: w2; 5th: ceil(2.5) = 3: w1; 6th: 3, w1 at it: w2
    assert chosen == ["w1", "w2", "w1", "w2", "w1", "w2"]
    unbounded = KvPolicy(index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED)
    assert {unbounded.select(req(prompt), WORKERS).worker for _ in range(6)} == {"w1"}


def test_the_bound_lifts_while_the_whole_fleet_is_idle() -> None:
    """A lone client's requests, each finished before the next, all go where their prefix is:
    the holder is over its share, but with nothing in flight anywhere the request delays
    nobody. Once any worker is busy the shares count again, the holder's idleness aside."""
    index, load, _, prompt = kv_setup()
    policy = KvPolicy(
        index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED, share_bound=1.5, share_window=4
    )
    chosen = []
    for i in range(6):
        chosen.append(policy.select(req(prompt), WORKERS).worker)
        load.start(f"r{i}", chosen[-1], prefill_tokens=0, blocks=0)
        load.finish(f"r{i}")
    assert chosen == ["w1"] * 6
    # w0 busy, w1 idle but holding 6 of the 6 decisions: left out, w2 (2 blocks cached) next
    load.start("busy", "w0", prefill_tokens=0, blocks=0)
    assert policy.select(req(prompt), WORKERS).worker == "w2"


def test_the_cap_moves_a_request_only_to_an_idle_worker() -> None:
    """With every worker it would keep busy the cap leaves nobody out: a request moved off
    its prefix's worker would recompute the prefix behind a queue, so the cost decides. Once
    one of them is idle, the holder over its share is left out."""
    index, load, _, prompt = kv_setup()
    policy = KvPolicy(
        index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED, share_bound=1.5, share_window=4
    )
    load.start("a", "w0", prefill_tokens=0, blocks=0)
    load.start("b", "w2", prefill_tokens=0, blocks=0)
    chosen = []
    for i in range(4):  # w1 at its capacity from the 2nd on (ceil(1.5 x 2 / 3) = 1)
        chosen.append(policy.select(req(prompt), WORKERS).worker)
        load.start(f"r{i}", chosen[-1], prefill_tokens=0, blocks=0)
    assert chosen == ["w1"] * 4
    load.finish("a")  # w0 idle: w1 (4 of 4) is left out, and w2's 2 cached blocks win
    assert policy.select(req(prompt), WORKERS).worker == "w2"


def test_near_ties_go_to_workers_below_their_fair_share() -> None:
    """Prompts nobody caches on an idle fleet tie exactly at temperature 0: with shares each
    goes to a worker below its fair share, so 3 workers take 2 of 6 each; without, the
    tie-break's draw (this seed) piles them up."""
    index, load, _, _ = kv_setup()

    def route(policy: KvPolicy) -> list[str]:
        return [policy.select(req([900 + i] * 8), WORKERS).worker for i in range(6)]

    fair = route(KvPolicy(index, load, block_size=4, hash_seed=1, seed=3, share_bound=3.0))
    assert sorted(fair) == ["w0", "w0", "w1", "w1", "w2", "w2"]
    assert len(set(fair[:3])) == len(set(fair[3:])) == 3
    drawn = route(KvPolicy(index, load, block_size=4, hash_seed=1, seed=3))
    assert max(drawn.count(w) for w in WORKERS) > 2


def test_a_cheaper_worker_over_its_fair_share_still_wins() -> None:
    """Fair shares steer only near-ties: w1, caching 6 of the prompt's 8 blocks, takes the
    second request too though it holds the only decision so far (its hard capacity at 3.0
    is ceil(3 x 2 / 3) = 2)."""
    index, load, _, prompt = kv_setup()
    policy = KvPolicy(
        index, load, block_size=4, hash_seed=DEFAULT_HASH_SEED, share_bound=3.0, share_window=4
    )
    for i in range(2):
        assert policy.select(req(prompt), WORKERS).worker == "w1"
        load.start(f"r{i}", "w1", prefill_tokens=0, blocks=0)


@pytest.mark.parametrize("bound", [0.5, 1.0, -2.0])
def test_a_share_bound_at_or_below_one_is_refused(bound: float) -> None:
    index, load, _, _ = kv_setup()
    with pytest.raises(ValueError, match="share bound must be 0"):
        make_policy(
            "kv",
            index=index,
            load=load,
            block_size=4,
            hash_seed=0,
            overlap_weight=1.0,
            temperature=0.0,
            seed=0,
            routed_ttl_s=0.0,
            routed_max_entries=1,
            share_bound=bound,
        )


@settings(max_examples=200, deadline=None)
@given(
    num_workers=st.integers(1, 6),
    window=st.integers(1, 8),
    bound=st.sampled_from([1.01, 1.05, 1.08, 1.5, 2.0]),
    preferences=st.lists(st.integers(0, 5), min_size=1, max_size=400),
)
def test_a_share_bound_caps_every_workers_count_over_the_whole_run(
    num_workers: int, window: int, bound: float, preferences: list[int]
) -> None:
    """Whatever the costs prefer (here: the preferred worker when allowed, else the last
    allowed one), after t = q x L + r decisions no worker has more than ceil(c r / W) +
    q ceil(c (L + 1) / W): the whole run's skew is within c + (c q + W (q + 1)) / t."""
    workers = [f"w{i}" for i in range(num_workers)]
    shares = RecentShares(window)
    counts = dict.fromkeys(workers, 0)
    for preferred in preferences:
        allowed = shares.bounded(workers, bound)
        choices = list(range(num_workers)) if allowed is None else allowed
        index = preferred % num_workers
        chosen = workers[index if index in choices else choices[-1]]
        shares.record(chosen, num_workers)
        counts[chosen] += 1
    decisions = len(preferences)
    span = window * num_workers
    full, rest = divmod(decisions - 1, span)
    rest += 1  # 0 < rest <= span
    cap = math.ceil(bound * rest / num_workers) + full * math.ceil(bound * (span + 1) / num_workers)
    assert max(counts.values()) <= cap
    skew = max(counts.values()) / (decisions / num_workers)
    assert skew <= bound + (bound * full + num_workers * (full + 1)) / decisions + 1e-9
