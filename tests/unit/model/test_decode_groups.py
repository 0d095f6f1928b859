"""Decode rows grouped by context length (`model.decode_groups`): hand-worked cuts, the
limits, and that a split never costs more than one group (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from armature.model.decode_groups import split_by_context


def _cost(lengths: list[int], groups: list[tuple[int, int]], overhead: int) -> int:
    return sum((b - a) * lengths[b - 1] + overhead for a, b in groups)


def test_two_clusters_are_two_groups() -> None:
    # one group: 8 x 288 = 2304 positions; cut at 4: 4 x 32 + 4 x 288 = 1280 (saves 1024)
    assert split_by_context([32] * 4 + [288] * 4, 64, 3) == [(0, 4), (4, 8)]


def test_equal_lengths_stay_one_group() -> None:
    assert split_by_context([160] * 8, 64, 3) == [(0, 8)]


def test_cuts_best_first_while_they_save_more_than_a_group_costs() -> None:
    lengths = [64, 70, 100, 150, 200, 240, 240, 240]
    # first cut after 100 (3 x (240 - 100) = 420 saved); then after 150 in the upper group
    # (1 x 90); the lower group's best cut would save 2 x 30 = 60, under the 64 a group costs
    assert split_by_context(lengths, 64, 4) == [(0, 3), (3, 4), (4, 8)]
    assert split_by_context(lengths, 64, 2) == [(0, 3), (3, 8)]
    assert split_by_context(lengths, 500, 4) == [(0, 8)]  # no cut saves 500


def test_limits() -> None:
    assert split_by_context([], 64, 3) == []
    assert split_by_context([7], 64, 3) == [(0, 1)]
    assert split_by_context([1, 1000], 0, 1) == [(0, 2)]
    with pytest.raises(ValueError, match="ascending"):
        split_by_context([5, 3], 64, 3)
    with pytest.raises(ValueError, match="max_groups"):
        split_by_context([5], 64, 0)


@given(
    st.lists(st.integers(1, 4096), max_size=64).map(sorted),
    st.integers(0, 512),
    st.integers(1, 6),
)
def test_groups_cover_the_rows_in_order_and_never_cost_more(
    lengths: list[int], overhead: int, max_groups: int
) -> None:
    groups = split_by_context(lengths, overhead, max_groups)
    assert len(groups) <= max_groups
    assert [i for a, b in groups for i in range(a, b)] == list(range(len(lengths)))
    assert all(a < b for a, b in groups)
    if lengths:
        assert _cost(lengths, groups, overhead) <= _cost(lengths, [(0, len(lengths))], overhead)
