"""Which embedding worker takes a request. Pure.

Embedding workers hold no KV cache, so no prefix can be reused and the only cost is queueing:
the worker with the fewest prompt tokens in flight from this router wins (the freshest view),
then the one that reports the fewest tokens queued (other frontends' traffic included), then
the first by name (deterministic).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "MAX_PROMPTS_PER_LEG",
    "MAX_TOKENS_PER_LEG",
    "pick_embed_worker",
    "split_prompts",
]

# one request's prompts go to workers in legs of at most this many prompts and tokens (at
# least one prompt): a large request spreads over the pool, and a leg's vectors stay far
# below the request plane's frame limit (64 x 8192 float32 dimensions = 2 MiB)
MAX_PROMPTS_PER_LEG = 64
MAX_TOKENS_PER_LEG = 32768


def pick_embed_worker(in_flight_tokens: Mapping[str, int], queued_tokens: Mapping[str, int]) -> str:
    """The worker of `in_flight_tokens` (not empty) to send the next request to; a worker
    missing from `queued_tokens` reports nothing queued."""
    assert in_flight_tokens, "no embedding worker to pick from"
    return min(
        sorted(in_flight_tokens), key=lambda w: (in_flight_tokens[w], queued_tokens.get(w, 0))
    )


def split_prompts(
    prompts: list[list[int]],
    max_prompts: int = MAX_PROMPTS_PER_LEG,
    max_tokens: int = MAX_TOKENS_PER_LEG,
) -> list[list[list[int]]]:
    """`prompts` in order, cut into consecutive legs of at most `max_prompts` prompts and
    `max_tokens` tokens (a prompt longer than that goes alone)."""
    legs: list[list[list[int]]] = []
    leg: list[list[int]] = []
    num_tokens = 0
    for prompt in prompts:
        if leg and (len(leg) >= max_prompts or num_tokens + len(prompt) > max_tokens):
            legs.append(leg)
            leg, num_tokens = [], 0
        leg.append(prompt)
        num_tokens += len(prompt)
    if leg:
        legs.append(leg)
    return legs
