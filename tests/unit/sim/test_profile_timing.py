"""The mocker's timing from a profile: hand-worked interpolation, the tables a profile gives,
and profiles that cannot be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.protocols.timing_profile import (
    DecodePoint,
    PrefillPoint,
    ProfileError,
    TimingProfile,
    write_profile,
)
from armature.sim.profile_timing import ProfileTiming, load_profile_timing, timing_from_profile
from armature.sim.timing import StepWork
from profiles import make_profile

TIMING = ProfileTiming(
    prefill_tokens=(64.0, 256.0, 1024.0),
    prefill_ms_table=(10.0, 22.0, 70.0),
    decode_requests=(1.0, 2.0, 4.0),
    decode_context_tokens=(256.0, 1024.0),
    decode_ms_grid=((10.0, 12.0), (11.0, 14.0), (13.0, 19.0)),
)


def test_prefill_is_piecewise_linear_and_extrapolates() -> None:
    assert TIMING.get_prefill_ms(128) == pytest.approx(10 + 12 * 64 / 192)  # 14.0
    assert TIMING.get_prefill_ms(640) == pytest.approx(22 + 48 * 384 / 768)  # 46.0
    assert TIMING.get_prefill_ms(2048) == pytest.approx(70 + 48 * 1024 / 768)  # 134.0
    assert TIMING.get_prefill_ms(1) == pytest.approx(10 - 12 * 63 / 192)  # 6.0625


def test_decode_is_bilinear_over_requests_and_context() -> None:
    # b=3 between rows 2 and 4 (w 0.5), c=640 between columns 256 and 1024 (w 0.5)
    row_2, row_4 = 11 + 3 * 0.5, 13 + 6 * 0.5  # 12.5, 16.0
    assert TIMING.get_decode_ms(3, 640) == pytest.approx((row_2 + row_4) / 2)  # 14.25
    assert TIMING.get_decode_ms(1, 256) == 10.0
    assert TIMING.get_decode_ms(8, 1024) == pytest.approx(19 + (19 - 14) * 2)  # 29.0
    assert TIMING.get_decode_ms(1, 0) == pytest.approx(10 - 2 / 3)  # 9.333


def test_step_time_mixes_prefill_and_decode_less_the_overhead() -> None:
    assert TIMING.get_step_overhead_ms() == pytest.approx(6.0)  # prefill table at 0 tokens
    decode = StepWork(0, 3, 0.0, num_decode_kv_tokens=3 * 640)
    prefill = StepWork(128, 0, 0.0)
    both = StepWork(128, 3, 0.0, num_decode_kv_tokens=3 * 640)
    assert TIMING.step_ms(decode) == pytest.approx(14.25)
    assert TIMING.step_ms(prefill) == pytest.approx(14.0)
    assert TIMING.step_ms(both) == pytest.approx(14.0 + 14.25 - 6.0)
    fast = ProfileTiming(**{**TIMING.__dict__, "speedup_ratio": 2.0})
    assert fast.step_ms(both) == pytest.approx((14.0 + 14.25 - 6.0) / 2)
    assert TIMING.step_ms(StepWork(0, 0, 0.0)) == 0.0
    # a caller that cannot tell the context gets the smallest profiled one
    assert TIMING.step_ms(StepWork(0, 2, 0.5)) == pytest.approx(11.0)


def test_tables_must_be_usable() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ProfileTiming((64.0,), (1.0,), (1.0,), (64.0,), ((1.0,),))
    with pytest.raises(ValueError, match="increase strictly"):
        ProfileTiming((64.0, 64.0), (1.0, 2.0), (1.0,), (64.0,), ((1.0,),))
    with pytest.raises(ValueError, match="2 x 1 grid"):
        ProfileTiming((1.0, 2.0), (1.0, 2.0), (1.0, 2.0), (64.0,), ((1.0,),))


def _profile(
    prefill: list[PrefillPoint], decode: list[DecodePoint], model: str = "tiny"
) -> TimingProfile:
    return make_profile(model=model, max_num_batched_tokens=256, prefill=prefill, decode=decode)


PREFILL = [
    PrefillPoint(num_requests=1, input_tokens=64, ttft_ms=10.0, tokens_per_s=6400.0),
    PrefillPoint(num_requests=4, input_tokens=64, ttft_ms=30.0, tokens_per_s=8000.0),
    PrefillPoint(num_requests=1, input_tokens=256, ttft_ms=22.0, tokens_per_s=11636.0),
    PrefillPoint(num_requests=1, input_tokens=1024, ttft_ms=99.0, tokens_per_s=10343.0),
]
DECODE = [
    DecodePoint(num_requests=b, context_tokens=c, itl_ms=ms, tokens_per_s=b / ms * 1e3)
    for (b, c), ms in {(1, 64): 5.0, (4, 64): 6.0, (1, 512): 7.0, (4, 512): 9.0}.items()
]


def test_a_profile_gives_batch_one_prefill_within_the_budget_and_the_decode_grid() -> None:
    timing = timing_from_profile(_profile(PREFILL, DECODE), speedup_ratio=3.0)
    assert timing == ProfileTiming(
        prefill_tokens=(64.0, 256.0),  # 4 together and 1024 > the 256-token budget: left out
        prefill_ms_table=(10.0, 22.0),
        decode_requests=(1.0, 4.0),
        decode_context_tokens=(64.0, 512.0),
        decode_ms_grid=((5.0, 7.0), (6.0, 9.0)),
        speedup_ratio=3.0,
    )


def test_a_prefill_pays_for_the_earlier_context_it_attends_over() -> None:
    timing = ProfileTiming(**{**TIMING.__dict__, "prefill_ms_per_context_pair": 1e-4})
    # 128 new tokens after 512 earlier ones: 14 ms fresh, plus 128 * 512 pairs at 1e-4 ms
    after = StepWork(128, 0, 0.0, num_prefill_context_pairs=128 * 512)
    assert timing.step_ms(after) == pytest.approx(14.0 + 6.5536)
    assert TIMING.step_ms(after) == pytest.approx(14.0)  # a profile without the term
    # mixed with decodes, the context is part of the prefill
    both = StepWork(128, 3, 0.0, num_decode_kv_tokens=3 * 640, num_prefill_context_pairs=65536)
    assert timing.step_ms(both) == pytest.approx(14.0 + 6.5536 + 14.25 - 6.0)
    with pytest.raises(ValueError, match="prefill_ms_per_context_pair must be >= 0"):
        ProfileTiming(**{**TIMING.__dict__, "prefill_ms_per_context_pair": -1.0})


def _after(input_tokens: int, context_tokens: int, ttft_ms: float) -> PrefillPoint:
    return PrefillPoint(
        num_requests=1,
        input_tokens=input_tokens,
        ttft_ms=ttft_ms,
        tokens_per_s=input_tokens / ttft_ms * 1e3,
        context_tokens=context_tokens,
    )


def test_the_context_cost_is_fitted_from_prefills_after_a_cached_prefix() -> None:
    # over the fresh table (64: 10 ms, 256: 22 ms): +2 ms for 64 x 200 pairs, +10 ms for
    # 256 x 200; least squares through 0: (2 * 12800 + 10 * 51200) / (12800^2 + 51200^2)
    points = [*PREFILL, _after(64, 200, 12.0), _after(256, 200, 32.0)]
    timing = timing_from_profile(_profile(points, DECODE))
    pairs = (12800.0, 51200.0)
    expected = (2 * pairs[0] + 10 * pairs[1]) / (pairs[0] ** 2 + pairs[1] ** 2)
    assert timing.prefill_ms_per_context_pair == pytest.approx(expected)
    # the fresh table is the fresh points' alone
    assert timing.prefill_ms_table == (10.0, 22.0)
    # a prefix that made it faster gives no negative cost; none at all gives none
    faster = timing_from_profile(_profile([*PREFILL, _after(64, 200, 9.0)], DECODE))
    assert faster.prefill_ms_per_context_pair == 0.0
    assert timing_from_profile(_profile(PREFILL, DECODE)).prefill_ms_per_context_pair == 0.0


def test_a_profile_whose_decode_points_are_not_a_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="none for 4 requests x 512 tokens"):
        timing_from_profile(_profile(PREFILL, DECODE[:3]))
    with pytest.raises(ValueError, match="at least 2"):
        timing_from_profile(_profile(PREFILL[:2], DECODE))


def test_loading_checks_the_model_and_says_which_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_profile(_profile(PREFILL, DECODE), path)
    assert load_profile_timing(path, model="tiny").prefill_ms_table == (10.0, 22.0)
    with pytest.raises(ProfileError, match="measured on model 'tiny', not 'other'"):
        load_profile_timing(path, model="other")
    write_profile(_profile(PREFILL, DECODE[:3]), path)
    with pytest.raises(ProfileError, match=f"{path} cannot give step times: decode points"):
        load_profile_timing(path)
