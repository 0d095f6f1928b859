"""Makes the fleet follow the planner's counts through a connector, one action at a time,
off the tick loop (a drain can take a minute; the planner keeps observing meanwhile).

`set_targets` records what each role should have and wakes the actuator; it scales each
role whose connector count differs. A `ConnectorError` (or any other error a connector
raises) is logged and counted, and the role is tried again after `retry_s` (or at the next
new target); neither the planner nor the actuator stops on it.
Every `retry_s` it also looks again without being woken, so a worker that left by itself (a
local process that died) is replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from armature.engines.api import wait_for_event
from armature.planner.connectors.api import Connector, ConnectorError
from armature.protocols.worker import WorkerRole

__all__ = ["Actuator"]

log = logging.getLogger(__name__)


class Actuator:
    """Owns the targets and the wake-up event; `run` until cancelled."""

    def __init__(
        self,
        connector: Connector,
        *,
        retry_s: float,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self._connector = connector
        self._retry_s = retry_s
        self._on_failure = on_failure
        self._targets: dict[WorkerRole, tuple[int, str]] = {}
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()  # set while the fleet matches every target

    def set_targets(
        self, targets: Mapping[WorkerRole, int], reasons: Mapping[WorkerRole, str]
    ) -> None:
        """What each role should have; `reasons` for the roles whose target changed."""
        for role, num in targets.items():
            old = self._targets.get(role)
            reason = reasons.get(role) or (old[1] if old else "the planner's initial count")
            self._targets[role] = (num, reason)
        self.idle.clear()
        self._wake.set()

    def get_pending(self) -> dict[WorkerRole, int]:
        """The roles whose connector count differs from their target, with the target."""
        have = self._connector.get_num_workers()
        return {r: n for r, (n, _) in self._targets.items() if have.get(r, 0) != n}

    async def run(self) -> None:
        while True:
            await wait_for_event(self._wake, self._retry_s)  # keeps a cancel (3.11)
            self._wake.clear()
            try:
                await self._follow()
            except Exception:  # a connector's own bug or its client's: log, count, retry
                log.exception(
                    "the connector failed unexpectedly (retrying in %.0f s)", self._retry_s
                )
                self._on_failure()

    async def _follow(self) -> None:
        """One look at the fleet: scale the roles that differ from their targets."""
        if not self.get_pending():
            self.idle.set()
            return
        self.idle.clear()
        if not await self._step() and not self.get_pending():
            self.idle.set()

    async def _step(self) -> bool:
        """One pass over the roles; whether an action failed."""
        failed = False
        for role, num in self.get_pending().items():
            _, reason = self._targets[role]
            try:
                await self._connector.scale(role, num, reason)
            except Exception as exc:
                # ConnectorError is the connectors' word for it; anything else (a discovery
                # backend's error, a malformed answer) must not end the actuator either
                log.error(
                    "scaling %s to %d failed (retrying in %.0f s): %s",
                    role,
                    num,
                    self._retry_s,
                    exc if isinstance(exc, ConnectorError) else f"{type(exc).__name__}: {exc}",
                    exc_info=not isinstance(exc, ConnectorError),
                )
                self._on_failure()
                failed = True
        return failed
