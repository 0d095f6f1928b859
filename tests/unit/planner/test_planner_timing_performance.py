"""The planner's performance model read off a step-time model, against hand-worked numbers,
and read from a timing profile with the limits the engine was profiled with."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from armature.config import PlannerConfig, PlannerServiceConfig
from armature.errors import ConfigError
from armature.planner.main import read_performance_model, read_role_models
from armature.planner.performance import RoleModels
from armature.planner.profile_match import ProfiledWorker
from armature.planner.timing_performance import TimingPerformanceModel
from armature.protocols.timing_profile import PrefillPoint, write_profile
from armature.sim.profile_timing import ProfileTiming, timing_from_profile
from armature.sim.timing import PolynomialTiming
from profiles import make_profile, write_small_profile


def _model(**kwargs: int) -> TimingPerformanceModel:
    settings = {
        "block_size": 16,
        "num_kv_blocks": 1000,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 1024,
    }
    settings.update(kwargs)
    return TimingPerformanceModel(PolynomialTiming(), **settings)


def test_prefill_runs_in_chunks_of_the_step_budget() -> None:
    # prefill_ms(1024) = 4.21e-7 * 1024^2 + 0.01518 * 1024 + 16.5 = 32.48577 ms, twice
    one_chunk_ms = 4.21e-7 * 1024**2 + 0.01518 * 1024 + 16.5
    assert _model().get_prefill_s(2048) == pytest.approx(2 * one_chunk_ms / 1000.0)
    # 100 tokens: one step, 0.00421 + 1.518 + 16.5 ms
    assert _model().get_prefill_s(100) == pytest.approx((4.21e-3 + 1.518 + 16.5) / 1000.0)
    assert _model().get_prefill_s(0) == 0.0


def test_decode_step_reads_the_pool_utilization_of_the_batch() -> None:
    # 10 requests x 160 tokens = 100 blocks of 1000: u = 0.1
    # decode_ms(0.1) = -25.74 * 0.01 + 54.01 * 0.1 + 5.74 = 10.8836 ms
    assert _model().get_decode_step_s(10, 160) == pytest.approx(10.8836e-3)
    # a full pool: u = 1 -> -25.74 + 54.01 + 5.74 = 34.01 ms
    assert _model().get_decode_step_s(100, 160) == pytest.approx(34.01e-3)


def test_max_decode_requests_by_pool_and_batch_limit() -> None:
    assert _model().get_max_decode_requests(160) == 100  # 1000 blocks / 10 each
    assert _model(max_num_seqs=64).get_max_decode_requests(160) == 64
    assert _model().get_max_decode_requests(1_000_000) == 1


def test_speedup_divides_every_time() -> None:
    fast = TimingPerformanceModel(PolynomialTiming(speedup_ratio=2.0), 16, 1000, 256, 1024)
    assert fast.get_decode_step_s(10, 160) == pytest.approx(10.8836e-3 / 2)


def test_profile_tables_by_requests_and_context() -> None:
    timing = ProfileTiming(
        prefill_tokens=(100.0, 1100.0),
        prefill_ms_table=(20.0, 120.0),
        decode_requests=(1.0, 5.0),
        decode_context_tokens=(100.0, 500.0),
        decode_ms_grid=((10.0, 14.0), (18.0, 30.0)),
    )
    model = TimingPerformanceModel(timing, 16, 1000, 256, 4096)
    assert model.get_prefill_s(600) == pytest.approx(0.070)
    # chunked: each chunk after the first pays for the context before it
    chunked = TimingPerformanceModel(
        dataclasses.replace(timing, prefill_ms_per_context_pair=1e-5), 16, 1000, 256, 400
    )
    # 400 tokens (50 ms), then 200 (30 ms) after 400: + 400 * 200 * 1e-5 ms
    assert chunked.get_prefill_s(600) == pytest.approx(0.0808)
    # 3 requests at 300 tokens: rows at b=1 (12) and b=5 (24), halfway: 18 ms
    assert model.get_decode_step_s(3, 300) == pytest.approx(0.018)


def test_rejects_empty_sizes() -> None:
    with pytest.raises(ValueError, match="num_kv_blocks"):
        TimingPerformanceModel(PolynomialTiming(), 16, 0, 256, 1024)


def test_a_timing_profile_gives_one_worker_with_the_limits_it_was_profiled_with(
    tmp_path: Path,
) -> None:
    path = tmp_path / "profile.json"
    write_small_profile(path, model="tiny")
    model, profiled = read_performance_model(str(path))
    assert profiled == ProfiledWorker(model_name="tiny", block_size_tokens=16, num_kv_blocks=96)
    assert model == TimingPerformanceModel(
        timing_from_profile(make_profile()),
        block_size=16,
        num_kv_blocks=96,
        max_num_seqs=32,
        max_num_batched_tokens=1024,
    )
    assert model.get_max_decode_requests(160) == 9  # 96 blocks / 10 each
    assert model.get_max_decode_requests(16) == 32  # --max-num-seqs
    # 2048 tokens in two 1024-token steps of 32 ms each
    assert model.get_prefill_s(2048) == pytest.approx(0.064)


def test_disaggregated_prefill_workers_may_have_a_profile_of_their_own(tmp_path: Path) -> None:
    decode_path, prefill_path, other_path = (tmp_path / f"{n}.json" for n in "dpo")
    write_small_profile(decode_path, model="tiny")
    # the prefill workers' profile: every prefill twice as long
    slow = [
        PrefillPoint(num_requests=1, input_tokens=n, ttft_ms=ms, tokens_per_s=n / ms * 1e3)
        for n, ms in ((16, 34.0), (1024, 64.0))
    ]
    write_profile(make_profile(model="tiny", prefill=slow), prefill_path)
    write_small_profile(other_path, model="other")
    disagg = PlannerConfig(mode="disagg")

    alone = PlannerServiceConfig(performance_model=str(decode_path))
    model, profiled, prefill_profiled = read_role_models(alone, disagg)
    assert isinstance(model, TimingPerformanceModel) and prefill_profiled is None

    both = dataclasses.replace(alone, prefill_performance_model=str(prefill_path))
    model, profiled, prefill_profiled = read_role_models(both, disagg)
    assert isinstance(model, RoleModels)
    assert model.get_prefill_s(2048) == pytest.approx(0.128)  # two 1024-token steps of 64 ms
    assert model.get_decode_step_s(1, 128) == pytest.approx(0.008)  # the decode profile's
    assert profiled == prefill_profiled == ProfiledWorker("tiny", 16, 96)

    errors = [
        (both, PlannerConfig(mode="agg"), "--prefill-performance-model is for --planner-mode"),
        (
            dataclasses.replace(alone, prefill_performance_model=str(other_path)),
            disagg,
            "measured on model 'other', --performance-model on 'tiny'",
        ),
        (
            dataclasses.replace(alone, prefill_performance_model=str(tmp_path / "none.json")),
            disagg,
            "--prefill-performance-model: ",
        ),
    ]
    for service, planner, message in errors:
        with pytest.raises(ConfigError, match=re.escape(message)):
            read_role_models(service, planner)
