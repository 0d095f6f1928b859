"""One worker's step times as the simulator takes them: a timing profile (the format
`armature profile` writes and `--timing-profile` reads), predicted by the operator model on
a fixed grid, or measured on this machine (the local system).

    prefill points  one prompt of 16, 24, 32, 48, ... 24576, 32768 tokens (2^k and 3 x 2^k),
                    one step each
    decode points   1, 2, ... 1024 requests x 64, 128, ... 131072 context tokens each

The mocker interpolates between the points (`sim.profile_timing`), so the configurator's
search, `armature replay --timing-profile` and a mocker fleet started from --save-dir all run
on the same step times. The grid is fixed, whatever the limits: a profile's limits change
which prefill points are read (those within its max-num-batched-tokens), never the times
between them, as long as max-num-batched-tokens is a grid point.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from armature.configurator.model_spec import ModelSpec
from armature.configurator.operators import get_step_breakdown
from armature.configurator.systems import SystemSpec
from armature.protocols.timing_profile import (
    PROFILE_VERSION,
    DecodePoint,
    PrefillPoint,
    ProfileSource,
    TimingProfile,
)
from armature.sim.profile_timing import ProfileTiming, timing_from_profile

__all__ = [
    "DECODE_GRID_CONTEXT_TOKENS",
    "DECODE_GRID_REQUESTS",
    "PREFILL_GRID_TOKENS",
    "WorkerTiming",
    "predict_profile",
    "with_limits",
]

PREFILL_GRID_TOKENS = tuple(sorted([2**i for i in range(4, 16)] + [3 * 2**i for i in range(3, 14)]))
DECODE_GRID_REQUESTS = tuple(2**i for i in range(11))
# prefills are also predicted after this many cached tokens (a prefix hit, an earlier chunk)
PREFILL_CONTEXT_TOKENS = 4096
DECODE_GRID_CONTEXT_TOKENS = tuple(2**i for i in range(6, 18))


@dataclass(frozen=True)
class WorkerTiming:
    """A worker of `tp` GPUs: its profile (limits as built) and the step times read off it."""

    tp: int
    profile: TimingProfile
    timing: ProfileTiming

    @staticmethod
    def of(tp: int, profile: TimingProfile) -> WorkerTiming:
        return WorkerTiming(tp, profile, timing_from_profile(profile))


def predict_profile(
    model: ModelSpec,
    system: SystemSpec,
    tp: int,
    *,
    served_model_name: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_kv_blocks: int,
    block_size_tokens: int,
) -> TimingProfile:
    """The operator model's profile of one worker of `tp` GPUs of `system`."""

    def step_ms(
        num_prefill_tokens: int, num_decode_requests: int, num_kv_tokens: int, context: int = 0
    ) -> float:
        breakdown = get_step_breakdown(
            model,
            system,
            tp,
            num_prefill_tokens=num_prefill_tokens,
            num_decode_requests=num_decode_requests,
            num_kv_tokens=num_kv_tokens,
            num_prefill_context_tokens=context,
        )
        return breakdown.total_s * 1000.0

    prefill = []
    for c in (0, PREFILL_CONTEXT_TOKENS):
        for t in PREFILL_GRID_TOKENS:
            if c and t > max_num_batched_tokens:
                continue  # the context's cost is fitted on prefills of one step
            ms = step_ms(t, 0, 0, c)
            prefill.append(
                PrefillPoint(
                    num_requests=1,
                    input_tokens=t,
                    ttft_ms=ms,
                    tokens_per_s=t / ms * 1000,
                    context_tokens=c,
                )
            )
    decode = []
    for b in DECODE_GRID_REQUESTS:
        for c in DECODE_GRID_CONTEXT_TOKENS:
            ms = step_ms(0, b, b * c)
            decode.append(
                DecodePoint(num_requests=b, context_tokens=c, itl_ms=ms, tokens_per_s=b / ms * 1000)
            )
    source = ProfileSource(
        machine=system.description,
        engine="predicted",
        model=served_model_name,
        dtype=model.dtype,
        device=f"{system.name} x{tp}",
        flags={"system": system.name, "tensor_parallel": str(tp), "by": "armature configure"},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    return TimingProfile(
        version=PROFILE_VERSION,
        source=source,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        block_size_tokens=block_size_tokens,
        num_kv_blocks=num_kv_blocks,
        prefill=prefill,
        decode=decode,
    )


def with_limits(
    profile: TimingProfile,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_kv_blocks: int,
    served_model_name: str,
) -> TimingProfile:
    """`profile` for a worker run with these limits and served under this name (the mocker
    refuses a profile of another model's name)."""
    source = msgspec.structs.replace(profile.source, model=served_model_name)
    return msgspec.structs.replace(
        profile,
        source=source,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_kv_blocks=num_kv_blocks,
    )
