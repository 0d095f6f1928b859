"""Conditional disaggregation: prefill a prompt on a prefill worker (remote) or where it is
decoded (local). Written once; the frontend's `DisaggRouter` and the simulator's
`DisaggSimulation` both ask `decide_prefill`. Pure: numbers in, a decision out.

    no live prefill worker ----------------------------------------> LOCAL_NO_PREFILL_WORKER
    enforce_disagg ------------------------------------------------> REMOTE_ENFORCED
    prompt - cached prefix < max_local_prefill_tokens -------------> LOCAL_SHORT_PREFILL
    every prefill worker has >= max_prefill_queue_tokens in flight -> LOCAL_PREFILL_SATURATED
    otherwise -----------------------------------------------------> REMOTE

The cached prefix is the decode pool's best (in whole blocks); it is asked for lazily, only
when the prompt's uncached length matters, so that aggregated serving (no prefill worker) and
enforced disaggregation never hash the prompt here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from armature.config import DisaggConfig

__all__ = ["PrefillDecision", "decide_prefill"]


class PrefillDecision(enum.Enum):
    """Where a prompt is prefilled, and why."""

    LOCAL_NO_PREFILL_WORKER = "local: no live prefill worker"
    LOCAL_SHORT_PREFILL = "local: uncached part shorter than max_local_prefill_tokens"
    LOCAL_PREFILL_SATURATED = "local: every prefill worker has max_prefill_queue_tokens queued"
    REMOTE_ENFORCED = "remote: disaggregation is enforced"
    REMOTE = "remote"

    @property
    def is_remote(self) -> bool:
        return self in (PrefillDecision.REMOTE, PrefillDecision.REMOTE_ENFORCED)


def decide_prefill(
    *,
    num_prompt_tokens: int,
    get_num_cached_blocks: Callable[[], int],
    block_size: int,
    prefill_queue_tokens: Sequence[int],
    config: DisaggConfig,
) -> PrefillDecision:
    """Where to prefill a prompt of `num_prompt_tokens`. `get_num_cached_blocks` gives the
    decode pool's best cached prefix in blocks (called at most once); `prefill_queue_tokens`
    holds, for each live prefill worker, the prompt tokens in flight on it (0 when idle)."""
    if not prefill_queue_tokens:
        return PrefillDecision.LOCAL_NO_PREFILL_WORKER
    if config.enforce_disagg:
        return PrefillDecision.REMOTE_ENFORCED
    num_uncached_tokens = num_prompt_tokens - get_num_cached_blocks() * block_size
    if num_uncached_tokens < config.max_local_prefill_tokens:
        return PrefillDecision.LOCAL_SHORT_PREFILL
    limit = config.max_prefill_queue_tokens
    if all(num_tokens >= limit for num_tokens in prefill_queue_tokens):
        return PrefillDecision.LOCAL_PREFILL_SATURATED
    return PrefillDecision.REMOTE
