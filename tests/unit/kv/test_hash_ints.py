"""Hashes cross into every C extension as Python ints in [0, 2**64) (kv/pyint.h `as_u64`):
each keeps the whole 64 bits, and refuses a negative int, one of 65 bits or more, or a
non-int, as its Python counterpart does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.backends import Backend
from armature.kv.block_pool import make_block_pool
from armature.kv.hashing import HashBackend, compute_block_hashes, has_native_hashing
from armature.kv.native_block_pool import has_native_pool
from armature.protocols.kv_events import KvStored, StoredBlock
from armature.router.holder_store import _index
from armature.router.index_backend import IndexBackend
from armature.router.prefix_index import PrefixIndex
from armature.router.routed_index import _routed, make_routed_index

# bounds of each 30-bit digit count, and of 64 bits
EDGES = [0, 1, 2**30 - 1, 2**30, 2**60 - 1, 2**60, 2**63, 2**64 - 2, 2**64 - 1]
HASHES = st.sampled_from(EDGES) | st.integers(min_value=0, max_value=2**64 - 1)
BAD = [-1, -(2**64), 2**64, 2**64 + 1, 2**90, 2**200]

needs_index = pytest.mark.skipif(_index is None, reason="armature.router._index was not built")
needs_routed = pytest.mark.skipif(_routed is None, reason="armature.router._routed was not built")
needs_pool = pytest.mark.skipif(not has_native_pool(), reason="armature.kv._pool was not built")
needs_hashing = pytest.mark.skipif(not has_native_hashing(), reason="kv._native was not built")


def _stored(hashes: list[int]) -> KvStored:
    return KvStored(0, None, [StoredBlock(h, h) for h in hashes])


@needs_index
@given(st.lists(HASHES, min_size=1, max_size=8, unique=True))
def test_the_index_keeps_every_bit(hashes: list[int]) -> None:
    index = PrefixIndex(IndexBackend.NATIVE)
    index.add_worker("w", 64)
    assert index.apply("w", _stored(hashes))
    assert index.find_overlaps(hashes) == {"w": len(hashes)}
    flipped = [hashes[0] ^ (1 << 63)]  # the top bit is part of the key
    assert index.find_overlaps(flipped) == ({"w": 1} if flipped[0] in hashes else {})


@needs_index
@pytest.mark.parametrize("bad", [*BAD, "1", 1.0])
def test_the_index_refuses_what_is_not_a_64_bit_hash(bad: object) -> None:
    index = PrefixIndex(IndexBackend.NATIVE)
    index.add_worker("w", 64)
    with pytest.raises(ValueError):
        index.apply("w", _stored([1, bad]))  # type: ignore[list-item]
    assert index.find_overlaps([1]) == {}
    held = PrefixIndex(IndexBackend.NATIVE)
    held.add_worker("w", 64)
    assert held.apply("w", _stored([1]))
    with pytest.raises(ValueError):  # the walk reads the second hash: the first is held
        held.find_overlaps([1, bad])  # type: ignore[list-item]


@needs_routed
@given(st.lists(HASHES, min_size=1, max_size=8, unique=True))
def test_routed_predictions_keep_every_bit(hashes: list[int]) -> None:
    routed = make_routed_index(60.0, 1000, IndexBackend.NATIVE)
    routed.record("w", hashes, now_s=0.0)
    assert routed.find_overlaps(hashes, now_s=1.0) == {"w": len(hashes)}


@needs_routed
@pytest.mark.parametrize("bad", BAD)
def test_routed_predictions_refuse_what_is_not_a_64_bit_hash(bad: int) -> None:
    routed = make_routed_index(60.0, 1000, IndexBackend.NATIVE)
    with pytest.raises(ValueError):
        routed.record("w", [1, bad], now_s=0.0)
    assert routed.find_overlaps([1], now_s=1.0) == {}


@needs_pool
@given(st.lists(HASHES, min_size=1, max_size=8, unique=True))
def test_the_pool_keeps_every_bit(hashes: list[int]) -> None:
    pool = make_block_pool(16, 4, backend=Backend.NATIVE)
    blocks = pool.allocate(len(hashes))
    pool.cache_blocks(blocks, [(h, h) for h in hashes], None)
    assert [pool.get_cached_block(h) for h in hashes] == blocks


@needs_pool
@pytest.mark.parametrize("bad", BAD)
def test_the_pool_refuses_what_is_not_a_64_bit_hash(bad: int) -> None:
    pool = make_block_pool(16, 4, backend=Backend.NATIVE)
    blocks = pool.allocate(2)
    with pytest.raises(ValueError):
        pool.cache_blocks(blocks, [(1, 1), (bad, 1)], None)


@needs_hashing
@given(HASHES, HASHES)
def test_hashing_takes_every_seed_and_parent_as_python_does(seed: int, parent: int) -> None:
    tokens = list(range(12))
    native = compute_block_hashes(tokens, 4, seed, parent, backend=HashBackend.NATIVE)
    assert native == compute_block_hashes(tokens, 4, seed, parent, backend=HashBackend.PYTHON)


@needs_hashing
@pytest.mark.parametrize("bad", BAD)
def test_hashing_refuses_a_seed_or_parent_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        compute_block_hashes([1, 2, 3, 4], 4, bad, backend=HashBackend.NATIVE)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        compute_block_hashes([1, 2, 3, 4], 4, 0, bad, backend=HashBackend.NATIVE)
