"""bench.profile_drift: the same points of two profiles, and how far the second moved."""

from __future__ import annotations

import msgspec

from armature.protocols.timing_profile import DecodePoint, PrefillPoint, TimingProfile
from bench.profile_drift import drift_table
from profiles import make_load_check, make_profile


def _profile(scale: float) -> TimingProfile:
    prefill = [
        PrefillPoint(num_requests=1, input_tokens=n, ttft_ms=ms * scale, tokens_per_s=1.0)
        for n, ms in ((16, 10.0), (512, 200.0))
    ]
    prefill.append(PrefillPoint(num_requests=4, input_tokens=512, ttft_ms=999.0, tokens_per_s=1.0))
    decode = [
        DecodePoint(num_requests=b, context_tokens=c, itl_ms=ms * scale, tokens_per_s=1.0)
        for b, c, ms in ((1, 64, 20.0), (8, 64, 40.0), (1, 256, 30.0), (4, 64, 33.0))
    ]
    return make_profile(prefill=prefill, decode=decode)


def test_the_table_shows_the_longest_prefill_and_decode_at_one_and_most_requests() -> None:
    after = msgspec.structs.replace(_profile(1.5), load=make_load_check(2.2, 2.0))
    table = drift_table([("before", _profile(1.0)), ("after", after)])
    lines = table.splitlines()
    assert lines[0] == (
        "| profile | made at | prefill 512 tokens TTFT ms | decode 1 x 64 ITL ms "
        "| decode 8 x 64 ITL ms | load pass factor |"
    )
    assert lines[2].startswith(
        "| before | 2026-11-24T00:00:00+00:00 | 200.0 (+0.0%) | 20.0 (+0.0%)"
    )
    assert lines[3] == (
        "| after | 2026-11-24T00:00:00+00:00 | 300.0 (+50.0%) | 30.0 (+50.0%) | 60.0 (+50.0%) "
        "| 1.100 |"
    )
