"""StepRecords for a vLLM engine. Pure: vLLM's per-step stats come in as plain numbers.

After every engine step vLLM hands its stat loggers the scheduler's stats (running and waiting
requests, KV usage, the prefix-cache hits of the requests it newly scheduled) and the step's
iteration stats (the prompt length of each request whose first token the step produced, one
inter-token latency for each other request that got a token). vLLM does not say how it split
a batch, so a StepRecord's fields are mapped like this:

    num_scheduled_prefill_requests  requests whose first token came out of this step
    num_scheduled_prefill_tokens    their prompt tokens less the step's prefix-cache hits (a
                                    prompt chunked over several steps counts in its last one;
                                    a recompute after preemption is not seen)
    num_queued_prefill_requests     vLLM's waiting requests (bounded as in the adapter's load)
    num_queued_prefill_tokens       the adapter's own count: prompt tokens of the requests
                                    whose first token has not reached it yet
    num_decode_requests             requests that got a token after their first
    num_decode_kv_tokens            0: vLLM does not report context lengths
    num_kv_tokens_used              vLLM's KV usage x the engine's blocks x block size
    step_wall_s                     the shortest inter-token latency of the step, i.e. the
                                    time since the previous step's outputs; 0 with no decode
    num_prefill_context_pairs       0: vLLM does not say where a chunk starts
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from armature.protocols.engine import EngineLoad, StepRecord

__all__ = ["IterationSnapshot", "read_iteration", "to_step_record"]


@dataclass(frozen=True)
class IterationSnapshot:
    """The part of one vLLM step's stats a StepRecord needs (all 0: nothing reported)."""

    num_first_tokens: int = 0  # requests whose prefill ended in this step
    num_first_token_prompt_tokens: int = 0  # their prompt tokens, cached ones included
    num_prefix_hit_tokens: int = 0  # prefix-cache hits of the requests scheduled this step
    num_decode_outputs: int = 0  # requests that got a token after their first
    min_inter_token_latency_s: float = 0.0  # 0 when num_decode_outputs is 0


def read_iteration(scheduler_stats: Any, iteration_stats: Any) -> IterationSnapshot:
    """The numbers from vLLM's SchedulerStats and IterationStats (duck-typed: neither is a
    stable API; a missing attribute reads as nothing reported)."""
    prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
    latencies = list(getattr(iteration_stats, "inter_token_latencies_iter", None) or ())
    return IterationSnapshot(
        num_first_tokens=len(getattr(iteration_stats, "time_to_first_tokens_iter", None) or ()),
        num_first_token_prompt_tokens=int(getattr(iteration_stats, "num_prompt_tokens", 0)),
        num_prefix_hit_tokens=int(getattr(prefix, "hits", 0)),
        num_decode_outputs=len(latencies),
        min_inter_token_latency_s=float(min(latencies, default=0.0)),
    )


def to_step_record(iteration: IterationSnapshot, load: EngineLoad, block_size: int) -> StepRecord:
    """One step's record from its iteration numbers and the engine's load right after it."""
    return StepRecord(
        num_scheduled_prefill_requests=iteration.num_first_tokens,
        num_scheduled_prefill_tokens=max(
            0, iteration.num_first_token_prompt_tokens - iteration.num_prefix_hit_tokens
        ),
        num_queued_prefill_requests=load.num_waiting,
        num_queued_prefill_tokens=load.num_prefill_tokens_queued,
        num_decode_requests=iteration.num_decode_outputs,
        num_decode_kv_tokens=0,
        num_kv_tokens_used=load.num_active_blocks * block_size,
        step_wall_s=iteration.min_inter_token_latency_s,
    )
