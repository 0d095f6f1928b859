"""children_first: exact orders, and against a naive oracle over random forests of blocks."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from armature.kv.block_key import BlockKey
from armature.kv.chain_order import children_first


def key(seq_hash: int, parent_hash: int | None) -> BlockKey:
    return BlockKey(seq_hash, 1000 + seq_hash, parent_hash)


A0, A1, A2 = key(0, None), key(1, 0), key(2, 1)
B0, B1 = key(10, None), key(11, 10)


def test_a_prompt_in_its_order_comes_back_from_its_end() -> None:
    assert children_first([A0, A1, A2]) == [A2, A1, A0]


def test_blocks_already_children_first_and_unrelated_ones_keep_their_order() -> None:
    assert children_first([A2, A1, A0]) == [A2, A1, A0]
    assert children_first([B0, A0]) == [B0, A0]
    # two prompts interleaved: each parent right after its last child
    assert children_first([A0, B0, A1, B1, A2]) == [B1, B0, A2, A1, A0]


def test_a_parent_waits_for_its_last_child_and_a_key_is_placed_where_it_last_is() -> None:
    c1, d1 = key(21, 0), key(31, 0)  # two more children of A0
    assert children_first([A0, c1, A1, d1]) == [c1, A1, d1, A0]
    assert children_first([A1, A2, A1]) == [A2, A1]


def test_a_key_in_a_cycle_is_left_out() -> None:
    assert children_first([key(5, 5), A0]) == [A0]


def _naive(keys: list[BlockKey]) -> list[BlockKey]:
    """Repeatedly take the first key (each at its last place) none of the rest extends."""
    rest = list({k.seq_hash: k for k in reversed(keys)}.values())[::-1]
    out: list[BlockKey] = []
    while rest:
        parents = {k.parent_hash for k in rest}
        first = next(k for k in rest if k.seq_hash not in parents)
        out.append(first)
        rest.remove(first)
    return out


forests = st.lists(st.integers(0, 11), min_size=0, max_size=12).map(
    lambda picks: [key(i, None if p >= i else p) for i, p in enumerate(picks)]
)


@given(forests, st.randoms(use_true_random=False))
def test_children_first_matches_the_naive_oracle(
    blocks: list[BlockKey], rng: random.Random
) -> None:
    shuffled = list(blocks)
    rng.shuffle(shuffled)
    batch = shuffled + shuffled[: len(shuffled) // 3]  # some keys twice
    assert children_first(batch) == _naive(batch)
