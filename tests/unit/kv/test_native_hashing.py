"""The native hashing extension: its XXH3-64 against the `xxhash` package at every input
length path, and whole-prompt hashing against the pure-Python backend.

Skipped as a whole where the extension was not built (no C compiler at install); the
pure-Python backend is tested everywhere, in test_hashing_backends.py.
"""

from __future__ import annotations

import array
import random

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from armature.kv.hashing import (
    HashBackend,
    compute_block_and_seq_hashes,
    compute_block_hashes,
    compute_seq_hashes,
    get_token_id_range,
)

_native = pytest.importorskip(
    "armature.kv._native",
    reason="armature.kv._native was not built (no C compiler at install): pure-Python hashing",
)

NATIVE, PYTHON = HashBackend.NATIVE, HashBackend.PYTHON


@pytest.mark.parametrize("seed", [0, 1337, 2**64 - 1, 0x0123456789ABCDEF])
def test_xxh3_matches_reference_at_every_length(seed: int) -> None:
    rng = random.Random(seed & 0xFFFF)
    # 0-16, 17-128, 129-240 and the long path's block boundaries (1024-byte blocks, stripes).
    lengths = [*range(300), 1023, 1024, 1025, 2047, 2048, 2049, 4096, 10_000]
    for length in lengths:
        data = rng.randbytes(length)
        assert _native.xxh3_64(data, seed) == xxhash.xxh3_64_intdigest(data, seed), length


token_lists = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=200)


@given(
    token_lists,
    st.integers(min_value=1, max_value=70),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.none() | st.integers(min_value=0, max_value=2**64 - 1),
)
def test_native_prompt_hashing_matches_python(
    tokens: list[int], block_size: int, seed: int, parent: int | None
) -> None:
    expected = compute_block_hashes(tokens, block_size, seed, parent, backend=PYTHON)
    assert compute_block_hashes(tokens, block_size, seed, parent, backend=NATIVE) == expected
    seqs = [s for s, _ in expected]
    assert compute_seq_hashes(tokens, block_size, seed, parent, backend=NATIVE) == seqs
    assert compute_seq_hashes(tuple(tokens), block_size, seed, parent, backend=NATIVE) == seqs
    # The default backend is the native one here.
    assert compute_block_hashes(tokens, block_size, seed, parent) == expected
    if parent is None:
        for backend in (NATIVE, PYTHON):
            both = compute_block_and_seq_hashes(tokens, block_size, seed, backend=backend)
            assert both == (expected, seqs)
    with pytest.raises(ValueError, match="with_local must be 0, 1 or 2"):
        _native.hash_blocks(tokens, block_size, seed, parent, 3)


@given(token_lists, st.integers(min_value=1, max_value=20), st.data())
def test_a_u32_buffer_hashes_and_ranges_as_its_list(
    tokens: list[int], block_size: int, data: st.DataObject
) -> None:
    """array('I') and numpy uint32 prompts are read as they are (no int objects), with the
    list's results; other buffers (signed, float, bytes) go through the items as before."""
    start = data.draw(st.integers(min_value=0, max_value=len(tokens)))
    pairs = compute_block_hashes(tokens, block_size, start=start)
    expected_range = (min(tokens), max(tokens)) if tokens else None
    for ids in (array.array("I", tokens), np.array(tokens, dtype=np.uint32)):
        assert compute_block_hashes(ids, block_size, start=start) == pairs
        assert compute_seq_hashes(ids, block_size) == compute_seq_hashes(tokens, block_size)
        assert _native.token_id_range(ids) == expected_range
    with pytest.raises(ValueError, match="start must be in"):
        compute_block_hashes(array.array("I", tokens), block_size, start=len(tokens) + 1)
    small = [t % 2**31 for t in tokens]
    signed = array.array("i", small)
    assert compute_block_hashes(signed, block_size) == compute_block_hashes(small, block_size)
    assert _native.token_id_range(array.array("f")) is None


@given(st.lists(st.integers(min_value=0, max_value=2**60 - 1), min_size=1, max_size=300))
def test_token_id_range_is_min_and_max(tokens: list[int]) -> None:
    assert _native.token_id_range(tokens) == (min(tokens), max(tokens))
    assert get_token_id_range(tokens) == (min(tokens), max(tokens))


def test_token_id_range_leaves_other_items_to_python() -> None:
    # negatives, bools, large ints and other types: None, and the wrapper's min/max decide
    for tokens in ([3, -1], [True, 4], [2**70, 1], [1.5, 2]):
        assert _native.token_id_range(tokens) is None
        assert get_token_id_range(tokens) == (min(tokens), max(tokens))
    assert _native.token_id_range([]) is None
    with pytest.raises(TypeError):
        _native.token_id_range(5)


@given(
    st.text(max_size=40),
    st.integers(min_value=0, max_value=10**13),
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=1, max_value=2**64 - 1),
)
def test_mock_tokens_are_xxhash_of_id_and_position(
    request_id: str, start: int, count: int, seed: int, vocab_size: int
) -> None:
    prefix = f"{request_id}/".encode()
    expected = [
        xxhash.xxh3_64_intdigest(f"{request_id}/{p}".encode(), seed=seed) % vocab_size
        for p in range(start, start + count)
    ]
    assert _native.mock_tokens(prefix, start, start + count, seed, vocab_size) == expected


def test_mock_tokens_refuse_bad_arguments() -> None:
    for args in [(b"a/", -1, 2, 0, 10), (b"a/", 3, 2, 0, 10), (b"a/", 0, 2, 0, 0)]:
        with pytest.raises(ValueError, match="start <= stop"):
            _native.mock_tokens(*args)
    with pytest.raises(ValueError, match="1024 bytes"):
        _native.mock_tokens(b"x" * 1025, 0, 1, 0, 10)
