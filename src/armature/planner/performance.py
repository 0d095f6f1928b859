"""What the planner needs to know about one worker's speed (`PerformanceModel`). The planner
core depends on nothing else about it; `timing_performance.TimingPerformanceModel` answers it
from a step-time model (a profile from `armature profile`, or the mocker's default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["KvHeadroom", "PerformanceModel", "RoleModels"]


class PerformanceModel(Protocol):
    """One worker's speed, as profiled. Times are uncorrected: the planner multiplies them by
    its correction factors (observed / predicted step time)."""

    def get_prefill_s(self, num_tokens: float) -> float:
        """Seconds to prefill `num_tokens` new prompt tokens of one request (batch 1)."""
        ...

    def get_prefill_step_s(self, num_tokens: int, num_context_pairs: int) -> float:
        """Seconds of one prefill-only step of `num_tokens` new tokens (within the step
        budget) that also attend over `num_context_pairs` (new token, earlier token) pairs
        of context: a prefix hit's or earlier chunks' (`StepRecord.num_prefill_context_pairs`)."""
        ...

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        """Seconds of one decode step for `num_requests` requests that each attend over
        `context_tokens` tokens (the step's ITL)."""
        ...

    def get_max_decode_requests(self, context_tokens: float) -> int:
        """The most requests of `context_tokens` tokens one worker decodes at once (its KV
        cache and batch limits); at least 1."""
        ...


@dataclass(frozen=True)
class KvHeadroom:
    """`model` with decode batches that fill only `kv_share` of the KV cache: a request counts
    as 1 / kv_share of its context. The rest is left for contexts longer than the mean and for
    bursts: a full cache preempts, and a preempted request computes its whole prompt again on
    the worker that decodes it, a long step for every request decoding beside it."""

    model: PerformanceModel
    kv_share: float

    def __post_init__(self) -> None:
        if not 0.0 < self.kv_share <= 1.0:
            raise ValueError(f"kv_share must be in (0, 1], got {self.kv_share}")

    def get_prefill_s(self, num_tokens: float) -> float:
        return self.model.get_prefill_s(num_tokens)

    def get_prefill_step_s(self, num_tokens: int, num_context_pairs: int) -> float:
        return self.model.get_prefill_step_s(num_tokens, num_context_pairs)

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        return self.model.get_decode_step_s(num_requests, context_tokens)

    def get_max_decode_requests(self, context_tokens: float) -> int:
        return self.model.get_max_decode_requests(context_tokens / self.kv_share)


@dataclass(frozen=True)
class RoleModels:
    """Disaggregated workers of two speeds: prefill times from `prefill` (the prefill
    workers' profile), decode times and batches from `decode`."""

    prefill: PerformanceModel
    decode: PerformanceModel

    def get_prefill_s(self, num_tokens: float) -> float:
        return self.prefill.get_prefill_s(num_tokens)

    def get_prefill_step_s(self, num_tokens: int, num_context_pairs: int) -> float:
        return self.prefill.get_prefill_step_s(num_tokens, num_context_pairs)

    def get_decode_step_s(self, num_requests: int, context_tokens: float) -> float:
        return self.decode.get_decode_step_s(num_requests, context_tokens)

    def get_max_decode_requests(self, context_tokens: float) -> int:
        return self.decode.get_max_decode_requests(context_tokens)
