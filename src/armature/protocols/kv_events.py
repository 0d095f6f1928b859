"""KV cache events (DESIGN §3). Emitted by a worker's block pool, consumed by routers.

`event_id` increases by exactly one per worker; a consumer that sees a gap asks for a dump.
"""

from __future__ import annotations

import enum

import msgspec

__all__ = [
    "DUMP_PART_HASHES",
    "KvCleared",
    "KvDump",
    "KvEvent",
    "KvRemoved",
    "KvStored",
    "KvTier",
    "StoredBlock",
    "merge_dumps",
    "split_dump",
]

# hashes in one part of a dump sent over a request plane: ~9 bytes each in msgpack, so a
# part stays far below NATS's default 1 MiB message (a dump of 116k blocks or more, one
# message, could never cross it, and the router's index stayed stale)
DUMP_PART_HASHES = 50_000


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


def split_dump(dump: KvDump, part_hashes: int = DUMP_PART_HASHES) -> list[KvDump]:
    """`dump` as parts of at most `part_hashes` hashes each (at least one part), every one
    with its `last_event_id`: G1's hashes first, then each tier's, in order."""
    parts = [
        KvDump(dump.seq_hashes[i : i + part_hashes], dump.last_event_id)
        for i in range(0, len(dump.seq_hashes), part_hashes)
    ]
    for tier, hashes in dump.tier_seq_hashes.items():  # a tier with none keeps its part
        parts += [
            KvDump([], dump.last_event_id, {tier: hashes[i : i + part_hashes]})
            for i in range(0, max(len(hashes), 1), part_hashes)
        ]
    return parts or [KvDump([], dump.last_event_id, dict(dump.tier_seq_hashes))]


def merge_dumps(parts: list[KvDump]) -> KvDump:
    """The dump `split_dump` cut into `parts` (one part: itself)."""
    if len(parts) == 1:
        return parts[0]
    tiers: dict[KvTier, list[int]] = {}
    for part in parts:
        for tier, hashes in part.tier_seq_hashes.items():
            tiers.setdefault(tier, []).extend(hashes)
    seq_hashes = [h for part in parts for h in part.seq_hashes]
    return KvDump(seq_hashes, parts[0].last_event_id, tiers)
