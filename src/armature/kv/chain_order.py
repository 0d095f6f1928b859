"""`children_first`: a batch of chained block keys in the order a recency list wants them.

A lower tier renews the blocks it just stored or served by moving them to its most recent end
one after another, so the last moved is the most recent. Moved in a prompt's order (parents
first), a prompt's first block would be its least recent and go first, leaving the rest of the
prompt stored and of no use: a prefix lookup stops at its first missing block.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from armature.kv.block_key import BlockKey

__all__ = ["children_first"]


def children_first(keys: Sequence[BlockKey]) -> list[BlockKey]:
    """`keys`, each once (where it last is), each after every key of the batch that extends it
    (its children, theirs...) and otherwise in the order given: a parent waits for its last
    child. O(len).

    A prompt's blocks (0, 1, 2) come back (2, 1, 0); blocks already children first, as the
    pool evicts them, and unrelated blocks keep their order. A key in a cycle (only a hash
    collision makes one) is left out."""
    if len(keys) < 2:
        return list(keys)
    by_hash: dict[int, BlockKey] = {}  # each key at its last place: its last use
    for key in keys:
        by_hash.pop(key.seq_hash, None)
        by_hash[key.seq_hash] = key
    num_waiting_children: dict[int, int] = {}  # a key of the batch -> its children not out
    for key in by_hash.values():
        parent = key.parent_hash
        if parent is not None and parent in by_hash:
            num_waiting_children[parent] = num_waiting_children.get(parent, 0) + 1
    waiting: set[int] = set()  # keys reached while some of their children were not out
    out: list[BlockKey] = []
    for key in by_hash.values():
        if num_waiting_children.get(key.seq_hash, 0):
            waiting.add(key.seq_hash)
            continue
        out.append(key)
        parent = key.parent_hash
        # the parents this key was the last child of, up the chain, follow it
        while parent is not None and parent in by_hash:
            num_waiting_children[parent] -= 1
            if num_waiting_children[parent] or parent not in waiting:
                break
            waiting.discard(parent)
            out.append(by_hash[parent])
            parent = by_hash[parent].parent_hash
    return out
