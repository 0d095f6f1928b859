"""The profile's load pass: its plan (lengths, rate, arrivals), its check (measured over
modeled step times), profiles made at once pooled, and the factor on the mocker's steps."""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import pytest

from armature.config import ProfileSweepConfig
from armature.profiler.load_pass import LOAD_UTILIZATION, LoadPlan, check_load, plan_load
from armature.profiler.plan import EngineLimits
from armature.profiler.points import median_profile, pooled_load
from armature.protocols.engine import StepRecord
from armature.protocols.timing_profile import LoadCheck, read_profile
from armature.sim.profile_timing import ProfileTiming, timing_from_profile
from armature.sim.timing import StepWork
from profiles import HAND_TIMING, make_load_check, make_profile

TIMING = HAND_TIMING
LIMITS = EngineLimits(
    max_num_seqs=8,
    max_num_batched_tokens=512,
    max_model_len_tokens=2048,
    block_size_tokens=16,
    num_kv_blocks=512,
)
SWEEP = ProfileSweepConfig(decode_output_tokens=10, prompt_seed=7)


def test_the_plan_loads_the_engine_to_a_share_of_its_capacity_by_the_tables() -> None:
    plan = plan_load(TIMING, SWEEP, LIMITS, 200)
    # a mean request: a 200-token prompt (30 ms alone), 20 outputs at 36 / 8 ms each (90 ms)
    assert plan.request_rate_per_s == pytest.approx(LOAD_UTILIZATION * 1000.0 / 120.0)
    arrivals = [a for a, _, _ in plan.requests]
    assert len(plan.requests) == 200
    assert arrivals[0] == 0.0
    assert all(b > a for a, b in itertools.pairwise(arrivals))
    # Poisson at that rate: the mean gap within 20% over 199 gaps (seeded: the same each run)
    assert arrivals[-1] / 199 == pytest.approx(1.0 / plan.request_rate_per_s, rel=0.2)
    assert all(100 <= prompt <= 300 and 10 <= out <= 30 for _, prompt, out in plan.requests)
    assert {prompt for _, prompt, _ in plan.requests} != {plan.requests[0][1]}  # mixed
    assert plan == plan_load(TIMING, SWEEP, LIMITS, 200)
    assert plan != plan_load(TIMING, ProfileSweepConfig(decode_output_tokens=10), LIMITS, 200)


def test_the_plan_uses_the_largest_batch_the_engine_runs() -> None:
    """Four requests at once at most: outputs at decode_ms(4) / 4 (about 26.9 / 4 ms)."""
    limits = EngineLimits(4, 512, 2048, 16, 512)
    plan = plan_load(TIMING, SWEEP, limits, 3)
    decode_ms = 20.0 + 16.0 * 3 / 7
    assert plan.request_rate_per_s == pytest.approx(
        LOAD_UTILIZATION * 1000.0 / (30.0 + 20 * decode_ms / 4)
    )


def test_a_plan_needs_a_request() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        plan_load(TIMING, SWEEP, LIMITS, 0)


def test_prompts_leave_room_for_their_outputs_in_the_context() -> None:
    """A 260-token context: prompts of at most 260 - 30 tokens; 120 tokens: none fits."""
    plan = plan_load(TIMING, SWEEP, EngineLimits(8, 512, 260, 16, 512), 200)
    assert max(prompt for _, prompt, _ in plan.requests) == 230
    assert min(prompt for _, prompt, _ in plan.requests) >= 100
    with pytest.raises(ValueError, match="a 100-token prompt and 30 outputs do not fit the "):
        plan_load(TIMING, SWEEP, EngineLimits(8, 512, 120, 16, 512), 1)


def test_the_check_sets_the_steps_wall_time_against_the_tables() -> None:
    plan = LoadPlan(2.0, ((0.0, 100, 10), (0.5, 200, 10)))
    records = [
        # a prefill of 100 tokens alone: 20 ms modeled, 30 measured
        StepRecord(num_scheduled_prefill_tokens=100, step_wall_s=0.030),
        # 8 decodes: 36 ms modeled, 45 measured
        StepRecord(num_decode_requests=8, num_decode_kv_tokens=800, step_wall_s=0.045),
        # a 200-token chunk beside one decode: 30 + 20 less the 10 ms overhead = 40 modeled
        StepRecord(
            num_scheduled_prefill_tokens=200,
            num_decode_requests=1,
            num_decode_kv_tokens=150,
            step_wall_s=0.040,
        ),
    ]
    works = [
        StepWork(r.num_scheduled_prefill_tokens, r.num_decode_requests, 0.0, r.num_decode_kv_tokens)
        for r in records
    ]
    modeled_ms = [TIMING.step_ms(w) for w in works]
    assert modeled_ms == pytest.approx([20.0, 36.0, 40.0])
    check = check_load(records, TIMING, plan)
    assert (check.num_requests, check.request_rate_per_s, check.num_steps) == (2, 2.0, 3)
    assert (check.measured_s, check.modeled_s) == (pytest.approx(0.115), pytest.approx(0.096))
    assert check.factor == pytest.approx(0.115 / 0.096)
    # prompt steps (the prefill alone and the chunk beside a decode) apart from the decode step
    assert (check.prompt_measured_s, check.prompt_modeled_s) == (
        pytest.approx(0.070),
        pytest.approx(0.060),
    )
    assert (check.decode_measured_s, check.decode_modeled_s) == (
        pytest.approx(0.045),
        pytest.approx(0.036),
    )
    assert check.prompt_step_factor == pytest.approx(0.070 / 0.060)
    assert check.decode_step_factor == pytest.approx(0.045 / 0.036)


def test_a_class_without_steps_has_no_factor() -> None:
    plan = LoadPlan(1.0, ((0.0, 100, 1),))
    only_prompts = [StepRecord(num_scheduled_prefill_tokens=100, step_wall_s=0.030)]
    check = check_load(only_prompts, TIMING, plan)
    assert (check.decode_measured_s, check.decode_modeled_s) == (0.0, 0.0)
    assert check.has_classes and check.decode_step_factor is None
    assert check.prompt_step_factor == pytest.approx(check.factor)
    # a pass written before the classes: neither
    old = make_load_check(6.0, 5.0)
    assert not old.has_classes
    assert (old.prompt_step_factor, old.decode_step_factor) == (None, None)


def test_no_steps_recorded_cannot_be_checked() -> None:
    with pytest.raises(ValueError, match="recorded no steps"):
        check_load([], TIMING, LoadPlan(1.0, ((0.0, 10, 10),)))


def _load(
    measured_s: float,
    modeled_s: float,
    num_steps: int = 10,
    prompt_s: tuple[float, float] = (0.0, 0.0),
    decode_s: tuple[float, float] = (0.0, 0.0),
) -> LoadCheck:
    return make_load_check(
        measured_s,
        modeled_s,
        num_requests=4,
        request_rate_per_s=1.5,
        num_steps=num_steps,
        prompt_s=prompt_s,
        decode_s=decode_s,
    )


def test_engines_at_once_pool_their_load_passes() -> None:
    first = msgspec.structs.replace(
        make_profile(), load=_load(6.0, 5.0, 10, prompt_s=(2.0, 1.5), decode_s=(4.0, 3.5))
    )
    second = msgspec.structs.replace(
        make_profile(), load=_load(9.0, 6.0, 12, prompt_s=(3.0, 2.0), decode_s=(6.0, 4.0))
    )
    pooled = pooled_load([first, second])
    assert pooled == LoadCheck(
        num_requests=4,
        request_rate_per_s=1.5,
        num_steps=22,
        measured_s=15.0,
        modeled_s=11.0,
        prompt_measured_s=5.0,
        prompt_modeled_s=3.5,
        decode_measured_s=10.0,
        decode_modeled_s=7.5,
    )
    assert pooled is not None and pooled.factor == 15.0 / 11.0
    assert pooled.prompt_step_factor == pytest.approx(5.0 / 3.5)
    assert median_profile([first, second]).load == pooled
    # a profile without a load pass: none for the pair
    assert pooled_load([first, make_profile()]) is None
    assert median_profile([make_profile(), make_profile()]).load is None


def test_the_prompt_step_factor_scales_the_steps_with_prefill_tokens_only() -> None:
    """Prompt steps ran 1.2 of the tables, decode steps 1.1: prompt steps 1.2 of the tables,
    decode steps as the tables give."""
    plain = make_profile()
    load = _load(7.0, 6.0, prompt_s=(2.4, 2.0), decode_s=(4.4, 4.0))
    loaded = msgspec.structs.replace(plain, load=load)
    base, scaled = timing_from_profile(plain), timing_from_profile(loaded, speedup_ratio=2.0)
    assert (scaled.load_factor, scaled.prompt_step_factor) == (1.0, pytest.approx(1.2))
    assert (base.load_factor, base.prompt_step_factor) == (1.0, 1.0)
    for work in (StepWork(100, 0, 0.0, 0), StepWork(64, 1, 0.0, 128)):
        assert scaled.step_ms(work) == pytest.approx(base.step_ms(work) * 1.2 / 2.0)
    decode = StepWork(0, 1, 0.0, 128)
    assert scaled.step_ms(decode) == pytest.approx(base.step_ms(decode) / 2.0)
    # a pass that ran no prompt step: nothing scaled, the decode class's ratio not applied
    decode_only = _load(4.4, 4.0, prompt_s=(0.0, 0.0), decode_s=(4.4, 4.0))
    timing = timing_from_profile(msgspec.structs.replace(plain, load=decode_only))
    assert (timing.load_factor, timing.prompt_step_factor) == (1.0, 1.0)
    with pytest.raises(ValueError, match="prompt_step_factor"):
        ProfileTiming((0.0, 1.0), (1.0, 2.0), (1.0,), (1.0,), ((1.0,),), prompt_step_factor=0.0)


def test_a_pass_written_before_the_classes_reads_with_its_factor_on_every_step(
    tmp_path: Path,
) -> None:
    """A profile file whose load pass has no class sums decodes, and scales every step."""
    profile = msgspec.structs.replace(make_profile(), load=_load(6.0, 5.0))
    data = msgspec.json.decode(msgspec.json.encode(profile))
    for name in ("prompt_measured_s", "prompt_modeled_s", "decode_measured_s", "decode_modeled_s"):
        del data["load"][name]
    path = tmp_path / "old.json"
    path.write_bytes(msgspec.json.encode(data))
    old = read_profile(path)
    assert old.load == profile.load
    timing = timing_from_profile(old)
    assert (timing.load_factor, timing.prompt_step_factor) == (pytest.approx(1.2), 1.0)


def test_the_factor_scales_every_step_time() -> None:
    """A pass without the classes (an older file): its factor on every step."""
    plain = make_profile()
    loaded = msgspec.structs.replace(plain, load=_load(6.0, 5.0))
    base, scaled = timing_from_profile(plain), timing_from_profile(loaded, speedup_ratio=2.0)
    assert (base.load_factor, scaled.load_factor) == (1.0, pytest.approx(1.2))
    for work in (StepWork(100, 0, 0.0, 0), StepWork(0, 1, 0.0, 128), StepWork(64, 1, 0.0, 128)):
        assert scaled.step_ms(work) == pytest.approx(base.step_ms(work) * 1.2 / 2.0)
    with pytest.raises(ValueError, match="load_factor"):
        ProfileTiming((0.0, 1.0), (1.0, 2.0), (1.0,), (1.0,), ((1.0,),), load_factor=0.0)
