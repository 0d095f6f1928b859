"""The search on a toy space with a known optimum, its ranking rules, and the step-time
profiles it runs on.

The toy worker (a measured profile, `--system local`): prefill 1 ms at 16 tokens and 2 ms
at 1024, decode 10 + b ms for b requests. Requests of 64 prompt and 100 output tokens: a
worker decoding b requests has ITL ~ 10 + b ms and serves b / (100 x ITL) requests/s, so
under an ITL target of 20 ms the best batch of the grid is 8 (12 would take 22 ms), which
only max-num-seqs 16 reaches (max-num-seqs 4 operates at most at 3)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

import msgspec
import pytest
from configurator_cases import tiny_llama, toy_system

from armature.configurator.estimate import Estimator, Prediction
from armature.configurator.hardware import Hardware, accelerator_hardware, local_hardware
from armature.configurator.operators import get_step_breakdown
from armature.configurator.plot import get_pareto_front
from armature.configurator.search import (
    Ranked,
    SearchSettings,
    make_plan,
    pick_finalists,
    rank_key,
    search,
)
from armature.configurator.simulate import SPAN_E2E_MULTIPLE
from armature.configurator.space import AGG, DISAGG, Deployment, SearchSpace, Targets, Workload
from armature.configurator.systems import list_systems, load_system
from armature.errors import ConfigError
from armature.protocols.timing_profile import DecodePoint, PrefillPoint
from armature.sim.timing import StepWork
from profiles import make_profile

TOY_SPACE = SearchSpace(max_num_seqs=(4, 16), modes=(AGG,))
TARGETS = Targets(ttft_ms=1000.0, itl_ms=20.0)
WORKLOAD = Workload(64.0, 100.0)


def _toy_hardware(space: SearchSpace = TOY_SPACE) -> Hardware:
    prefill = [
        PrefillPoint(num_requests=1, input_tokens=n, ttft_ms=ms, tokens_per_s=n / ms * 1e3)
        for n, ms in ((16, 1.0), (1024, 2.0))
    ]
    decode = [
        DecodePoint(num_requests=b, context_tokens=128, itl_ms=10.0 + b, tokens_per_s=1.0)
        for b in (1, 64)
    ]
    profile = msgspec.structs.replace(
        make_profile(prefill=prefill, decode=decode), num_kv_blocks=4096
    )
    return local_hardware(tiny_llama(), profile, space)


def _settings(**overrides: object) -> SearchSettings:
    settings = SearchSettings(WORKLOAD, TARGETS, total_gpus=8, num_finalists=2, sim_requests=100)
    return replace(settings, **overrides)  # type: ignore[arg-type]


def test_the_estimate_finds_the_best_batch_under_the_itl_target() -> None:
    hardware = _toy_hardware()
    estimator = Estimator({1: hardware.timings[1].timing}, WORKLOAD)
    best = estimator.get_best(Deployment(AGG, 1, 16, 1024), TARGETS)
    assert best is not None
    point, miss = best
    assert point.num_running == 8
    assert point.itl_ms == pytest.approx(18.0, abs=0.1)
    assert miss < 1.0
    assert point.tokens_per_s_per_gpu == pytest.approx(8 / point.itl_ms * 1000.0)
    capped = estimator.get_best(Deployment(AGG, 1, 4, 1024), TARGETS)
    assert capped is not None and capped[0].num_running == 3


def test_search_ranks_the_known_optimum_first() -> None:
    result = search(_toy_hardware(), _settings())
    first, second = result.ranked[:2]
    assert (first.deployment.max_num_seqs, second.deployment.max_num_seqs) == (16, 4)
    assert first.simulated and first.meets_targets
    assert not second.simulated  # the same layout: its estimate stands
    assert first.num_groups == 8  # one worker each, as many as the GPUs hold
    assert first.prediction.tokens_per_s_per_gpu > second.prediction.tokens_per_s_per_gpu
    assert result.num_deployments == result.num_fitting == 2


def test_with_a_request_rate_it_ranks_by_fewest_gpus() -> None:
    # seqs 16 serves 8 / (100 x ~18 ms) ~ 4.4 requests/s a worker, seqs 4 ~ 2.3
    result = search(_toy_hardware(), _settings(request_rate_per_s=10.0))
    first, second = result.ranked[:2]
    assert first.deployment.max_num_seqs == 16
    assert (first.num_gpus, second.num_gpus) == (3, 5)
    assert first.meets_targets


def test_with_a_request_rate_every_row_shows_what_it_serves_of_it() -> None:
    """An estimated row's capacity is more than the rate's share of its groups: the table
    shows the share (as the simulated rows show what they were offered), never more than the
    rate allows."""
    result = search(_toy_hardware(), _settings(request_rate_per_s=10.0, num_finalists=1))
    estimated = [r for r in result.ranked if not r.simulated]
    assert estimated and any(r.simulated for r in result.ranked)
    osl = WORKLOAD.osl_tokens
    for r in result.ranked:
        per_group, per_gpu = result.get_served(r)
        if r.simulated:
            assert (per_group, per_gpu) == (
                r.prediction.request_rate_per_s,
                r.prediction.tokens_per_s_per_gpu,
            )
            continue
        share = min(10.0 / r.num_groups, r.prediction.request_rate_per_s)
        assert per_group == pytest.approx(share)
        assert per_gpu == pytest.approx(share * osl / r.deployment.num_gpus)
        assert per_gpu * r.num_gpus <= 10.0 * osl * (1 + 1e-9)
    # without a rate: each at its capacity
    plain = search(_toy_hardware(), _settings(num_finalists=1))
    r = next(r for r in plain.ranked if not r.simulated)
    assert plain.get_served(r) == (
        r.prediction.request_rate_per_s,
        r.prediction.tokens_per_s_per_gpu,
    )


def test_a_rate_beyond_the_gpus_misses() -> None:
    result = search(_toy_hardware(), _settings(request_rate_per_s=1000.0, num_finalists=1))
    assert not result.meets_targets
    first = result.ranked[0]
    assert first.num_gpus == first.num_groups > 8  # what the rate needs, one GPU a group
    assert first.miss >= first.num_gpus / 8


def test_impossible_targets_leave_the_closest_first() -> None:
    result = search(_toy_hardware(), _settings(targets=Targets(ttft_ms=1000.0, itl_ms=5.0)))
    assert not result.meets_targets
    simulated = [r.miss for r in result.ranked if r.simulated]
    assert simulated == sorted(simulated) and simulated[0] > 1.0
    assert result.ranked[0].prediction.itl_ms == pytest.approx(11.0, rel=0.05)  # b=1: closest


def _ranked(mode: str, per_gpu: float, miss: float, gpus: int = 1) -> Ranked:
    deployment = Deployment(mode, gpus, 16, 1024)
    return Ranked(deployment, 1, Prediction(10.0, 10.0, 1.0, per_gpu, 4), miss)


def test_rank_key_orders_meeting_before_missing_and_by_throughput() -> None:
    rows = [
        _ranked(AGG, 500.0, 1.5),
        _ranked(AGG, 100.0, 0.9),
        _ranked(DISAGG, 300.0, 0.5),
        _ranked(AGG, 900.0, 1.1),
    ]
    ordered = sorted(rows, key=lambda r: rank_key(r, by_gpus=False))
    assert [(r.prediction.tokens_per_s_per_gpu, r.miss) for r in ordered] == [
        (300.0, 0.5),
        (100.0, 0.9),
        (900.0, 1.1),
        (500.0, 1.5),
    ]
    by_gpus = [_ranked(AGG, 900.0, 0.5, gpus=4), _ranked(AGG, 100.0, 0.5, gpus=2)]
    assert sorted(by_gpus, key=lambda r: rank_key(r, by_gpus=True))[0].num_gpus == 2


def test_finalists_keep_the_best_of_each_layout_and_of_each_mode() -> None:
    rows = [_ranked(AGG, 900.0 - i, 0.5) for i in range(4)] + [_ranked(DISAGG, 10.0, 0.5)]
    chosen = pick_finalists(rows, 1)
    assert [r.deployment.mode for r in chosen] == [AGG, DISAGG]
    assert chosen[0] is rows[0]


@pytest.mark.parametrize(
    ("num_groups", "max_sim_groups", "simulated", "arrival_shape"),
    [(8, 1, 1, 8), (8, 4, 4, 2), (2, 4, 2, 1), (6, 4, 4, 1)],
)
def test_a_plan_replays_up_to_max_sim_groups_groups(
    num_groups: int, max_sim_groups: int, simulated: int, arrival_shape: int
) -> None:
    """min(groups, max_sim_groups) groups replayed together: their workers, their rate, and
    arrivals of the share of the stream that many of the groups see; as many requests as
    one group's replay would need at their joint rate (the minimum, until the requests
    needed to span 5 end-to-end latencies at that rate are more)."""
    hardware = _toy_hardware()
    deployment = Deployment(DISAGG, 1, 16, 1024, prefill_tp=1, num_prefill_workers=1)
    settings = _settings(max_sim_groups=max_sim_groups)
    for itl_ms, short in ((10.0, True), (200.0, False)):
        ranked = Ranked(deployment, num_groups, Prediction(10.0, itl_ms, 2.0, 100.0, 4), 0.5)
        plan = make_plan(hardware, ranked, 2.0, settings)
        assert (plan.num_groups, plan.arrival_shape) == (simulated, arrival_shape)
        workers = (plan.config.num_workers, plan.config.num_prefill_workers)
        assert workers == (2 * simulated, simulated)
        assert plan.request_rate_per_s == 2.0 * simulated
        e2e_s = (10.0 + itl_ms * WORKLOAD.osl_tokens) / 1000.0
        needed = math.ceil(2.0 * simulated * SPAN_E2E_MULTIPLE * e2e_s)
        assert plan.num_requests == (100 if short else needed)
        assert (needed < 100) is short


def test_pareto_front() -> None:
    def point(per_user: float, per_gpu: float) -> Prediction:
        return Prediction(1.0, 1000.0 / per_user, 1.0, per_gpu, 1)

    points = [point(10, 100), point(20, 80), point(15, 50), point(30, 10), point(5, 90)]
    front = get_pareto_front(points)
    pairs = [(round(p.tokens_per_s_per_user), p.tokens_per_s_per_gpu) for p in front]
    assert pairs == [(30, 10), (20, 80), (10, 100)]


def test_the_predicted_profile_runs_the_operator_model() -> None:
    """At the profile's grid points the mocker's step times are the operator model's; between
    them within 5% (attention's t^2 between grid points 1.5x apart)."""
    model, system = tiny_llama(), toy_system()
    hardware = accelerator_hardware(model, system, SearchSpace(), 8, "tiny")
    timing = hardware.timings[2].timing

    def operator_ms(t: int, b: int, kv: int) -> float:
        step = get_step_breakdown(
            model, system, 2, num_prefill_tokens=t, num_decode_requests=b, num_kv_tokens=kv
        )
        return step.total_s * 1000.0

    assert timing.step_ms(StepWork(1024, 0, 0.0)) == pytest.approx(operator_ms(1024, 0, 0))
    assert timing.step_ms(StepWork(0, 8, 0.0, 8 * 512)) == pytest.approx(operator_ms(0, 8, 4096))
    assert timing.step_ms(StepWork(700, 0, 0.0)) == pytest.approx(operator_ms(700, 0, 0), rel=0.05)
    between = timing.step_ms(StepWork(0, 6, 0.0, 6 * 700))
    assert between == pytest.approx(operator_ms(0, 6, 4200), rel=0.05)


def test_every_shipped_system_loads_with_a_source_for_every_number() -> None:
    names = [n for n in list_systems() if n != "local"]
    assert names == ["a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm", "l40s"]
    for name in names:
        system = load_system(name)
        assert system.name == name
        assert system.get_peak_flops("bfloat16") > 1e14
        assert system.memory_capacity_bytes.value >= 48e9
    assert load_system("h100_sxm").memory_bandwidth_bytes_s.value == 3.35e12
    with pytest.raises(ConfigError, match="a100_sxm has no fp8 math"):
        load_system("a100_sxm").get_peak_flops("fp8")
    with pytest.raises(ConfigError, match="unknown system 'tpu9'; choose from a100_sxm"):
        load_system("tpu9")


@pytest.mark.parametrize("name", ["gemm_efficiency", "memory_utilization", "link_efficiency"])
def test_a_system_file_with_a_share_above_one_is_refused(name: str, tmp_path: Path) -> None:
    data = json.loads((files("armature.configurator") / "systems" / "h100_sxm.json").read_text())
    data[name]["value"] = 1.5
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"{name} is a fraction \\(at most 1\\), got 1.5"):
        load_system(str(path))
    data[name]["value"] = 1.0  # all of it is a bound, not a mistake
    path.write_text(json.dumps(data))
    assert getattr(load_system(str(path)), name).value == 1.0
