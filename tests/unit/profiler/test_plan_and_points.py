"""The profiler's pure parts: which sweeps an engine can run, and request timings -> points."""

from __future__ import annotations

import msgspec
import pytest

from armature.config import ProfileSweepConfig
from armature.errors import ConfigError
from armature.profiler.plan import (
    EngineLimits,
    check_sweep,
    decode_context_tokens,
    decode_max_tokens,
    prefill_context_points,
)
from armature.profiler.points import (
    RequestTimes,
    decode_point,
    median_decode_points,
    median_prefill_points,
    median_profile,
    prefill_after_prefix_point,
    prefill_alone_point,
    prefill_batch_point,
)
from armature.protocols.timing_profile import DecodePoint, PrefillPoint, TimingProfile
from armature.workload.measure import MeasureError
from profiles import make_profile

LIMITS = EngineLimits(
    max_num_seqs=16,
    max_num_batched_tokens=256,
    max_model_len_tokens=512,
    block_size_tokens=16,
    num_kv_blocks=256,  # 4096 tokens
)


def test_decode_requests_are_timed_after_settling() -> None:
    sweep = ProfileSweepConfig(decode_output_tokens=8)
    assert decode_max_tokens(sweep) == 1 + 2 + 8
    # tokens 4..11 are timed, over 100 + 3 .. 100 + 10 tokens: mean 106.5, rounded down
    assert decode_context_tokens(100, sweep) == 106


def _sweep(**settings: object) -> ProfileSweepConfig:
    """A sweep with no prefill after a cached prefix unless it says so."""
    return ProfileSweepConfig(**{"prefill_context_tokens": (), **settings})  # type: ignore[arg-type]


def test_prefill_context_points() -> None:
    sweep = _sweep(prefill_input_tokens=(32, 128, 400), prefill_context_tokens=(8, 100, 300))
    # 8 is under a block; 100 is 96 in whole blocks; 400 is over the step budget
    assert prefill_context_points(sweep, LIMITS) == [(32, 96), (128, 96), (32, 288), (128, 288)]
    assert prefill_context_points(_sweep(), LIMITS) == []


def test_a_sweep_that_fits_passes() -> None:
    check_sweep(
        _sweep(
            prefill_input_tokens=(32, 128, 400),
            prefill_batch_requests=4,
            decode_requests=(1, 16),
            decode_context_tokens=(64, 128),
            prefill_context_tokens=(100, 300),
        ),
        LIMITS,
    )


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        (_sweep(prefill_input_tokens=(32, 512)), "at least two lengths within"),
        (_sweep(prefill_input_tokens=(32, 64, 600)), "600 does not fit the context"),
        (
            _sweep(prefill_input_tokens=(32, 64, 500), prefill_batch_requests=9),
            "9 prompts of 500 tokens do not fit the KV cache (4096 tokens)",
        ),
        (
            _sweep(prefill_input_tokens=(32, 64), decode_requests=(1, 32)),
            "--decode-requests 32 is above --max-num-seqs 16",
        ),
        (
            _sweep(
                prefill_input_tokens=(32, 64), decode_requests=(1,), decode_context_tokens=(500,)
            ),
            "--decode-context-tokens 500 plus 19 output tokens does not fit",
        ),
        (
            _sweep(
                prefill_input_tokens=(32, 64), decode_requests=(16,), decode_context_tokens=(300,)
            ),
            "16 requests of 319 tokens do not fit the KV cache",
        ),
        (
            _sweep(prefill_input_tokens=(32, 128), prefill_context_tokens=(400,)),
            "--prefill-context-tokens 400 (in whole blocks) plus --prefill-input-tokens 128 "
            "does not fit the context of 512",
        ),
        (
            _sweep(prefill_input_tokens=(32, 64), prefill_context_tokens=(5, 64)),
            "--prefill-context-tokens 5 is less than one block (16 tokens)",
        ),
    ],
)
def test_a_sweep_the_engine_cannot_run_is_refused(sweep: ProfileSweepConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_sweep(sweep, LIMITS)


def test_merged_outputs_share_their_gap() -> None:
    times = RequestTimes(10.0, ((10.5, 1), (10.6, 1), (10.9, 3), (11.0, 1)))
    assert times.ttft_s == pytest.approx(0.5)
    assert times.get_itls_s() == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])


def test_tokens_merged_into_the_first_output_are_not_timed() -> None:
    times = RequestTimes(10.0, ((10.5, 3), (10.6, 1), (10.8, 2)))
    itls_s = times.get_itls_s()
    assert itls_s[:2] == [None, None]
    assert itls_s[2:] == pytest.approx([0.1, 0.1, 0.1])


def test_decode_point_of_a_consumer_that_fell_behind() -> None:
    # the window (tokens 3..4) came with the first output: all the timed gaps are used
    late = RequestTimes(0.0, ((1.0, 5), (1.3, 1), (1.4, 1)))
    point = decode_point(100, [late], skip=2, count=2)
    assert point.itl_ms == pytest.approx(200.0)
    with pytest.raises(MeasureError, match="no gap to time"):
        decode_point(100, [RequestTimes(0.0, ((1.0, 7),))], skip=2, count=2)


def test_a_prefill_after_a_cached_prefix_is_its_new_tokens_over_the_cached() -> None:
    # 300-token prompts whose first 256 were cached: 44 new tokens after 256
    repeats = [RequestTimes(0.0, ((t, 1),), num_cached_tokens=256) for t in (0.05, 0.04, 0.06)]
    point = prefill_after_prefix_point(300, repeats)
    assert point is not None
    assert (point.num_requests, point.input_tokens, point.context_tokens) == (1, 44, 256)
    assert point.ttft_ms == pytest.approx(50.0)
    assert point.tokens_per_s == pytest.approx(44 / 0.05)
    # an engine that cached nothing gives no point
    assert prefill_after_prefix_point(300, [RequestTimes(0.0, ((0.1, 1),))]) is None


def test_prefill_points() -> None:
    alone = [RequestTimes(0.0, ((t, 1),)) for t in (0.3, 0.1, 0.2)]
    point = prefill_alone_point(100, alone)
    assert (point.num_requests, point.input_tokens) == (1, 100)
    assert point.ttft_ms == pytest.approx(200.0)
    assert point.tokens_per_s == pytest.approx(500.0)
    together = [RequestTimes(s, ((t, 1),)) for s, t in ((0.0, 0.2), (0.01, 0.4))]
    point = prefill_batch_point(100, together)
    assert point.num_requests == 2
    assert point.ttft_ms == pytest.approx((0.2 + 0.39) / 2 * 1e3)
    assert point.tokens_per_s == pytest.approx(200 / 0.4)


def test_decode_point_takes_the_median_after_skipping() -> None:
    # ITLs: 0.5 (skipped), then 0.1, 0.2, 0.3 (timed), then 0.9 (past the count)
    arrivals = ((1.0, 1), (1.5, 1), (1.6, 1), (1.8, 1), (2.1, 1), (3.0, 1))
    point = decode_point(300, [RequestTimes(0.0, arrivals)] * 2, skip=1, count=3)
    assert (point.num_requests, point.context_tokens) == (2, 300)
    assert point.itl_ms == pytest.approx(200.0)
    assert point.tokens_per_s == pytest.approx(2 / 0.2)


def test_decode_point_is_the_median_request_of_their_window_means() -> None:
    # seen late (0.25) then early (0.05): the window's mean is its elapsed time over its
    # tokens, 0.5 s / 4, where the median single gap (0.1) would be short of a step
    late = RequestTimes(0.0, ((1.0, 1), (1.1, 1), (1.35, 1), (1.4, 1), (1.5, 1)))
    assert decode_point(64, [late], skip=0, count=4).itl_ms == pytest.approx(125.0)
    # a merged output's gap shared by its tokens counts the same: 0.4 s over 3 tokens
    merged = RequestTimes(0.0, ((1.0, 1), (1.1, 1), (1.4, 2)))
    assert decode_point(64, [merged], skip=0, count=3).itl_ms == pytest.approx(400 / 3)
    # over requests, the median of their means
    steady = RequestTimes(0.0, ((1.0, 1), (1.2, 1), (1.4, 1), (1.6, 1), (1.8, 1)))
    slow = RequestTimes(0.0, ((1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1), (5.0, 1)))
    point = decode_point(64, [slow, late, steady], skip=0, count=4)
    assert point.itl_ms == pytest.approx(200.0)
    assert point.tokens_per_s == pytest.approx(3 / 0.2)


def _prefill(num_requests: int, tokens: int, ttft_ms: float, tokens_per_s: float) -> PrefillPoint:
    return PrefillPoint(
        num_requests=num_requests, input_tokens=tokens, ttft_ms=ttft_ms, tokens_per_s=tokens_per_s
    )


def _decode(num_requests: int, context: int, itl_ms: float) -> DecodePoint:
    return DecodePoint(
        num_requests=num_requests,
        context_tokens=context,
        itl_ms=itl_ms,
        tokens_per_s=num_requests / (itl_ms / 1e3),
    )


def test_passes_keep_each_points_median() -> None:
    """Three passes, one of them in a slow spell at each point: the median drops it. A prompt
    alone keeps tokens over its median TTFT; a batch its median tokens/s."""
    passes = [
        [_prefill(1, 100, 50.0, 2000.0), _prefill(4, 100, 90.0, 4000.0)],
        [_prefill(1, 100, 80.0, 1250.0), _prefill(4, 100, 95.0, 4200.0)],
        [_prefill(1, 100, 40.0, 2500.0), _prefill(4, 100, 200.0, 2000.0)],
    ]
    assert median_prefill_points(passes) == [
        _prefill(1, 100, 50.0, 2000.0),
        _prefill(4, 100, 95.0, 4000.0),
    ]
    decodes = [
        [_decode(1, 64, 10.0), _decode(8, 64, 20.0)],
        [_decode(1, 64, 30.0), _decode(8, 64, 16.0)],
        [_decode(1, 64, 12.0), _decode(8, 64, 18.0)],
    ]
    assert median_decode_points(decodes) == [_decode(1, 64, 12.0), _decode(8, 64, 18.0)]
    assert median_decode_points(decodes[:1]) == decodes[0]  # one pass: as measured
    assert median_decode_points(decodes[:2])[0].itl_ms == pytest.approx(20.0)  # the midpoint


def test_passes_that_measured_different_points_are_refused() -> None:
    with pytest.raises(ValueError, match="different points"):
        median_decode_points([[_decode(1, 64, 10.0)], [_decode(2, 64, 10.0)]])
    with pytest.raises(ValueError, match="different points"):
        median_prefill_points([[_prefill(1, 100, 5.0, 1.0)], []])
    with pytest.raises(ValueError, match="no pass"):
        median_decode_points([])


def test_profiles_made_at_once_merge_point_by_point() -> None:
    """Two engines profiled at once: each point's median (of two: the mean), the first's
    source and limits; a prompt alone keeps its tokens over the median TTFT."""

    def profile(ttft_ms: float, itl_ms: float) -> TimingProfile:
        prefill = [PrefillPoint(num_requests=1, input_tokens=100, ttft_ms=ttft_ms, tokens_per_s=0)]
        decode = [DecodePoint(num_requests=4, context_tokens=64, itl_ms=itl_ms, tokens_per_s=0)]
        return make_profile(prefill=prefill, decode=decode)

    first, second = profile(40.0, 10.0), profile(60.0, 30.0)
    merged = median_profile([first, second])
    assert merged.source == msgspec.structs.replace(first.source, engines_at_once=2)
    assert merged.num_kv_blocks == 96
    assert merged.prefill == [
        PrefillPoint(num_requests=1, input_tokens=100, ttft_ms=50.0, tokens_per_s=2000.0)
    ]
    assert merged.decode == [
        DecodePoint(num_requests=4, context_tokens=64, itl_ms=20.0, tokens_per_s=200.0)
    ]
