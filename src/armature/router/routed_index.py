"""Prefixes the router assumes a worker holds because it just routed them there.

KV events only announce blocks once a worker has computed them; a repeat of a prefix that
arrives while the first request is still queued or prefilling would find nothing. Recording
each routing decision closes that window, and alone it is the event-less ("approximate") mode:
an entry lives for `ttl_s` after its last use and the whole map is bounded by `max_entries`
(oldest first out). Pure: the caller passes the time.

    entries:  (seq_hash, worker) -> expiry_s     (insertion order = pruning order)
    by_hash:  seq_hash -> {worker: expiry_s}
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["RoutedPrefixIndex"]


class RoutedPrefixIndex:
    def __init__(self, ttl_s: float, max_entries: int):
        if ttl_s <= 0 or max_entries <= 0:
            raise ValueError("ttl_s and max_entries must be > 0")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._by_hash: dict[int, dict[str, float]] = {}

    def record(self, worker: str, seq_hashes: Sequence[int], now_s: float) -> None:
        """`worker` was sent a prompt with these block hashes at `now_s`."""
        expiry = now_s + self.ttl_s
        for seq_hash in seq_hashes:
            key = (seq_hash, worker)
            self._entries.pop(key, None)
            self._entries[key] = expiry
            self._by_hash.setdefault(seq_hash, {})[worker] = expiry
        while len(self._entries) > self.max_entries:
            self._pop_oldest()

    def prune(self, now_s: float) -> None:
        """Drop expired entries. Every entry lives ttl_s from its last record and records come
        in time order, so insertion order is expiry order: stop at the first live one."""
        while self._entries:
            (_, _), expiry = next(iter(self._entries.items()))
            if expiry > now_s:
                return
            self._pop_oldest()

    def find_overlaps(self, seq_hashes: Sequence[int], now_s: float) -> dict[str, int]:
        """Leading blocks of `seq_hashes` each worker is assumed to hold (unexpired)."""
        overlaps: dict[str, int] = {}
        active: set[str] | None = None
        depth = 0
        for seq_hash in seq_hashes:
            holders = {w for w, exp in self._by_hash.get(seq_hash, {}).items() if exp > now_s}
            still = holders if active is None else active & holders
            for worker in (active or set()) - still:
                overlaps[worker] = depth
            active = still
            if not active:
                break
            depth += 1
        for worker in active or set():
            overlaps[worker] = depth
        return overlaps

    def get_num_entries(self) -> int:
        return len(self._entries)

    def _pop_oldest(self) -> None:
        (seq_hash, worker), _ = self._entries.popitem(last=False)
        holders = self._by_hash[seq_hash]
        del holders[worker]
        if not holders:
            del self._by_hash[seq_hash]
