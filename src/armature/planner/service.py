"""The planner service: the tick loop around the pure `Planner`.

Every `load_interval_s` it scrapes the frontend, takes the workers' step records of the
window, and runs `plan_load`; every `interval_s` the same over the longer window with
`plan_interval`. Each decision is one log line with its reason, is counted in the metrics,
and (unless dry-run) becomes the role's target for the `Actuator`, which makes the fleet
follow through the connector. A role whose maximum holds it below what a rule asks for gets
a warning when that starts and a line when it ends (`LimitWatch`), and the gap shows in the
metrics (wanted against target workers). A tick whose scrape fails is skipped with a logged
error and a counted failure: a failed feed never reads as "no traffic".
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import msgspec

from armature.config.planner import PlannerConfig
from armature.engines.api import wait_for_event
from armature.planner.actuator import Actuator
from armature.planner.core import Planner, PlannerEffects
from armature.planner.frontend_feed import FrontendFeed, FrontendUnreachableError
from armature.planner.limit_watch import LimitWatch
from armature.planner.metrics import PlannerMetrics
from armature.planner.observation import PlannerObservation
from armature.planner.scrape import judges_by
from armature.planner.worker_feed import WorkerStepFeed

__all__ = ["INTERVAL_WINDOW", "LOAD_WINDOW", "PlannerService", "get_next_due_s"]

log = logging.getLogger(__name__)

LOAD_WINDOW = "load"
INTERVAL_WINDOW = "interval"


def get_next_due_s(due_s: float, interval_s: float, now_s: float) -> float:
    """The first time after `now_s` on the schedule of `due_s` every `interval_s`: the ticks a
    stall (a paused process, a throttled CPU) missed are skipped, not run back to back over
    windows of a few milliseconds."""
    return due_s + max(1, math.floor((now_s - due_s) / interval_s) + 1) * interval_s


class PlannerService:
    """Owns the tick schedule; the planner, feeds, metrics and actuator are given (the
    actuator is None in a dry run)."""

    def __init__(
        self,
        planner: Planner,
        config: PlannerConfig,
        frontend: FrontendFeed,
        workers: WorkerStepFeed,
        metrics: PlannerMetrics,
        actuator: Actuator | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._planner = planner
        self._config = config
        self._frontend = frontend
        self._workers = workers
        self._metrics = metrics
        self._actuator = actuator
        self._clock = clock
        self._limits = LimitWatch()

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set. The windows start at the first scrape that answers (main
        waits for one before; a frontend lost since is retried every load interval)."""
        while True:
            start_s = self._clock()
            try:
                sample = await self._frontend.scrape()
                break
            except FrontendUnreachableError as exc:
                log.error(
                    "the first scrape failed (retrying in %g s): %s",
                    self._config.load_interval_s,
                    exc,
                )
                self._metrics.scrape_failures.inc()
                self._metrics.frontends.set(0)
            if await wait_for_event(stop, self._config.load_interval_s):  # keeps a cancel
                return
        self._frontend.start(sample, start_s)
        for window in (LOAD_WINDOW, INTERVAL_WINDOW):
            self._workers.take_steps(window)
        next_load_s = start_s + self._config.load_interval_s
        next_interval_s = start_s + self._config.interval_s
        while not stop.is_set():
            wait_s = max(0.0, min(next_load_s, next_interval_s) - self._clock())
            if await wait_for_event(stop, wait_s):
                return
            now_s = self._clock()
            if now_s >= next_interval_s:
                next_interval_s = get_next_due_s(next_interval_s, self._config.interval_s, now_s)
                await self._tick(INTERVAL_WINDOW, now_s)
            if now_s >= next_load_s:
                next_load_s = get_next_due_s(next_load_s, self._config.load_interval_s, now_s)
                await self._tick(LOAD_WINDOW, now_s)

    async def _tick(self, window: str, now_s: float) -> None:
        try:
            sample = await self._frontend.scrape()
        except FrontendUnreachableError as exc:
            log.error("skipping the %s tick: %s", window, exc)
            self._metrics.scrape_failures.inc()
            self._metrics.frontends.set(0)  # the last tick read none
            return
        frontend = self._frontend.take_window(window, sample, now_s)
        self._metrics.frontends.set(len(sample.samples))
        if window == LOAD_WINDOW:
            self._metrics.observed_requests.inc(frontend.num_requests)
        config = self._config
        if not judges_by(sample.total, config.ttft_ms, config.itl_ms):
            # judged against other targets (or none): not the planner's attainment
            frontend = msgspec.structs.replace(frontend, num_judged_requests=0, num_met_requests=0)
        observation = PlannerObservation(
            frontend=frontend, workers=self._workers.take_steps(window)
        )
        if window == INTERVAL_WINDOW:
            effects = self._planner.plan_interval(observation, now_s)
        else:
            effects = self._planner.plan_load(observation, now_s)
        self._act(effects, window)

    def _act(self, effects: PlannerEffects, window: str) -> None:
        dry = " (dry run)" if self._actuator is None else ""
        reasons = {}
        for decision in effects.decisions:
            log.info("%s%s", decision.get_log_line(), dry)
            self._metrics.count_decision(decision)
            reasons[decision.role] = decision.get_log_line()
        for decision in effects.held:
            log.debug("held by a cool-down: %s", decision.get_log_line())
        entered, released = self._limits.update(window, effects.num_workers, effects.limited)
        for hold in entered:
            log.warning("%s", hold.get_log_line())
        for role in released:
            log.info("planner: %s is back within its limits", role.value)
        self._metrics.observe(effects, self._workers.get_num_workers(), self._limits.get_held())
        if self._actuator is not None and effects.decisions:
            self._actuator.set_targets(effects.num_workers, reasons)
