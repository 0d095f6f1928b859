"""A hand-workable profile shared by the planner's tests: the planner's own performance model
(`TimingPerformanceModel`) over a profile's tables (`ProfileTiming`).

    prefill_s(n)       = 0.02 + 1e-4 n                   (tables at 0, 1000, 2000, 4000 tokens)
    decode_step_s(B,C) = 0.010 + 0.0005 B   at C = 1000  (tables at B = 1, 16, 32, 64)
                       = 0.010 + 0.0010 B   at C = 3000
so, linear in both, decode_step_s(B, C) = 0.010 + B (0.0005 + 0.0005 (C - 1000) / 2000)
everywhere (also past the table's ends, which are extended linearly). A worker holds 64
requests and 200,000 KV tokens (blocks of one token), and prefills any prompt in one step.
"""

from __future__ import annotations

import pytest

from armature.planner.timing_performance import TimingPerformanceModel
from armature.sim.profile_timing import ProfileTiming


def make_profile() -> TimingPerformanceModel:
    timing = ProfileTiming(
        prefill_tokens=(0.0, 1000.0, 2000.0, 4000.0),
        prefill_ms_table=(20.0, 120.0, 220.0, 420.0),
        decode_requests=(1.0, 16.0, 32.0, 64.0),
        decode_context_tokens=(1000.0, 3000.0),
        decode_ms_grid=((10.5, 11.0), (18.0, 26.0), (26.0, 42.0), (42.0, 74.0)),
    )
    return TimingPerformanceModel(
        timing,
        block_size=1,
        num_kv_blocks=200_000,
        max_num_seqs=64,
        max_num_batched_tokens=1 << 20,
    )


@pytest.fixture
def profile() -> TimingPerformanceModel:
    return make_profile()
