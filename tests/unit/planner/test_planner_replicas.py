"""The throughput plan's formulas against hand-worked examples (profile: conftest.py)."""

from __future__ import annotations

import pytest

from armature.planner import LoadForecast, PerformanceModel, Targets
from armature.planner.agg_itl import get_itl_attainment
from armature.planner.performance import KvHeadroom
from armature.planner.replicas import (
    QUEUE_SEARCH_PAST_MAX,
    get_agg_workers_for_itl,
    get_decode_batch,
    plan_agg,
    plan_decode,
    plan_prefill,
    workers_for,
)

TARGETS = Targets(ttft_s=0.5, itl_s=0.030, slo_attainment=0.95)


def test_workers_for_forgives_float_error() -> None:
    assert workers_for(2.0000000001) == 2
    assert workers_for(2.01) == 3
    assert workers_for(0.0) == 0


def test_prefill_replicas(profile: PerformanceModel) -> None:
    """10 req/s of 3000 tokens, half from the prefix cache: n = 1500 new tokens,
    p = 0.02 + 1e-4 x 1500 = 0.17 s. Predicted prompt tokens/s 10 x 1500 = 15000; one worker
    sustains 1500 / 0.17 = 8823.5 tokens/s; 15000 / 8823.5 = 1.7 -> 2 workers.
    Correction 1.5: p = 0.255 s, 2.55 -> 3 workers."""
    load = LoadForecast(10.0, 3000.0, 200.0)
    plan = plan_prefill(load, 0.5, profile, 1.0, TARGETS, queue_aware=False, max_workers=16)
    assert (plan.num_workers, plan.num_by_throughput, plan.num_by_queue) == (2, 2, None)
    assert plan.service_s == pytest.approx(0.17)
    assert plan.meets_target
    slower = plan_prefill(load, 0.5, profile, 1.5, TARGETS, queue_aware=False, max_workers=16)
    assert slower.num_workers == 3


def test_prefill_replicas_with_the_queue(profile: PerformanceModel) -> None:
    """Same load, queue-aware: lam = 10, s = 0.17 (a = 1.7), slack 0.5 - 0.17 = 0.33 s.
    c = 2: 1 - C(2, 1.7) e^-(2/0.17 - 10) 0.33 = 0.564 < 0.95; c = 3: 0.975 -> 3 workers,
    one more than capacity alone: at 85% utilization too many prompts would wait."""
    load = LoadForecast(10.0, 3000.0, 200.0)
    plan = plan_prefill(load, 0.5, profile, 1.0, TARGETS, queue_aware=True, max_workers=16)
    assert (plan.num_workers, plan.num_by_throughput, plan.num_by_queue) == (3, 2, 3)


def test_prefill_queue_past_the_maximum_asks_for_what_it_needs(
    profile: PerformanceModel,
) -> None:
    """TTFT 200 ms: slack 0.2 - 0.17 = 0.03 s at lam = 10, s = 0.17 (a = 1.7). C(4, 1.7) =
    0.1087: 1 - 0.1087 e^-(4/0.17 - 10) 0.03 = 0.9276 < 0.95; C(5, 1.7) = 0.0326: 0.9818 -> 5
    workers, against 2 by capacity. With a maximum of 4 the plan still asks for 5 (the
    limits cap it at 4 and report the role held), not capacity's 2. At 20 req/s (capacity 4,
    the queue 7) with a maximum of 1 the search stops at 4 x 1 workers: at least 5."""
    load = LoadForecast(10.0, 3000.0, 200.0)
    tight = Targets(ttft_s=0.2, itl_s=0.030, slo_attainment=0.95)
    for max_workers in (16, 4):
        plan = plan_prefill(
            load, 0.5, profile, 1.0, tight, queue_aware=True, max_workers=max_workers
        )
        assert (plan.num_workers, plan.num_by_throughput, plan.num_by_queue) == (5, 2, 5)
    assert QUEUE_SEARCH_PAST_MAX == 4
    heavy = LoadForecast(20.0, 3000.0, 200.0)
    assert (
        plan_prefill(heavy, 0.5, profile, 1.0, tight, queue_aware=True, max_workers=16).num_by_queue
        == 7
    )
    past = plan_prefill(heavy, 0.5, profile, 1.0, tight, queue_aware=True, max_workers=1)
    assert (past.num_workers, past.num_by_throughput, past.num_by_queue) == (5, 4, 5)


def test_prefill_that_cannot_meet_ttft_says_so(profile: PerformanceModel) -> None:
    """8000 new tokens: p = 0.82 s > 0.5 s; no pool size helps, the plan still sizes for
    throughput (2 req/s x 0.82 = 1.64 -> 2) and the queue model gives nothing."""
    load = LoadForecast(2.0, 8000.0, 10.0)
    plan = plan_prefill(load, 0.0, profile, 1.0, TARGETS, queue_aware=True, max_workers=16)
    assert (plan.num_workers, plan.num_by_queue, plan.meets_target) == (2, None, False)


def test_decode_batch_is_the_largest_within_itl(profile: PerformanceModel) -> None:
    """isl 1000, osl 200: context 1000 + 200/2 = 1100; step = 0.010 + 0.000525 B <= 0.030
    -> B <= 38.1 -> B = 38, step 0.02995 s."""
    batch = get_decode_batch(profile, 1100.0, 0.030, 1.0)
    assert (batch.num_requests, batch.meets_itl) == (38, True)
    assert batch.step_s == pytest.approx(0.02995)
    # ITL 5 ms: not even one request (0.010525 s)
    alone = get_decode_batch(profile, 1100.0, 0.005, 1.0)
    assert (alone.num_requests, alone.meets_itl) == (1, False)


def test_decode_replicas(profile: PerformanceModel) -> None:
    """B = 38 at step 0.02995 s; a request stays osl x step = 200 x 0.02995 = 5.99 s.
    Little: 10 req/s x 5.99 s = 59.9 requests in flight; / 38 per worker = 1.58 -> 2.
    (A worker finishes 38 / 5.99 = 6.34 req/s.) 30 req/s: 179.7 / 38 = 4.73 -> 5."""
    plan = plan_decode(
        LoadForecast(10.0, 1000.0, 200.0), profile, 1.0, TARGETS, queue_aware=False, max_workers=16
    )
    assert plan.num_workers == 2
    assert plan.service_s == pytest.approx(5.99)
    busier = plan_decode(
        LoadForecast(30.0, 1000.0, 200.0), profile, 1.0, TARGETS, queue_aware=False, max_workers=16
    )
    assert busier.num_workers == 5


def test_decode_replicas_with_kv_headroom(profile: PerformanceModel) -> None:
    """isl 10000, osl 200, ITL 100 ms: context 10100, step = 0.010 + 0.002775 B <= 0.1 for
    B <= 32, but the KV cache holds 200000 // 10100 = 19: B = 19, step 0.062725 s, a request
    stays 12.545 s; 4 req/s: 50.18 / 19 = 2.64 -> 3 workers. Filling half the cache:
    200000 // 20200 = 9, step 0.034975 s, stay 6.995 s; 27.98 / 9 = 3.11 -> 4 workers."""
    load = LoadForecast(4.0, 10_000.0, 200.0)
    targets = Targets(ttft_s=0.5, itl_s=0.1, slo_attainment=0.95)
    full = plan_decode(load, profile, 1.0, targets, queue_aware=False, max_workers=16)
    assert full.num_workers == 3
    assert full.service_s == pytest.approx(200 * 0.062725)
    half = plan_decode(
        load, KvHeadroom(profile, 0.5), 1.0, targets, queue_aware=False, max_workers=16
    )
    assert half.num_workers == 4
    assert half.service_s == pytest.approx(200 * 0.034975)


def test_decode_replicas_with_the_queue(profile: PerformanceModel) -> None:
    """30 req/s: 5 workers are 190 slots for a = 179.7 Erlangs; the slack is
    (0.030 - 0.02995) x 199 = 0.00995 s, so nearly no arrival may wait: Erlang C must be
    <= 5%, which 190 slots are not and 228 (6 workers) are."""
    plan = plan_decode(
        LoadForecast(30.0, 1000.0, 200.0), profile, 1.0, TARGETS, queue_aware=True, max_workers=16
    )
    assert (plan.num_by_throughput, plan.num_by_queue, plan.num_workers) == (5, 6, 6)


def test_agg_replicas(profile: PerformanceModel) -> None:
    """5 req/s, isl 3000 (half cached), osl 200, ITL 50 ms. Prefill p = 0.17 s. Decode at
    context 3100: step = 0.010 + 0.001025 B <= 0.050 -> B = 39, step 0.049975 s, a request
    decodes for 200 x 0.049975 = 9.995 s. Time per second of the pool: 5 x 0.17 = 0.85 on
    prefill + 5 x 9.995 / 39 = 1.2814 on decode = 2.131 -> 3 workers. Their mean ITL holds
    (17 decodes, step 0.027425 s, / (1 - 0.283) = 38.3 ms), but per request only 0.917 of
    them keep it (`get_itl_attainment(5 / 3, 0.17, 0.027425, 200, 0.05)`: the short answers
    a prefill lands on), below 0.95; 4 workers (13 decodes, step 0.023325 s): 0.978 -> 4."""
    targets = Targets(ttft_s=0.5, itl_s=0.050, slo_attainment=0.95)
    plan = plan_agg(
        LoadForecast(5.0, 3000.0, 200.0),
        0.5,
        profile,
        (1.0, 1.0),
        targets,
        queue_aware=False,
        max_workers=16,
    )
    assert (plan.num_workers, plan.num_by_throughput) == (4, 4)
    assert plan.service_s == pytest.approx(0.17 + 9.995)
    assert get_itl_attainment(5.0 / 3.0, 0.17, 0.027425, 200.0, 0.050) == pytest.approx(
        0.9169, abs=1e-4
    )
    assert get_itl_attainment(5.0 / 4.0, 0.17, 0.023325, 200.0, 0.050) == pytest.approx(
        0.9781, abs=1e-4
    )


def test_agg_replicas_keep_itl_while_prefills_share_the_steps(profile: PerformanceModel) -> None:
    """5 req/s, isl 6000 (half cached), osl 200, ITL 50 ms: p = 0.02 + 1e-4 x 3000 = 0.32 s.
    Decode at context 6100: step = 0.010 + 0.001775 B. By capacity alone: B = 22 within 50
    ms (step 0.04905 s), 1.6 s/s on prefill + 5 x 200 x 0.04905 / 22 = 2.23 on decode ->
    4 workers. But a worker of 4 prefills 40% of the time, and its 13 decodes (1.25 x 200 x
    0.05) step 0.033075 s -> ITL 0.033075 / 0.6 = 0.0551 s, above target; 5 workers: 32%
    and 10 decodes, 0.02775 / 0.68 = 0.0408 s -> 5 by the mean. Per request
    (`get_itl_attainment`): 5 workers keep 0.839 of requests within target, 6 (9 decodes,
    step 0.025975 s) 0.922, 7 (8 decodes, step 0.0242 s) 0.972 -> 7."""
    targets = Targets(ttft_s=0.5, itl_s=0.050, slo_attainment=0.95)
    load = LoadForecast(5.0, 6000.0, 200.0)
    assert get_agg_workers_for_itl(load, 0.32, profile, 1.0, 6100.0, 0.050, 16) == 5
    assert (
        get_agg_workers_for_itl(load, 0.32, profile, 1.0, 6100.0, 0.050, 16, attainment=0.95) == 7
    )
    shares = [
        get_itl_attainment(5.0 / w, 0.32, step_s, 200.0, 0.050)
        for w, step_s in ((5, 0.02775), (6, 0.025975), (7, 0.0242))
    ]
    assert shares == pytest.approx([0.8392, 0.9216, 0.9723], abs=1e-4)
    plan = plan_agg(load, 0.5, profile, (1.0, 1.0), targets, queue_aware=False, max_workers=16)
    assert (plan.num_by_throughput, plan.num_workers, plan.meets_target) == (7, 7, True)
    # within 6 workers it cannot be held: the plan asks for the most it may, and says so
    small = plan_agg(load, 0.5, profile, (1.0, 1.0), targets, queue_aware=False, max_workers=6)
    assert (small.num_workers, small.meets_target) == (6, False)
