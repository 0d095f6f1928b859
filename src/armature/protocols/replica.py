"""What frontend replicas tell each other (msgspec, on the wire): the in-flight load each adds
to each worker, so that every replica's routing cost sees the requests the others routed.

A replica registers a `FrontendCard` in discovery under `frontend_key(namespace, id)`; the
others, watching `frontend_prefix(namespace)`, subscribe to its event-plane url, where it
publishes `ReplicaLoad` snapshots: its whole contribution each time (so a lost message
costs nothing and a replica that joins has the current state with the next one), when it
changes (at most every `share_load_interval_s`) and at least every `heartbeat_s`. The card
also names the address where that replica alone answers HTTP (`http_url`): replicas that
share a port are each reached there (the planner reads every replica's /metrics).
"""

from __future__ import annotations

import msgspec

from armature.protocols.address import EndpointAddress

__all__ = [
    "FrontendCard",
    "ReplicaLoad",
    "WorkerShare",
    "frontend_key",
    "frontend_prefix",
    "replica_name",
]

FRONTEND_COMPONENT = "frontend"
LOAD_ENDPOINT = "load"


class FrontendCard(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: int  # random 64-bit, new for every process: a restart is a new replica
    namespace: str
    events_url: str  # where its ReplicaLoad snapshots are published (zmq or nats url)
    heartbeat_s: float  # it publishes at least this often
    # where this replica alone serves its HTTP API (its /metrics), e.g. http://10.0.0.5:41234;
    # None: a replica that names none
    http_url: str | None = None


class WorkerShare(msgspec.Struct, frozen=True, array_like=True):
    """One replica's in-flight load on one worker: requests it routed there and that have
    not finished, their blocks, and the prompt tokens of those not past their first token."""

    worker: str
    prefill_tokens: int
    blocks: int
    requests: int


class ReplicaLoad(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: int
    seq: int  # one more per snapshot from this replica: an older or repeated one is ignored
    shares: list[WorkerShare]  # workers it has nothing on are left out


def replica_name(replica_id: int) -> str:
    return f"frontend-{replica_id:x}"


def frontend_prefix(namespace: str) -> str:
    """Discovery prefix of every frontend replica in `namespace` (AddressError for a bad
    namespace)."""
    return f"instances/{EndpointAddress(namespace, FRONTEND_COMPONENT, LOAD_ENDPOINT)}/"


def frontend_key(namespace: str, replica_id: int) -> str:
    """Discovery key of one replica: `instances/<namespace>/frontend/load/<id hex>`."""
    address = EndpointAddress(namespace, FRONTEND_COMPONENT, LOAD_ENDPOINT, replica_id)
    return f"instances/{address}"
