"""Requests waiting for KV blocks to come back from lower tiers (onboarding).

When the scheduler is about to admit a request whose prompt continues, past its G1 prefix, in
lower tiers, `try_start` holds the G1 prefix, allocates fresh G1 blocks for the tier hits and
hands them to the tier manager's loaders; the request leaves the waiting queue meanwhile, so
others keep stepping. `take_ready` caches the blocks that loaded and hands each request back
holding its prefix (`held_block_ids`, as an imported KV transfer does): admitted next, it finds
the whole prefix in G1 and computes only the rest. A refused block ends the loaded prefix
there; the rest is computed. An aborted request's blocks are freed once its load is done.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from armature.engines.native.request import RequestState
from armature.kv.block_pool import BlockPool
from armature.kv.tier_policy import TierHit
from armature.tiers.api import KvTiers

__all__ = ["OnboardStart", "Onboarding"]


class OnboardStart(enum.Enum):
    STARTED = "started"  # the request now waits for its loads
    NONE = "none"  # nothing to load (or no room): compute as usual
    WAIT = "wait"  # loads are full; try again once some finish


@dataclass
class _Job:
    request: RequestState
    prefix_ids: list[int]  # the G1 prefix it holds meanwhile
    new_ids: list[int]  # G1 blocks the loads fill, in prompt order
    hits: list[TierHit]
    cancelled: bool = False


class Onboarding:
    """Engine thread only."""

    def __init__(self, pool: BlockPool, tiers: KvTiers):
        self.pool = pool
        self.tiers = tiers
        self._jobs: dict[int, _Job] = {}
        self._by_request: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def get_num_waiting(self) -> int:
        """Requests waiting for their loads (not those aborted meanwhile)."""
        return sum(1 for job in self._jobs.values() if not job.cancelled)

    def get_num_tokens_to_compute(self) -> int:
        """The prompt tokens the waiting requests compute once their loads are done (if
        every block loads)."""
        bs = self.pool.block_size
        return sum(
            job.request.num_tokens - (len(job.prefix_ids) + len(job.hits)) * bs
            for job in self._jobs.values()
            if not job.cancelled
        )

    def try_start(self, request: RequestState, cached_ids: list[int]) -> OnboardStart:
        """Start loading what lower tiers hold of `request`'s uncached prompt blocks (its block
        hashes are computed). At least the last token is left to compute."""
        max_blocks = (request.num_tokens - 1) // self.pool.block_size
        rest = [h for h, _ in request.block_hashes[len(cached_ids) : max_blocks]]
        hits = self.tiers.find(rest) if rest else []
        if not hits:
            self.tiers.count_lookup(len(rest), hits)
            return OnboardStart.NONE
        if not self.tiers.can_load(len(hits)):
            return OnboardStart.WAIT  # looked up again next step: counted when decided
        num_cached_free = self.pool.get_num_unreferenced(cached_ids)
        if len(hits) + num_cached_free > self.pool.get_num_free_blocks():
            if self.pool.get_num_active_blocks() > 0:
                return OnboardStart.WAIT
            self.tiers.count_lookup(len(rest), hits)
            return OnboardStart.NONE
        self.tiers.count_lookup(len(rest), hits)
        self.tiers.reserve(hits)
        self.pool.touch(cached_ids)
        new_ids = self.pool.allocate(len(hits))
        job_id = self.tiers.submit(hits, new_ids)
        self._jobs[job_id] = _Job(request, list(cached_ids), new_ids, hits)
        self._by_request[request.request_id] = job_id
        return OnboardStart.STARTED

    def cancel(self, request: RequestState) -> None:
        """`request` was aborted while loading: its blocks go once the load is done."""
        self._jobs[self._by_request[request.request_id]].cancelled = True

    def take_ready(self) -> list[RequestState]:
        """Requests whose loads finished, holding their prefix in G1, oldest first."""
        ready: list[RequestState] = []
        for result in self.tiers.take_finished():
            job = self._jobs.pop(result.job_id)
            del self._by_request[job.request.request_id]
            num_loaded = result.num_loaded
            loaded_ids = job.new_ids[:num_loaded]
            if loaded_ids:
                start = len(job.prefix_ids)
                hashes = job.request.block_hashes[start : start + num_loaded]
                parent = job.request.block_hashes[start - 1][0] if start else None
                self.pool.cache_blocks(loaded_ids, hashes, parent)
            self.pool.free(list(reversed(job.new_ids[num_loaded:])))
            held = job.prefix_ids + loaded_ids
            if job.cancelled:
                self.pool.free(list(reversed(held)))
                continue
            if job.request.held_block_ids:  # imported blocks it held while it waited
                self.pool.free(list(reversed(job.request.held_block_ids)))
            job.request.held_block_ids = held
            ready.append(job.request)
        return ready
