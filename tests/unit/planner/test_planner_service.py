"""The planner service's tick loop around its feeds: a frontend lost between main's first
scrape and the loop's is retried and counted, never a crash."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import httpx
import msgspec
import pytest

from armature.config.planner import PlannerConfig
from armature.planner.core import Planner, PlannerEffects
from armature.planner.decisions import DecisionReason, LimitHold, LimitReason
from armature.planner.frontend_feed import (
    FrontendFeed,
    FrontendScrape,
    FrontendUnreachableError,
    one_frontend,
)
from armature.planner.metrics import PlannerMetrics
from armature.planner.predictors import ConstantPredictor
from armature.planner.scrape import ZERO_SAMPLE
from armature.planner.service import LOAD_WINDOW, PlannerService, get_next_due_s
from armature.planner.timing_performance import TimingPerformanceModel
from armature.protocols.worker import WorkerRole

# a frontend that has served nothing yet
SAMPLE = msgspec.structs.replace(ZERO_SAMPLE, model_name="m", num_output_lengths=None)
SCRAPE = FrontendScrape(
    {"http://127.0.0.1:9": SAMPLE}, {"http://127.0.0.1:9": "http://127.0.0.1:9"}
)


class FlakyFeed:
    """A frontend whose first `num_failures` scrapes fail; `started` once the windows start."""

    def __init__(self, num_failures: int) -> None:
        self.num_failures = num_failures
        self.num_scrapes = 0
        self.started = asyncio.Event()

    async def scrape(self) -> FrontendScrape:
        self.num_scrapes += 1
        if self.num_scrapes <= self.num_failures:
            raise FrontendUnreachableError("http://127.0.0.1:9/metrics answered HTTP 500")
        return SCRAPE

    def start(self, scrape: FrontendScrape, now_s: float) -> None:
        assert scrape is SCRAPE
        self.started.set()


class NoWorkers:
    def take_steps(self, window: str) -> list[Any]:
        return []

    def get_num_workers(self) -> dict[WorkerRole, int]:
        return {}


async def test_a_failed_first_scrape_is_retried_and_counted(
    profile: TimingPerformanceModel,
) -> None:
    config = PlannerConfig(mode="agg", ttft_ms=500.0, itl_ms=50.0, load_interval_s=0.01)
    planner = Planner(config, profile, predictor_factory=ConstantPredictor)
    metrics = PlannerMetrics(config.get_roles())
    feed = FlakyFeed(num_failures=2)
    service = PlannerService(
        planner, config, cast(Any, feed), cast(Any, NoWorkers()), metrics, actuator=None
    )
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await asyncio.wait_for(feed.started.wait(), 5.0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)  # ends cleanly: no exception escaped
    assert feed.num_scrapes >= 3
    assert metrics.registry.get_sample_value("armature_planner_scrape_failures_total") == 2


async def test_a_stop_while_the_frontend_is_lost_ends_the_loop(
    profile: TimingPerformanceModel,
) -> None:
    config = PlannerConfig(mode="agg", ttft_ms=500.0, itl_ms=50.0, load_interval_s=0.01)
    planner = Planner(config, profile, predictor_factory=ConstantPredictor)
    feed = FlakyFeed(num_failures=10**9)
    metrics = PlannerMetrics(config.get_roles())
    metrics.frontends.set(2)  # as a tick that read two replicas left it
    service = PlannerService(
        planner, config, cast(Any, feed), cast(Any, NoWorkers()), metrics, actuator=None
    )
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))

    async def retried() -> None:
        while feed.num_scrapes < 2:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(retried(), 5.0)
    stop.set()
    await asyncio.wait_for(task, 5.0)
    assert not feed.started.is_set()
    # the last tick read no frontend (it kept showing the last one that answered)
    assert metrics.registry.get_sample_value("armature_planner_frontends") == 0


async def test_a_scrape_failure_without_a_message_names_its_kind() -> None:
    """A connection reset carries no text: the log line says what failed, not ': '."""

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("", request=request)

    feed = FrontendFeed(one_frontend("http://127.0.0.1:9"), "it", ["load"])
    feed._client = httpx.AsyncClient(transport=httpx.MockTransport(reset))
    with pytest.raises(FrontendUnreachableError) as caught:
        await feed.scrape()
    assert str(caught.value) == "cannot read http://127.0.0.1:9/metrics: ReadError"


def test_a_role_held_at_its_maximum_is_logged_once_and_shown_in_the_metrics(
    profile: TimingPerformanceModel, caplog: pytest.LogCaptureFixture
) -> None:
    """Two load ticks holding agg at 3 (5 then 6 asked for): one warning, wanted_workers
    follows the ask; the tick that lets go: one line, wanted_workers back to the target."""
    config = PlannerConfig(mode="agg", ttft_ms=500.0, itl_ms=50.0, max_workers=3)
    planner = Planner(config, profile, predictor_factory=ConstantPredictor)
    metrics = PlannerMetrics(config.get_roles())
    service = PlannerService(
        planner, config, cast(Any, FlakyFeed(0)), cast(Any, NoWorkers()), metrics, actuator=None
    )

    def held(wanted: int, at_s: float) -> LimitHold:
        return LimitHold(
            role=WorkerRole.AGG,
            num_workers=3,
            wanted_workers=wanted,
            reason=DecisionReason.TTFT_ABOVE_TARGET,
            limited_by=LimitReason.MAX_WORKERS,
            at_s=at_s,
        )

    def wanted() -> float | None:
        return metrics.registry.get_sample_value("armature_planner_wanted_workers", {"role": "agg"})

    caplog.set_level(logging.INFO, logger="armature.planner.service")
    for ask, at_s in ((5, 5.0), (6, 10.0)):
        effects = PlannerEffects([], [], {WorkerRole.AGG: 3}, limited=[held(ask, at_s)])
        service._act(effects, LOAD_WINDOW)
        assert wanted() == ask
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [held(5, 5.0).get_log_line()]
    service._act(PlannerEffects([], [], {WorkerRole.AGG: 3}), LOAD_WINDOW)
    assert wanted() == 3
    assert caplog.records[-1].getMessage() == "planner: agg is back within its limits"
    assert len(caplog.records) == 2


@pytest.mark.parametrize(
    ("now_s", "due_s"),
    [
        (100.0, 160.0),  # on time
        (100.004, 160.0),  # woken a little late: the schedule keeps its phase
        (159.9, 160.0),  # late by almost an interval
        (160.0, 220.0),  # a whole interval late: that tick is skipped
        (250.0, 280.0),  # a stall of 2.5 intervals: the next due on the old phase
    ],
)
def test_ticks_missed_in_a_stall_are_skipped_not_run_back_to_back(
    now_s: float, due_s: float
) -> None:
    """A tick due at 100 s every 60 s runs at `now_s`; the next is due at `due_s`. The
    interval tick ran every missed tick at once, over windows of milliseconds."""
    assert get_next_due_s(100.0, 60.0, now_s) == due_s


async def test_a_frontend_that_protects_its_metrics_is_read_with_a_key() -> None:
    """A frontend run with --protect-metrics answers 401 without a key: the planner sends
    --frontend-api-key as a bearer token, and without one it says which flag to give (it
    said "the frontend does not answer ... HTTP 401")."""
    seen: list[str | None] = []

    def protected(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer k1":
            return httpx.Response(401, json={"error": {"message": "Incorrect API key"}})
        return httpx.Response(200, text="not metrics")

    errors = []
    for key in (None, "wrong", "k1"):
        feed = FrontendFeed(one_frontend("http://127.0.0.1:9"), "it", ["load"], api_key=key)
        headers = feed._client.headers
        feed._client = httpx.AsyncClient(transport=httpx.MockTransport(protected), headers=headers)
        with pytest.raises(FrontendUnreachableError) as caught:
            await feed.scrape()
        errors.append(str(caught.value))
    assert seen == [None, "Bearer wrong", "Bearer k1"]
    assert errors[0] == (
        "http://127.0.0.1:9/metrics needs an API key (the frontend runs --protect-metrics): "
        "give the planner one of its keys (--frontend-api-key, or ARMATURE_FRONTEND_API_KEY)"
    )
    assert errors[1] == "http://127.0.0.1:9/metrics refused the planner's API key (HTTP 401)"
    assert "needs an API key" not in errors[2] and "401" not in errors[2]  # read, not parsed
