"""KV cache events (DESIGN §3). Emitted by a worker's block pool, consumed by routers.

`event_id` increases by exactly one per worker; a consumer that sees a gap asks for a dump.
"""

from __future__ import annotations

import enum

import msgspec

__all__ = ["KvCleared", "KvDump", "KvEvent", "KvRemoved", "KvStored", "KvTier", "StoredBlock"]


class KvTier(enum.StrEnum):
    """Where a KV block lives (G1..G4 in the docs); on the wire as its value."""

    DEVICE = "device"  # G1: the engine's own KV memory (GPU, or CPU for a CPU engine)
    HOST = "host"  # G2: host RAM
    DISK = "disk"  # G3: local disk
    EXTERNAL = "external"  # G4: a shared remote store


class StoredBlock(msgspec.Struct, frozen=True, gc=False):
    """Two ints: never in a reference cycle, so not tracked by the cyclic collector (half the
    cost to make; an engine makes one per cached block)."""

    seq_hash: int
    local_hash: int


class KvStored(msgspec.Struct, frozen=True, tag="stored"):
    event_id: int
    parent_hash: int | None  # seq_hash of the block before blocks[0]; None at sequence start
    blocks: list[StoredBlock]
    tier: KvTier = KvTier.DEVICE


class KvRemoved(msgspec.Struct, frozen=True, tag="removed"):
    event_id: int
    seq_hashes: list[int]
    tier: KvTier = KvTier.DEVICE


class KvCleared(msgspec.Struct, frozen=True, tag="cleared"):
    event_id: int


KvEvent = KvStored | KvRemoved | KvCleared


class KvDump(msgspec.Struct, frozen=True):
    """Every block a worker caches, as of its event `last_event_id` (the answer to a gap):
    `seq_hashes` in its device cache (G1), `tier_seq_hashes` in each lower tier it has (absent
    from dumps of workers that predate tiers, or have none)."""

    seq_hashes: list[int]
    last_event_id: int
    tier_seq_hashes: dict[KvTier, list[int]] = msgspec.field(default_factory=dict)
