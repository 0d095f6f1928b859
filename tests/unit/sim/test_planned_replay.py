"""The planner in the loop of a replay: the fleet follows its decisions on the virtual clock,
new workers start late, leaving ones drain, and the report says what the fleet cost."""

from __future__ import annotations

import dataclasses

import pytest

from armature.config import PlannerConfig
from armature.sim import planned_fleet
from armature.sim.planned_fleet import ReplayTooLongError
from armature.sim.replay import ReplayConfig, get_performance_model, replay
from armature.sim.timing import PolynomialTiming
from armature.workload.rate_shapes import StepShape, reshape_arrivals
from armature.workload.traces import TraceRequest

TTFT_MS, ITL_MS = 150.0, 25.0


def _steady(rate_per_s: float, duration_s: float, input_tokens: int = 512) -> list[TraceRequest]:
    """Unique prompts at a constant rate (no prefix sharing: every prompt is prefilled)."""
    num = int(rate_per_s * duration_s)
    blocks = -(-input_tokens // 512)
    return [
        TraceRequest(
            1000.0 * i / rate_per_s, input_tokens, 32, tuple(range(i * 100, i * 100 + blocks))
        )
        for i in range(num)
    ]


def _config(num_workers: int, rule: str | None, **planner: object) -> ReplayConfig:
    settings: dict[str, object] = {
        "ttft_ms": TTFT_MS,
        "itl_ms": ITL_MS,
        "interval_s": 10.0,
        "load_interval_s": 2.0,
        "scale_up_cooldown_s": 2.0,
        "scale_down_cooldown_s": 10.0,
        "min_workers": 1,
        "max_workers": 6,
        "predictor": "constant",
        "mode": "agg",
    }
    settings.update(planner)
    return ReplayConfig(
        num_workers=num_workers,
        router="round-robin",
        block_size=16,
        num_kv_blocks=4096,
        seed=3,
        planner=PlannerConfig(**settings),  # type: ignore[arg-type]
        planner_rule=rule,
        worker_startup_s=3.0,
    )


STEP = reshape_arrivals(_steady(10.0, 120.0), StepShape(4.0, 20.0, 20.0))


def test_static_fleet_reports_its_cost_and_attainment() -> None:
    report = replay(STEP, _config(1, None))
    span_s = report.simulated_time_s
    assert report.worker_seconds == pytest.approx(span_s)
    assert report.worker_seconds_by_role == {"agg": pytest.approx(span_s)}
    assert report.peak_workers == {"agg": 1}
    assert report.planner_decisions == {}
    # one sample every 2 s of the run, the fleet never changing
    assert len(report.timeline) == pytest.approx(span_s / 2.0, abs=1)
    assert {tuple(s.serving.items()) for s in report.timeline} == {(("agg", 1),)}
    assert sum(s.arrival_rate_per_s * 2.0 for s in report.timeline) == pytest.approx(
        len(STEP), abs=40
    )
    # one worker cannot hold a 25 ms ITL through the step; two can
    assert 0.0 < report.sla_attainment < 0.9
    assert replay(STEP, _config(2, None)).sla_attainment == 1.0


def test_load_rule_grows_the_fleet_in_the_step_and_shrinks_it_after() -> None:
    static = replay(STEP, _config(1, None))
    planned = replay(STEP, _config(1, "load"))
    assert planned.num_requests == len(STEP) and planned.num_rejected == 0  # nothing lost
    assert planned.peak_workers["agg"] > 1
    assert (
        planned.planner_decisions.get("ttft_above_target", 0)
        + planned.planner_decisions.get("queue_predicted", 0)
        >= 1
    )
    assert planned.planner_decisions.get("below_target", 0) >= 1
    in_step = [s for s in planned.timeline if 25.0 <= s.time_s <= 40.0]
    after = [s for s in planned.timeline if s.time_s >= 50.0]  # the step ends at 40 s
    assert max(s.serving["agg"] for s in in_step) > 1
    assert after and after[-1].serving["agg"] < max(s.serving["agg"] for s in in_step)
    assert planned.sla_attainment > static.sla_attainment
    # a worker asked for costs from then: more than one worker's time, less than the peak's
    assert static.worker_seconds < planned.worker_seconds
    assert planned.worker_seconds < planned.peak_workers["agg"] * planned.simulated_time_s


def test_new_workers_join_after_their_startup_time() -> None:
    planned = replay(STEP, _config(1, "load"))
    first_up = next(i for i, s in enumerate(planned.timeline) if s.starting["agg"] > 0)
    started_at_s = planned.timeline[first_up].time_s
    # the worker asked for in the tick before is starting for 3 s: it serves 2 ticks later
    assert planned.timeline[first_up].serving["agg"] == 1
    joined = next(s for s in planned.timeline[first_up:] if s.serving["agg"] > 1)
    assert joined.time_s - started_at_s >= 2.0


def test_same_seed_same_planned_report() -> None:
    a = dataclasses.asdict(replay(STEP, _config(1, "both")))
    b = dataclasses.asdict(replay(STEP, _config(1, "both")))
    a.pop("wall_time_s")
    b.pop("wall_time_s")
    assert a == b


def test_throughput_plan_sizes_the_fleet_for_the_load() -> None:
    # 40 req/s for 60 s: the plan (every 10 s) asks for more than one worker, then keeps it
    heavy = _steady(40.0, 60.0)
    planned = replay(heavy, _config(1, "sla"))
    assert set(planned.planner_decisions) == {"throughput"}
    assert planned.peak_workers["agg"] >= 2
    assert planned.num_requests == len(heavy)


def test_scale_down_drains_in_flight_requests() -> None:
    # 6 workers for a light load: once calm, the load rule takes the pool down, half the way
    # at a time (6 -> 3 -> 2 -> 1), to what the queue model needs at the rate's high bound
    # (one worker) while requests are in flight on the five that leave, and every request
    # still finishes with all its tokens
    light = _steady(5.0, 60.0)
    planned = replay(light, _config(6, "load"))
    assert planned.planner_decisions == {"below_target": 3}
    assert planned.timeline[-1].serving["agg"] == 1
    assert planned.num_requests == len(light) and planned.num_rejected == 0
    assert planned.throughput_tokens_s * planned.simulated_time_s == pytest.approx(32 * len(light))


def test_disaggregated_planner_scales_prefill_for_long_prompts() -> None:
    prompts = reshape_arrivals(_steady(4.0, 90.0, input_tokens=4096), StepShape(4.0, 20.0, 20.0))
    config = dataclasses.replace(
        _config(2, "load", mode="disagg"),
        num_prefill_workers=1,
        max_local_prefill_tokens=0,
    )
    planned = replay(prompts, config)
    assert planned.num_requests == len(prompts)
    assert planned.peak_workers["prefill"] > 1
    assert set(planned.worker_seconds_by_role) == {"prefill", "decode"}


def test_the_report_says_how_long_a_maximum_held_the_fleet_short() -> None:
    """At most one worker through a x4 step that one worker cannot hold: the planner asks
    for more, the maximum holds it, and the report says for how long and how many it asked
    for; the same step with room to grow is never held, and a static fleet has no planner to
    hold."""
    held = replay(STEP, _config(1, "load", max_workers=1))
    assert held.peak_workers == {"agg": 1}
    assert held.planner_most_wanted["agg"] >= 2
    # held from a tick in the step (20-40 s) until a tick after it, within the replay
    assert 0.0 < held.planner_limited_s["agg"] < held.simulated_time_s
    assert set(held.planner_limited_s) == set(held.planner_most_wanted) == {"agg"}
    roomy = replay(STEP, _config(1, "load"))
    assert roomy.peak_workers["agg"] > 1
    assert (roomy.planner_limited_s, roomy.planner_most_wanted) == ({}, {})
    static = replay(STEP, _config(1, None))
    assert (static.planner_limited_s, static.planner_most_wanted) == ({}, {})


def test_a_replay_past_its_sample_budget_stops_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fleet sample every load interval of simulated time, at most MAX_FLEET_SAMPLES: past
    them (a timing far slower than the arrivals, a load interval far too short) the replay
    stops saying so, where it ran for hours."""
    workload = _steady(10.0, 20.0)  # 20 s of arrivals: 10 samples at 2 s, and the drain
    assert len(replay(workload, _config(1, None)).timeline) > 10
    monkeypatch.setattr(planned_fleet, "MAX_FLEET_SAMPLES", 10)
    with pytest.raises(ReplayTooLongError) as caught:
        replay(workload, _config(1, None))
    assert str(caught.value).startswith(
        "the replay passed 10 fleet samples of --load-interval-s 2 (22 s of simulated time)"
    )


def test_disaggregated_planner_sizes_prefill_by_the_prefill_workers_step_times() -> None:
    # the prefill workers prefill 2x slower than the decode workers would: the throughput
    # plan asks for prefill workers by their own step times, not the decode workers'
    prompts = _steady(6.0, 40.0, input_tokens=2048)
    config = dataclasses.replace(
        _config(2, "sla", mode="disagg", max_workers=16),
        num_prefill_workers=1,
        max_local_prefill_tokens=0,
    )
    default = PolynomialTiming()
    slow = PolynomialTiming(prefill_coeffs=tuple(2 * c for c in default.prefill_coeffs))  # type: ignore[arg-type]
    model = get_performance_model(config, default, slow)
    assert model.get_prefill_s(2048) == pytest.approx(2 * default.prefill_ms(2048) / 1000.0)
    assert model.get_decode_step_s(8, 2048) == get_performance_model(
        config, default
    ).get_decode_step_s(8, 2048)

    as_fast = replay(prompts, config, default)
    as_slow = replay(prompts, config, default, slow)
    # the same fleet as when every worker runs the slow step times (decode steps are alike)
    all_slow = replay(prompts, config, slow)
    assert as_fast.peak_workers == {"prefill": 2, "decode": 1}
    assert as_slow.peak_workers == all_slow.peak_workers == {"prefill": 3, "decode": 1}
    assert as_slow.num_requests == as_fast.num_requests == len(prompts)
