"""What the planner's `virtual` connector publishes in discovery for an external orchestrator,
and the acknowledgement it waits for (msgspec, on the wire).

    planner/<namespace>/targets/<role>  ScaleTarget  (the planner's lease: gone when it stops)
    planner/<namespace>/acks/<role>     ScaleAck     (the orchestrator's, under its own lease)

The orchestrator watches the targets prefix, makes the role's fleet `num_workers` strong
(draining the workers it removes), then registers a `ScaleAck` with the target's
`sequence`. A target is done when an ack of its role carries its sequence number.
"""

from __future__ import annotations

import msgspec

from armature.protocols.worker import WorkerRole

__all__ = ["ScaleAck", "ScaleTarget", "planner_ack_key", "planner_prefix", "planner_target_key"]


class ScaleTarget(msgspec.Struct, frozen=True, kw_only=True):
    """The planner asks for `num_workers` workers of `role`. `sequence` increases by one per
    target the planner publishes (over all roles); `reason` is the decision's log line."""

    role: WorkerRole
    num_workers: int
    sequence: int
    reason: str = ""


class ScaleAck(msgspec.Struct, frozen=True, kw_only=True):
    """The orchestrator did target `sequence`: `role` now has `num_workers` workers."""

    role: WorkerRole
    num_workers: int
    sequence: int


def planner_prefix(namespace: str) -> str:
    return f"planner/{namespace}/"


def planner_target_key(namespace: str, role: WorkerRole) -> str:
    return f"{planner_prefix(namespace)}targets/{role.value}"


def planner_ack_key(namespace: str, role: WorkerRole) -> str:
    return f"{planner_prefix(namespace)}acks/{role.value}"
