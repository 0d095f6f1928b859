"""Prefixes the router assumes a worker holds because it just routed them there.

KV events only announce blocks once a worker has computed them; a repeat of a prefix that
arrives while the first request is still queued or prefilling would find nothing. Recording
each routing decision closes that window, and alone it is the event-less ("approximate") mode:
an entry lives for `ttl_s` after its last use and the whole map is bounded by `max_entries`
(oldest decisions first out). Pure: the caller passes the time.

    by_worker:  worker -> {seq_hash: expiry_s}
    by_first:   first block's seq_hash -> workers recorded with it   (the lookup's filter)
    decisions:  (expiry_s, worker, seq_hashes) in record order   (pruning order)

Every record covers a whole prefix (blocks 0..n) with one expiry, later records only raise
expiries, and a decision's entries are dropped only where it was their last record (expiries
are unique and increasing). So along any chain of hashes a worker's live entries form a
prefix, and a lookup binary-searches the depth of each worker recorded with the prompt's
first block: O(holders x log blocks) dict gets.
Recording is one C-level dict update. Both are on the router's hot path.

Two implementations give identical results for chained block hashes (a hash names its whole
prefix, so it is never both a first block and a later one; tests hold them equal under
hypothesis): `PyRoutedPrefixIndex` here, the reference, and the C table of
`armature.router._routed` (flat arrays instead of dicts of Python ints and floats, several
times faster). `make_routed_index` picks one as `armature.router.index_backend` says.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from typing import Protocol

from armature.router.index_backend import (
    BACKEND_ENV_VAR,
    IndexBackend,
    IndexBackendUnavailableError,
    resolve_backend,
)

try:
    from armature.router import _routed
except ImportError:  # built without a C compiler: the pure-Python index
    _routed = None  # type: ignore[assignment]

__all__ = ["PyRoutedPrefixIndex", "RoutedPrefixIndex", "has_native_routed", "make_routed_index"]

# Expired decisions dropped per record at most: each decision is dropped once, so this keeps
# up with any steady rate while bounding the work added to one routing decision.
_PRUNE_PER_RECORD = 2


class RoutedPrefixIndex(Protocol):
    """Routing decisions with a TTL and a size bound (see the module's comment). Pure: the
    caller passes the time."""

    max_entries: int  # the next record drops the oldest decisions down to it

    @property
    def ttl_s(self) -> float: ...

    def record(self, worker: str, seq_hashes: Sequence[int], now_s: float) -> None:
        """`worker` was sent a prompt with these block hashes at `now_s`."""
        ...

    def prune(self, now_s: float, max_decisions: int | None = None) -> None:
        """Drop expired decisions (at most `max_decisions` of them)."""
        ...

    def find_overlaps(
        self, seq_hashes: Sequence[int], now_s: float, known: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Leading blocks of `seq_hashes` each worker is assumed to hold (unexpired).
        `known`: blocks each worker is already known to hold; a worker assumed to hold no
        more than that is left out."""
        ...

    def get_num_entries(self) -> int:
        """Live (worker, block) entries."""
        ...


def has_native_routed() -> bool:
    """Whether armature.router._routed was built (and so is the default)."""
    return _routed is not None


def make_routed_index(
    ttl_s: float, max_entries: int, backend: IndexBackend | None = None
) -> RoutedPrefixIndex:
    """A routed index of `backend` (None: as `armature.router.index_backend` says)."""
    if resolve_backend(backend, _routed is not None) is IndexBackend.PYTHON:
        return PyRoutedPrefixIndex(ttl_s, max_entries)
    if _routed is None:
        raise IndexBackendUnavailableError(
            "armature.router._routed was not built (no C compiler at install); "
            f"use {BACKEND_ENV_VAR}=python"
        )
    index: RoutedPrefixIndex = _routed.RoutedTable(ttl_s, max_entries)
    return index


class PyRoutedPrefixIndex:
    def __init__(self, ttl_s: float, max_entries: int):
        if ttl_s <= 0 or max_entries <= 0:
            raise ValueError("ttl_s and max_entries must be > 0")
        self.ttl_s = ttl_s
        self._max_entries = max_entries
        self._by_worker: dict[str, dict[int, float]] = {}
        self._by_first: dict[int, set[str]] = {}
        self._decisions: deque[tuple[float, str, Sequence[int]]] = deque()
        self._num_entries = 0
        self._last_expiry_s = -math.inf

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @max_entries.setter
    def max_entries(self, max_entries: int) -> None:
        """The next record drops the oldest decisions down to it."""
        if max_entries <= 0:
            raise ValueError("max_entries must be > 0")
        self._max_entries = max_entries

    def record(self, worker: str, seq_hashes: Sequence[int], now_s: float) -> None:
        """`worker` was sent a prompt with these block hashes at `now_s`."""
        expiry = max(now_s + self.ttl_s, math.nextafter(self._last_expiry_s, math.inf))
        self._last_expiry_s = expiry
        entries = self._by_worker.setdefault(worker, {})
        before = len(entries)
        entries.update(dict.fromkeys(seq_hashes, expiry))
        self._num_entries += len(entries) - before
        self._decisions.append((expiry, worker, seq_hashes))
        if seq_hashes:
            self._by_first.setdefault(seq_hashes[0], set()).add(worker)
        while self._num_entries > self._max_entries:
            self._drop_oldest()
        self.prune(now_s, _PRUNE_PER_RECORD)

    def prune(self, now_s: float, max_decisions: int | None = None) -> None:
        """Drop expired decisions (at most `max_decisions` of them)."""
        dropped = 0
        decisions = self._decisions
        while decisions and decisions[0][0] <= now_s:
            if max_decisions is not None and dropped >= max_decisions:
                return
            self._drop_oldest()
            dropped += 1

    def find_overlaps(
        self, seq_hashes: Sequence[int], now_s: float, known: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """Leading blocks of `seq_hashes` each worker is assumed to hold (unexpired).
        `known`: blocks each worker is already known to hold (the event index's overlaps); a
        worker whose assumed prefix is no longer than that is left out, found with one lookup
        (the block after its known prefix) instead of a search."""
        overlaps: dict[str, int] = {}
        if not seq_hashes:
            return overlaps
        known = known or {}
        first, last = seq_hashes[0], seq_hashes[-1]
        num_blocks = len(seq_hashes)
        for worker in self._by_first.get(first, ()):
            get = self._by_worker[worker].get
            floor = known.get(worker, 0)
            if floor >= num_blocks or get(seq_hashes[floor], -math.inf) <= now_s:
                continue  # not beyond what is known (live entries form a prefix)
            if get(last, -math.inf) > now_s:
                overlaps[worker] = num_blocks
                continue
            # seq_hashes[live] is live, [dead] is not
            live, dead = floor, num_blocks - 1
            while dead - live > 1:
                mid = (live + dead) // 2
                if get(seq_hashes[mid], -math.inf) > now_s:
                    live = mid
                else:
                    dead = mid
            overlaps[worker] = live + 1
        return overlaps

    def get_num_entries(self) -> int:
        return self._num_entries

    def _drop_oldest(self) -> None:
        expiry, worker, seq_hashes = self._decisions.popleft()
        entries = self._by_worker.get(worker)
        if entries is None:
            return  # a prompt shorter than a block, its worker's entries all gone already
        # the entries not refreshed by a later record (C-level loops: a prompt has hundreds)
        now_expired = map(operator.eq, map(entries.get, seq_hashes), repeat(expiry))
        doomed = dict.fromkeys(compress(seq_hashes, now_expired))
        deque(map(entries.pop, doomed), maxlen=0)
        self._num_entries -= len(doomed)
        if seq_hashes and seq_hashes[0] not in entries:
            holders = self._by_first.get(seq_hashes[0])
            if holders is not None:
                holders.discard(worker)
                if not holders:
                    del self._by_first[seq_hashes[0]]
        if not entries:
            del self._by_worker[worker]
