"""The local machine's cores shared by the engines and the serving stack (`HostShare`): the
share by hand-worked cases, the step times it gives a local worker, and a search that
predicts a loaded 2-worker fleet slower when the stack takes CPU."""

from __future__ import annotations

import math

import msgspec
import pytest
from configurator_cases import tiny_llama

from armature.configurator.estimate import Prediction
from armature.configurator.hardware import Hardware, local_hardware
from armature.configurator.host import MIN_ENGINE_SHARE, HostShare
from armature.configurator.search import (
    RETRY_RATE_FACTORS,
    Ranked,
    SearchSettings,
    get_acceptance_miss,
    get_sim_timings,
    get_ttft_growth,
    search,
)
from armature.configurator.simulate import make_requests, simulate
from armature.configurator.space import AGG, SearchSpace, Targets, Workload
from armature.protocols.timing_profile import DecodePoint, PrefillPoint
from armature.sim.timing import StepWork
from profiles import make_profile


@pytest.mark.parametrize(
    ("cores", "stack_s", "workers", "rate", "share"),
    [
        (2.0, 0.0, 2, 10.0, 1.0),  # a core each, no stack
        (2.0, 0.0, 4, 1.0, 0.5),  # more engines than cores take turns
        (2.0, 0.05, 1, 2.0, 1.0),  # one engine: the stack runs on the other core
        (2.0, 0.3, 1, 4.0, 0.8),  # 1.2 cores of stack: the 0.2 the free core lacks comes off
        (2.0, 0.05, 2, 2.0, 0.95),  # (2 - 0.05 x 2) / 2
        (4.0, 0.1, 3, 5.0, 1.0),  # 0.5 cores of stack on the one free core
        (2.0, 0.05, 3, 2.0, 1.9 / 3),  # (2 - 0.1) / 3: more engines than cores
        (2.0, 1.0, 2, 10.0, MIN_ENGINE_SHARE),  # the stack would take it all
    ],
)
def test_the_engine_share(
    cores: float, stack_s: float, workers: int, rate: float, share: float
) -> None:
    assert HostShare(cores, stack_s).get_engine_share(workers, rate) == pytest.approx(share)


@pytest.mark.parametrize(
    ("cores", "workers", "share"),
    [
        # 2 req/s of 30 ms: shells 0.02 cores, frontend 0.02, the rest 0.02
        (2.0, 1, 0.96),  # a lone worker runs in the frontend's process: 1 - (0.02 + 0.02)
        (4.0, 2, 0.99),  # the shells only, each its own: 1 - 0.02 / 2
        (2.0, 2, 0.97),  # as many engines as cores: (2 - 0.06) / 2, whoever's process
        (1.0, 2, 0.47),  # more engines than cores: (1 - 0.06) / 2
    ],
)
def test_what_runs_in_an_engines_process_comes_off_it(
    cores: float, workers: int, share: float
) -> None:
    host = HostShare(cores, 0.03, shell_cpu_s_per_request=0.01, frontend_cpu_s_per_request=0.01)
    assert host.get_own_cores(workers, 2.0) == pytest.approx(0.04 if workers == 1 else 0.02)
    assert host.get_engine_share(workers, 2.0) == pytest.approx(share)


def test_the_rest_of_the_stack_spills_onto_the_engines_past_the_free_cores() -> None:
    # 4 req/s: 2.0 cores of stack, 0.4 of them the shells'; 3 engines leave one core free
    host = HostShare(4.0, 0.5, shell_cpu_s_per_request=0.1)
    assert host.get_engine_share(3, 4.0) == pytest.approx(1.0 - (0.4 + 0.6) / 3)


def test_the_two_rules_meet_where_the_engines_fill_the_cores() -> None:
    for shell_s, frontend_s in ((0.0, 0.0), (0.01, 0.0), (0.01, 0.02)):
        host = HostShare(3.0, 0.03, 0.05, shell_s, frontend_s)
        at_cores = host.get_engine_share(3, 4.0)
        assert at_cores == pytest.approx((3.0 - host.get_stack_cores(4.0)) / 3)
        # one engine more takes turns: the share drops by a step, not a cliff
        assert host.get_engine_share(4, 4.0) == pytest.approx(at_cores * 3 / 4)
        # one fewer: its own process's part only, the rest fits on the free core
        assert host.get_engine_share(2, 4.0) == pytest.approx(1.0 - 4.0 * shell_s / 2)


def test_the_stacks_idle_cores_come_off_at_any_rate() -> None:
    host = HostShare(2.0, 0.02, stack_idle_cores=0.1)
    assert host.get_stack_cores(0.0) == pytest.approx(0.1)
    assert host.get_stack_cores(5.0) == pytest.approx(0.2)  # 0.1 + 0.02 x 5
    assert host.get_engine_share(2, 0.0) == pytest.approx(0.95)
    assert host.get_engine_share(2, 5.0) == pytest.approx(0.9)


def test_bad_hosts_are_refused() -> None:
    with pytest.raises(ValueError, match="num_cores"):
        HostShare(0.0)
    with pytest.raises(ValueError, match="stack_cpu_s_per_request"):
        HostShare(2.0, -0.001)
    with pytest.raises(ValueError, match="stack_idle_cores"):
        HostShare(2.0, 0.0, -0.1)
    with pytest.raises(ValueError, match="shell_cpu_s_per_request"):
        HostShare(2.0, 0.0, 0.0, -0.001)
    with pytest.raises(ValueError, match="frontend_cpu_s_per_request"):
        HostShare(2.0, 0.0, 0.0, 0.0, -0.001)
    with pytest.raises(ValueError, match="cannot exceed it"):
        HostShare(2.0, 0.03, 0.0, 0.02, 0.02)
    with pytest.raises(ValueError, match="num_workers"):
        HostShare(2.0).get_engine_share(0, 1.0)


def _hardware(host: HostShare | None) -> Hardware:
    prefill = [
        PrefillPoint(num_requests=1, input_tokens=n, ttft_ms=ms, tokens_per_s=n / ms * 1e3)
        for n, ms in ((16, 20.0), (1024, 400.0))
    ]
    decode = [
        DecodePoint(num_requests=b, context_tokens=128, itl_ms=20.0 + 2 * b, tokens_per_s=1.0)
        for b in (1, 16)
    ]
    profile = msgspec.structs.replace(
        make_profile(prefill=prefill, decode=decode), num_kv_blocks=4096
    )
    space = SearchSpace(max_num_seqs=(8,), modes=(AGG,))
    return local_hardware(tiny_llama(), profile, space, host)


def test_a_local_worker_steps_at_its_share() -> None:
    work = StepWork(num_prefill_tokens=0, num_decode_requests=4, kv_utilization=0.1)
    alone = _hardware(None)
    shared = _hardware(HostShare(2.0, 0.05))
    base_ms = alone.get_timing(1, 2, 2.0).step_ms(work)
    assert alone.get_timing(1, 2, 2.0) is alone.timings[1].timing  # a core each
    assert shared.get_timing(1, 1, 2.0).step_ms(work) == pytest.approx(base_ms)
    assert shared.get_timing(1, 2, 2.0).step_ms(work) == pytest.approx(base_ms / 0.95)
    assert shared.get_timing(1, 4, 0.0).step_ms(work) == pytest.approx(base_ms / 0.5)


def _first(
    host: HostShare | None,
    targets: Targets,
    step_margin: float = 0.0,
    max_ttft_growth: float | None = None,
    request_rate_per_s: float | None = None,
) -> Ranked:
    settings = SearchSettings(
        Workload(256.0, 64.0),
        targets,
        total_gpus=2 if request_rate_per_s is None else 8,
        request_rate_per_s=request_rate_per_s,
        num_finalists=1,
        step_margin=step_margin,
        max_ttft_growth=max_ttft_growth,
    )
    return search(_hardware(host), settings).ranked[0]


def test_the_search_predicts_a_shared_host_slower() -> None:
    """The same finalist at the same rate (loose targets: no retry): with the stack taking
    CPU from two engines on two cores, each step is 1 / share as long."""
    loose = Targets(50000.0, 2000.0)
    host = HostShare(2.0, 0.2)
    alone, shared = _first(None, loose), _first(host, loose)
    assert shared.deployment == alone.deployment and shared.num_groups == 2
    assert shared.plan is not None and alone.plan is not None
    assert shared.plan.request_rate_per_s == pytest.approx(alone.plan.request_rate_per_s)
    rate = alone.plan.request_rate_per_s / alone.plan.num_groups
    timing, prefill = get_sim_timings(_hardware(host), shared, rate)
    assert prefill is None
    share = host.get_engine_share(2, rate * 2)  # both groups' workers, the whole rate
    assert share < 1.0 and timing.speedup_ratio == pytest.approx(share)
    assert shared.prediction.itl_ms > alone.prediction.itl_ms


def test_a_shared_host_is_offered_less() -> None:
    """At targets the fleet meets alone at its estimated rate, the shared host misses there
    and is simulated again at the first of RETRY_RATE_FACTORS, where it meets."""
    targets = Targets(5000.0, 200.0)
    alone, shared = _first(None, targets), _first(HostShare(2.0, 0.2), targets)
    assert alone.miss <= 1.0 and shared.miss <= 1.0
    assert shared.plan is not None and alone.plan is not None
    assert shared.plan.request_rate_per_s == pytest.approx(
        RETRY_RATE_FACTORS[0] * alone.plan.request_rate_per_s
    )


def test_a_step_margin_offers_less_where_slower_steps_miss() -> None:
    """ITL 32.9 ms at the estimated rate meets a 35 ms target, but not with every step 10%
    slower: with the margin the finalist is offered the first retry rate, where both its
    simulations meet; its prediction stays the simulation at the profiled step times."""
    targets = Targets(5000.0, 35.0)
    plain, margin = _first(None, targets), _first(None, targets, step_margin=0.1)
    assert plain.deployment == margin.deployment and plain.slower is None
    assert plain.plan is not None and margin.plan is not None and margin.slower is not None
    assert plain.miss <= 1.0 and plain.prediction.itl_ms == pytest.approx(32.92, abs=0.01)
    assert margin.plan.request_rate_per_s == pytest.approx(
        RETRY_RATE_FACTORS[0] * plain.plan.request_rate_per_s
    )
    assert margin.miss == pytest.approx(margin.slower.itl_ms / 35.0)
    assert margin.prediction.itl_ms < margin.slower.itl_ms <= 35.0
    # the margin's simulation at the full rate is what missed
    assert _replay(plain, 1.1).itl_ms > 35.0
    # the reported prediction: the same plan on the profiled step times
    assert _replay(margin) == margin.prediction


def test_a_finalist_near_its_knee_is_offered_less() -> None:
    """Loose targets, so only the TTFT growth limit binds. At the estimated rate TTFT p50 grows
    14.2% with every step 10% slower: within a 20% limit (the miss is that growth over the
    limit), but past 14%, so the finalist is offered the first retry rate, where it grows
    11.6%; past 11%, the second, where it grows 10.5%; past 10%, it misses there too."""
    loose = Targets(50000.0, 2000.0)
    plain = _first(None, loose, step_margin=0.1)
    assert plain.plan is not None and plain.slower is not None
    full_rate = plain.plan.request_rate_per_s
    assert get_ttft_growth(plain.prediction, plain.slower) == pytest.approx(0.1424, abs=1e-4)
    assert plain.miss < 0.1  # the targets alone are far from binding
    expected = {0.2: (1.0, 0.1424), 0.14: (0.85, 0.1159), 0.11: (0.7, 0.1052)}
    for limit, (factor, growth) in expected.items():
        r = _first(None, loose, step_margin=0.1, max_ttft_growth=limit)
        assert r.plan is not None and r.slower is not None
        assert r.plan.request_rate_per_s == pytest.approx(factor * full_rate)
        assert get_ttft_growth(r.prediction, r.slower) == pytest.approx(growth, abs=1e-4)
        assert r.miss == pytest.approx(growth / limit, rel=1e-3) and r.meets_targets
        assert _replay(r, 1.1) == r.slower  # the growth is the margin's own simulation
    missed = _first(None, loose, step_margin=0.1, max_ttft_growth=0.1)
    assert missed.plan is not None and not missed.meets_targets
    assert missed.plan.request_rate_per_s == pytest.approx(RETRY_RATE_FACTORS[-1] * full_rate)
    assert missed.miss == pytest.approx(1.0521, abs=1e-4)
    # without a step margin there is no slower simulation to grow: the limit has no effect
    no_margin = _first(None, loose, max_ttft_growth=0.01)
    assert no_margin.slower is None and no_margin.meets_targets
    assert no_margin.plan is not None and no_margin.plan.request_rate_per_s == full_rate


def test_with_a_request_rate_a_finalist_near_its_knee_gets_more_groups() -> None:
    """The rate that the 2 groups of the case above served at their estimated rate, now asked
    for: the same 2 groups at the same rate (growth 14.2%) meet without a limit; with a 14%
    limit the rate is spread over ceil(2 / 0.85) = 3 groups instead, each offered a third
    of it, where TTFT grows less."""
    loose = Targets(50000.0, 2000.0)
    plain = _first(None, loose, step_margin=0.1)
    assert plain.plan is not None and plain.num_groups == 2
    rate = plain.plan.request_rate_per_s
    asked = _first(None, loose, step_margin=0.1, request_rate_per_s=rate)
    assert asked.plan is not None and asked.slower is not None and asked.num_groups == 2
    assert asked.plan.request_rate_per_s == pytest.approx(rate)
    assert get_ttft_growth(asked.prediction, asked.slower) == pytest.approx(0.1424, abs=1e-4)
    spread = _first(None, loose, step_margin=0.1, max_ttft_growth=0.14, request_rate_per_s=rate)
    assert spread.plan is not None and spread.slower is not None and spread.meets_targets
    assert spread.num_groups == 3 and spread.plan.num_groups == 3
    assert spread.plan.request_rate_per_s == pytest.approx(rate)  # all 3 groups: the whole rate
    assert get_ttft_growth(spread.prediction, spread.slower) < 0.14
    # a limit no count of groups within the 8 GPUs keeps: it misses, at the most groups offered
    missed = _first(None, loose, step_margin=0.1, max_ttft_growth=1e-6, request_rate_per_s=rate)
    assert not missed.meets_targets and missed.num_groups == 3


def test_a_growth_limit_must_be_positive() -> None:
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="max_ttft_growth must be > 0 or None"):
            SearchSettings(Workload(256.0, 64.0), Targets(1.0, 1.0), 2, max_ttft_growth=bad)


def test_a_simulation_where_nothing_finished_meets_nothing() -> None:
    """No request finished: latencies of 0 and no rate. Loose targets would take the zeros for
    a pass; the acceptance rule does not, with or without the slower replay."""
    settings = SearchSettings(Workload(256.0, 64.0), Targets(5000.0, 200.0), 2)
    nothing = Prediction(0.0, 0.0, 0.0, 0.0, 0)
    served = Prediction(100.0, 20.0, 1.0, 64.0, 1)
    assert get_acceptance_miss(nothing, None, settings) == math.inf
    assert get_acceptance_miss(served, nothing, settings) == math.inf
    assert get_acceptance_miss(served, served, settings) == pytest.approx(0.1)  # 20 / 200


def test_the_ttft_growth_of_a_zero_ttft() -> None:
    def at(ttft_ms: float) -> Prediction:
        return Prediction(ttft_ms, 10.0, 1.0, 1.0, 1)

    assert get_ttft_growth(at(100.0), at(150.0)) == pytest.approx(0.5)
    assert get_ttft_growth(at(0.0), at(0.0)) == 0.0
    assert get_ttft_growth(at(0.0), at(1.0)) == math.inf


def _replay(r: Ranked, step_scale: float = 1.0) -> Prediction:
    """`r`'s simulated plan again (its requests, rate and fleet, the search's seed 0), on the
    local hardware's step times `step_scale` times as long."""
    assert r.plan is not None
    plan = r.plan
    workload = Workload(256.0, 64.0)
    requests = make_requests(
        workload, plan.request_rate_per_s, plan.num_requests, 0, plan.arrival_shape
    )
    rate = plan.request_rate_per_s / plan.num_groups
    return simulate(plan, requests, *get_sim_timings(_hardware(None), r, rate, step_scale))
