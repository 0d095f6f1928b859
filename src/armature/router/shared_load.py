"""The in-flight load other frontend replicas add to each worker, as their snapshots tell it
(protocols/replica.py). Pure; one owner (the replica's sharing shell).

    watch(replica, ttl_s)  a replica appeared in discovery: its snapshots are taken from now
    apply(snapshot)        its whole contribution, replacing the last (older seqs ignored)
    expire(now_s)          replicas not heard from for their ttl_s count for nothing (a dead
                           one stops publishing; one that was only slow comes back with its
                           next snapshot)
    remove(replica)        it left discovery (clean exit, or its lease ended)
    get_totals()           worker -> the sum over replicas, what ActiveLoad adds to its own

Snapshots rather than per-request deltas: the planes are best effort, and a whole snapshot
makes a lost message harmless and gives a replica that joins the current state at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from armature.protocols.replica import ReplicaLoad, WorkerShare
from armature.router.load import WorkerLoad

__all__ = ["PeerLoads", "get_shares"]


@dataclass
class _Peer:
    ttl_s: float
    heard_s: float
    seq: int = -1
    loads: dict[str, WorkerLoad] = field(default_factory=dict)


class PeerLoads:
    def __init__(self) -> None:
        self._peers: dict[int, _Peer] = {}
        self._totals: dict[str, WorkerLoad] = {}
        self._view = MappingProxyType(self._totals)

    def watch(self, replica_id: int, ttl_s: float, now_s: float) -> None:
        """Take `replica_id`'s snapshots from now on; it expires `ttl_s` after the last one
        (or after now, if none comes). Watching a known replica again only updates its ttl."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        peer = self._peers.get(replica_id)
        if peer is None:
            self._peers[replica_id] = _Peer(ttl_s, now_s)
        else:
            peer.ttl_s = ttl_s

    def apply(self, snapshot: ReplicaLoad, now_s: float) -> bool:
        """Take `snapshot` as its replica's whole contribution. False (and nothing changes)
        for a replica not watched, or a seq not newer than the last one taken."""
        peer = self._peers.get(snapshot.replica_id)
        if peer is None or snapshot.seq <= peer.seq:
            return False
        peer.seq = snapshot.seq
        peer.heard_s = now_s
        loads = {
            s.worker: WorkerLoad(s.prefill_tokens, s.blocks, s.requests)
            for s in snapshot.shares
            if s.requests > 0
        }
        self._replace(peer, loads)
        return True

    def expire(self, now_s: float) -> list[int]:
        """Drop the contributions of replicas not heard from for their ttl; their ids (only
        of those that had load), in watch order."""
        expired = []
        for replica_id, peer in self._peers.items():
            if peer.loads and now_s - peer.heard_s >= peer.ttl_s:
                self._replace(peer, {})
                expired.append(replica_id)
        return expired

    def remove(self, replica_id: int) -> None:
        """Forget `replica_id` and its contribution (unknown ids are ignored)."""
        peer = self._peers.pop(replica_id, None)
        if peer is not None:
            self._replace(peer, {})

    def get_totals(self) -> Mapping[str, WorkerLoad]:
        """A read-only live view: worker -> the load every watched replica adds to it
        (workers with none are absent)."""
        return self._view

    def get_replicas(self) -> list[int]:
        """The replicas watched, in watch order."""
        return list(self._peers)

    def get_num_requests(self, replica_id: int) -> int:
        peer = self._peers.get(replica_id)
        return sum(x.num_requests for x in peer.loads.values()) if peer else 0

    def _replace(self, peer: _Peer, loads: dict[str, WorkerLoad]) -> None:
        for worker in peer.loads.keys() | loads.keys():
            old = peer.loads.get(worker, _IDLE)
            new = loads.get(worker, _IDLE)
            total = _plus(self._totals.get(worker, _IDLE), new, old)
            assert min(total.active_prefill_tokens, total.active_blocks, total.num_requests) >= 0
            if total == _IDLE:
                self._totals.pop(worker, None)
            else:
                self._totals[worker] = total
        peer.loads = loads


_IDLE = WorkerLoad()


def _plus(total: WorkerLoad, add: WorkerLoad, sub: WorkerLoad) -> WorkerLoad:
    return WorkerLoad(
        total.active_prefill_tokens + add.active_prefill_tokens - sub.active_prefill_tokens,
        total.active_blocks + add.active_blocks - sub.active_blocks,
        total.num_requests + add.num_requests - sub.num_requests,
    )


def get_shares(loads: Mapping[str, WorkerLoad]) -> list[WorkerShare]:
    """A replica's own loads as the snapshot's shares, by worker name."""
    return [
        WorkerShare(worker, x.active_prefill_tokens, x.active_blocks, x.num_requests)
        for worker, x in sorted(loads.items())
    ]
