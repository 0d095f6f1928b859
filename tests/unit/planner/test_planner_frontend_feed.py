"""The planner's feed over several frontend replicas: each replica's /metrics read at its own
address (httpx's MockTransport answers as each would), their windows summed; a replica that
joins counts from zero, one that does not answer skips the tick; the replicas listed from
their cards in discovery (a real FileDiscovery)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import msgspec
import pytest

from armature.planner.frontend_feed import (
    FrontendFeed,
    FrontendUnreachableError,
    discovered_frontends,
)
from armature.protocols.replica import FrontendCard, frontend_key
from armature.runtime.discovery_file import FileDiscovery


def metrics_text(
    *, finished: int, in_flight: int, prompt: int, first_tokens: int, uptime_s: float | None = None
) -> str:
    """A frontend's /metrics with the families the feed needs (and its uptime, if given)."""
    uptime = "" if uptime_s is None else f"armature_frontend_uptime_seconds {uptime_s}\n"
    return (
        uptime
        + f"""\
# TYPE armature_requests_total counter
armature_requests_total{{endpoint="chat",status="200"}} {finished}.0
# TYPE armature_requests_in_flight gauge
armature_requests_in_flight {in_flight}.0
# TYPE armature_prompt_tokens_total counter
armature_prompt_tokens_total {prompt}.0
# TYPE armature_time_to_first_token_seconds histogram
armature_time_to_first_token_seconds_bucket{{le="+Inf"}} {first_tokens}.0
armature_time_to_first_token_seconds_count {first_tokens}.0
armature_time_to_first_token_seconds_sum {first_tokens * 0.1}
# TYPE armature_model_info gauge
armature_model_info{{model="m"}} 1.0
"""
    )


class Replicas:
    """Frontends by host, as the feed lists and reads them: `texts[host]` is what its /metrics
    answers (None: it does not answer)."""

    def __init__(self) -> None:
        self.texts: dict[str, str | None] = {}
        self.read: list[str] = []

    async def list(self) -> dict[str, str]:
        return {f"frontend-{host}": f"http://{host}:8000" for host in self.texts}

    def answer(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.read.append(f"{host}{request.url.path}")
        text = self.texts[host]
        if text is None:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, text=text)

    def feed(self) -> FrontendFeed:
        feed = FrontendFeed(self.list, "the test's replicas", ["load"])
        feed._client = httpx.AsyncClient(transport=httpx.MockTransport(self.answer))
        return feed


async def test_each_replica_is_read_and_the_windows_summed() -> None:
    replicas = Replicas()
    replicas.texts = {
        "a": metrics_text(finished=10, in_flight=1, prompt=1000, first_tokens=11),
        "b": metrics_text(finished=4, in_flight=0, prompt=400, first_tokens=4),
    }
    feed = replicas.feed()
    first = await feed.scrape()
    assert sorted(replicas.read) == ["a/metrics", "b/metrics"]
    assert set(first.samples) == {"frontend-a", "frontend-b"}
    assert first.total.num_finished_requests == 14.0
    feed.start(first, 0.0)
    replicas.texts = {
        "a": metrics_text(finished=30, in_flight=2, prompt=3000, first_tokens=32),
        "b": metrics_text(finished=24, in_flight=1, prompt=2400, first_tokens=25),
    }
    window = feed.take_window("load", await feed.scrape(), 10.0)
    # a: 20 finished + 1 more in flight; b: 20 + 1: 42 arrived in 10 s
    assert window.num_requests == 42
    assert window.get_request_rate_per_s() == pytest.approx(4.2)
    assert window.mean_input_tokens == pytest.approx(4000 / 42)  # prompt tokens per first token
    await feed.close()


async def test_a_replica_that_joins_counts_from_its_start() -> None:
    """A replica first seen since the window began: its counters started at zero then."""
    replicas = Replicas()
    replicas.texts = {"a": metrics_text(finished=10, in_flight=0, prompt=1000, first_tokens=10)}
    feed = replicas.feed()
    feed.start(await feed.scrape(), 0.0)
    replicas.texts["a"] = metrics_text(finished=15, in_flight=0, prompt=1500, first_tokens=15)
    # started since the last scrape: all it counted is in this window
    replicas.texts["c"] = metrics_text(finished=6, in_flight=2, prompt=800, first_tokens=8)
    window = feed.take_window("load", await feed.scrape(), 5.0)
    assert window.num_requests == 5 + (6 + 2)
    assert window.mean_input_tokens == pytest.approx((500 + 800) / (5 + 8))
    # a replica that left is simply not read: the next window is the one left's
    del replicas.texts["a"]
    replicas.texts["c"] = metrics_text(finished=9, in_flight=0, prompt=1100, first_tokens=10)
    assert feed.take_window("load", await feed.scrape(), 10.0).num_requests == 3 - 2
    await feed.close()


async def test_a_replica_back_in_discovery_counts_from_its_return() -> None:
    """The same replica out of discovery for a while (its lease lost in a stall, its Pod not
    ready) and back under its name: its counters went on, so counting it from zero counted
    its whole life again (1,000 requests that had long been counted). Each window counts it
    from its return, and a longer window that saw it before counts it from then."""
    replicas = Replicas()
    replicas.texts = {
        "a": metrics_text(finished=1000, in_flight=0, prompt=10**5, first_tokens=1000)
    }
    feed = FrontendFeed(replicas.list, "the test's replicas", ["load", "interval"])
    feed._client = httpx.AsyncClient(transport=httpx.MockTransport(replicas.answer))
    feed.start(await feed.scrape(), 0.0)
    replicas.texts["b"] = metrics_text(finished=0, in_flight=0, prompt=0, first_tokens=0)
    del replicas.texts["a"]  # unlisted at the next scrape
    assert feed.take_window("load", await feed.scrape(), 5.0).num_requests == 0
    replicas.texts["a"] = metrics_text(finished=1010, in_flight=0, prompt=10**5, first_tokens=1010)
    replicas.texts["b"] = metrics_text(finished=3, in_flight=0, prompt=30, first_tokens=3)
    scrape = await feed.scrape()
    # a's 10 while it was unlisted are not this window's; b, new since 0, counts from zero
    assert feed.take_window("load", scrape, 10.0).num_requests == 3
    # the interval's window began when a was listed: all of a's 10 in it, and b's 3
    assert feed.take_window("interval", scrape, 10.0).num_requests == 13
    replicas.texts["a"] = metrics_text(finished=1015, in_flight=0, prompt=10**5, first_tokens=1015)
    assert feed.take_window("load", await feed.scrape(), 15.0).num_requests == 5
    await feed.close()


async def test_a_replica_running_unlisted_at_the_planners_start_counts_from_its_listing() -> None:
    """A replica out of discovery when the planner first listed the fleet, listed later: its
    uptime (an hour) is longer than the window, so its counters went on before it; counting
    it from zero counted its whole life (1,000 requests) as the window's arrivals. One whose
    uptime is within the window started in it and counts from zero."""
    replicas = Replicas()
    replicas.texts = {"a": metrics_text(finished=10, in_flight=0, prompt=100, first_tokens=10)}
    feed = replicas.feed()
    feed.start(await feed.scrape(), 0.0)
    replicas.texts["a"] = metrics_text(finished=14, in_flight=0, prompt=140, first_tokens=14)
    replicas.texts["old"] = metrics_text(
        finished=1000, in_flight=1, prompt=10**5, first_tokens=1001, uptime_s=3600.0
    )
    replicas.texts["new"] = metrics_text(
        finished=6, in_flight=0, prompt=60, first_tokens=6, uptime_s=4.0
    )
    assert feed.take_window("load", await feed.scrape(), 5.0).num_requests == 4 + 6
    replicas.texts["old"] = metrics_text(
        finished=1003, in_flight=1, prompt=10**5 + 30, first_tokens=1004, uptime_s=3605.0
    )
    assert feed.take_window("load", await feed.scrape(), 10.0).num_requests == 3
    await feed.close()


def test_the_frontend_exports_how_long_its_counters_have_counted() -> None:
    """The uptime the feed reads: the seconds since the frontend's metrics started, from the
    clock it is given, as the planner's parser reads it."""
    from armature.frontend.metrics import FrontendMetrics
    from armature.planner.scrape import parse_frontend_sample
    from armature.protocols.engine import EngineLoad

    now_s = [100.0]
    idle = EngineLoad(
        num_active_blocks=0,
        num_total_blocks=1,
        num_waiting=0,
        num_running=0,
        num_prefill_tokens_queued=0,
    )
    metrics = FrontendMetrics("m", lambda: idle, clock_s=lambda: now_s[0])
    now_s[0] = 142.5
    assert parse_frontend_sample(metrics.render().decode()).uptime_s == 42.5


async def test_a_replica_that_does_not_answer_skips_the_tick() -> None:
    """A window without one replica's requests would read as less traffic: the scrape fails,
    naming it, and the next window spans from the last scrape that read every replica."""
    replicas = Replicas()
    replicas.texts = {
        "a": metrics_text(finished=10, in_flight=0, prompt=1000, first_tokens=10),
        "b": metrics_text(finished=10, in_flight=0, prompt=1000, first_tokens=10),
    }
    feed = replicas.feed()
    feed.start(await feed.scrape(), 0.0)
    replicas.texts["a"] = metrics_text(finished=20, in_flight=0, prompt=2000, first_tokens=20)
    replicas.texts["b"] = None
    with pytest.raises(FrontendUnreachableError) as caught:
        await feed.scrape()
    assert str(caught.value) == "cannot read http://b:8000/metrics: connection refused"
    replicas.texts["b"] = metrics_text(finished=16, in_flight=0, prompt=1600, first_tokens=16)
    window = feed.take_window("load", await feed.scrape(), 10.0)
    assert window.num_requests == 10 + 6
    assert window.window_s == 10.0
    replicas.texts.clear()
    with pytest.raises(FrontendUnreachableError, match="no frontend is listed"):
        await feed.scrape()
    await feed.close()


async def test_the_replicas_are_listed_from_their_cards(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    discovery = FileDiscovery(tmp_path, poll_interval_s=0.05)
    registrations = []
    for replica_id, url in ((1, "http://10.0.0.1:41001"), (2, None), (3, "http://[::1]:41003")):
        card = FrontendCard(
            replica_id=replica_id,
            namespace="ns",
            events_url="tcp://10.0.0.1:5000",
            heartbeat_s=1.0,
            http_url=url,
        )
        key = frontend_key("ns", replica_id)
        registrations.append(await discovery.register(key, msgspec.msgpack.encode(card), 30.0))
    registrations.append(await discovery.register(frontend_key("ns", 4), b"\xc1", 30.0))
    other = FrontendCard(
        replica_id=5, namespace="other", events_url="x", heartbeat_s=1.0, http_url="http://o:1"
    )
    registrations.append(
        await discovery.register(frontend_key("other", 5), msgspec.msgpack.encode(other), 30.0)
    )
    listed = discovered_frontends(discovery, "ns")
    with caplog.at_level(logging.WARNING, logger="armature.planner.frontend_feed"):
        assert await listed() == {
            frontend_key("ns", 1): "http://10.0.0.1:41001",
            frontend_key("ns", 3): "http://[::1]:41003",
        }
        await listed()
    # the unreadable card and the one naming no address (an older frontend) are left out,
    # each said once
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"frontend card {frontend_key('ns', 2)} names no address of its own (an older "
        "frontend): its requests are not counted",
        f"frontend card {frontend_key('ns', 4)} is unreadable; not read",
    ]
    for registration in registrations:
        await registration.close()
    await discovery.close()


async def test_a_replica_first_seen_by_a_tick_at_the_same_time_counts_in_both_windows() -> None:
    """The interval's tick and the load's fall due together: each scrapes, at one time. A
    replica first in the load tick's scrape started after the interval's window began: it
    counts there too (by time, the two scrapes were one instant and it was left out)."""
    replicas = Replicas()
    replicas.texts = {"a": metrics_text(finished=10, in_flight=0, prompt=100, first_tokens=10)}
    feed = FrontendFeed(replicas.list, "the test's replicas", ["load", "interval"])
    feed._client = httpx.AsyncClient(transport=httpx.MockTransport(replicas.answer))
    feed.start(await feed.scrape(), 0.0)
    assert feed.take_window("interval", await feed.scrape(), 60.0).num_requests == 0
    replicas.texts["b"] = metrics_text(finished=7, in_flight=0, prompt=70, first_tokens=7)
    assert feed.take_window("load", await feed.scrape(), 60.0).num_requests == 7
    replicas.texts["b"] = metrics_text(finished=9, in_flight=0, prompt=90, first_tokens=9)
    assert feed.take_window("interval", await feed.scrape(), 120.0).num_requests == 9
    await feed.close()
