"""What the planner needs to know about one worker's speed (`PerformanceModel`). The planner
core depends on nothing else about it; `timing_performance.TimingPerformanceModel` answers it
from a step-time model (a profile from `armature profile`, or the mocker's default)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["PerformanceModel"]


class PerformanceModel(Protocol):
    """One worker's speed, as profiled. Times are uncorrected: the planner multiplies them by
    its correction factors (observed / predicted step time)."""

    def get_prefill_s(self, num_tokens: float) -> float:
        """Seconds to prefill `num_tokens` new prompt tokens of one request (batch 1)."""
        ...

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        """Seconds of one decode step for `num_requests` requests that each attend over
        `context_tokens` tokens (the step's ITL)."""
        ...

    def get_max_decode_requests(self, context_tokens: float) -> int:
        """The most requests of `context_tokens` tokens one worker decodes at once (its KV
        cache and batch limits); at least 1."""
        ...
