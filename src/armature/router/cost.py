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
by their range. Pure. This is the router's hot path (64 workers per decision): logits are
plain floats, idle workers without an overlap share one precomputed logit, cached-block
counts are asked for tied workers only, and the logits, bounded shares' capacities and fair
near-ties, and the softmax draw run in C (`armature.router._index`: the same float operations
in the same order as `worker_logits_py`, `within_capacity_py`, `fair_ties_py` and
`softmax_pick_py`, their references and the fallback where the extension was not built).
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
    "cost_terms",
    "fair_ties",
    "fair_ties_py",
    "select_worker",
    "softmax_pick_py",
    "within_capacity",
    "within_capacity_py",
    "worker_logits",
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


def worker_logits(
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
    if _native is not None:
        return _native.worker_logits(
            workers, isl_tokens, block_size, overlaps, loads, overlap_weight, decode_weight
        )
    return worker_logits_py(
        workers, isl_tokens, block_size, overlaps, loads, overlap_weight, decode_weight
    )


def worker_logits_py(
    workers: Sequence[str],
    isl_tokens: int,
    block_size: int,
    overlaps: Mapping[str, float],
    loads: Mapping[str, WorkerLoad],
    overlap_weight: float = 1.0,
    decode_weight: float = 1.0,
) -> list[float]:
    """`worker_logits` in Python: the reference of the native one."""
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


def fair_ties(
    logits: Sequence[float], counts: Sequence[int], temperature: float
) -> list[int] | None:
    """Bounded shares' fair near-ties: when some worker is at its fair share of the window
    (`counts` at a bound of 1), the indexes of the workers within `temperature` x the logits'
    range of the cheapest (exact ties at temperature 0) that are below it; None when no
    worker is at it or no such tie is below it."""
    if _native is not None:
        return _native.fair_ties(logits, counts, temperature)
    return fair_ties_py(logits, counts, temperature)


def fair_ties_py(
    logits: Sequence[float], counts: Sequence[int], temperature: float
) -> list[int] | None:
    """`fair_ties` in Python: the reference of the native one."""
    if len(logits) != len(counts):
        raise ValueError("logits and counts differ in length")
    fair = within_capacity_py(counts, 1.0)
    if fair is None:
        return None
    low = min(logits)
    near = low + temperature * (max(logits) - low)
    below = set(fair)
    return [i for i, logit in enumerate(logits) if logit <= near and i in below] or None


def select_worker(
    logits: Sequence[float],
    cached_blocks: Callable[[int], int],
    temperature: float,
    rng: random.Random,
) -> int:
    """The index of the chosen worker; `cached_blocks(i)` (worker i's total) breaks exact
    ties at temperature 0."""
    if not logits:
        raise ValueError("no workers to choose from")
    if temperature <= 0:
        best = min(logits)
        if logits.count(best) == 1:
            return logits.index(best)
        tied = [i for i, logit in enumerate(logits) if logit == best]
        counts = [cached_blocks(i) for i in tied]
        fewest = min(counts)
        tied = [i for i, count in zip(tied, counts, strict=True) if count == fewest]
        return tied[0] if len(tied) == 1 else rng.choice(tied)
    if _native is not None:
        return _native.softmax_pick(logits, temperature, rng.random())
    return softmax_pick_py(logits, temperature, rng.random())


def softmax_pick_py(logits: Sequence[float], temperature: float, u: float) -> int:
    """The index drawn from softmax(-normalized / temperature) by `u` in [0, 1): what
    rng.choices(range(n), weights) draws with u = rng.random(), without its population and
    argument handling. The reference of the native draw."""
    low = min(logits)
    span = max(logits) - low
    if span > 0:
        exp = math.exp
        weights = [exp(-((logit - low) / span) / temperature) for logit in logits]
    else:
        weights = [1.0] * len(logits)
    cumulative = list(accumulate(weights))
    return bisect(cumulative, u * (cumulative[-1] + 0.0), 0, len(logits) - 1)
