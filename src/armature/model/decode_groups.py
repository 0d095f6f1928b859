"""Decode rows grouped by context length: pure.

Decode attention over a paged cache gathers each sequence's blocks and attends, padded and
masked, to its group's longest context, so a group costs about (sequences x its longest
context) key positions. One group for a whole batch makes a 32-token context pay for a
288-token one beside it; a group per sequence pays a fixed cost per group (a gather and an
attention call per layer) many times. The split here takes the context lengths in ascending
order and cuts them where a cut saves more padded positions than a group's fixed cost:

    cost(groups) = sum over groups of len(group) x max(group) + overhead_tokens x len(groups)

greedily, one best cut at a time, at most `max_groups` groups (O(sequences x groups)).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

__all__ = ["split_by_context"]


def _best_cut(lengths: Sequence[int], start: int, end: int) -> tuple[int, int]:
    """(padded positions saved, cut index) of the best cut of lengths[start:end] into two."""
    top = lengths[end - 1]
    best_saved, best_cut = 0, start
    for cut in range(start + 1, end):
        saved = (cut - start) * (top - lengths[cut - 1])
        if saved > best_saved:
            best_saved, best_cut = saved, cut
    return best_saved, best_cut


def split_by_context(
    lengths: Sequence[int], overhead_tokens: int, max_groups: int
) -> list[tuple[int, int]]:
    """[start, end) index ranges of `lengths` (ascending) as groups, in order: a cut is made
    where it saves more than `overhead_tokens` padded key positions, best first, until
    `max_groups` groups."""
    if any(b < a for a, b in itertools.pairwise(lengths)):
        raise ValueError("context lengths must be in ascending order")
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    groups = [(0, len(lengths))] if lengths else []
    while len(groups) < max_groups:
        saved, at, which = max(
            ((*_best_cut(lengths, a, b), i) for i, (a, b) in enumerate(groups)),
            default=(0, 0, 0),
        )
        if saved <= overhead_tokens:
            break
        a, b = groups[which]
        groups[which : which + 1] = [(a, at), (at, b)]
    return groups
