"""RoutedPrefixIndex: predictions from routing decisions, with a TTL and a size bound. Every
behaviour test runs on both implementations (`make` builds the Python or the C one)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.kv.hashing import DEFAULT_HASH_SEED, compute_seq_hashes
from armature.router.index_backend import IndexBackend
from armature.router.load import ActiveLoad
from armature.router.policies import KvPolicy, RouteRequest
from armature.router.routed_index import (
    PyRoutedPrefixIndex,
    RoutedPrefixIndex,
    has_native_routed,
    make_routed_index,
)

Make = Callable[..., RoutedPrefixIndex]
NOT_BUILT = "armature.router._routed was not built (no C compiler at install)"


@pytest.fixture(
    params=[
        IndexBackend.PYTHON,
        pytest.param(
            IndexBackend.NATIVE,
            marks=pytest.mark.skipif(not has_native_routed(), reason=NOT_BUILT),
        ),
    ]
)
def make(request: pytest.FixtureRequest) -> Make:
    backend = request.param

    def build(ttl_s: float, max_entries: int) -> RoutedPrefixIndex:
        return make_routed_index(ttl_s, max_entries, backend)

    return build


def test_records_are_found_until_they_expire(make: Make) -> None:
    index = make(ttl_s=10.0, max_entries=100)
    index.record("a", [1, 2, 3], now_s=0.0)
    index.record("b", [1, 2], now_s=5.0)
    assert index.find_overlaps([1, 2, 3, 4], now_s=6.0) == {"a": 3, "b": 2}
    assert index.find_overlaps([1, 2, 3], now_s=12.0) == {"b": 2}  # a expired at 10
    index.prune(now_s=12.0)
    assert index.get_num_entries() == 2
    index.prune(now_s=20.0)
    assert index.get_num_entries() == 0
    assert index.find_overlaps([1], now_s=20.0) == {}


def test_a_record_that_expires_at_time_zero(make: Make) -> None:
    """An expiry of exactly 0.0 (the C table keeps +0.0 apart from its free-entry mark) is
    live before it, expired at it, and its decision's blocks are dropped then."""
    index = make(1.0, 100)
    index.record("a", [1, 2], now_s=-1.0)
    assert index.find_overlaps([1, 2], now_s=-0.5) == {"a": 2}
    assert index.find_overlaps([1, 2], now_s=0.0) == {}
    index.prune(now_s=0.0)
    assert index.get_num_entries() == 0


def test_a_new_record_refreshes_the_ttl(make: Make) -> None:
    index = make(ttl_s=10.0, max_entries=100)
    index.record("a", [1], now_s=0.0)
    index.record("a", [1], now_s=8.0)
    index.prune(now_s=15.0)
    assert index.find_overlaps([1], now_s=15.0) == {"a": 1}


def test_size_bound_drops_the_oldest_decisions(make: Make) -> None:
    index = make(ttl_s=100.0, max_entries=3)
    index.record("a", [1, 2], now_s=0.0)
    index.record("b", [7, 8], now_s=1.0)
    assert index.get_num_entries() == 2  # a's whole decision went first
    assert index.find_overlaps([1, 2], now_s=2.0) == {}
    assert index.find_overlaps([7, 8], now_s=2.0) == {"b": 2}


def test_dropping_a_refreshed_decision_keeps_the_refreshed_blocks(make: Make) -> None:
    index = make(ttl_s=10.0, max_entries=100)
    index.record("a", [1, 2, 3], now_s=0.0)
    index.record("a", [1], now_s=0.0)  # same time: expiries stay unique
    index.prune(now_s=10.0, max_decisions=1)
    assert index.get_num_entries() == 1
    assert index.find_overlaps([1, 2, 3], now_s=10.0) == {"a": 1}


def test_depth_search_matches_a_linear_scan(make: Make) -> None:
    rng = random.Random(5)
    index = make(ttl_s=10.0, max_entries=10**6)
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


def test_a_first_block_held_by_a_thousand_workers(make: Make) -> None:
    """More holders of one first block than the native lookup keeps on its stack (512): each
    one's depth, past what is known, until it expires."""
    index = make(ttl_s=10.0, max_entries=10**6)
    query = list(range(1, 41))
    # worker i was routed the query's first 1 + i % 40 blocks; the odd ones first, to expire
    for i in [*range(1, 1000, 2), *range(0, 1000, 2)]:
        index.record(f"w{i}", query[: 1 + i % 40], now_s=0.0 if i % 2 else 1.0)
    found = index.find_overlaps(query, now_s=10.5)
    assert found == {f"w{i}": 1 + i % 40 for i in range(0, 1000, 2)}
    known = {f"w{i}": 20 for i in range(1000)}
    deeper = index.find_overlaps(query, now_s=5.0, known=known)
    assert deeper == {f"w{i}": 1 + i % 40 for i in range(1000) if 1 + i % 40 > 20}


def test_invalid_settings(make: Make) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        make(ttl_s=0.0, max_entries=1)


def routed_policy(make: Make, now: list[float]) -> KvPolicy:
    """A kv policy with routed predictions only (no events), blocks of 4, at clock now[0]."""
    return KvPolicy(
        None,
        ActiveLoad(),
        block_size=4,
        hash_seed=DEFAULT_HASH_SEED,
        routed=make(60.0, 1000),
        clock=lambda: now[0],
    )


def test_kv_policy_without_events_follows_its_own_decisions(make: Make) -> None:
    now = [0.0]
    policy = routed_policy(make, now)
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


def test_kv_policy_records_the_sequence_hashes_it_is_given(make: Make) -> None:
    """Given a prompt's sequence hashes, the policy records those as the worker's prefix: a
    later request of that prompt, hashed from its tokens, follows it there."""
    policy = routed_policy(make, [0.0])
    workers = ["w0", "w1", "w2"]
    prompt = list(range(40))
    given = compute_seq_hashes(prompt, 4)
    first = policy.select(RouteRequest("a", [7] * 40, seq_hashes=given), workers)
    second = policy.select(RouteRequest("b", [*prompt, 99]), workers)
    assert (second.worker, second.overlap_blocks) == (first.worker, 10)


def test_kv_policy_needs_some_source_of_overlaps() -> None:
    with pytest.raises(ValueError, match="needs a prefix index"):
        KvPolicy(None, ActiveLoad(), block_size=4, hash_seed=DEFAULT_HASH_SEED)


def test_first_block_filter_loses_no_worker_under_eviction() -> None:
    rng = random.Random(9)
    index = PyRoutedPrefixIndex(ttl_s=3.0, max_entries=120)
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


def test_a_shrunk_bound_applies_at_the_next_record(make: Make) -> None:
    index = make(ttl_s=100.0, max_entries=10)
    index.record("a", [1, 2, 3], now_s=0.0)
    index.record("b", [4, 5], now_s=1.0)
    index.max_entries = 2
    assert index.get_num_entries() == 5
    index.record("c", [6], now_s=2.0)
    assert index.get_num_entries() == 1  # a's and b's decisions went, oldest first
    assert index.find_overlaps([6], now_s=3.0) == {"c": 1}
    with pytest.raises(ValueError):
        index.max_entries = 0


@pytest.mark.skipif(not has_native_routed(), reason=NOT_BUILT)
def test_the_native_index_refuses_what_is_not_a_block_hash() -> None:
    index = make_routed_index(10.0, 10, IndexBackend.NATIVE)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        index.record("a", [1, -1], now_s=0.0)
    with pytest.raises(TypeError):
        index.find_overlaps(["x"], now_s=0.0)
    assert index.get_num_entries() == 0


def test_the_native_index_is_refused_where_it_was_not_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from armature.router import routed_index
    from armature.router.index_backend import IndexBackendUnavailableError

    monkeypatch.setattr(routed_index, "_routed", None)
    assert not routed_index.has_native_routed()
    assert isinstance(make_routed_index(1.0, 10), PyRoutedPrefixIndex)  # the default falls back
    with pytest.raises(IndexBackendUnavailableError, match="ARMATURE_INDEX_BACKEND=python"):
        make_routed_index(1.0, 10, IndexBackend.NATIVE)


# ---- the C index against the Python one ------------------------------------------------------

# prompts as token lists from a few shared stems, hashed the way the router hashes them
_prompts = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(0, 2)), min_size=1, max_size=60
)
_op = st.tuples(
    st.sampled_from(["record", "find", "find_known", "prune", "prune_some", "shrink"]),
    st.integers(0, 5),  # worker
    st.integers(0, 10**6),  # which prompt, known depth, bound: taken modulo
    st.floats(0.0, 2.0),  # time step
)


def _prompt_hashes(stem: int, num_blocks: int, branch: int) -> list[int]:
    tokens = [stem * 1000 + i for i in range(num_blocks * 4)]
    if branch and num_blocks:
        tokens[-1] = 10**6 + branch  # the last block differs: a branch off the stem
    return compute_seq_hashes(tokens, 4, DEFAULT_HASH_SEED)


@pytest.mark.skipif(not has_native_routed(), reason=NOT_BUILT)
@settings(max_examples=300, deadline=None)
@given(
    prompts=_prompts,
    ops=st.lists(_op, min_size=1, max_size=80),
    ttl_s=st.sampled_from([0.5, 1.0, 3.0]),
    max_entries=st.integers(1, 60),
)
def test_the_native_index_equals_the_python_one(
    prompts: list[tuple[int, int, int]],
    ops: list[tuple[str, int, int, float]],
    ttl_s: float,
    max_entries: int,
) -> None:
    chains = [_prompt_hashes(*p) for p in prompts]
    python = make_routed_index(ttl_s, max_entries, IndexBackend.PYTHON)
    native = make_routed_index(ttl_s, max_entries, IndexBackend.NATIVE)
    now_s = 0.0
    for op, worker, number, step_s in ops:
        now_s += step_s
        chain = chains[number % len(chains)]
        name = f"w{worker}"
        if op == "record":
            for index in (python, native):
                index.record(name, chain, now_s)
        elif op in ("find", "find_known"):
            known = None
            if op == "find_known":
                known = {f"w{w}": (number >> w) % (len(chain) + 2) for w in range(0, 6, 2)}
            assert native.find_overlaps(chain, now_s, known) == python.find_overlaps(
                chain, now_s, known
            )
        elif op == "prune":
            for index in (python, native):
                index.prune(now_s)
        elif op == "prune_some":
            for index in (python, native):
                index.prune(now_s, number % 3)
        else:
            for index in (python, native):
                index.max_entries = 1 + number % 60
        assert native.get_num_entries() == python.get_num_entries()


def test_prompts_shorter_than_a_block_expire_cleanly(make: Make) -> None:
    """Two decisions with no block for one worker: dropping the second, after the first left
    the worker with no entry at all, is no error."""
    index = make(ttl_s=1.0, max_entries=10)
    index.record("a", [], now_s=0.0)
    index.record("a", [], now_s=0.5)
    index.prune(now_s=5.0)
    assert index.get_num_entries() == 0
    index.record("a", [7], now_s=6.0)
    assert index.find_overlaps([7], now_s=6.5) == {"a": 1}


@pytest.mark.skipif(not has_native_routed(), reason=NOT_BUILT)
def test_the_native_index_grown_to_megabytes() -> None:
    """A worker's table grown through many doublings (to megabytes, past armature/kv/bigmem.h's
    threshold for arrays mapped on their own): found, and expired to nothing."""
    index = make_routed_index(10.0, 1_000_000, IndexBackend.NATIVE)
    hashes = list(range(1, 200_001))  # 2**19 entries of 24 bytes
    index.record("a", hashes, now_s=0.0)
    index.record("b", hashes[:3], now_s=1.0)
    assert index.get_num_entries() == 200_003
    assert index.find_overlaps(hashes, now_s=2.0) == {"a": 200_000, "b": 3}
    index.prune(now_s=20.0)
    assert index.get_num_entries() == 0
    assert index.find_overlaps(hashes, now_s=20.0) == {}
