"""`PrefixIndex.find_token_overlaps`: the overlaps of a prompt's token ids, hashed a block at a
time as the native walk reaches them. Under hypothesis, both stores give exactly
`find_overlaps(compute_seq_hashes(...))` (block sizes on and off the C stack buffer, partial
trailing blocks, hash salts' seeds); the walk stops reading where no worker matches; the kv
policy's events-only path, which uses it, decides as the hashing path does; and
`--kv-routed-ttl-s 0` is what selects that path."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.config import RouterConfig
from armature.errors import ConfigError
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_seq_hashes
from armature.protocols.kv_events import KvStored, StoredBlock
from armature.router.cost import softmax_pick_py, worker_logits_py
from armature.router.holder_store import IndexBackend, has_native_index
from armature.router.load import ActiveLoad
from armature.router.policies import KvPolicy, RouteRequest, make_policy
from armature.router.prefix_index import PrefixIndex

NOT_BUILT = "armature.router._index was not built (no C compiler at install)"
BACKENDS = [
    pytest.param(
        IndexBackend.NATIVE,
        marks=pytest.mark.skipif(not has_native_index(), reason=NOT_BUILT),
    ),
    IndexBackend.PYTHON,
]
WORKERS = ["a", "b", "c"]


def indexed(
    backend: IndexBackend, held: dict[str, list[list[int]]], block_size: int, seed: int
) -> PrefixIndex:
    """An index whose workers each hold the full blocks of their prompts (one Stored event per
    prompt)."""
    index = PrefixIndex(backend)
    event_ids = dict.fromkeys(held, 0)
    for worker, prompts in held.items():
        index.add_worker(worker, 10_000)
        for tokens in prompts:
            hashes = compute_seq_hashes(tokens, block_size, seed)
            if not hashes:
                continue
            blocks = [StoredBlock(h, 0) for h in hashes]
            index.apply(worker, KvStored(event_ids[worker], None, blocks))
            event_ids[worker] += 1
    return index


# prompts built from a few shared stems, so that workers hold prefixes of each other's
TOKENS = st.lists(st.integers(0, 3), min_size=0, max_size=40)


def grow(stem: list[int], tail: list[int]) -> list[int]:
    return stem + tail


PROMPTS = st.builds(grow, st.sampled_from([[], [7, 7, 7, 7, 7, 7], [9] * 20]), TOKENS)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=200, deadline=None)
@given(
    held=st.fixed_dictionaries({w: st.lists(PROMPTS, max_size=3) for w in WORKERS}),
    queries=st.lists(PROMPTS, min_size=1, max_size=4),
    block_size=st.sampled_from([1, 3, 4, 16]),
    seed=st.sampled_from([DEFAULT_HASH_SEED, 0, 2**64 - 1]),
)
def test_token_overlaps_equal_the_overlaps_of_the_hashes(
    backend: IndexBackend,
    held: dict[str, list[list[int]]],
    queries: list[list[int]],
    block_size: int,
    seed: int,
) -> None:
    index = indexed(backend, held, block_size, seed)
    for tokens in queries + [p for prompts in held.values() for p in prompts]:
        expected = index.find_overlaps(compute_seq_hashes(tokens, block_size, seed))
        assert index.find_token_overlaps(tokens, block_size, seed) == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_larger_than_the_stack_buffer(backend: IndexBackend) -> None:
    """A block of 300 tokens (the C walk packs up to 256 on the stack, more on the heap)."""
    rng = random.Random(3)
    shared = [rng.randrange(50_000) for _ in range(900)]
    index = indexed(backend, {"a": [shared], "b": [shared[:600]]}, 300, DEFAULT_HASH_SEED)
    query = [*shared[:750], 1, 2, 3]
    assert index.find_token_overlaps(query, 300, DEFAULT_HASH_SEED) == {"a": 2, "b": 2}
    assert index.find_token_overlaps(shared, 300, DEFAULT_HASH_SEED) == {"a": 3, "b": 2}


@pytest.mark.skipif(not has_native_index(), reason=NOT_BUILT)
def test_the_native_walk_reads_no_token_past_the_last_match() -> None:
    """Token ids past the block where every worker's match ended are never read: a value no
    block hash could take there raises nothing, while the same value in a block the walk
    reaches is refused as the hashing refuses it."""
    index = indexed(IndexBackend.NATIVE, {"a": [[5] * 8]}, 4, DEFAULT_HASH_SEED)
    unread = [5] * 4 + [6] * 4 + [-1] * 4  # block 1 already differs from a's
    assert index.find_token_overlaps(unread, 4, DEFAULT_HASH_SEED) == {"a": 1}
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        index.find_token_overlaps([5] * 4 + [-1] * 4, 4, DEFAULT_HASH_SEED)
    with pytest.raises(ValueError, match="block_size must be positive"):
        index.find_token_overlaps([5] * 8, 0, DEFAULT_HASH_SEED)
    with pytest.raises(ValueError, match="seed"):
        index.find_token_overlaps([5] * 8, 4, -1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_only_policy_decides_as_the_hashing_path(backend: IndexBackend) -> None:
    """KvPolicy without routed predictions or tier weights takes the token walk; each decision
    (worker and overlap) equals the hashing path's: hashes, find_overlaps, the same cost and
    the same draw from the same random stream."""
    rng = random.Random(11)
    stems = [[rng.randrange(32_000) for _ in range(64)] for _ in range(4)]
    held = {w: [rng.choice(stems) + [rng.randrange(32_000) for _ in range(20)]] for w in WORKERS}
    index = indexed(backend, held, 16, DEFAULT_HASH_SEED)
    load = ActiveLoad()
    policy = KvPolicy(index, load, 16, DEFAULT_HASH_SEED, temperature=0.5, seed=5)
    reference = random.Random(5)
    for i in range(200):
        tokens = rng.choice(stems)[: rng.randrange(1, 65)] + [rng.randrange(32_000)] * 8
        decision = policy.select(RouteRequest(f"r{i}", tokens), WORKERS)
        overlaps = index.find_overlaps(compute_seq_hashes(tokens, 16, DEFAULT_HASH_SEED))
        logits = worker_logits_py(WORKERS, len(tokens), 16, overlaps, load.get_loads(), 1.0, 1.0)
        expected = WORKERS[softmax_pick_py(logits, 0.5, reference.random())]
        assert (decision.worker, decision.overlap_blocks) == (expected, overlaps.get(expected, 0))


@pytest.mark.parametrize(("ttl_s", "routed"), [(0.0, False), (120.0, True)])
def test_a_routed_ttl_of_zero_makes_the_kv_policy_events_only(ttl_s: float, routed: bool) -> None:
    policy = make_policy(
        "kv",
        index=PrefixIndex(),
        load=ActiveLoad(),
        block_size=16,
        hash_seed=DEFAULT_HASH_SEED,
        overlap_weight=1.0,
        temperature=0.0,
        seed=0,
        routed_ttl_s=ttl_s,
        routed_max_entries=100,
    )
    assert isinstance(policy, KvPolicy)
    assert (policy.routed is not None) is routed


def test_kv_approx_needs_routed_predictions() -> None:
    with pytest.raises(ConfigError, match="--kv-routed-ttl-s must be above 0"):
        RouterConfig(policy="kv-approx", routed_ttl_s=0.0)
    assert RouterConfig(policy="kv", routed_ttl_s=0.0).routed_ttl_s == 0.0
