"""A `PerformanceModel` read off a step-time model (`sim.timing.TimingModel`): the mocker's
default model, or a profile of a real engine (`sim.profile_timing.ProfileTiming`). The planner
then sizes a fleet by the same step times the mocker runs on, or the profiled engine measured.

    prefill_s(n)        n tokens in chunks of the step budget, one prefill-only step each,
                        the KV filling as the chunks land
    prefill_step_s(n,q) one prefill-only step of n tokens over q context pairs (a step record)
    decode_step_s(b, c) one decode-only step of b requests over c tokens each; their KV takes
                        b x ceil(c / block) blocks of the pool (the utilization a model by
                        utilization reads)
    max_decode(c)       as many requests as the pool holds at c tokens each, at most
                        max_num_seqs, at least 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from armature.sim.timing import StepWork, TimingModel

__all__ = ["TimingPerformanceModel"]


@dataclass(frozen=True)
class TimingPerformanceModel:
    """One worker of `num_kv_blocks` blocks of `block_size` tokens, stepping at most
    `max_num_batched_tokens` tokens and `max_num_seqs` requests, timed by `timing`."""

    timing: TimingModel
    block_size: int
    num_kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def _utilization(self, num_tokens: float) -> float:
        return min(1.0, math.ceil(num_tokens / self.block_size) / self.num_kv_blocks)

    def get_prefill_s(self, num_tokens: float) -> float:
        total_ms = 0.0
        done = 0
        remaining = max(0, math.ceil(num_tokens))
        while remaining > 0:
            chunk = min(remaining, self.max_num_batched_tokens)
            work = StepWork(
                num_prefill_tokens=chunk,
                num_decode_requests=0,
                kv_utilization=self._utilization(done + chunk),
                num_prefill_context_pairs=done * chunk,  # over the earlier chunks
            )
            total_ms += self.timing.step_ms(work)
            done += chunk
            remaining -= chunk
        return total_ms / 1000.0

    def get_prefill_step_s(self, num_tokens: int, num_context_pairs: int) -> float:
        work = StepWork(
            num_prefill_tokens=num_tokens,
            num_decode_requests=0,
            kv_utilization=self._utilization(num_tokens),
            num_prefill_context_pairs=num_context_pairs,
        )
        return self.timing.step_ms(work) / 1000.0

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        num_requests = max(1, num_requests)
        context = max(1.0, context_tokens)
        blocks = num_requests * math.ceil(context / self.block_size)
        work = StepWork(
            num_prefill_tokens=0,
            num_decode_requests=num_requests,
            kv_utilization=min(1.0, blocks / self.num_kv_blocks),
            num_decode_kv_tokens=round(num_requests * context),
        )
        return self.timing.step_ms(work) / 1000.0

    def get_max_decode_requests(self, context_tokens: float) -> int:
        per_request = math.ceil(max(1.0, context_tokens) / self.block_size)
        return max(1, min(self.max_num_seqs, self.num_kv_blocks // per_request))
