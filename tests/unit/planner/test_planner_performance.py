"""TablePerformanceModel: interpolation inside the tables, linear extension past them, the
decode batch limit, and tables that cannot work."""

from __future__ import annotations

import pytest

from armature.errors import ConfigError
from armature.planner import TablePerformanceModel
from armature.planner.performance import interpolate


def test_interpolate_inside_past_and_single_point() -> None:
    assert interpolate([0, 10], [1.0, 2.0], 5) == 1.5
    assert interpolate([0, 10], [1.0, 2.0], 20) == 3.0  # the last segment extended
    assert interpolate([0, 10], [1.0, 2.0], -10) == 0.0
    assert interpolate([4], [7.0], 100) == 7.0


def test_prefill_and_decode_follow_the_hand_formulas(profile: TablePerformanceModel) -> None:
    assert profile.get_prefill_s(1500) == pytest.approx(0.02 + 1e-4 * 1500)
    assert profile.get_prefill_s(8000) == pytest.approx(0.82)  # extended: 0.02 + 0.8
    # C = 1100: 0.010 + B (0.0005 + 0.0005 * 100 / 2000) = 0.010 + 0.000525 B
    assert profile.get_decode_step_s(38, 1100) == pytest.approx(0.010 + 0.000525 * 38)
    # C = 3100, past the table: 0.010 + 0.001025 B
    assert profile.get_decode_step_s(19, 3100) == pytest.approx(0.010 + 0.001025 * 19)


def test_max_decode_requests_is_the_tighter_of_kv_and_max_num_seqs(
    profile: TablePerformanceModel,
) -> None:
    assert profile.get_max_decode_requests(1100) == 64  # 200000 // 1100 = 181 > 64
    assert profile.get_max_decode_requests(10_000) == 20  # 200000 // 10000
    assert profile.get_max_decode_requests(500_000) == 1  # at least one


def test_tables_that_cannot_work_are_rejected() -> None:
    with pytest.raises(ConfigError, match="prefill_tokens: expected increasing"):
        TablePerformanceModel(
            prefill_tokens=(0, 0),
            prefill_s=(0.1, 0.2),
            decode_requests=(1,),
            decode_context_tokens=(1,),
            decode_step_s=((0.01,),),
            max_num_seqs=1,
            max_kv_tokens=1,
        )
    with pytest.raises(ConfigError, match="decode_step_s: one row per batch size"):
        TablePerformanceModel(
            prefill_tokens=(0,),
            prefill_s=(0.1,),
            decode_requests=(1, 2),
            decode_context_tokens=(1,),
            decode_step_s=((0.01,),),
            max_num_seqs=1,
            max_kv_tokens=1,
        )
