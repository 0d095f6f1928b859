"""A sweep point's request timings -> one profile point: pure.

`RequestTimes` holds when a request was submitted and when each of its outputs arrived with
how many tokens (an engine may hand a slow consumer several tokens at once: each of them is
given an equal share of the gap since the previous output; the tokens that came with the first
output have no gap to share and are not timed).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from msgspec.structs import replace

from armature.protocols.timing_profile import DecodePoint, LoadCheck, PrefillPoint, TimingProfile
from armature.workload.measure import MeasureError, quantile

__all__ = [
    "RequestTimes",
    "decode_point",
    "median_decode_points",
    "median_prefill_points",
    "median_profile",
    "pooled_load",
    "prefill_after_prefix_point",
    "prefill_alone_point",
    "prefill_batch_point",
]


@dataclass(frozen=True)
class RequestTimes:
    submitted_s: float
    outputs: tuple[tuple[float, int], ...]  # (arrival time, tokens), oldest first
    num_cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache

    @property
    def ttft_s(self) -> float:
        return self.outputs[0][0] - self.submitted_s

    def get_itls_s(self) -> list[float | None]:
        """One inter-token latency per token after the first, in token order; None for the
        tokens that arrived with the first one (no gap was seen before them)."""
        itls: list[float | None] = [None] * (self.outputs[0][1] - 1)
        for (before_s, _), (at_s, num_tokens) in itertools.pairwise(self.outputs):
            itls += [(at_s - before_s) / num_tokens] * num_tokens
        return itls


def prefill_alone_point(input_tokens: int, repeats: Sequence[RequestTimes]) -> PrefillPoint:
    """Prompts of `input_tokens` timed one at a time: the median TTFT, and tokens/s at it."""
    median_s = quantile([t.ttft_s for t in repeats], 0.5)
    return PrefillPoint(
        num_requests=1,
        input_tokens=input_tokens,
        ttft_ms=median_s * 1e3,
        tokens_per_s=input_tokens / median_s,
    )


def prefill_after_prefix_point(
    prompt_tokens: int, repeats: Sequence[RequestTimes]
) -> PrefillPoint | None:
    """Prompts of `prompt_tokens` whose start was cached first, timed one at a time: the
    median TTFT over the median of the tokens the engine found cached (its context) and
    computed; None when it found none (an engine without a prefix cache)."""
    context = round(quantile([t.num_cached_tokens for t in repeats], 0.5))
    if context <= 0:
        return None
    median_s = quantile([t.ttft_s for t in repeats], 0.5)
    return PrefillPoint(
        num_requests=1,
        input_tokens=prompt_tokens - context,
        ttft_ms=median_s * 1e3,
        tokens_per_s=(prompt_tokens - context) / median_s,
        context_tokens=context,
    )


def prefill_batch_point(input_tokens: int, together: Sequence[RequestTimes]) -> PrefillPoint:
    """Prompts of `input_tokens` submitted together: the median TTFT, and all their tokens
    over the time from the first submission to the last first token."""
    span_s = max(t.outputs[0][0] for t in together) - min(t.submitted_s for t in together)
    return PrefillPoint(
        num_requests=len(together),
        input_tokens=input_tokens,
        ttft_ms=quantile([t.ttft_s for t in together], 0.5) * 1e3,
        tokens_per_s=input_tokens * len(together) / span_s,
    )


def decode_point(
    context_tokens: int, times: Sequence[RequestTimes], skip: int, count: int
) -> DecodePoint:
    """Requests decoding together: each request's mean timed ITL over its tokens `skip` ..
    `skip + count` (the window's elapsed time over its tokens, the field's TPOT), and the
    median of those over the requests. A mean, not a median of single gaps: a consumer that
    fell behind sees an output late and the merged one after it early, so single gaps run
    shorter than a step about as often as longer; their sum over the window does not. Of all
    a request's timed ITLs when its window came merged into the first output; MeasureError
    when no token after the first was timed at all."""
    means_s: list[float] = []
    for t in times:
        itls_s = [x for x in t.get_itls_s()[skip : skip + count] if x is not None]
        if not itls_s:
            itls_s = [x for x in t.get_itls_s() if x is not None]
        if itls_s:
            means_s.append(sum(itls_s) / len(itls_s))
    if not means_s:
        raise MeasureError(
            "every token of the decode requests came in their first output: no gap to time"
        )
    median_s = quantile(means_s, 0.5)
    return DecodePoint(
        num_requests=len(times),
        context_tokens=context_tokens,
        itl_ms=median_s * 1e3,
        tokens_per_s=len(times) / median_s,
    )


def _same_keys(keys: list[list[tuple[int, ...]]]) -> list[tuple[int, ...]]:
    """The points every pass measured (their keys, in order); ValueError when there is no
    pass or the passes measured different points."""
    if not keys:
        raise ValueError("no pass to take the median of")
    if any(k != keys[0] for k in keys):
        raise ValueError("the passes measured different points")
    return keys[0]


def median_prefill_points(passes: Sequence[Sequence[PrefillPoint]]) -> list[PrefillPoint]:
    """The same prefill points measured in several passes: each point's median TTFT and
    tokens/s over the passes (a prompt alone keeps input tokens over its TTFT)."""
    keys = _same_keys(
        [[(p.num_requests, p.input_tokens, p.context_tokens) for p in points] for points in passes]
    )
    out = []
    for i, (num_requests, input_tokens, _) in enumerate(keys):
        ttft_ms = quantile([points[i].ttft_ms for points in passes], 0.5)
        if num_requests == 1:
            tokens_per_s = input_tokens / (ttft_ms / 1e3)
        else:
            tokens_per_s = quantile([points[i].tokens_per_s for points in passes], 0.5)
        out.append(replace(passes[0][i], ttft_ms=ttft_ms, tokens_per_s=tokens_per_s))
    return out


def median_decode_points(passes: Sequence[Sequence[DecodePoint]]) -> list[DecodePoint]:
    """The same decode points measured in several passes: each point's median ITL over the
    passes, and its requests' tokens/s at it."""
    keys = _same_keys([[(p.num_requests, p.context_tokens) for p in points] for points in passes])
    out = []
    for i, (num_requests, _) in enumerate(keys):
        itl_ms = quantile([points[i].itl_ms for points in passes], 0.5)
        out.append(replace(passes[0][i], itl_ms=itl_ms, tokens_per_s=num_requests / (itl_ms / 1e3)))
    return out


def pooled_load(profiles: Sequence[TimingProfile]) -> LoadCheck | None:
    """The load passes of engines run at once, their steps together: the first's plan, the
    steps and times summed, in all and by class (the factors of the sums). None unless every
    profile has one."""
    checks = [p.load for p in profiles if p.load is not None]
    if not checks or len(checks) < len(profiles):
        return None
    return replace(
        checks[0],
        num_steps=sum(c.num_steps for c in checks),
        measured_s=sum(c.measured_s for c in checks),
        modeled_s=sum(c.modeled_s for c in checks),
        prompt_measured_s=sum(c.prompt_measured_s for c in checks),
        prompt_modeled_s=sum(c.prompt_modeled_s for c in checks),
        decode_measured_s=sum(c.decode_measured_s for c in checks),
        decode_modeled_s=sum(c.decode_modeled_s for c in checks),
    )


def median_profile(profiles: Sequence[TimingProfile]) -> TimingProfile:
    """Profiles of the same sweep made by engines at once: the first's source (with how
    many engines) and limits, each point the median of theirs, their load passes pooled."""
    first = profiles[0]
    return replace(
        first,
        source=replace(first.source, engines_at_once=len(profiles)),
        prefill=median_prefill_points([p.prefill for p in profiles]),
        decode=median_decode_points([p.decode for p in profiles]),
        load=pooled_load(profiles),
    )
