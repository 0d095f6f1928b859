"""Correction factors and live estimates from step records (profile: conftest.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from armature.planner import FrontendMetrics, PerformanceModel, WorkerSteps
from armature.planner.correction import CorrectionTracker, get_step_ratios
from armature.planner.live import LiveEstimate, estimate_live
from armature.planner.performance import KvHeadroom
from armature.planner.timing_performance import TimingPerformanceModel
from armature.protocols.engine import StepRecord
from armature.protocols.worker import WorkerRole
from armature.sim.profile_timing import ProfileTiming

PREFILL_ONLY = StepRecord(num_scheduled_prefill_tokens=1000, step_wall_s=0.24)  # profile 0.12
DECODE_ONLY = StepRecord(num_decode_requests=16, num_decode_kv_tokens=16_000, step_wall_s=0.018)
MIXED = StepRecord(num_scheduled_prefill_tokens=500, num_decode_requests=4, step_wall_s=9.0)
UNMEASURED = StepRecord(num_scheduled_prefill_tokens=1000, step_wall_s=0.0)


def test_step_ratios_leave_out_mixed_and_unmeasured_steps(
    profile: PerformanceModel,
) -> None:
    """Prefill: 0.24 / 0.12 = 2.0. Decode: 16 requests at 1000 tokens: profile 0.018 s,
    observed 0.018 s: 1.0."""
    records = [PREFILL_ONLY, DECODE_ONLY, MIXED, UNMEASURED]
    assert get_step_ratios(records, profile) == (pytest.approx(2.0), pytest.approx(1.0))
    assert get_step_ratios([MIXED], profile) == (None, None)


def test_a_prefill_step_is_predicted_with_its_context(profile: TimingPerformanceModel) -> None:
    """A profile pricing 0.5 us per (new, earlier) token pair: 1000 new tokens after 4000
    cached cost 0.12 s + 4e6 x 0.5 us = 2.12 s. A record timed at exactly that is on profile
    (factor 1.0); priced as a fresh prompt it read 17.7x slow."""
    timing = profile.timing
    assert isinstance(timing, ProfileTiming)
    model = replace(profile, timing=replace(timing, prefill_ms_per_context_pair=0.0005))
    assert model.get_prefill_step_s(1000, 4_000_000) == pytest.approx(0.12 + 2.0)
    after_prefix = StepRecord(
        num_scheduled_prefill_tokens=1000, num_prefill_context_pairs=4_000_000, step_wall_s=2.12
    )
    assert get_step_ratios([after_prefix], model) == (pytest.approx(1.0), None)
    assert get_step_ratios([after_prefix], KvHeadroom(model, 0.5))[0] == pytest.approx(1.0)


def test_correction_factors_move_halfway_and_stay_bounded(
    profile: PerformanceModel,
) -> None:
    """1.0 -> 0.5 x 1.0 + 0.5 x 2.0 = 1.5 -> 1.75; a window with no decode step keeps 1.0.
    A 100x slower window stops at the bound, 5.0."""
    tracker = CorrectionTracker()
    workers = [WorkerSteps(worker_id="p0", role=WorkerRole.PREFILL, step_records=[PREFILL_ONLY])]
    tracker.observe(workers, profile)
    assert (tracker.prefill_factor, tracker.decode_factor) == (pytest.approx(1.5), 1.0)
    tracker.observe(workers, profile)
    assert tracker.prefill_factor == pytest.approx(1.75)
    slow = StepRecord(num_scheduled_prefill_tokens=1000, step_wall_s=12.0)
    tracker.observe(
        [WorkerSteps(worker_id="p0", role=WorkerRole.PREFILL, step_records=[slow])], profile
    )
    assert tracker.prefill_factor == 5.0


def test_live_ttft_counts_the_queue_ahead(profile: PerformanceModel) -> None:
    """n = 1500, p = 0.17 s. Worker p0 has 3000 tokens queued, p1 none; the frontend holds 2
    requests, 1500 tokens each over 2 workers. p0: 0.17 (3000 + 1500 + 1500) / 1500 = 0.68;
    p1: 0.17 (0 + 1500 + 1500) / 1500 = 0.34; mean 0.51 s."""
    workers = [
        WorkerSteps(
            worker_id="p0",
            role=WorkerRole.PREFILL,
            step_records=[StepRecord(num_queued_prefill_tokens=3000)],
        ),
        WorkerSteps(worker_id="p1", role=WorkerRole.PREFILL),
    ]
    frontend = FrontendMetrics(
        window_s=5.0,
        num_requests=10,
        mean_input_tokens=1500.0,
        mean_output_tokens=100.0,
        num_queued_requests=2,
    )
    live = estimate_live(WorkerRole.PREFILL, workers, frontend, profile, 1.0, 1500.0)
    assert live.ttft_s == pytest.approx(0.51)
    assert live.itl_s is None


def test_live_itl_is_the_mean_decoding_step(profile: PerformanceModel) -> None:
    records = [
        StepRecord(num_decode_requests=8, step_wall_s=0.020),
        StepRecord(num_decode_requests=8, step_wall_s=0.040),
        StepRecord(num_scheduled_prefill_tokens=100, step_wall_s=0.5),  # no decode: not ITL
    ]
    workers = [WorkerSteps(worker_id="d0", role=WorkerRole.DECODE, step_records=records)]
    frontend = FrontendMetrics(
        window_s=5.0, num_requests=0, mean_input_tokens=0.0, mean_output_tokens=0.0
    )
    live = estimate_live(WorkerRole.DECODE, workers, frontend, profile, 1.0, 1500.0)
    assert live == LiveEstimate(ttft_s=None, itl_s=pytest.approx(0.030))
    assert estimate_live(WorkerRole.DECODE, [], frontend, profile, 1.0, 1500.0) == LiveEstimate(
        None, None
    )
