"""The block pool's eviction hook (DESIGN §6): what a lower KV tier sees before a cached block
is overwritten, so it can copy the block down first.

A block is evicted when `BlockPool.allocate` takes a free block that still holds a cached hash.
The pool tells its observer once per `allocate` call that evicts, before anything changes: the
blocks still hold their contents, hashes and cached-map entries, and no Removed event has been
emitted yet. Blocks that were never cached, blocks whose hash was forgotten by a prefix-cache
reset, and free cached blocks revived by a prefix hit are never reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["EvictedBlock", "EvictionObserver"]


@dataclass(frozen=True, slots=True)
class EvictedBlock:
    """One cached block about to be reused: where its contents are and what they are."""

    block_id: int  # index into the engine's KV block pool (where the contents live)
    seq_hash: int
    local_hash: int
    parent_hash: int | None  # seq_hash of the block before it; None at a sequence start
    num_hits: int = 0  # prefix-cache hits it served while cached in the pool


class EvictionObserver(Protocol):
    def on_evict(self, blocks: Sequence[EvictedBlock]) -> None:
        """`blocks` (non-empty, in eviction order: least recently freed first) are about to be
        overwritten. Called synchronously from `BlockPool.allocate` by the pool's owner; the
        observer may read the blocks' contents but must not call back into the pool. If it
        raises, the allocation fails and the pool is left unchanged."""
        ...
