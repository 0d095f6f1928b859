"""The Planner state machine: the throughput plan on a step load, hysteresis, the load rule,
cool-downs, limits, and the queueing model acting before the threshold rule.

Profile: conftest.py. Load: prompts of 3000 tokens, half from the prefix cache (n = 1500,
prefill p = 0.17 s), 200 output tokens; targets TTFT 500 ms, ITL 30 ms. Decode context
3000 + 100 = 3100: step = 0.010 + 0.001025 B <= 0.030 -> B = 19, step 0.029475 s, a
request decodes for 200 x 0.029475 = 5.895 s.

    2 req/s:  prefill 2 x 0.17 = 0.34 -> 1;   decode 2 x 5.895 / 19 = 0.62 -> 1
    10 req/s: prefill 10 x 0.17 = 1.7 -> 2;   decode 10 x 5.895 / 19 = 3.10 -> 4
"""

from __future__ import annotations

import msgspec
import pytest

from armature.config import PlannerConfig
from armature.planner import (
    DecisionReason,
    FrontendMetrics,
    LimitHold,
    LimitReason,
    PerformanceModel,
    Planner,
    PlannerObservation,
    ScalingDecision,
    WorkerSteps,
)
from armature.planner.forecast import LoadForecast
from armature.planner.live import LiveEstimate
from armature.planner.load_rule import LoadRule, Pending, RoleState, get_halfway
from armature.planner.predictors import ConstantPredictor
from armature.planner.recent_load import get_rate_bounds, get_rising_rate
from armature.planner.replicas import PoolPlan, Targets, plan_prefill
from armature.protocols.engine import StepRecord
from armature.protocols.worker import WorkerRole

P, D, A = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.AGG
INTERVAL_S = 60.0


def observe(
    rate_per_s: float,
    window_s: float = INTERVAL_S,
    *,
    isl: float = 3000.0,
    osl: float = 200.0,
    workers: list[WorkerSteps] | None = None,
) -> PlannerObservation:
    frontend = FrontendMetrics(
        window_s=window_s,
        num_requests=round(rate_per_s * window_s),
        mean_input_tokens=isl,
        mean_output_tokens=osl,
        prefix_hit_rate=0.5,
    )
    return PlannerObservation(frontend=frontend, workers=workers or [])


def make_planner(profile: PerformanceModel, **settings: object) -> Planner:
    values: dict[str, object] = {"ttft_ms": 500.0, "itl_ms": 30.0, "queue_aware": False}
    values.update(settings)
    return Planner(PlannerConfig(**values), profile, predictor_factory=ConstantPredictor)  # type: ignore[arg-type]


def run_intervals(planner: Planner, rates: list[float]) -> list[list[ScalingDecision]]:
    return [
        planner.plan_interval(observe(rate), now_s=INTERVAL_S * (k + 1)).decisions
        for k, rate in enumerate(rates)
    ]


def summary(decisions: list[ScalingDecision]) -> list[tuple[str, int, int, str]]:
    return [(d.role.value, d.from_workers, d.to_workers, d.reason.value) for d in decisions]


def test_step_load_scales_up_at_once_and_down_after_the_window(
    profile: PerformanceModel,
) -> None:
    """2 -> 10 -> 2 req/s. Up in the interval that first predicts 10; the first interval
    back at 2 (t = 420) still has the t = 360 plan (2, 4) in its 60 s window, so the pools go
    down one interval later (t = 480), half the way: prefill 2 -> 1, decode 4 -> 2 (not 1),
    and decode the rest of the way an interval later (t = 540)."""
    planner = make_planner(profile)
    decisions = run_intervals(planner, [2, 2, 2, 10, 10, 10, 2, 2, 2])
    assert [k for k, d in enumerate(decisions) if d] == [3, 7, 8]
    assert summary(decisions[3]) == [
        ("prefill", 1, 2, "throughput"),
        ("decode", 1, 4, "throughput"),
    ]
    assert summary(decisions[7]) == [
        ("prefill", 2, 1, "throughput"),
        ("decode", 4, 2, "throughput"),
    ]
    assert summary(decisions[8]) == [("decode", 2, 1, "throughput")]
    assert decisions[3][0].get_log_line() == (
        "planner: prefill 1 -> 2 workers, throughput: predicted 10 req/s, isl 3000, osl 200; "
        "by throughput 2, by queue None; service 170.0 ms"
    )
    assert planner.get_num_workers() == {P: 1, D: 1}


def test_queue_aware_plan_adds_a_prefill_worker(profile: PerformanceModel) -> None:
    """10 req/s at p = 0.17 s with 0.33 s of slack: Erlang C needs 3 (test_planner_replicas);
    decode's 4 workers (76 slots at a = 58.95 Erlangs) already let 95% of requests wait within
    their slack, (0.030 - 0.029475) x 199 = 0.104 s."""
    planner = make_planner(profile, queue_aware=True)
    decisions = run_intervals(planner, [10])
    assert summary(decisions[0]) == [
        ("prefill", 1, 3, "throughput"),
        ("decode", 1, 4, "throughput"),
    ]


def test_alternating_load_does_not_flap(profile: PerformanceModel) -> None:
    """2, 10, 2, 10, ...: every 60 s window holds a plan for 10 req/s, so after the first
    scale-up nothing moves (the complaint about planners that oscillate)."""
    planner = make_planner(profile)
    decisions = run_intervals(planner, [2, 10] * 6)
    assert [(k, summary(d)) for k, d in enumerate(decisions) if d] == [
        (1, [("prefill", 1, 2, "throughput"), ("decode", 1, 4, "throughput")])
    ]


def test_agg_mode_sizes_one_pool(profile: PerformanceModel) -> None:
    """ITL 50 ms: decode at 3100 tokens takes B = 39, 9.995 s a request; 5 req/s:
    5 x 0.17 + 5 x 9.995 / 39 = 2.13 -> 3, and 4 to keep 95% of requests' own ITL
    (test_planner_replicas.test_agg_replicas)."""
    planner = make_planner(profile, mode="agg", itl_ms=50.0)
    decisions = run_intervals(planner, [5])
    assert summary(decisions[0]) == [("agg", 1, 4, "throughput")]


def test_max_workers_and_total_budget_limit_the_plan(profile: PerformanceModel) -> None:
    """10 req/s wants (2, 4); max 3 per role gives (2, 3); a total of 4 then shares 4 over
    wanted (2, 3): 1.6 and 2.4 -> 1 and 2, the one left to prefill's 0.6: (2, 2)."""
    capped = make_planner(profile, max_workers=3)
    assert [(d.to_workers, d.limited_by) for d in run_intervals(capped, [10])[0]] == [
        (2, None),
        (3, LimitReason.MAX_WORKERS),
    ]
    budget = make_planner(profile, max_workers=3, max_total_workers=4)
    decisions = run_intervals(budget, [10])[0]
    assert [(d.to_workers, d.wanted_workers, d.limited_by) for d in decisions] == [
        (2, 2, None),
        (2, 4, LimitReason.TOTAL_WORKERS),
    ]


def test_a_maximum_that_holds_a_role_is_reported_with_or_without_a_change(
    profile: PerformanceModel,
) -> None:
    """10 req/s wants decode 4 with max 3: 1 -> 3 and held (4 asked for); the next interval
    asks 4 again, no change is left to make, and it is still reported held. At 2 req/s
    (decode 1) nothing is held. Prefill (2 of 3) never is."""
    planner = make_planner(profile, max_workers=3)
    first = planner.plan_interval(observe(10), now_s=INTERVAL_S)
    assert [(d.role, d.to_workers) for d in first.decisions] == [(P, 2), (D, 3)]
    hold = LimitHold(
        role=D,
        num_workers=3,
        wanted_workers=4,
        reason=DecisionReason.THROUGHPUT,
        limited_by=LimitReason.MAX_WORKERS,
        at_s=INTERVAL_S,
    )
    assert first.limited == [hold]
    again = planner.plan_interval(observe(10), now_s=2 * INTERVAL_S)
    assert again.decisions == []
    assert again.limited == [msgspec.structs.replace(hold, at_s=2 * INTERVAL_S)]
    assert planner.plan_interval(observe(2), now_s=3 * INTERVAL_S).limited == []


def test_the_load_rule_at_its_maximum_is_held_not_silent(profile: PerformanceModel) -> None:
    """One prefill worker at max 1 with a 1.53 s live TTFT: the load rule asks for 2, the
    maximum keeps 1, no decision, and the hold names the rule."""
    planner = make_planner(profile, worker_startup_s=0.0, max_workers=1)
    effects = planner.plan_load(
        observe(2, window_s=5.0, workers=prefill_workers(1, 12000)), now_s=0.0
    )
    assert effects.decisions == [] and effects.held == []
    assert [(h.role, h.num_workers, h.wanted_workers, h.reason) for h in effects.limited] == [
        (P, 1, 2, DecisionReason.TTFT_ABOVE_TARGET)
    ]
    assert effects.limited[0].get_log_line() == (
        "planner: prefill wants 2 workers (ttft_above_target) but max_workers holds it at 1: "
        "its targets may be missed"
    )


def test_a_queue_the_maximum_cannot_serve_gets_the_maximum_and_is_held(
    profile: PerformanceModel,
) -> None:
    """Queue-aware, TTFT 200 ms, 10 req/s: prefill needs 5 by the queue, 2 by capacity
    (test_planner_replicas). With a maximum of 4 it gets 4, reported held, not capacity's 2."""
    planner = make_planner(profile, queue_aware=True, ttft_ms=200.0, max_workers=4)
    effects = planner.plan_interval(observe(10), now_s=INTERVAL_S)
    assert [(d.role, d.to_workers, d.wanted_workers) for d in effects.decisions] == [
        (P, 4, 5),
        (D, 4, 4),
    ]
    assert [(h.role, h.num_workers, h.wanted_workers) for h in effects.limited] == [(P, 4, 5)]


def test_a_total_budget_that_holds_a_role_is_reported(profile: PerformanceModel) -> None:
    """10 req/s wants (2, 4) under a total of 4: decode gets 2 of the 4 it asked for."""
    planner = make_planner(profile, max_workers=3, max_total_workers=4)
    effects = planner.plan_interval(observe(10), now_s=INTERVAL_S)
    assert [(h.role, h.num_workers, h.wanted_workers, h.limited_by) for h in effects.limited] == [
        (D, 2, 4, LimitReason.TOTAL_WORKERS)
    ]


def test_a_held_shrink_leaves_no_room_in_the_total_budget(profile: PerformanceModel) -> None:
    """Total 4. The load rule takes prefill 1 -> 2 -> 3 (t = 0, 10). At t = 20 the plan for
    10 req/s wants (3, 4) and shares the 4 as (2, 2): prefill's shrink is held by its 60 s
    down cool-down, so decode may not grow into the room it would have left (the fleet went
    to 5, and stayed above its budget)."""
    planner = make_planner(profile, worker_startup_s=0.0, max_total_workers=4)
    planner.plan_load(observe(2, window_s=5.0, workers=prefill_workers(1, 12000)), now_s=0.0)
    planner.plan_load(observe(2, window_s=5.0, workers=prefill_workers(2, 24000)), now_s=10.0)
    assert planner.get_num_workers() == {P: 3, D: 1}
    effects = planner.plan_interval(observe(10), now_s=20.0)
    assert (summary(effects.decisions), summary(effects.held)) == (
        [],
        [("prefill", 3, 2, "throughput")],
    )
    assert [(h.role, h.num_workers, h.wanted_workers) for h in effects.limited] == [
        (P, 2, 3),
        (D, 1, 4),  # held at what the total leaves it now
    ]
    assert all(h.limited_by is LimitReason.TOTAL_WORKERS for h in effects.limited)
    assert planner.get_num_workers() == {P: 3, D: 1}
    # once prefill's cool-down lets it shrink, decode grows into the room
    effects = planner.plan_interval(observe(10), now_s=80.0)
    assert summary(effects.decisions) == [
        ("prefill", 3, 2, "throughput"),
        ("decode", 1, 2, "throughput"),
    ]
    assert planner.get_num_workers() == {P: 2, D: 2}


def prefill_workers(num_workers: int, queued_tokens: float) -> list[WorkerSteps]:
    record = StepRecord(num_queued_prefill_tokens=round(queued_tokens / num_workers))
    return [
        WorkerSteps(worker_id=f"p{i}", role=P, step_records=[record]) for i in range(num_workers)
    ]


def decode_workers(num_workers: int, step_s: float) -> list[WorkerSteps]:
    record = StepRecord(num_decode_requests=8, num_decode_kv_tokens=8 * 3100, step_wall_s=step_s)
    return [
        WorkerSteps(worker_id=f"d{i}", role=D, step_records=[record]) for i in range(num_workers)
    ]


def test_load_rule_adds_one_above_target_with_a_cool_down(
    profile: PerformanceModel,
) -> None:
    """A 12000-token queue on one prefill worker: ttft = 0.17 (12000 + 1500) / 1500 = 1.53 s
    > 0.5 s. Workers that serve at once (worker_startup_s 0): +1 at t = 0; at t = 5, with two
    serving and the queue as long on each, the 10 s cool-down holds the next +1; at t = 10 it
    goes."""
    planner = make_planner(profile, worker_startup_s=0.0)
    first = planner.plan_load(
        observe(2, window_s=5.0, workers=prefill_workers(1, 12000)), now_s=0.0
    )
    assert summary(first.decisions) == [("prefill", 1, 2, "ttft_above_target")]
    assert first.decisions[0].detail == "live ttft 1530 ms"
    load = observe(2, window_s=5.0, workers=prefill_workers(2, 24000))
    held = planner.plan_load(load, now_s=5.0)
    assert (summary(held.decisions), summary(held.held)) == (
        [],
        [("prefill", 2, 3, "ttft_above_target")],
    )
    assert summary(planner.plan_load(load, now_s=10.0).decisions) == [
        ("prefill", 2, 3, "ttft_above_target")
    ]


def test_load_rule_waits_for_a_starting_worker(profile: PerformanceModel) -> None:
    """Workers take 30 s to start. The live TTFT is above target (1.53 s) with the queue
    growing (12 req/s against one worker): +1. Five and fifteen seconds later the same
    window, one worker still serving: the one asked for is starting, so nothing more (not
    even a held decision); once it serves and the queue still grows, +1 again."""
    planner = make_planner(profile, worker_startup_s=30.0)
    growing = observe(12, window_s=5.0, workers=prefill_workers(1, 12000))
    assert summary(planner.plan_load(growing, now_s=0.0).decisions) == [
        ("prefill", 1, 2, "ttft_above_target")
    ]
    for now_s in (5.0, 15.0):
        effects = planner.plan_load(growing, now_s=now_s)
        assert (effects.decisions, effects.held) == ([], [])
    both = observe(12, window_s=5.0, workers=prefill_workers(2, 40000))
    assert summary(planner.plan_load(both, now_s=30.0).decisions) == [
        ("prefill", 2, 3, "ttft_above_target")
    ]


def test_load_rule_leaves_a_queue_that_drains_before_a_worker_could_start(
    profile: PerformanceModel,
) -> None:
    """12000 queued tokens on one prefill worker are 8 prompts of 1500, 8 x 0.17 = 1.36
    worker-seconds. At 2 req/s (10 arrivals in 5 s; high bound (sqrt(10) + 0.5)^2 / 5 =
    2.68 req/s) the worker is busy 2.68 x 0.17 = 0.456 of its time and clears the queue in
    1.36 / (1 - 0.456) = 2.5 s: a worker asked for now would serve after 30 s, so nothing,
    though the live TTFT (1.53 s) is above target. With a 2 s start it would help: +1."""
    load = observe(2, window_s=5.0, workers=prefill_workers(1, 12000))
    slow_start = make_planner(profile, worker_startup_s=30.0)
    assert slow_start.plan_load(load, now_s=0.0).decisions == []
    fast_start = make_planner(profile, worker_startup_s=2.0)
    assert summary(fast_start.plan_load(load, now_s=0.0).decisions) == [
        ("prefill", 1, 2, "ttft_above_target")
    ]


def test_load_rule_itl_above_target_and_well_below(profile: PerformanceModel) -> None:
    planner = make_planner(profile)
    slow = observe(2, window_s=5.0, workers=decode_workers(1, 0.045))
    assert summary(planner.plan_load(slow, now_s=0.0).decisions) == [
        ("decode", 1, 2, "itl_above_target")
    ]
    # 10 ms < 0.5 x 30 ms: down, but only once it has been so for the 60 s down cool-down
    # (calm from 30 s on), and a busy window in between starts the count again
    fast = observe(2, window_s=5.0, workers=decode_workers(2, 0.010))
    busy = observe(2, window_s=5.0, workers=decode_workers(2, 0.020))
    assert planner.plan_load(fast, now_s=30.0).decisions == []
    assert planner.plan_load(fast, now_s=60.0).decisions == []
    assert planner.plan_load(busy, now_s=70.0).decisions == []  # 20 ms >= 15 ms: not calm
    assert planner.plan_load(fast, now_s=80.0).decisions == []
    assert planner.plan_load(fast, now_s=135.0).decisions == []
    assert summary(planner.plan_load(fast, now_s=140.0).decisions) == [
        ("decode", 2, 1, "below_target")
    ]


def test_load_rule_never_goes_below_the_throughput_plan(profile: PerformanceModel) -> None:
    planner = make_planner(profile)
    run_intervals(planner, [10])  # floor: prefill 2, decode 4
    idle = observe(0.2, window_s=5.0, workers=prefill_workers(2, 0) + decode_workers(4, 0.005))
    assert planner.plan_load(idle, now_s=1000.0).decisions == []
    assert planner.get_floor() == {P: 2, D: 4}


def test_load_rule_grows_into_the_budget_without_shrinking_another_role(
    profile: PerformanceModel,
) -> None:
    planner = make_planner(profile, max_total_workers=3)
    run_intervals(planner, [10])  # wants (2, 4), total 3: (1, 2)
    assert planner.get_num_workers() == {P: 1, D: 2}
    busy = observe(2, window_s=5.0, workers=prefill_workers(1, 12000))
    assert planner.plan_load(busy, now_s=1000.0).decisions == []  # no room: decode keeps 2
    assert planner.get_num_workers() == {P: 1, D: 2}


def simulate_step_load(profile: PerformanceModel, *, queue_aware: bool) -> list[float]:
    """Prefill pool under a step from 5 to 12 req/s at t = 0, as a fluid queue: prompts of
    1500 new tokens (isl 3000, half cached), each worker drains 1500 / 0.17 = 8823.5 tokens/s.
    Two workers (the min) drain 17647 tokens/s against 12 x 1500 = 18000 arriving: the queue
    grows by 353 tokens/s. The live TTFT, 0.17 (Q/2 + 1500) / 1500, passes 0.5 s when
    Q > 5824, after 16.5 s: the threshold rule acts at the t = 20 tick. Erlang C sees the
    rate: at rho = 12 x 0.17 / 2 = 1.02 two workers cannot hold, three reach 0.928 < 0.95,
    four 0.996. It reads the rate's low bound over the last 30 s: at t = 5, 60 arrivals in
    5 s, (sqrt(60) - 0.5)^2 / 5 = 10.50 req/s, for which 3 hold, so it goes to 3 before any
    queue has built (the queue then drains: 3 workers take 26,470 tokens/s); at t = 25, 300
    arrivals in 25 s, (sqrt(300) - 0.5)^2 / 25 = 11.32 req/s, for which 4 are needed.
    Returns the times of the prefill pool's scale-ups."""
    planner = make_planner(profile, queue_aware=queue_aware, min_prefill_workers=2)
    queued_tokens, num_workers, ups = 0.0, 2, []
    for tick in range(1, 9):
        now_s = 5.0 * tick
        rate = 12.0
        drain_per_s = num_workers * 1500 / 0.17
        queued_tokens = max(0.0, queued_tokens + (rate * 1500 - drain_per_s) * 5.0)
        workers = prefill_workers(num_workers, queued_tokens)
        effects = planner.plan_load(observe(rate, window_s=5.0, workers=workers), now_s=now_s)
        for decision in effects.decisions:
            if decision.role is P:
                ups.append(now_s)
                num_workers = decision.to_workers
                assert decision.reason in (
                    DecisionReason.QUEUE_PREDICTED,
                    DecisionReason.TTFT_ABOVE_TARGET,
                )
    return ups


def test_queue_aware_acts_before_the_threshold_rule(profile: PerformanceModel) -> None:
    assert simulate_step_load(profile, queue_aware=False) == [20.0]
    assert simulate_step_load(profile, queue_aware=True) == [5.0, 25.0]


def test_queue_model_does_not_scale_up_before_the_step(profile: PerformanceModel) -> None:
    """5 req/s on two prefill workers: Erlang C 0.973 >= 0.95, no change; one worker would
    give 0.365, so no scale-down either (the live TTFT 0.17 s is below 0.25 s)."""
    planner = Planner(
        PlannerConfig(ttft_ms=500.0, itl_ms=30.0, min_prefill_workers=1),
        profile,
        num_workers={P: 2},
        predictor_factory=ConstantPredictor,
    )
    load = observe(5, window_s=5.0, workers=prefill_workers(2, 0))
    effects = planner.plan_load(load, now_s=100.0)
    assert [d for d in effects.decisions if d.role is P] == []
    assert effects.plans[P].num_by_queue == 2


def test_correction_factor_from_steps_grows_the_plan(profile: PerformanceModel) -> None:
    """Prefill steps twice as slow as the profile: factor 1 -> 1.5; p = 1.5 x 0.17 = 0.255,
    10 req/s -> 2.55 -> 3 prefill workers (not 2)."""
    planner = make_planner(profile)
    slow = StepRecord(num_scheduled_prefill_tokens=1500, step_wall_s=2 * 0.17)
    workers = [WorkerSteps(worker_id="p0", role=P, step_records=[slow])]
    effects = planner.plan_interval(observe(10, workers=workers), now_s=60.0)
    assert effects.prefill_correction == pytest.approx(1.5)
    assert summary(effects.decisions)[0] == ("prefill", 1, 3, "throughput")


def test_no_traffic_yet_decides_nothing(profile: PerformanceModel) -> None:
    planner = make_planner(profile)
    empty = PlannerObservation(
        frontend=FrontendMetrics(
            window_s=5.0, num_requests=0, mean_input_tokens=0.0, mean_output_tokens=0.0
        )
    )
    assert planner.plan_load(empty, now_s=0.0).decisions == []
    assert planner.get_num_workers() == {P: 1, D: 1}


def test_prompts_are_sized_before_an_output_length_is_measured(
    profile: PerformanceModel,
) -> None:
    """A live frontend's first windows: arrivals, no request finished (output length 0.0,
    not measured). The load rule still sizes the prefill pool on its prompts (at one output
    token a request until one is measured); the throughput plan waits for a length."""

    def make() -> Planner:
        return Planner(
            PlannerConfig(ttft_ms=500.0, itl_ms=30.0, min_prefill_workers=1),
            profile,
            num_workers={P: 1, D: 1},
            predictor_factory=ConstantPredictor,
        )

    unmeasured, measured = make(), make()
    burst = unmeasured.plan_load(observe(8, window_s=5.0, osl=0.0), 100.0)
    known = measured.plan_load(observe(8, window_s=5.0, osl=1.0), 100.0)
    assert burst.plans[P] == known.plans[P]
    assert burst.plans[P].num_workers > 1  # the burst's prompts need more than one
    assert unmeasured.plan_interval(observe(8, osl=0.0), 160.0).forecast is None


def test_scale_down_goes_half_the_way() -> None:
    assert [get_halfway(14, 6), get_halfway(10, 6), get_halfway(8, 6), get_halfway(7, 6)] == [
        10,
        8,
        7,
        6,
    ]
    assert get_halfway(3, 5) == 3
    assert get_halfway(4, 4) == 4


def test_rising_rate_is_the_highest_low_bound_over_recent_windows() -> None:
    """8 arrivals in the latest 1 s, none in the two before: low bounds (sqrt(8) - 0.5)^2
    = 5.42 over 1 s, 2.71 over 2 s, 1.81 over 3 s -> 5.42 (a rise shows in the latest
    window). 30 arrivals in the window before an empty one: 0 over 5 s, (sqrt(30) - 0.5)^2
    / 10 = 2.477 over 10 s -> 2.477 (one lull moves nothing)."""
    assert get_rising_rate([(8, 1.0), (8, 2.0), (8, 3.0)]) == pytest.approx(5.4216, abs=1e-4)
    assert get_rising_rate([(0, 5.0), (30, 10.0)]) == pytest.approx(2.4772, abs=1e-4)
    assert get_rising_rate([]) == 0.0


def test_load_rule_scales_down_on_the_whole_rate_window(profile: PerformanceModel) -> None:
    """Two prefill workers; 12 arrivals in a 5 s window (low bound (sqrt(12) - 0.5)^2 / 5 =
    1.757 req/s: one worker would let only 1 - 0.2987 e^-(1/0.17 - 1.757) 0.33 = 0.923 of
    prompts wait within the slack, so 2 stay), then an empty one, the live TTFT (0.17 s)
    calm all along. On the empty window alone the high bound, 0.25 / 5 = 0.05 req/s, needs
    1; over the 30 s rate window, 12 arrivals in 10 s, (sqrt(12) + 0.5)^2 / 10 = 1.571
    req/s, one would give 0.936: the pool stays at 2. With a 5 s rate window it goes 2 -> 1,
    once calm for the down cool-down from the empty window: the first window's arrivals
    needed both workers (the role was not calm then; counted calm from it, the queue model
    raised what the throughput plan lowered, tick after tick)."""
    for rate_window_s in (30.0, 5.0):
        config = PlannerConfig(
            ttft_ms=500.0,
            itl_ms=30.0,
            min_prefill_workers=1,
            scale_down_cooldown_s=10.0,
            load_rate_window_s=rate_window_s,
        )
        planner = Planner(config, profile, num_workers={P: 2}, predictor_factory=ConstantPredictor)
        workers = prefill_workers(2, 0)
        planner.plan_load(observe(2.4, window_s=5.0, workers=workers), 0.0)
        effects = planner.plan_load(observe(0, window_s=5.0, workers=workers), 10.0)
        assert summary([d for d in effects.decisions if d.role is P]) == []
        if rate_window_s == 5.0:
            effects = planner.plan_load(observe(0, window_s=5.0, workers=workers), 20.0)
            decisions = [d for d in effects.decisions if d.role is P]
            assert summary(decisions) == [("prefill", 2, 1, "below_target")]


def test_rate_bounds_of_a_window() -> None:
    """16 arrivals in 5 s: (4 -+ 0.5)^2 / 5 = 2.45 and 4.05 req/s; none: 0 and 0.25 / 5."""
    assert get_rate_bounds(16, 5.0) == pytest.approx((2.45, 4.05))
    assert get_rate_bounds(0, 5.0) == pytest.approx((0.0, 0.05))
    assert get_rate_bounds(1, 2.0) == pytest.approx((0.125, 1.125))


def test_queue_jump_reads_the_low_bound_of_a_short_window(profile: PerformanceModel) -> None:
    """8 arrivals in a 1 s window: on its face 8 req/s, for which the queue model wants 3
    prefill workers; 5 req/s gives such a window now and then. The low bound,
    (sqrt(8) - 0.5)^2 = 5.4 req/s, needs 2, so the two workers stay."""
    face = plan_prefill(
        LoadForecast(8.0, 3000.0, 200.0),
        0.5,
        profile,
        1.0,
        Targets(0.5, 0.03, 0.95),
        queue_aware=True,
        max_workers=8,
    )
    assert face.num_by_queue == 3
    planner = Planner(
        PlannerConfig(ttft_ms=500.0, itl_ms=30.0, min_prefill_workers=1),
        profile,
        num_workers={P: 2},
        predictor_factory=ConstantPredictor,
    )
    effects = planner.plan_load(observe(8, window_s=1.0, workers=prefill_workers(2, 0)), 100.0)
    assert effects.plans[P].num_by_queue == 2
    assert [d for d in effects.decisions if d.role is P] == []


def test_throughput_plan_does_not_undo_the_load_rule_until_calm(
    profile: PerformanceModel,
) -> None:
    """The load rule adds a decode worker for a slow ITL; a low prediction does not take it
    away until the live estimates have been calm (below half the targets) for the 60 s down
    cool-down: calm from 70 s, so not at 120 s, and at 180 s."""
    planner = make_planner(profile)
    slow = observe(2, window_s=5.0, workers=decode_workers(1, 0.045))
    assert summary(planner.plan_load(slow, now_s=0.0).decisions) == [
        ("decode", 1, 2, "itl_above_target")
    ]
    quiet = observe(0.5)
    assert [d for d in planner.plan_interval(quiet, now_s=60.0).decisions if d.role is D] == []
    fast = observe(2, window_s=5.0, workers=decode_workers(2, 0.010))
    assert planner.plan_load(fast, now_s=70.0).decisions == []
    assert [d for d in planner.plan_interval(quiet, now_s=120.0).decisions if d.role is D] == []
    assert [
        summary([d])[0] for d in planner.plan_interval(quiet, now_s=180.0).decisions if d.role is D
    ] == [("decode", 2, 1, "throughput")]


def test_queue_aware_load_rule_sizes_for_the_backlog_at_the_join(
    profile: PerformanceModel,
) -> None:
    """50 arrivals in 5 s: low bound (sqrt(50) - 0.5)^2 / 5 = 8.636 req/s, for which the
    queue model wants 3 prefill workers; they keep 8.636 x 0.17 = 1.468 workers busy. Two
    serve, with 600,000 tokens queued: 400 prompts, 68 worker-seconds. Workers asked for now
    serve 30 s later, when the backlog is 68 + 30 (1.468 - 2) = 52.04 worker-seconds;
    clearing it in 30 s more takes 1.468 + 52.04 / 30 = 3.20 -> 4 workers."""
    planner = Planner(
        PlannerConfig(ttft_ms=500.0, itl_ms=30.0, worker_startup_s=30.0),
        profile,
        num_workers={P: 2},
        predictor_factory=ConstantPredictor,
    )
    load = observe(10, window_s=5.0, workers=prefill_workers(2, 600_000))
    effects = planner.plan_load(load, now_s=0.0)
    assert effects.plans[P].num_workers == 3
    assert summary([d for d in effects.decisions if d.role is P]) == [
        ("prefill", 2, 4, "queue_backlog")
    ]


def test_queue_aware_scale_down_goes_to_what_the_high_bound_needs(
    profile: PerformanceModel,
) -> None:
    """Six prefill workers, 10 arrivals a 5 s window, nothing queued: the live TTFT, 0.17 s,
    is below half the target from t = 0. After the 60 s down cool-down of calm the queue
    model at the rate's high bound needs 2 (over the last 30 s, 20 arrivals in 10 s at the
    second tick: (sqrt(20) + 0.5)^2 / 10 = 2.47 req/s): the pool goes half the way, 6 -> 4
    (threshold-only: 6 -> 5)."""
    for queue_aware, expected in ((True, 4), (False, 5)):
        planner = Planner(
            PlannerConfig(ttft_ms=500.0, itl_ms=30.0, queue_aware=queue_aware),
            profile,
            num_workers={P: 6},
            predictor_factory=ConstantPredictor,
        )
        load = observe(2, window_s=5.0, workers=prefill_workers(6, 0))
        assert planner.plan_load(load, now_s=0.0).decisions == []
        down = [d for d in planner.plan_load(load, now_s=60.0).decisions if d.role is P]
        assert summary(down) == [("prefill", 6, expected, "below_target")]


def test_the_kv_share_sizes_decode_for_headroom(profile: PerformanceModel) -> None:
    """4 req/s of 10000-token prompts, ITL 100 ms: the KV cache bounds a decode worker to
    19 requests (3 workers), at share 0.5 to 9 (4 workers; test_planner_replicas)."""

    def decode_workers(**settings: object) -> int:
        planner = make_planner(profile, itl_ms=100.0, **settings)
        planner.plan_interval(observe(4.0, isl=10_000.0), now_s=INTERVAL_S)
        return planner.get_num_workers()[D]

    assert (decode_workers(), decode_workers(decode_kv_share=0.5)) == (3, 4)


def test_a_role_the_queue_model_raised_is_not_calm_while_it_needs_them() -> None:
    """Quiet for long, then the queue model asks for a second prefill worker: the role was
    still counted calm from before, so the throughput plan lowered it 10 s later and the
    queue model raised it again (a flap a cool-down long, cutting requests each time). Calm
    counts again only once the queue model needs fewer than the role has."""
    rule = LoadRule(PlannerConfig(scale_down_cooldown_s=10.0), Targets(1.5, 0.15, 0.95))
    role, quiet = WorkerRole.PREFILL, LiveEstimate(ttft_s=0.247, itl_s=None)
    pending = Pending(1, 0, 0.0, 0.5, 0.5, 0.25, 0.25)
    one = PoolPlan(1, 1, 1, 0.25, True, 0.25)
    two = PoolPlan(2, 1, 2, 0.25, True, 0.25)
    for now_s in range(0, 21, 2):  # idle and quiet
        assert rule.decide(role, RoleState(1, 1), quiet, (one, one), pending, False, now_s) is None
    want = rule.decide(role, RoleState(1, 1), quiet, (two, one), pending, False, 22.0)
    assert want is not None and (want.num_workers, want.reason.value) == (2, "queue_predicted")
    for now_s in range(24, 41, 2):  # two serve it, as the queue model says they must
        assert rule.decide(role, RoleState(2, 1), quiet, (two, one), pending, False, now_s) is None
        assert not rule.is_calm(role, now_s)
    for now_s in range(42, 51, 2):  # the load went: calm from 42
        rule.decide(role, RoleState(2, 1), quiet, (one, one), pending, False, now_s)
    assert not rule.is_calm(role, 50.0) and rule.is_calm(role, 52.0)
