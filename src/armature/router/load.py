"""Per-worker active load as the router sees it (DESIGN §4: track load on every path).

A routed request counts its uncached prompt tokens as prefill load until its first token, and
its blocks as decode load until it ends, whatever way it ends (finish, error, cancel): the
caller must call `finish` in a `finally`. Pure; one owner.

With frontend replicas, the load the other replicas add (`set_peer_loads`, from
router/shared_load.py) joins this router's own: `get`/`get_loads` are the sum, what routing
sees; `get_own_loads` is this router's part alone, what it tells the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

__all__ = ["ActiveLoad", "WorkerLoad"]


class WorkerLoad(NamedTuple):
    """A tuple, so that the router's native choice reads it by position."""

    active_prefill_tokens: int = 0
    active_blocks: int = 0
    num_requests: int = 0


@dataclass
class _Entry:
    worker: str
    prefill_tokens: int
    blocks: int


class ActiveLoad:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._own: dict[str, WorkerLoad] = {}
        self._peers: Mapping[str, WorkerLoad] = {}
        self._loads: dict[str, WorkerLoad] = {}  # own + peers
        self._own_view = MappingProxyType(self._own)

    def start(self, request_id: str, worker: str, prefill_tokens: int, blocks: int) -> None:
        if request_id in self._entries:
            raise ValueError(f"request {request_id!r} is already tracked")
        self._entries[request_id] = _Entry(worker, prefill_tokens, blocks)
        self._add(worker, prefill_tokens, blocks, 1)

    def first_token(self, request_id: str) -> None:
        """The prefill is done: its tokens stop counting (idempotent)."""
        entry = self._entries.get(request_id)
        if entry is None or entry.prefill_tokens == 0:
            return
        self._add(entry.worker, -entry.prefill_tokens, 0, 0)
        entry.prefill_tokens = 0

    def finish(self, request_id: str) -> None:
        """The request ended in any way; unknown ids are ignored (idempotent)."""
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self._add(entry.worker, -entry.prefill_tokens, -entry.blocks, -1)

    def get(self, worker: str) -> WorkerLoad:
        """`worker`'s load: this router's requests and the peers'."""
        return self._loads.get(worker, _IDLE)

    def get_loads(self) -> Mapping[str, WorkerLoad]:
        """The live loads of busy workers, this router's and the peers' (idle workers are
        absent). Read-only by its type: it is the table itself, which the router's native
        choice reads as a dict (a proxy in front of it costs a second lookup a worker)."""
        return self._loads

    def get_own_loads(self) -> Mapping[str, WorkerLoad]:
        """A read-only live view of the load of this router's own requests."""
        return self._own_view

    def get_peer_loads(self) -> Mapping[str, WorkerLoad]:
        """The load other replicas add, as last set (read-only)."""
        return MappingProxyType(dict(self._peers))

    def set_peer_loads(self, peers: Mapping[str, WorkerLoad]) -> None:
        """The load other replicas add, by worker (kept by reference: the caller's live
        totals; call again whenever they change)."""
        self._peers = peers
        self._loads.clear()
        for worker in self._own.keys() | peers.keys():
            self._combine(worker)

    def get_num_tracked(self) -> int:
        return len(self._entries)

    def _add(self, worker: str, prefill: int, blocks: int, requests: int) -> None:
        old = self._own.get(worker, _IDLE)
        new = WorkerLoad(
            old.active_prefill_tokens + prefill,
            old.active_blocks + blocks,
            old.num_requests + requests,
        )
        assert min(new.active_prefill_tokens, new.active_blocks, new.num_requests) >= 0
        if new == _IDLE:
            self._own.pop(worker, None)
        else:
            self._own[worker] = new
        self._combine(worker)

    def _combine(self, worker: str) -> None:
        own = self._own.get(worker)
        peer = self._peers.get(worker)
        if own is None or peer is None:
            total = own or peer
        else:
            total = WorkerLoad(
                own.active_prefill_tokens + peer.active_prefill_tokens,
                own.active_blocks + peer.active_blocks,
                own.num_requests + peer.num_requests,
            )
        if total is None:
            self._loads.pop(worker, None)
        else:
            self._loads[worker] = total


_IDLE = WorkerLoad()
