"""Routing policies: which worker serves a request. Pure; the frontend's shell owns them.

round-robin   workers in turn
random        uniformly at random (seeded)
least-loaded  fewest active blocks, then fewest requests (from ActiveLoad)
kv            the DESIGN §3 cost over the prefix index's overlaps and ActiveLoad; tier-aware
              (lower-tier blocks count at their weight, `tier_weights`) or tier-blind
direct        the worker named by the request (header), for debugging and tests
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from armature.config.routing import DEFAULT_SHARE_WINDOW
from armature.errors import ArmatureError
from armature.kv.hashing import compute_seq_hashes, hash_seed_for_salt
from armature.router.cost import bounded_workers, break_ties, choose
from armature.router.index_backend import IndexBackend
from armature.router.load import ActiveLoad
from armature.router.prefix_index import PrefixIndex
from armature.router.routed_index import RoutedPrefixIndex, make_routed_index
from armature.router.shares import RecentShares
from armature.router.tier_weights import TierWeightBook

__all__ = [
    "POLICY_NAMES",
    "DirectPolicy",
    "KvPolicy",
    "LeastLoadedPolicy",
    "NoWorkerError",
    "RandomPolicy",
    "RoundRobinPolicy",
    "RouteDecision",
    "RouteRequest",
    "RoutingError",
    "RoutingPolicy",
    "make_policy",
]

POLICY_NAMES = ("round-robin", "random", "least-loaded", "kv", "kv-approx", "direct")


class RoutingError(ArmatureError, ValueError):
    """The request cannot be routed (no workers, unknown direct target)."""


class NoWorkerError(RoutingError):
    """No worker of a role the request needs is live: the fleet's state, not the request's
    fault (a 503 at the edge)."""


@dataclass(frozen=True)
class RouteRequest:
    request_id: str
    token_ids: Sequence[int]
    target_worker: str | None = None  # for the direct policy
    hash_salt: str | None = None  # its LoRA adapter's salt: its blocks' hashes are seeded by it
    # its full blocks' sequence hashes when the caller has them, made with the policy's block
    # size and the request's seed (the simulator hashes a prompt once for router and engine)
    seq_hashes: Sequence[int] | None = None


@dataclass(frozen=True)
class RouteDecision:
    worker: str
    overlap_blocks: int = 0  # leading prompt blocks the worker has in any tier: no prefill


class RoutingPolicy(Protocol):
    def select(self, request: RouteRequest, workers: Sequence[str]) -> RouteDecision: ...


def _require(workers: Sequence[str]) -> None:
    if not workers:
        raise NoWorkerError("no workers are available")


class RoundRobinPolicy:
    def __init__(self) -> None:
        self._counter = itertools.count()

    def select(self, request: RouteRequest, workers: Sequence[str]) -> RouteDecision:
        _require(workers)
        return RouteDecision(workers[next(self._counter) % len(workers)])


class RandomPolicy:
    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def select(self, request: RouteRequest, workers: Sequence[str]) -> RouteDecision:
        _require(workers)
        return RouteDecision(self._rng.choice(list(workers)))


class LeastLoadedPolicy:
    def __init__(self, load: ActiveLoad) -> None:
        self.load = load

    def select(self, request: RouteRequest, workers: Sequence[str]) -> RouteDecision:
        _require(workers)

        def key(worker: str) -> tuple[int, int, int]:
            w = self.load.get(worker)
            return (w.active_blocks, w.num_requests, workers.index(worker))

        return RouteDecision(min(workers, key=key))


class DirectPolicy:
    def select(self, request: RouteRequest, workers: Sequence[str]) -> RouteDecision:
        if request.target_worker is None:
            raise RoutingError("the direct router needs a target worker (x-worker-id header)")
        if request.target_worker not in workers:
            raise RoutingError(
                f"unknown worker {request.target_worker!r}; workers: {', '.join(workers)}"
            )
        return RouteDecision(request.target_worker)


class KvPolicy:
    """`index` (KV events) and `routed` (recent decisions) are each optional; a worker's
    overlap is the larger of the two (a routed prefix counts as device blocks). `clock` gives
    seconds for the routed entries' TTL. With `tier_weights` the index's lower-tier blocks
    count at each worker's weights (tier-aware); without, only device blocks count."""

    def __init__(
        self,
        index: PrefixIndex | None,
        load: ActiveLoad,
        block_size: int,
        hash_seed: int,
        overlap_weight: float = 1.0,
        temperature: float = 0.0,
        seed: int = 0,
        routed: RoutedPrefixIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
        decode_weight: float = 1.0,
        tier_weights: TierWeightBook | None = None,
        load_bound: float = 0.0,
        share_bound: float = 0.0,
        share_window: int = DEFAULT_SHARE_WINDOW,
    ) -> None:
        if index is None and routed is None:
            raise ValueError("the kv policy needs a prefix index, routed predictions or both")
        self.routed = routed
        self.clock = clock
        self.index = index
        self.load = load
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.overlap_weight = overlap_weight
        self.decode_weight = decode_weight
        self.temperature = temperature
        self.tier_weights = tier_weights
        _check_bound("load", load_bound)
        self.load_bound = load_bound
        _check_bound("share", share_bound)
        self.share_bound = share_bound
        self.shares = RecentShares(share_window) if share_bound > 0 else None
        self._rng = random.Random(seed)

    def select(self, request: RouteRequest, workers: Sequence[str]) -> RouteDecision:
        _require(workers)
        seed = (
            self.hash_seed if request.hash_salt is None else hash_seed_for_salt(request.hash_salt)
        )
        if self.routed is None and self.tier_weights is None:
            # events only, tier-blind: the index hashes the prompt as far as it matches
            assert self.index is not None
            if request.seq_hashes is not None:
                overlaps = self.index.find_overlaps(request.seq_hashes)
            else:
                overlaps = self.index.find_token_overlaps(request.token_ids, self.block_size, seed)
            return self._choose(request, workers, overlaps, overlaps)
        hashes = request.seq_hashes
        if hashes is None:
            hashes = compute_seq_hashes(request.token_ids, self.block_size, seed)
        now_s = self.clock()
        overlaps = {}  # matched blocks, any tier
        weighted: dict[str, float] | None = None  # tier-aware: overlaps at the tiers' weights
        if self.index is not None and self.tier_weights is not None:
            weights = self.tier_weights
            tiered = self.index.find_tier_overlaps(hashes)
            overlaps = {w: o.num_blocks for w, o in tiered.items()}
            weighted = {w: weights.get(w).weigh(o) for w, o in tiered.items()}
        elif self.index is not None:
            overlaps = self.index.find_overlaps(hashes)
        if self.routed is not None:
            # a routed prefix no deeper than what the index gives changes nothing below
            known = overlaps if weighted is None else {w: int(x) for w, x in weighted.items()}
            for worker, depth in self.routed.find_overlaps(hashes, now_s, known).items():
                overlaps[worker] = max(depth, overlaps.get(worker, 0))
                if weighted is not None:  # a routed prefix will be on the worker's device
                    weighted[worker] = max(depth, weighted.get(worker, 0.0))
        decision = self._choose(
            request, workers, overlaps, overlaps if weighted is None else weighted
        )
        if self.routed is not None:
            self.routed.record(decision.worker, hashes, now_s)
        return decision

    def _choose(
        self,
        request: RouteRequest,
        workers: Sequence[str],
        overlaps: Mapping[str, int],
        scored: Mapping[str, float],
    ) -> RouteDecision:
        """The cost over `scored` overlaps (tier-weighted where tier-aware), then the draw
        (with a load or share bound, among the workers within it)."""
        loads = self.load.get_loads()
        num_workers = len(workers)
        if self.load_bound > 0:
            allowed = bounded_workers(workers, loads, self.load_bound)
            if allowed is not None:
                workers = [workers[i] for i in allowed]
        shares = self.shares
        picked = choose(
            workers,
            len(request.token_ids),
            self.block_size,
            scored,
            loads,
            self.overlap_weight,
            self.decode_weight,
            None if shares is None else shares.get_counts(workers),
            self.share_bound,
            self.temperature,
            self._rng.random() if self.temperature > 0 else 0.0,
        )
        if isinstance(picked, int):
            chosen = workers[picked]
        else:
            index = self.index
            cached = (lambda i: index.get_num_worker_blocks(workers[i])) if index else _no_blocks
            chosen = workers[break_ties(picked, cached, self._rng)]
        if shares is not None:
            shares.record(chosen, num_workers)
        return RouteDecision(chosen, overlaps.get(chosen, 0))


def _check_bound(kind: str, bound: float) -> None:
    """ValueError unless a `kind` (load, share) bound is 0 (unbounded) or above 1."""
    if bound != 0 and not bound > 1:
        raise ValueError(f"the {kind} bound must be 0 (none) or above 1, got {bound:g}")


def _no_blocks(worker_index: int) -> int:
    return 0


def make_policy(
    name: str,
    *,
    index: PrefixIndex,
    load: ActiveLoad,
    block_size: int,
    hash_seed: int,
    overlap_weight: float,
    temperature: float,
    seed: int,
    routed_ttl_s: float,
    routed_max_entries: int,
    clock: Callable[[], float] = time.monotonic,
    decode_weight: float = 1.0,
    tier_weights: TierWeightBook | None = None,
    routed_backend: IndexBackend | None = None,
    load_bound: float = 0.0,
    share_bound: float = 0.0,
    share_window: int = DEFAULT_SHARE_WINDOW,
) -> RoutingPolicy:
    """The policy named `name` (one of POLICY_NAMES). kv uses `index` and routed predictions
    (none when `routed_ttl_s` is 0: KV events only); kv-approx only the predictions, bounded
    by `routed_max_entries`, in C or Python as `routed_backend` says (None: as
    `armature.router.index_backend` says). kv is tier-aware with `tier_weights`, tier-blind
    without; `load_bound` > 1 bounds each worker's in-flight requests (`cost.bounded_workers`;
    0: unbounded), `share_bound` > 1 its share of the last `share_window` x workers decisions
    (`shares.RecentShares`; 0: unbounded)."""
    match name:
        case "round-robin":
            return RoundRobinPolicy()
        case "random":
            return RandomPolicy(seed)
        case "least-loaded":
            return LeastLoadedPolicy(load)
        case "direct":
            return DirectPolicy()
        case "kv" | "kv-approx":
            return KvPolicy(
                index if name == "kv" else None,
                load,
                block_size,
                hash_seed,
                overlap_weight,
                temperature,
                seed,
                routed=(
                    make_routed_index(routed_ttl_s, max(1, routed_max_entries), routed_backend)
                    if routed_ttl_s > 0
                    else None
                ),
                clock=clock,
                decode_weight=decode_weight,
                tier_weights=tier_weights,
                load_bound=load_bound,
                share_bound=share_bound,
                share_window=share_window,
            )
    raise ValueError(f"unknown router policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
