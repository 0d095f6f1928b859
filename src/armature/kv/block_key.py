"""A full KV block's identity outside the engine's pool: what a lower tier stores it under."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BlockKey"]


class BlockKey(NamedTuple):
    """`seq_hash` names the block and its whole prefix (DESIGN §3); `local_hash` is its own
    tokens' hash and `parent_hash` the seq_hash of the block before it (None at a sequence
    start): enough to re-announce the block in a Stored event."""

    seq_hash: int
    local_hash: int
    parent_hash: int | None
