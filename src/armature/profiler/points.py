"""A sweep point's request timings -> one profile point: pure.

`RequestTimes` holds when a request was submitted and when each of its outputs arrived with
how many tokens (an engine may hand a slow consumer several tokens at once: each of them is
given an equal share of the gap since the previous output).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from armature.protocols.timing_profile import DecodePoint, PrefillPoint
from armature.workload.measure import quantile

__all__ = ["RequestTimes", "decode_point", "prefill_alone_point", "prefill_batch_point"]


@dataclass(frozen=True)
class RequestTimes:
    submitted_s: float
    outputs: tuple[tuple[float, int], ...]  # (arrival time, tokens), oldest first

    @property
    def ttft_s(self) -> float:
        return self.outputs[0][0] - self.submitted_s

    def get_itls_s(self) -> list[float]:
        """One inter-token latency per token after the first."""
        itls: list[float] = []
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
    """Requests decoding together: the median of the ITLs `skip` .. `skip + count` of each."""
    itls_s = [x for t in times for x in t.get_itls_s()[skip : skip + count]]
    median_s = quantile(itls_s, 0.5)
    return DecodePoint(
        num_requests=len(times),
        context_tokens=context_tokens,
        itl_ms=median_s * 1e3,
        tokens_per_s=len(times) / median_s,
    )
