"""Block hashing (DESIGN §3): conformance vector, full blocks only, chaining, salt, seed."""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from armature.kv.hashing import (
    DEFAULT_HASH_SEED,
    chain_hash,
    compute_block_hashes,
    compute_local_hashes,
    hash_seed_for_salt,
)

# DESIGN §3 conformance vector, checked against Dynamo 1.6.1's own function.
CONFORMANCE_TOKENS = list(range(100, 148))
CONFORMANCE_LOCAL = [10823191264391160519, 1219978239041041138, 11579058346470406089]

token_lists = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=80)
block_sizes = st.integers(min_value=1, max_value=8)


def _spec_local(block: list[int], seed: int) -> int:
    """The spec, written out: xxh3_64(seed) of the block's token ids as little-endian u32."""
    data = b"".join(t.to_bytes(4, "little") for t in block)
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def _spec_chain(parent: int, local: int, seed: int) -> int:
    data = parent.to_bytes(8, "little") + local.to_bytes(8, "little")
    return xxhash.xxh3_64_intdigest(data, seed=seed)


# ---- conformance and seed ------------------------------------------------------------------


def test_conformance_vector() -> None:
    assert compute_local_hashes(CONFORMANCE_TOKENS, 16) == CONFORMANCE_LOCAL
    pairs = compute_block_hashes(CONFORMANCE_TOKENS, 16)
    assert [local for _, local in pairs] == CONFORMANCE_LOCAL


def test_conformance_sequence_hashes_follow_the_spec() -> None:
    seq = [h for h, _ in compute_block_hashes(CONFORMANCE_TOKENS, 16)]
    l0, l1, l2 = CONFORMANCE_LOCAL
    s1 = _spec_chain(l0, l1, 1337)
    s2 = _spec_chain(s1, l2, 1337)
    assert seq == [l0, s1, s2]
    assert len(set(seq)) == 3


def test_default_seed_is_1337() -> None:
    assert DEFAULT_HASH_SEED == 1337
    tokens = list(range(32))
    assert compute_local_hashes(tokens, 16) == compute_local_hashes(tokens, 16, seed=1337)
    assert compute_local_hashes(tokens, 16) != compute_local_hashes(tokens, 16, seed=1338)
    assert compute_local_hashes(tokens, 16) == [
        _spec_local(tokens[:16], 1337),
        _spec_local(tokens[16:], 1337),
    ]
    assert chain_hash(5, 7) == chain_hash(5, 7, seed=1337) == _spec_chain(5, 7, 1337)
    assert compute_block_hashes(tokens, 16) == compute_block_hashes(tokens, 16, seed=1337)


def test_tokens_are_little_endian_u32() -> None:
    block = [1, 2**32 - 1, 0x01020304, 0]
    expected = xxhash.xxh3_64_intdigest(
        b"\x01\x00\x00\x00\xff\xff\xff\xff\x04\x03\x02\x01\x00\x00\x00\x00", seed=1337
    )
    assert compute_local_hashes(block, 4) == [expected]


def test_token_outside_u32_is_rejected() -> None:
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        compute_local_hashes([2**32], 1)
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        compute_local_hashes([-1], 1)


@pytest.mark.parametrize("block_size", [0, -1, -16])
def test_non_positive_block_size_is_rejected(block_size: int) -> None:
    with pytest.raises(ValueError):
        compute_local_hashes(CONFORMANCE_TOKENS, block_size)
    with pytest.raises(ValueError):
        compute_block_hashes(CONFORMANCE_TOKENS, block_size)


# ---- full blocks only ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_tokens", "num_hashes"), [(0, 0), (1, 0), (15, 0), (16, 1), (17, 1), (47, 2), (48, 3)]
)
def test_partial_block_is_never_hashed(num_tokens: int, num_hashes: int) -> None:
    tokens = list(range(100, 100 + num_tokens))
    assert compute_local_hashes(tokens, 16) == CONFORMANCE_LOCAL[:num_hashes]
    assert len(compute_block_hashes(tokens, 16)) == num_hashes


def test_trailing_partial_block_does_not_change_full_block_hashes() -> None:
    full = compute_block_hashes(CONFORMANCE_TOKENS[:32], 16)
    for tail in ([7], [7, 8, 9], list(range(15))):
        assert compute_block_hashes(CONFORMANCE_TOKENS[:32] + tail, 16) == full


@given(tokens=token_lists, block_size=block_sizes)
def test_number_of_hashes_is_number_of_full_blocks(tokens: list[int], block_size: int) -> None:
    assert len(compute_local_hashes(tokens, block_size)) == len(tokens) // block_size
    assert len(compute_block_hashes(tokens, block_size)) == len(tokens) // block_size


# ---- chaining ------------------------------------------------------------------------------


@given(tokens=token_lists, block_size=block_sizes)
def test_sequence_hashes_chain(tokens: list[int], block_size: int) -> None:
    pairs = compute_block_hashes(tokens, block_size)
    local = compute_local_hashes(tokens, block_size)
    assert [lh for _, lh in pairs] == local
    seq = [sh for sh, _ in pairs]
    if seq:
        assert seq[0] == local[0]
        assert chain_hash(None, local[0]) == local[0]
    for i in range(1, len(seq)):
        assert seq[i] == chain_hash(seq[i - 1], local[i])
        assert seq[i] == _spec_chain(seq[i - 1], local[i], DEFAULT_HASH_SEED)


def test_sequence_hash_depends_on_the_prefix() -> None:
    # Same last block after different first blocks: same local hash, different sequence hash.
    a = compute_block_hashes([1] * 16 + [9] * 16, 16)
    b = compute_block_hashes([2] * 16 + [9] * 16, 16)
    assert a[1][1] == b[1][1]
    assert a[1][0] != b[1][0]


@given(tokens=token_lists, block_size=block_sizes, data=st.data())
def test_chaining_from_parent_equals_hashing_whole_sequence(
    tokens: list[int], block_size: int, data: st.DataObject
) -> None:
    whole = compute_block_hashes(tokens, block_size)
    num_blocks = len(whole)
    split = data.draw(st.integers(min_value=0, max_value=num_blocks), label="split")
    parent = whole[split - 1][0] if split > 0 else None
    rest = compute_block_hashes(tokens[split * block_size :], block_size, parent_seq_hash=parent)
    assert rest == whole[split:]


def test_chaining_from_parent_conformance() -> None:
    whole = compute_block_hashes(CONFORMANCE_TOKENS, 16)
    rest = compute_block_hashes(CONFORMANCE_TOKENS[16:], 16, parent_seq_hash=whole[0][0])
    assert rest == whole[1:]
    # Without the parent the first block of the tail is hashed as a sequence start.
    alone = compute_block_hashes(CONFORMANCE_TOKENS[16:], 16)
    assert alone[0] == (CONFORMANCE_LOCAL[1], CONFORMANCE_LOCAL[1])
    assert alone[0][0] != whole[1][0]


@given(tokens=token_lists, block_size=block_sizes, extra=token_lists)
def test_hashes_of_a_prefix_are_a_prefix_of_the_hashes(
    tokens: list[int], block_size: int, extra: list[int]
) -> None:
    short = compute_block_hashes(tokens, block_size)
    long = compute_block_hashes(tokens + extra, block_size)
    assert long[: len(short)] == short


# ---- salt ----------------------------------------------------------------------------------


def test_no_salt_gives_default_seed() -> None:
    assert hash_seed_for_salt(None) == DEFAULT_HASH_SEED
    assert hash_seed_for_salt("") == DEFAULT_HASH_SEED


def test_salt_seed_is_deterministic_and_distinct() -> None:
    seed_a = hash_seed_for_salt("lora-a")
    assert seed_a == hash_seed_for_salt("lora-a")
    assert seed_a == xxhash.xxh3_64_intdigest(b"lora-a", seed=DEFAULT_HASH_SEED)
    assert seed_a != DEFAULT_HASH_SEED
    assert seed_a != hash_seed_for_salt("lora-b")


def test_salt_changes_local_and_sequence_hashes() -> None:
    plain = compute_block_hashes(CONFORMANCE_TOKENS, 16)
    seed_a = hash_seed_for_salt("lora-a")
    salted_a = compute_block_hashes(CONFORMANCE_TOKENS, 16, seed=seed_a)
    salted_b = compute_block_hashes(CONFORMANCE_TOKENS, 16, seed=hash_seed_for_salt("lora-b"))
    assert compute_local_hashes(CONFORMANCE_TOKENS, 16, seed=seed_a) == [lh for _, lh in salted_a]
    for x, y, z in zip(plain, salted_a, salted_b, strict=True):
        assert x[0] != y[0] != z[0] != x[0]
        assert x[1] != y[1] != z[1] != x[1]
    # The salt seeds the chain step too, not only the local hashes.
    assert salted_a[1][0] == _spec_chain(salted_a[0][0], salted_a[1][1], seed_a)
    assert salted_a[1][0] != _spec_chain(salted_a[0][0], salted_a[1][1], DEFAULT_HASH_SEED)
