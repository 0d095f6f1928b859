"""The native hashing extension: its XXH3-64 against the `xxhash` package at every input
length path, and whole-prompt hashing against the pure-Python reference."""

from __future__ import annotations

import random

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from armature.kv import (
    _native,
    hashing,
)
from armature.kv.hashing import compute_block_hashes, compute_block_hashes_py, compute_seq_hashes


def test_the_install_built_the_native_path() -> None:
    assert hashing.has_native_hashing()


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
    expected = compute_block_hashes_py(tokens, block_size, seed, parent)
    assert compute_block_hashes(tokens, block_size, seed, parent) == expected
    assert compute_seq_hashes(tokens, block_size, seed, parent) == [s for s, _ in expected]
    assert compute_seq_hashes(tuple(tokens), block_size, seed, parent) == [s for s, _ in expected]


def test_native_rejects_bad_input_like_python() -> None:
    for bad in ([2**32], [-1], ["a"]):
        with pytest.raises(ValueError, match="unsigned 32-bit"):
            compute_seq_hashes(bad, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size must be positive"):
        compute_seq_hashes([1, 2], 0)
    with pytest.raises(TypeError):
        compute_seq_hashes(5, 1)  # type: ignore[arg-type]
    # A partial block is never read, so its contents are never validated either.
    assert compute_seq_hashes([1, 2**40], 4) == []
