"""KV cache events (DESIGN §3). Emitted by a worker's block pool, consumed by routers.

`event_id` increases by exactly one per worker; a consumer that sees a gap asks for a dump.
"""

from __future__ import annotations

import msgspec

__all__ = ["KvCleared", "KvDump", "KvEvent", "KvRemoved", "KvStored", "StoredBlock", "Tier"]

Tier = str  # "G1" engine memory, "G2" host, "G3" disk, "G4" remote


class StoredBlock(msgspec.Struct, frozen=True):
    seq_hash: int
    local_hash: int


class KvStored(msgspec.Struct, frozen=True, tag="stored"):
    event_id: int
    parent_hash: int | None  # seq_hash of the block before blocks[0]; None at sequence start
    blocks: list[StoredBlock]
    tier: Tier = "G1"


class KvRemoved(msgspec.Struct, frozen=True, tag="removed"):
    event_id: int
    seq_hashes: list[int]
    tier: Tier = "G1"


class KvCleared(msgspec.Struct, frozen=True, tag="cleared"):
    event_id: int


KvEvent = KvStored | KvRemoved | KvCleared


class KvDump(msgspec.Struct, frozen=True):
    """Every block a worker caches, as of its event `last_event_id` (the answer to a gap)."""

    seq_hashes: list[int]
    last_event_id: int
