"""A small valid timing profile for tests that need one on disk (the planner's
--performance-model, the mocker's --timing-profile), built from the protocol's own types; a
load pass's record; and a two-point timing model worked by hand."""

from __future__ import annotations

from pathlib import Path

from armature.protocols.timing_profile import (
    PROFILE_VERSION,
    DecodePoint,
    LoadCheck,
    PrefillPoint,
    ProfileSource,
    TimingProfile,
    write_profile,
)
from armature.sim.profile_timing import ProfileTiming

# prefill 10 ms + 0.1 ms a token, swept at 100 and 300 tokens; decode 20 ms at 1 request,
# 36 ms at 8, whatever the context; a mixed step costs both less the 10 ms overhead
HAND_TIMING = ProfileTiming(
    prefill_tokens=(100.0, 300.0),
    prefill_ms_table=(20.0, 40.0),
    decode_requests=(1.0, 8.0),
    decode_context_tokens=(64.0,),
    decode_ms_grid=((20.0,), (36.0,)),
)


def make_profile(
    *,
    model: str = "tiny",
    version: int = PROFILE_VERSION,
    max_num_batched_tokens: int = 1024,
    prefill: list[PrefillPoint] | None = None,
    decode: list[DecodePoint] | None = None,
) -> TimingProfile:
    """Model `model` on a worker of 96 blocks of 16 tokens, 32 requests, a 1024-token step;
    by default prefill 17 ms at 16 tokens and 32 ms at 1024, decode 8 ms (one point)."""
    source = ProfileSource(
        machine="cpu",
        engine="mocker",
        model=model,
        dtype="float32",
        device="cpu",
        flags={"num-kv-blocks": "96", "max-num-seqs": "32"},
        created_at="2026-11-24T00:00:00+00:00",
    )
    if prefill is None:
        prefill = [
            PrefillPoint(num_requests=1, input_tokens=n, ttft_ms=ms, tokens_per_s=n / ms * 1e3)
            for n, ms in ((16, 17.0), (1024, 32.0))
        ]
    if decode is None:
        decode = [DecodePoint(num_requests=1, context_tokens=128, itl_ms=8.0, tokens_per_s=125.0)]
    return TimingProfile(
        version=version,
        source=source,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=32,
        block_size_tokens=16,
        num_kv_blocks=96,
        prefill=prefill,
        decode=decode,
    )


def write_small_profile(path: Path, *, model: str = "tiny", version: int = PROFILE_VERSION) -> None:
    write_profile(make_profile(model=model, version=version), path)


def make_load_check(
    measured_s: float,
    modeled_s: float,
    *,
    num_requests: int = 48,
    request_rate_per_s: float = 1.5,
    num_steps: int = 500,
    prompt_s: tuple[float, float] = (0.0, 0.0),
    decode_s: tuple[float, float] = (0.0, 0.0),
) -> LoadCheck:
    """A load pass whose steps took `measured_s` where the tables give `modeled_s`; its prompt
    and decode steps (measured, modeled) apart where given (none: a pass written before the
    classes)."""
    return LoadCheck(
        num_requests=num_requests,
        request_rate_per_s=request_rate_per_s,
        num_steps=num_steps,
        measured_s=measured_s,
        modeled_s=modeled_s,
        prompt_measured_s=prompt_s[0],
        prompt_modeled_s=prompt_s[1],
        decode_measured_s=decode_s[0],
        decode_modeled_s=decode_s[1],
    )
