"""bench.loaded_steps: steps summed by kind against the profile's tables."""

from __future__ import annotations

import pytest

from armature.protocols.engine import StepRecord
from bench.loaded_steps import sum_ratios
from bench.served_steps import get_step_kind
from profiles import HAND_TIMING

TIMING = HAND_TIMING


def test_steps_are_summed_by_kind_and_together() -> None:
    records = [
        StepRecord(num_scheduled_prefill_tokens=100, step_wall_s=0.030),  # 20 ms modeled
        StepRecord(num_decode_requests=8, num_decode_kv_tokens=800, step_wall_s=0.045),  # 36
        StepRecord(num_decode_requests=1, num_decode_kv_tokens=90, step_wall_s=0.019),  # 20
        StepRecord(  # 30 + 20 less the 10 ms overhead: 40
            num_scheduled_prefill_tokens=200,
            num_decode_requests=1,
            num_decode_kv_tokens=150,
            step_wall_s=0.040,
        ),
    ]
    assert [get_step_kind(r) for r in records] == ["prefill", "decode", "decode", "mixed"]
    ratios = sum_ratios(records, TIMING)
    assert ratios.keys() == {"prefill", "decode", "mixed", "all"}
    assert ratios["prefill"] == (1, pytest.approx(1.5))
    assert ratios["decode"] == (2, pytest.approx(0.064 / 0.056))
    assert ratios["mixed"] == (1, pytest.approx(1.0))
    assert ratios["all"] == (4, pytest.approx(0.134 / 0.116))
    assert sum_ratios([], TIMING) == {}
