"""What `armature profile` measures: the sweep over input lengths (prefill) and over running
requests and context lengths (decode)."""

from __future__ import annotations

from dataclasses import dataclass

from armature.config.settings import setting
from armature.config.values import (
    int64,
    non_negative_int,
    positive_int,
    positive_ints,
    positive_ints_or_none,
)

__all__ = ["ProfileSweepConfig"]


@dataclass(frozen=True, kw_only=True)
class ProfileSweepConfig:
    """The profiler's sweep: every combination it measures, each on fresh random prompts."""

    prefill_input_tokens: tuple[int, ...] = setting(
        (64, 256, 1024),
        "prefill: input lengths to time, comma list (the timing model uses those within "
        "--max-num-batched-tokens)",
        parse=positive_ints,
    )
    prefill_repeats: int = setting(
        3,
        "prefill: prompts timed alone at each input length (the median is kept)",
        parse=positive_int,
    )
    prefill_batch_requests: int = setting(
        4,
        "prefill: prompts submitted together at each input length, for chunked batches (0: none)",
        parse=non_negative_int,
    )
    prefill_context_tokens: tuple[int, ...] = setting(
        (256,),
        "prefill: cached prompt lengths to time prefills after, comma list (each input length "
        "within --max-num-batched-tokens is timed again after that many tokens of its prompt "
        "were cached, rounded down to whole blocks: the attention a prefix-cache hit or a "
        "later chunk pays over earlier context); 0: none",
        parse=positive_ints_or_none,
    )
    decode_requests: tuple[int, ...] = setting(
        (1, 4, 16, 64),
        "decode: running requests to time, comma list (at most --max-num-seqs)",
        parse=positive_ints,
    )
    decode_context_tokens: tuple[int, ...] = setting(
        (128, 512),
        "decode: prompt lengths to decode after, comma list (prompts are cached first, so "
        "no prefill is mixed in)",
        parse=positive_ints,
    )
    decode_output_tokens: int = setting(
        16, "decode: inter-token latencies timed per request", parse=positive_int
    )
    passes: int = setting(
        1,
        "sweep every point this many times, one whole sweep after another, and keep each "
        "point's median over them: steadier on a machine whose speed moves for seconds at a "
        "time (a point measured once catches whatever spell it lands in)",
        flag="sweep-passes",
        parse=positive_int,
    )
    load_requests: int = setting(
        0,
        "after the sweep, serve this many Poisson arrivals of mixed lengths at 70% of the "
        "engine's capacity by the sweep's tables, and keep its steps' wall time over the "
        "tables', prompt steps and decode steps apart: the mocker scales prompt steps by "
        "the first over the second (batches as a loaded server forms them); 0: no load pass",
        parse=non_negative_int,
    )
    prompt_seed: int = setting(0, "seed for the random prompts", parse=int64)
