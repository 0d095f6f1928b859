"""The planner's measured attainment: the frontend judges each finished request against its
SLO targets (`armature_slo_requests_total`), a simulated fleet's windows do the same, and the
planner reports the share within both over the load rule's window (`PlannerEffects`, the
`armature_planner_measured_attainment` gauge) when the frontend judges by its own targets.

Profile: conftest.py; targets TTFT 500 ms and ITL 30 ms.
"""

from __future__ import annotations

import pytest
from test_planner_core import make_planner
from test_planner_scrape import exposition

from armature.config import PlannerConfig
from armature.planner import FrontendMetrics, PerformanceModel, PlannerObservation
from armature.planner.main import describe_attainment_source
from armature.planner.recent_load import RecentWindows
from armature.planner.scrape import (
    FrontendSample,
    get_window_metrics,
    judges_by,
    parse_frontend_sample,
)
from armature.sim.fleet_monitor import FinishedRequest, FrontendWindows


def window(judged: int, met: int) -> PlannerObservation:
    frontend = FrontendMetrics(
        window_s=5.0,
        num_requests=10,
        mean_input_tokens=3000.0,
        mean_output_tokens=200.0,
        num_judged_requests=judged,
        num_met_requests=met,
    )
    return PlannerObservation(frontend=frontend)


def test_the_planner_reports_the_attainment_over_the_load_rules_window(
    profile: PerformanceModel,
) -> None:
    """The window holds the last six load windows (30 s of 5 s): 10 judged, then 30 more (40:
    enough), then six windows of 10 each of which 9 met (the first two gone)."""
    planner = make_planner(profile)
    assert planner.plan_load(window(10, 10), now_s=0.0).attainment is None  # 10 < 20 judged
    assert planner.plan_load(window(30, 27), now_s=5.0).attainment == 37 / 40
    for k in range(6):
        effects = planner.plan_load(window(10, 9), now_s=10.0 + 5.0 * k)
    assert effects.attainment == 0.9
    assert planner.plan_load(window(0, 0), now_s=40.0).attainment == 45 / 50


def finished(ttft_ms: float | None, mean_itl_ms: float | None, gaps: int = 4) -> FinishedRequest:
    """A request with `gaps` token gaps of `mean_itl_ms` each (none: one output token)."""
    if mean_itl_ms is None:
        return FinishedRequest(ttft_ms, 0 if ttft_ms is None else 1, 0.0, 0)
    return FinishedRequest(ttft_ms, gaps + 1, mean_itl_ms * gaps, gaps)


def test_a_simulated_fleets_windows_judge_each_finished_request() -> None:
    """Targets TTFT 3000 ms, mean ITL 50 ms: met within both; a request of one token (no
    ITL) by its TTFT alone; one with no first token is missed. Every window counts it."""
    windows = FrontendWindows(("load", "interval"), targets=(3000.0, 50.0))
    windows.on_finish(finished(100.0, 40.0))  # met
    windows.on_finish(finished(3000.0, 50.0))  # met: at the targets
    windows.on_finish(finished(4000.0, 10.0))  # TTFT missed
    windows.on_finish(finished(100.0, 60.0, gaps=12))  # ITL missed
    windows.on_finish(finished(100.0, None))  # one token: met
    windows.on_finish(finished(None, None))  # no first token: missed
    load = windows.take("load", 5.0)
    assert (load.num_judged_requests, load.num_met_requests) == (6, 3)
    # the token gaps' mean, as a frontend's ITL histogram gives it (not the requests' means)
    expected_ms = (4 * 40.0 + 4 * 50.0 + 4 * 10.0 + 12 * 60.0) / 24  # 46.7; the requests' 40
    assert load.mean_itl_ms == pytest.approx(expected_ms, rel=1e-12)
    interval = windows.take("interval", 60.0)
    assert (interval.num_judged_requests, interval.num_met_requests) == (6, 3)
    assert windows.take("load", 5.0).num_judged_requests == 0  # taken: empty again
    unjudged = FrontendWindows(("load",))
    unjudged.on_finish(finished(100.0, 40.0))
    assert unjudged.take("load", 5.0).num_judged_requests == 0


def test_a_simulated_fleets_lengths_are_measured_as_a_frontend_measures_them() -> None:
    """Input over first tokens, output over finished requests: unknown until measured (0.0),
    then the last window's while none is."""
    windows = FrontendWindows(("load",))
    for _ in range(3):
        windows.on_arrival()
    first = windows.take("load", 5.0)  # arrivals, nothing measured yet
    assert (first.num_requests, first.mean_input_tokens, first.mean_output_tokens) == (3, 0.0, 0.0)
    assert (first.mean_ttft_ms, first.mean_itl_ms) == (None, None)
    windows.on_first_token(200.0, 100, 400)
    windows.on_first_token(400.0, 0, 200)
    second = windows.take("load", 5.0)
    assert (second.num_requests, second.mean_input_tokens) == (0, 300.0)
    assert second.mean_ttft_ms == pytest.approx(300.0, rel=1e-12)
    assert second.prefix_hit_rate == 100 / 600
    assert second.mean_output_tokens == 0.0  # none finished
    windows.on_finish(finished(200.0, 20.0, gaps=9))
    windows.on_finish(finished(400.0, 20.0, gaps=29))
    third = windows.take("load", 5.0)
    assert third.mean_output_tokens == (10 + 30) / 2
    assert (third.mean_input_tokens, third.prefix_hit_rate) == (300.0, 100 / 600)  # kept
    assert windows.take("load", 5.0).mean_output_tokens == 20.0  # kept


def test_the_recent_attainment_sums_the_windows_kept() -> None:
    recent = RecentWindows(window_s=10.0, load_interval_s=5.0)  # the last two windows

    def window(judged: int, met: int) -> FrontendMetrics:
        return FrontendMetrics(
            window_s=5.0,
            num_requests=judged,
            mean_input_tokens=100.0,
            mean_output_tokens=10.0,
            num_judged_requests=judged,
            num_met_requests=met,
        )

    recent.add(window(10, 10))
    load = recent.add(window(30, 20))
    assert load.get_attainment(min_judged=20) == 30 / 40
    load = recent.add(window(0, 0))  # the first window left the two kept
    assert (load.num_judged_requests, load.num_met_requests) == (30, 20)
    assert load.get_attainment(min_judged=31) is None


SLO_FAMILIES = """\
# HELP armature_slo_requests_total Finished requests judged against the SLO targets, met or missed
# TYPE armature_slo_requests_total counter
armature_slo_requests_total{{result="met"}} {met}.0
armature_slo_requests_total{{result="missed"}} {missed}.0
# HELP armature_slo_requests_created Finished requests judged against the SLO targets, met or missed
# TYPE armature_slo_requests_created gauge
armature_slo_requests_created{{result="met"}} 1.7e+09
# HELP armature_slo_target_seconds The targets requests are judged against
# TYPE armature_slo_target_seconds gauge
armature_slo_target_seconds{{target="ttft"}} 0.5
armature_slo_target_seconds{{target="itl"}} 0.03
"""


def scrape(met: int, missed: int, *, judged: bool = True) -> FrontendSample:
    text = exposition(
        ok=met + missed,
        bad=0,
        left=0,
        in_flight=0,
        queued=0,
        prompt=100,
        cached=0,
        output=10,
        ttft=(met + missed, 1.0),
        itl=(10, 0.1),
        e2e=met + missed,
    )
    return parse_frontend_sample(
        text + (SLO_FAMILIES.format(met=met, missed=missed) if judged else "")
    )


def test_a_scrape_reads_the_judged_requests_and_a_window_their_differences() -> None:
    before, after = scrape(18, 2), scrape(55, 5)
    assert (before.num_slo_met, before.num_slo_missed) == (18.0, 2.0)
    assert (before.slo_ttft_target_s, before.slo_itl_target_s) == (0.5, 0.03)
    window = get_window_metrics(before, after, 5.0)
    assert (window.num_judged_requests, window.num_met_requests) == (40, 37)
    unjudged = scrape(0, 0, judged=False)
    assert (unjudged.slo_ttft_target_s, unjudged.slo_itl_target_s) == (None, None)
    assert get_window_metrics(unjudged, unjudged, 5.0).num_judged_requests == 0


def test_the_planner_reads_only_a_frontend_judging_by_its_own_targets() -> None:
    sample = scrape(1, 0)  # the frontend judges against TTFT 500 ms and ITL 30 ms
    assert judges_by(sample, 500.0, 30.0)
    assert not judges_by(sample, 500.0, 50.0)
    same = PlannerConfig(ttft_ms=500.0, itl_ms=30.0)
    assert describe_attainment_source(same, sample) == "the frontend's judged requests"
    other = PlannerConfig(ttft_ms=3000.0, itl_ms=30.0)
    assert describe_attainment_source(other, sample) == (
        "not measured: the frontend judges requests against TTFT 500 ms and ITL 30 ms (start "
        "it with --slo-ttft-ms 3000 --slo-itl-ms 30)"
    )
    unjudged = scrape(0, 0, judged=False)
    assert not judges_by(unjudged, 500.0, 30.0)
    assert "against no targets" in describe_attainment_source(same, unjudged)
