"""The `virtual` connector: the planner publishes each role's target in discovery and an
external orchestrator makes it so (protocols/planner.py has the keys and structs).

`scale` registers a `ScaleTarget` under the planner's lease (the key goes when the planner
does), then waits for a `ScaleAck` with the target's sequence number; no ack within
`ack_timeout_s` is a ConnectorError (the service retries: the same count is published again
with a new sequence). The counts it reports are the last acknowledged ones, or, before any
ack, the workers of each role found in discovery at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import msgspec

from armature.planner.connectors.api import ConnectorError
from armature.protocols.planner import (
    ScaleAck,
    ScaleTarget,
    planner_ack_key,
    planner_prefix,
    planner_target_key,
)
from armature.protocols.worker import WorkerRole
from armature.runtime.discovery import Discovery, Registration

__all__ = ["VirtualConnector"]

log = logging.getLogger(__name__)


class VirtualConnector:
    """Owns its target registrations (one per role) and the ack watcher task."""

    def __init__(
        self,
        discovery: Discovery,
        namespace: str,
        *,
        num_workers: Mapping[WorkerRole, int],
        ack_timeout_s: float,
        lease_ttl_s: float,
    ) -> None:
        self._discovery = discovery
        self._namespace = namespace
        self._num_workers = dict(num_workers)
        self._ack_timeout_s = ack_timeout_s
        self._lease_ttl_s = lease_ttl_s
        self._sequence = 0
        self._registrations: dict[WorkerRole, Registration] = {}
        self._acks: dict[WorkerRole, ScaleAck] = {}
        self._acked = asyncio.Condition()
        self._watcher: asyncio.Task[None] | None = None

    def get_num_workers(self) -> dict[WorkerRole, int]:
        return dict(self._num_workers)

    async def scale(self, role: WorkerRole, num_workers: int, reason: str) -> None:
        if self._watcher is None:
            # acks a previous planner left behind: our sequence numbers start above them
            existing = await self._discovery.list(planner_prefix(self._namespace) + "acks/")
            for value in existing.values():
                try:
                    old = msgspec.msgpack.decode(value, type=ScaleAck)
                except msgspec.DecodeError:
                    continue
                self._sequence = max(self._sequence, old.sequence)
            self._watcher = asyncio.get_running_loop().create_task(self._watch_acks())
        self._sequence += 1
        target = ScaleTarget(
            role=role, num_workers=num_workers, sequence=self._sequence, reason=reason
        )
        previous = self._registrations.pop(role, None)
        if previous is not None:
            await previous.close()
        self._registrations[role] = await self._discovery.register(
            planner_target_key(self._namespace, role),
            msgspec.msgpack.encode(target),
            self._lease_ttl_s,
        )
        log.info(
            "published target %s=%d (#%d), waiting for its ack", role, num_workers, target.sequence
        )
        try:
            async with self._acked:
                await asyncio.wait_for(
                    self._acked.wait_for(lambda: self._is_acked(target)), self._ack_timeout_s
                )
        except TimeoutError:
            raise ConnectorError(
                f"no ack for target {role.value}={num_workers} (#{target.sequence}) within "
                f"{self._ack_timeout_s:.0f} s"
            ) from None
        self._num_workers[role] = self._acks[role].num_workers

    def _is_acked(self, target: ScaleTarget) -> bool:
        ack = self._acks.get(target.role)
        return ack is not None and ack.sequence >= target.sequence

    async def _watch_acks(self) -> None:
        prefix = planner_prefix(self._namespace) + "acks/"
        async for event in self._discovery.watch(prefix):
            if event.kind != "put":
                continue
            try:
                ack = msgspec.msgpack.decode(event.value, type=ScaleAck)
            except msgspec.DecodeError as exc:
                log.error("ignoring an unreadable ack at %s: %s", event.key, exc)
                continue
            if event.key != planner_ack_key(self._namespace, ack.role):
                log.error("ignoring an ack of %s at %s", ack.role, event.key)
                continue
            async with self._acked:
                self._acks[ack.role] = ack
                self._acked.notify_all()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        for registration in self._registrations.values():
            await registration.close()
        self._registrations = {}
