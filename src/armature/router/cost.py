"""The KV-aware routing cost (DESIGN §3), lower is better:

    prefill_blocks_w = (isl - overlap_w * block_size + active_prefill_tokens_w) / block_size
    decode_blocks_w  = active_blocks_w + (ceil(isl / block_size) - overlap_w)
    logit_w          = overlap_weight * prefill_blocks_w + decode_blocks_w

Temperature 0 takes the argmin (ties: the worker caching the fewest blocks in total, then
random); above 0 it samples softmax(-normalized / temperature) over logits normalized to [0, 1]
by their range. Pure.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from armature.router.load import WorkerLoad

__all__ = ["WorkerScore", "score_workers", "select_worker"]


@dataclass(frozen=True)
class WorkerScore:
    worker: str
    overlap_blocks: int
    prefill_blocks: float
    decode_blocks: float
    logit: float


def score_workers(
    workers: Sequence[str],
    isl_tokens: int,
    block_size: int,
    overlaps: Mapping[str, int],
    loads: Mapping[str, WorkerLoad],
    overlap_weight: float = 1.0,
) -> list[WorkerScore]:
    total_blocks = -(-isl_tokens // block_size)
    scores = []
    for worker in workers:
        overlap = overlaps.get(worker, 0)
        load = loads.get(worker, WorkerLoad())
        prefill = (isl_tokens - overlap * block_size + load.active_prefill_tokens) / block_size
        decode = float(load.active_blocks + total_blocks - overlap)
        scores.append(
            WorkerScore(worker, overlap, prefill, decode, overlap_weight * prefill + decode)
        )
    return scores


def select_worker(
    scores: Sequence[WorkerScore],
    cached_blocks: Mapping[str, int],
    temperature: float,
    rng: random.Random,
) -> WorkerScore:
    """Pick a worker from `scores`; `cached_blocks` (total per worker) breaks exact ties."""
    if not scores:
        raise ValueError("no workers to choose from")
    if temperature <= 0:
        best = min(s.logit for s in scores)
        tied = [s for s in scores if s.logit == best]
        fewest = min(cached_blocks.get(s.worker, 0) for s in tied)
        tied = [s for s in tied if cached_blocks.get(s.worker, 0) == fewest]
        return tied[0] if len(tied) == 1 else rng.choice(tied)
    low = min(s.logit for s in scores)
    span = max(s.logit for s in scores) - low
    normalized = [(s.logit - low) / span if span > 0 else 0.0 for s in scores]
    weights = [math.exp(-n / temperature) for n in normalized]
    return rng.choices(list(scores), weights=weights, k=1)[0]
