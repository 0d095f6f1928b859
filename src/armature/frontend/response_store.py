"""The Responses API's memory: responses kept for `previous_response_id` and GET, bounded in
count and age. Pure: the caller passes the time (`now_s`, monotonic seconds).

    oldest ─▶ [id0][id1][id2] ... [idN] ◀─ newest        (insertion order = age order)
              └ dropped first when full or older than the TTL

A response made with `store: false` leaves only its id (a tombstone, bounded the same way),
so a later reference to it is told why it is missing rather than "unknown".
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Missing", "ResponseStore"]

V = TypeVar("V")


class Missing(enum.Enum):
    """Why an id has no stored value."""

    UNKNOWN = "unknown"  # never made here, deleted, pushed out, or expired long ago
    EXPIRED = "expired"  # older than the TTL (noticed at this lookup)
    NOT_STORED = "not_stored"  # made with store: false


@dataclass(frozen=True)
class _Entry(Generic[V]):
    stored_at_s: float
    value: V | None  # None: a tombstone of a store: false response


class ResponseStore(Generic[V]):
    """At most `max_entries` ids (values and tombstones together), each forgotten
    `ttl_s` after it was put. Not thread-safe: one event loop owns it."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        assert max_entries >= 1 and ttl_s > 0
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, _Entry[V]] = OrderedDict()

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def put(self, key: str, value: V, now_s: float) -> None:
        """Keep `value` under `key`; drops expired entries, then the oldest past the bound."""
        self._insert(key, _Entry(now_s, value), now_s)

    def put_tombstone(self, key: str, now_s: float) -> None:
        """Remember that `key` was made and not kept (store: false)."""
        self._insert(key, _Entry(now_s, None), now_s)

    def get(self, key: str, now_s: float) -> V | Missing:
        """The value under `key`, or why there is none. An expired entry is dropped here."""
        entry = self._entries.get(key)
        if entry is None:
            return Missing.UNKNOWN
        if now_s - entry.stored_at_s >= self.ttl_s:
            del self._entries[key]
            return Missing.EXPIRED
        return Missing.NOT_STORED if entry.value is None else entry.value

    def delete(self, key: str, now_s: float) -> bool:
        """Forget `key`; False when nothing live was stored under it."""
        found = self.get(key, now_s)
        if isinstance(found, Missing):
            return False
        del self._entries[key]
        return True

    def get_keys(self) -> list[str]:
        """The ids held, oldest first (expired ones not yet dropped included)."""
        return list(self._entries)

    def check_integrity(self) -> None:
        assert len(self._entries) <= self.max_entries
        times = [e.stored_at_s for e in self._entries.values()]
        assert times == sorted(times), "entries must be in age order"

    def _insert(self, key: str, entry: _Entry[V], now_s: float) -> None:
        assert key not in self._entries, f"response id {key!r} stored twice"
        while self._entries:
            _, oldest = next(iter(self._entries.items()))
            if now_s - oldest.stored_at_s < self.ttl_s and len(self._entries) < self.max_entries:
                break
            self._entries.popitem(last=False)
        self._entries[key] = entry
