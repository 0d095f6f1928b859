"""The planner tests' shared profile (conftest) follows the hand formulas its docstring gives:
the other tests' numbers rest on them."""

from __future__ import annotations

import pytest

from armature.planner.performance import KvHeadroom
from armature.planner.timing_performance import TimingPerformanceModel


def test_prefill_and_decode_follow_the_hand_formulas(profile: TimingPerformanceModel) -> None:
    assert profile.get_prefill_s(1500) == pytest.approx(0.02 + 1e-4 * 1500)
    assert profile.get_prefill_s(8000) == pytest.approx(0.82)  # extended: 0.02 + 0.8
    # C = 1100: 0.010 + B (0.0005 + 0.0005 * 100 / 2000) = 0.010 + 0.000525 B
    assert profile.get_decode_step_s(38, 1100) == pytest.approx(0.010 + 0.000525 * 38)
    # C = 3100, past the table: 0.010 + 0.001025 B
    assert profile.get_decode_step_s(19, 3100) == pytest.approx(0.010 + 0.001025 * 19)


def test_max_decode_requests_is_the_tighter_of_kv_and_max_num_seqs(
    profile: TimingPerformanceModel,
) -> None:
    assert profile.get_max_decode_requests(1100) == 64  # 200000 // 1100 = 181 > 64
    assert profile.get_max_decode_requests(10_000) == 20  # 200000 // 10000
    assert profile.get_max_decode_requests(500_000) == 1  # at least one


def test_kv_headroom_counts_each_request_at_its_context_over_the_share(
    profile: TimingPerformanceModel,
) -> None:
    half = KvHeadroom(profile, 0.5)
    assert half.get_max_decode_requests(10_000) == 10  # 200000 // 20000
    assert half.get_max_decode_requests(1100) == 64  # 200000 // 2200 = 90: max_num_seqs binds
    assert half.get_prefill_s(1500) == profile.get_prefill_s(1500)
    assert half.get_decode_step_s(19, 3100) == profile.get_decode_step_s(19, 3100)
    assert KvHeadroom(profile, 1.0).get_max_decode_requests(10_000) == 20
    for bad in (0.0, 1.2):
        with pytest.raises(ValueError, match="kv_share"):
            KvHeadroom(profile, bad)
