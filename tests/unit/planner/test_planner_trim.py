"""The planner's SLO feedback (`trim.py`): the share of the predicted load the pools are sized
for, lowered by intervals at the high mark, restored by one under target or by a load above
the one it held at.

Profile and load: test_planner_core (decode 5.895 s a request, 19 a worker at ITL 30 ms:
10 req/s needs 10 x 5.895 / 19 = 3.10 -> 4 decode workers, 7 needs 2.17 -> 3, 5 needs 1.55
-> 2, 13 needs 4.03 -> 5).
"""

from __future__ import annotations

import pytest
from test_planner_core import INTERVAL_S, P, make_planner, prefill_workers, summary

from armature.cli.options import Parser, add_settings, read_settings
from armature.config import PlannerConfig
from armature.planner import FrontendMetrics, PerformanceModel, Planner, PlannerObservation
from armature.planner.metrics import PlannerMetrics
from armature.planner.predictors import ConstantPredictor
from armature.planner.trim import RISE_MARGIN, AttainmentTrim, get_high_mark
from armature.protocols.worker import WorkerRole

D = WorkerRole.DECODE


def test_the_high_mark_is_half_way_from_the_target_to_all() -> None:
    assert get_high_mark(0.95) == pytest.approx(0.975)
    assert get_high_mark(0.9) == pytest.approx(0.95)


def test_intervals_at_the_high_mark_lower_the_scale_to_its_floor() -> None:
    trim = AttainmentTrim(step=0.3, min_scale=0.5, slo_attainment=0.95)
    assert trim.get_scale(10.0) == 1.0
    trim.observe(0.98, 10.0)
    assert trim.scale == pytest.approx(0.7)
    trim.observe(0.96, 10.0)  # between the target and the high mark: held
    assert trim.scale == pytest.approx(0.7)
    trim.observe(None, 10.0)  # too few judged to tell: held
    assert trim.scale == pytest.approx(0.7)
    trim.observe(0.975, 9.0)  # at the mark: 0.49, floored
    assert trim.scale == 0.5
    trim.observe(0.94, 10.0)  # under the target: all of the load at once
    assert trim.scale == 1.0


def test_a_load_above_the_one_the_trim_held_at_is_sized_whole() -> None:
    """Held the mark at 8 and then 10 req/s: up to 10 x (1 + RISE_MARGIN) the trim applies,
    above it the whole load is sized for; back under, the trim again."""
    trim = AttainmentTrim(step=0.3, min_scale=0.5, slo_attainment=0.95)
    trim.observe(1.0, 8.0)
    trim.observe(1.0, 10.0)
    limit = 10.0 * (1.0 + RISE_MARGIN)
    assert trim.get_scale(limit) == 0.5  # 0.7 x 0.7 = 0.49, floored
    assert trim.get_scale(limit + 0.01) == 1.0
    assert trim.get_scale(3.0) == 0.5


def test_step_zero_is_off() -> None:
    trim = AttainmentTrim(step=0.0, min_scale=0.5, slo_attainment=0.95)
    for _ in range(5):
        trim.observe(1.0, 10.0)
    assert (trim.scale, trim.get_scale(10.0)) == (1.0, 1.0)


def judged(rate_per_s: float, num_judged: int, num_met: int) -> PlannerObservation:
    return PlannerObservation(
        frontend=FrontendMetrics(
            window_s=INTERVAL_S,
            num_requests=round(rate_per_s * INTERVAL_S),
            mean_input_tokens=3000.0,
            mean_output_tokens=200.0,
            prefix_hit_rate=0.5,
            num_judged_requests=num_judged,
            num_met_requests=num_met,
        )
    )


def test_the_planner_sizes_decode_for_the_trimmed_load(profile: PerformanceModel) -> None:
    """10 req/s throughout. t=60: nothing judged, 4 decode workers. t=120: all 100 met, scale
    0.7, the plan at 7 req/s is 3, but the t=60 plan (4) is still in the down cool-down's
    window: held at 4. t=180: all met again, scale 0.49 -> 0.5, plan at 5 req/s 2; the
    highest plan of the last 60 s is 3: 4 -> 3. t=240: 90 of 100 met, under 0.95: the whole
    10 req/s again, 4. Without the trim the pool stays at 4 throughout."""

    def decode_counts(**settings: object) -> list[int]:
        planner = make_planner(profile, **settings)
        counts = []
        for k, (num_judged, num_met) in enumerate([(0, 0), (100, 100), (100, 100), (100, 90)]):
            effects = planner.plan_interval(judged(10.0, num_judged, num_met), INTERVAL_S * (k + 1))
            counts.append(effects.num_workers[D])
        return counts

    assert decode_counts() == [4, 4, 4, 4]
    assert decode_counts(trim_step=0.3) == [4, 4, 3, 4]


def test_the_trim_flags_and_their_bounds() -> None:
    parser = Parser(prog="armature plan")
    add_settings(parser, PlannerConfig(), environ={})
    argv = ["--planner-trim-step", "0.3", "--planner-trim-min", "0.6"]
    assert read_settings(parser.parse_args(argv), PlannerConfig) == PlannerConfig(
        trim_step=0.3, trim_min_scale=0.6
    )
    assert PlannerConfig().trim_step == 0.0  # off unless asked for
    for flag, bad in (
        ("--planner-trim-step", "1"),
        ("--planner-trim-step", "-0.1"),
        ("--planner-trim-step", "a third"),
        ("--planner-trim-min", "0"),
        ("--planner-trim-min", "1.2"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, bad])


def test_the_high_mark_counts_as_calm_for_the_load_rule(profile: PerformanceModel) -> None:
    """Six prefill workers, no queue: the live TTFT, 0.17 s, is above 0.3 of the 500 ms target
    (--scale-down-ratio 0.3), so the live estimates alone never call the pool calm. With the
    trim on, windows where all 30 judged requests met both targets (at the high mark) do:
    after the 60 s down cool-down the threshold rule removes one, 6 -> 5. Without it, none."""

    def decisions(**settings: object) -> list[tuple[str, int, int, str]]:
        planner = Planner(
            PlannerConfig(
                ttft_ms=500.0,
                itl_ms=30.0,
                queue_aware=False,
                scale_down_ratio=0.3,
                **settings,  # type: ignore[arg-type]
            ),
            profile,
            num_workers={P: 6},
            predictor_factory=ConstantPredictor,
        )
        window = PlannerObservation(
            frontend=FrontendMetrics(
                window_s=5.0,
                num_requests=10,
                mean_input_tokens=3000.0,
                mean_output_tokens=200.0,
                prefix_hit_rate=0.5,
                num_judged_requests=30,
                num_met_requests=30,
            ),
            workers=prefill_workers(6, 0),
        )
        assert planner.plan_load(window, now_s=0.0).decisions == []
        later = planner.plan_load(window, now_s=60.0).decisions
        return [s for s in summary(later) if s[0] == "prefill"]

    assert decisions() == []
    assert decisions(trim_step=0.3) == [("prefill", 6, 5, "below_target")]


def test_the_trim_scale_is_a_gauge(profile: PerformanceModel) -> None:
    """`armature_planner_trim_scale`: 1 from the start, then the scale a tick reports (one
    interval at the high mark at step 0.3: 0.7)."""
    metrics = PlannerMetrics((P, D))
    read = lambda: metrics.registry.get_sample_value("armature_planner_trim_scale")  # noqa: E731
    assert read() == 1.0
    planner = make_planner(profile, trim_step=0.3)
    effects = planner.plan_interval(judged(10.0, 100, 100), INTERVAL_S)
    metrics.observe(effects, {})
    assert effects.trim_scale == pytest.approx(0.7)
    assert read() == pytest.approx(0.7)


def test_the_effects_report_the_prediction_and_the_log_the_share(
    profile: PerformanceModel,
) -> None:
    """The forecast in the effects (and the predicted-rate gauge) is the predictor's own;
    the decision's detail says what share of it the pools were sized for (two intervals at
    the high mark: 0.7, then 0.49 floored to 0.5; decode at 5 req/s needs 2, from 3)."""
    planner = make_planner(profile, trim_step=0.3)
    planner.plan_interval(judged(10.0, 100, 100), INTERVAL_S)
    effects = planner.plan_interval(judged(10.0, 100, 100), 3 * INTERVAL_S)
    assert effects.forecast is not None and effects.forecast.request_rate_per_s == 10.0
    (decision,) = [d for d in effects.decisions if d.role is D]
    assert (decision.from_workers, decision.to_workers) == (3, 2)
    assert decision.detail.startswith("predicted 10 req/s (sized for 50% of it: SLO feedback)")
