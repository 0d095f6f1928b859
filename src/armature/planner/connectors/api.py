"""The planner's connector contract: make a role's fleet `num_workers` strong."""

from __future__ import annotations

from typing import Protocol

from armature.errors import ArmatureError
from armature.protocols.worker import WorkerRole

__all__ = ["Connector", "ConnectorError"]


class ConnectorError(ArmatureError):
    """A scaling action failed (a worker would not start, no ack came); the fleet may be
    part of the way there. The planner service logs it and retries."""


class Connector(Protocol):
    """Carries the planner's counts out. `scale` is idempotent: calling it again with the
    same count after a failure finishes the job (the service retries that way)."""

    def get_num_workers(self) -> dict[WorkerRole, int]:
        """Each role's workers as this connector last made or saw them."""
        ...

    async def scale(self, role: WorkerRole, num_workers: int, reason: str) -> None:
        """Make `role` have `num_workers` workers; a removed worker leaves routing and
        finishes its in-flight requests first. ConnectorError when it cannot."""
        ...

    async def close(self) -> None:
        """Release what the connector holds (the local one stops its workers, draining)."""
        ...
