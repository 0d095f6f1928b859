"""A hand-workable profile shared by the planner's tests.

    prefill_s(n)       = 0.02 + 1e-4 n                   (tables at 0, 1000, 2000, 4000 tokens)
    decode_step_s(B,C) = 0.010 + 0.0005 B   at C = 1000  (tables at B = 1, 16, 32, 64)
                       = 0.010 + 0.0010 B   at C = 3000
so, linear in both, decode_step_s(B, C) = 0.010 + B (0.0005 + 0.0005 (C - 1000) / 2000)
everywhere (also past the table's ends, which are extended linearly). A worker holds 64
requests and 200,000 KV tokens.
"""

from __future__ import annotations

import pytest

from armature.planner import TablePerformanceModel


def make_profile() -> TablePerformanceModel:
    return TablePerformanceModel(
        prefill_tokens=(0, 1000, 2000, 4000),
        prefill_s=(0.02, 0.12, 0.22, 0.42),
        decode_requests=(1, 16, 32, 64),
        decode_context_tokens=(1000, 3000),
        decode_step_s=(
            (0.0105, 0.011),
            (0.018, 0.026),
            (0.026, 0.042),
            (0.042, 0.074),
        ),
        max_num_seqs=64,
        max_kv_tokens=200_000,
    )


@pytest.fixture
def profile() -> TablePerformanceModel:
    return make_profile()
