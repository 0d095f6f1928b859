"""The KV-aware routing cost (DESIGN §3), lower is better:

    prefill_blocks_w = (isl - overlap_w * block_size + active_prefill_tokens_w) / block_size
    decode_blocks_w  = decode_weight * active_blocks_w + (ceil(isl / block_size) - overlap_w)
    logit_w          = overlap_weight * prefill_blocks_w + decode_blocks_w

Tier-aware, overlap_w is the weighted overlap: a matched block in a lower tier counts as a
fraction of a device block (`tier_weights`), in both terms. Tier-blind it is the device
overlap, DESIGN's formula.

decode_weight 1 is DESIGN's baseline. Below 1 the blocks a worker already holds for running
requests count less against it: with long prompts and a large cache that is what lets a
repeat prefix go back to its worker. The default cost (RouterConfig: decode weight 0.5,
temperature 0.02, with bounded shares at 1.05) was chosen on the first halves of the two
Mooncake traces and checked on their second halves (docs/benchmarks.md, replay_balance): more
prefix hits than the baseline at a lower load skew.

Temperature 0 takes the argmin (ties: the worker caching the fewest blocks in total, then
random); above 0 it samples softmax(-normalized / temperature) over logits normalized to [0, 1]
by their range. Pure. This is the router's hot path, once a request over every worker (256 in
the large replays): `choose` runs the whole choice (the share cap, the logits, the fair
near-ties and the draw) in one C call over arrays (`armature.router._index.choose`: the same
float operations in the same order as `choose_py`, its reference and the fallback where the
extension was not built), reading each worker's load (a `WorkerLoad` tuple) by position.
"""

from __future__ import annotations

import math
import random
from bisect import bisect
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate

from armature.router.load import WorkerLoad

try:
    from armature.router import _index as _native
except ImportError:  # built without a C compiler
    _native = None  # type: ignore[assignment]

__all__ = [
    "bounded_workers",
    "break_ties",
    "choose",
    "choose_py",
    "cost_terms",
    "fair_ties_py",
    "may_spill",
    "softmax_pick_py",
    "within_capacity",
    "within_capacity_py",
    "worker_logits_py",
]

_IDLE = WorkerLoad()


def cost_terms(
    isl_tokens: int,
    block_size: int,
    overlap_blocks: float,
    load: WorkerLoad,
    decode_weight: float = 1.0,
) -> tuple[float, float]:
    """(prefill_blocks, decode_blocks) of one worker."""
    total_blocks = -(-isl_tokens // block_size)
    prefill = (isl_tokens - overlap_blocks * block_size + load.active_prefill_tokens) / block_size
    active = load.active_blocks if decode_weight == 1.0 else decode_weight * load.active_blocks
    return prefill, float(active + total_blocks - overlap_blocks)


def worker_logits_py(
    workers: Sequence[str],
    isl_tokens: int,
    block_size: int,
    overlaps: Mapping[str, float],
    loads: Mapping[str, WorkerLoad],
    overlap_weight: float = 1.0,
    decode_weight: float = 1.0,
) -> list[float]:
    """The logit of each of `workers`, in order. `loads` may leave out idle workers;
    `overlaps` (weighted or not) may leave out workers with none."""
    idle_prefill, idle_decode = cost_terms(isl_tokens, block_size, 0, _IDLE)
    idle_logit = overlap_weight * idle_prefill + idle_decode
    logits = [idle_logit] * len(workers)
    busy = overlaps.keys() | loads.keys() if loads else overlaps.keys()
    if not busy:
        return logits
    for i in [i for i, worker in enumerate(workers) if worker in busy]:
        worker = workers[i]
        overlap = overlaps.get(worker, 0)
        load = loads.get(worker)
        if load is None and overlap == 0:
            continue
        prefill, decode = cost_terms(isl_tokens, block_size, overlap, load or _IDLE, decode_weight)
        logits[i] = overlap_weight * prefill + decode
    return logits


def bounded_workers(
    workers: Sequence[str], loads: Mapping[str, WorkerLoad], load_bound: float
) -> list[int] | None:
    """Bounded loads: the indexes of `workers` that may take one more request when none may
    hold `load_bound` x the mean in-flight requests or more (counting the new one, rounded
    up: `ceil(load_bound * (total + 1) / len(workers))`); None when every worker may. Some
    worker always may (one at or below the mean is below the bound when `load_bound` > 1)."""
    if not loads:
        return None
    counts = [loads[w].num_requests if w in loads else 0 for w in workers]
    return within_capacity(counts, load_bound)


def within_capacity(counts: Sequence[int], bound: float) -> list[int] | None:
    """The indexes of `counts` below `ceil(bound * (sum + 1) / len(counts))` when some count is
    at it (the rule of bounded loads and bounded shares); None when none is."""
    if _native is not None:
        return _native.within_capacity(counts, bound)
    return within_capacity_py(counts, bound)


def within_capacity_py(counts: Sequence[int], bound: float) -> list[int] | None:
    """`within_capacity` in Python: the reference of the native one."""
    capacity = math.ceil(bound * (sum(counts) + 1) / len(counts))
    if max(counts, default=0) < capacity:
        return None
    return [i for i, count in enumerate(counts) if count < capacity] or None


def fair_ties_py(
    logits: Sequence[float], counts: Sequence[int], temperature: float
) -> list[int] | None:
    """Bounded shares' fair near-ties: when some worker is at its fair share of the window
    (`counts` at a bound of 1), the indexes of the workers within `temperature` x the logits'
    range of the cheapest (exact ties at temperature 0) that are below it; None when no
    worker is at it or no such tie is below it."""
    if len(logits) != len(counts):
        raise ValueError("logits and counts differ in length")
    fair = within_capacity_py(counts, 1.0)
    if fair is None:
        return None
    low = min(logits)
    near = low + temperature * (max(logits) - low)
    below = set(fair)
    return [i for i, logit in enumerate(logits) if logit <= near and i in below] or None


def choose_py(
    workers: Sequence[str],
    isl_tokens: int,
    block_size: int,
    overlaps: Mapping[str, float],
    loads: Mapping[str, WorkerLoad],
    overlap_weight: float,
    decode_weight: float,
    counts: Sequence[int] | None,
    share_bound: float,
    temperature: float,
    u: float,
) -> int | list[int]:
    """The kv policy's choice among `workers`, in Python: the reference of the native one.

    With `counts` (the workers' shares of the window, bounded shares), first the share cap:
    the workers below their capacity at `share_bound` when some is at it, where the cap may
    spill (`may_spill`); then the cost's logits (`worker_logits_py`) and, with counts, the
    fair near-ties (`fair_ties_py`). At temperature > 0 the index of `workers` that `u` (one
    random() in [0, 1)) draws from the softmax (`softmax_pick_py`); at 0 the indexes of the
    cheapest, in order, whose ties the caller breaks (`break_ties`)."""
    if not workers:
        raise ValueError("no workers to choose from")
    kept = list(range(len(workers)))
    if counts is not None:
        if len(counts) != len(workers):
            raise ValueError("workers and counts differ in length")
        allowed = within_capacity_py(counts, share_bound)
        if allowed and may_spill(loads, workers, allowed):
            kept = allowed
        counts = [counts[i] for i in kept]
    names = [workers[i] for i in kept]
    logits = worker_logits_py(
        names, isl_tokens, block_size, overlaps, loads, overlap_weight, decode_weight
    )
    if counts is not None:
        ties = fair_ties_py(logits, counts, temperature)
        if ties is not None:
            kept = [kept[i] for i in ties]
            logits = [logits[i] for i in ties]
    if temperature > 0:
        return kept[softmax_pick_py(logits, temperature, u)]
    best = min(logits)
    first = logits.index(best)  # with a NaN there, the only one
    return [
        i
        for j, (i, logit) in enumerate(zip(kept, logits, strict=True))
        if logit == best or j == first
    ]


# the kv policy's choice among workers (see `choose_py`), in C where it was built
choose = _native.choose if _native is not None else choose_py


def may_spill(loads: Mapping[str, WorkerLoad], workers: Sequence[str], kept: list[int]) -> bool:
    """Whether the share cap leaves its workers out: only when a worker it keeps has nothing
    in flight (the request it moves starts at once) and some worker has something. With
    every worker busy, a request moved off its prefix's worker recomputes the prefix behind
    a queue, so the cost (queues and cache) decides; with the whole fleet idle it delays
    nobody anywhere, so a lone client's turns stay where their prefix is."""
    if not loads:  # nothing in flight anywhere
        return False
    return any(_idle(loads, workers[i]) for i in kept) and not all(_idle(loads, w) for w in workers)


def _idle(loads: Mapping[str, WorkerLoad], worker: str) -> bool:
    load = loads.get(worker)
    return load is None or load.num_requests == 0


def break_ties(tied: Sequence[int], cached_blocks: Callable[[int], int], rng: random.Random) -> int:
    """One of `tied` (indexes, at least one): the one caching the fewest blocks in total
    (`cached_blocks(i)`), then at random."""
    if len(tied) == 1:
        return tied[0]
    counts = [cached_blocks(i) for i in tied]
    fewest = min(counts)
    tied = [i for i, count in zip(tied, counts, strict=True) if count == fewest]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def softmax_pick_py(logits: Sequence[float], temperature: float, u: float) -> int:
    """The index drawn from softmax(-normalized / temperature) by `u` in [0, 1): what
    rng.choices(range(n), weights) draws with u = rng.random(), without its population and
    argument handling."""
    low = min(logits)
    span = max(logits) - low
    if span > 0:
        exp = math.exp
        weights = [exp(-((logit - low) / span) / temperature) for logit in logits]
    else:
        weights = [1.0] * len(logits)
    cumulative = list(accumulate(weights))
    return bisect(cumulative, u * (cumulative[-1] + 0.0), 0, len(logits) - 1)
