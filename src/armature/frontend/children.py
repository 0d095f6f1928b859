"""The processes `armature serve` started (workers, frontend replicas), kept running: one
that fails while the fleet serves is logged and started again with the same command, after
a wait that doubles while it keeps failing soon after its start (a crash loop costs a start
a minute at most, not a start a second). One that exits cleanly (code 0) or by SIGINT or
SIGTERM (someone stopped it) is logged and left stopped, as is everything once the fleet
itself is stopping; then the children that drain beside the fleet's frontend (its replicas)
are signalled at once (`ChildWatch.signal_drainers`).

`ChildWatch.check` is the whole decision, on the caller's clock; `ChildWatch.run` calls it
every `POLL_S`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Child", "ChildWatch", "StartChild"]

log = logging.getLogger("armature")

POLL_S = 0.5
FIRST_WAIT_S = 1.0  # before a restart; doubles while the child fails within STABLE_S
MAX_WAIT_S = 60.0
STABLE_S = 60.0  # a child that ran this long before it failed starts again after FIRST_WAIT_S
# exit codes that are not failures: a clean exit, SIGINT or SIGTERM (or the CLI's own exit
# code for a KeyboardInterrupt, 128 + SIGINT)
_STOPPED_BY = {0, -signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT}

StartChild = Callable[[list[str], dict[str, str]], "subprocess.Popen[bytes]"]


@dataclass
class Child:
    """A process of the fleet: what it is (for logs), how to start it, the one running."""

    name: str
    command: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    started_s: float
    wait_s: float = FIRST_WAIT_S  # before its next restart
    restart_at_s: float | None = None  # it failed: started again at this time
    stopped: bool = field(default=False)  # exited cleanly: left stopped
    # a frontend replica: signalled as soon as the fleet stops, so that it stops listening
    # and drains beside serve's own frontend (workers wait until every frontend drained)
    drains_beside: bool = False


class ChildWatch:
    def __init__(
        self,
        children: Sequence[Child],
        start: StartChild,
        stopping: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = list(children)
        self.start = start
        self.stopping = stopping
        self.clock = clock
        self.num_restarts = 0

    def check(self) -> None:
        """Notice children that exited; start again those whose wait is over."""
        if self.stopping():
            return
        now_s = self.clock()
        for child in self.children:
            if child.stopped:
                continue
            if child.restart_at_s is None:
                code = child.proc.poll()
                if code is None:
                    continue
                self._exited(child, code, now_s)
            elif now_s >= child.restart_at_s:
                try:
                    proc = self.start(child.command, child.env)
                except OSError as exc:  # no fork for now (memory, pids), a command gone
                    log.error("%s could not be started again: %s", child.name, exc)
                    child.restart_at_s = now_s + child.wait_s
                    child.wait_s = min(MAX_WAIT_S, child.wait_s * 2)
                    continue
                child.proc, child.started_s, child.restart_at_s = proc, now_s, None
                self.num_restarts += 1
                log.info("%s started again (pid %d)", child.name, proc.pid)

    def signal_drainers(self) -> None:
        """The fleet stops: SIGTERM to the running children that drain beside it."""
        for child in self.children:
            if child.drains_beside and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)

    def _exited(self, child: Child, code: int, now_s: float) -> None:
        if code in _STOPPED_BY:
            child.stopped = True
            log.warning(
                "%s (pid %d) exited (code %d); not started again", child.name, child.proc.pid, code
            )
            return
        if now_s - child.started_s >= STABLE_S:
            child.wait_s = FIRST_WAIT_S
        child.restart_at_s = now_s + child.wait_s
        log.error(
            "%s (pid %d) failed (exit code %d); starting it again in %g s",
            child.name,
            child.proc.pid,
            code,
            child.wait_s,
        )
        child.wait_s = min(MAX_WAIT_S, child.wait_s * 2)

    async def run(self) -> None:
        """`check` every POLL_S until cancelled."""
        while True:
            self.check()
            await asyncio.sleep(POLL_S)
