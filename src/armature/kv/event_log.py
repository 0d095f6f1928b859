"""One worker's KV event sequence (DESIGN §3): every component that caches blocks (the engine's
block pool, the lower KV tiers) appends here, so `event_id` increases by exactly one per worker
whatever tier an event is about."""

from __future__ import annotations

from collections.abc import Sequence

from armature.kv.block_key import BlockKey
from armature.protocols.kv_events import (
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
)

__all__ = ["KvEventLog"]


class KvEventLog:
    """Pure; one owner thread. Events wait here until `take` drains them."""

    def __init__(self) -> None:
        self._events: list[KvEvent] = []
        self._next_event_id = 0

    def get_last_event_id(self) -> int:
        """Id of the newest event emitted so far (-1 before the first)."""
        return self._next_event_id - 1

    def stored(self, parent_hash: int | None, blocks: list[StoredBlock], tier: KvTier) -> None:
        """`blocks` form one chain whose first block follows `parent_hash`."""
        self._events.append(KvStored(self._take_event_id(), parent_hash, blocks, tier))

    def stored_keys(self, keys: Sequence[BlockKey], tier: KvTier) -> None:
        """One Stored event per run of consecutive chained keys (each key's parent is the
        previous key's seq_hash)."""
        run: list[StoredBlock] = []
        run_parent: int | None = None
        prev: int | None = None
        for key in keys:
            if run and key.parent_hash != prev:
                self.stored(run_parent, run, tier)
                run = []
            if not run:
                run_parent = key.parent_hash
            run.append(StoredBlock(key.seq_hash, key.local_hash))
            prev = key.seq_hash
        if run:
            self.stored(run_parent, run, tier)

    def removed(self, seq_hashes: list[int], tier: KvTier) -> None:
        self._events.append(KvRemoved(self._take_event_id(), seq_hashes, tier))

    def cleared(self) -> None:
        self._events.append(KvCleared(self._take_event_id()))

    def take(self) -> list[KvEvent]:
        """Drain the events emitted since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def _take_event_id(self) -> int:
        event_id = self._next_event_id
        self._next_event_id += 1
        return event_id
