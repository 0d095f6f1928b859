"""The tier-aware prefix walk behind `PrefixIndex.find_tier_overlaps`: how many leading blocks
of a prompt each worker can get, each counted once in the fastest tier the worker can load it
from. Pure: it reads the index's holder maps (`armature.router.prefix_index`), owns nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat, takewhile

__all__ = ["NO_HOLDERS", "HolderGet", "Holders", "TierOverlap", "WorkerId", "find_tier_overlaps"]

WorkerId = str
NO_HOLDERS: frozenset[WorkerId] = frozenset()
Holders = set[WorkerId] | frozenset[WorkerId]
# one tier's seq_hash -> holders map, read as its `get(seq_hash, NO_HOLDERS)`
HolderGet = Callable[[int, frozenset[WorkerId]], Holders]
_Classes = tuple[Holders, Holders, Holders, Holders]  # device, host, disk, external


@dataclass(frozen=True)
class TierOverlap:
    """One worker's matched prefix: its leading blocks, each counted once in the fastest tier
    the worker can load it from (a G4 block the worker lacks locally counts as external)."""

    num_device_blocks: int = 0
    num_host_blocks: int = 0
    num_disk_blocks: int = 0
    num_external_blocks: int = 0

    @property
    def num_blocks(self) -> int:
        return (
            self.num_device_blocks
            + self.num_host_blocks
            + self.num_disk_blocks
            + self.num_external_blocks
        )


def find_tier_overlaps(
    seq_hashes: Sequence[int],
    gets: tuple[HolderGet, HolderGet, HolderGet],
    external: Container[int],
    workers: Holders,
) -> dict[WorkerId, TierOverlap]:
    """For each worker that can get the first block from some tier: its matched prefix,
    the leading blocks of `seq_hashes` it holds in any tier (or that G4 holds), counted
    by the fastest tier (workers matching none are absent).

    The walk sorts the still-matching workers into classes by the tier a block comes
    from (device, host, disk, external) and runs at C speed while every class keeps its
    workers (`_run_length`); Python only runs where a worker changes class or drops out."""
    num_blocks = len(seq_hashes)
    get_device, get_host, get_disk = gets
    active: Holders = workers
    num_lower: dict[WorkerId, list[int]] = {}  # blocks from host, disk, external
    lower: list[Holders] = [NO_HOLDERS] * 3  # workers now in the host, disk, external class
    since: dict[WorkerId, int] = {}  # the depth each of them entered its class at
    depths: dict[WorkerId, int] = {}
    depth = 0
    while active and depth < num_blocks:
        seq_hash = seq_hashes[depth]
        device = get_device(seq_hash, NO_HOLDERS)
        host = get_host(seq_hash, NO_HOLDERS)
        disk = get_disk(seq_hash, NO_HOLDERS)
        if seq_hash in external:
            still = active
        elif host or disk:
            still = active & (device | host | disk)
        else:
            still = active & device
        if depth and len(still) < len(active):
            for worker in active - still:
                depths[worker] = depth
        active = still
        on_device = still & device
        below = still - on_device
        on_host = below & host
        on_disk = (below - on_host) & disk
        classes = (on_device, on_host, on_disk, below - on_host - on_disk)
        _settle(lower, classes[1:], since, num_lower, depth)
        if not still:
            break
        depth += 1 + _run_length(seq_hashes[depth + 1 :], classes, gets, external)
    for worker in active:
        depths[worker] = depth
    _settle(lower, (NO_HOLDERS,) * 3, since, num_lower, depth)
    return {w: _tier_overlap(d, num_lower.get(w)) for w, d in depths.items() if d}


def _run_length(
    seq_hashes: Sequence[int],
    classes: _Classes,
    gets: tuple[HolderGet, HolderGet, HolderGet],
    external: Container[int],
) -> int:
    """How many leading blocks of `seq_hashes` leave every worker in its class: each
    worker of class t holds the block in tier t and in no faster tier (external: G4
    holds it). One C-level predicate per class condition, zipped."""
    on_device, on_host, on_disk, on_external = classes
    get_device, get_host, get_disk = gets
    none = repeat(NO_HOLDERS)
    tests: list[Iterator[bool]] = []
    if on_device:
        tests.append(map(on_device.issubset, map(get_device, seq_hashes, none)))
    if on_host:
        tests.append(map(on_host.issubset, map(get_host, seq_hashes, none)))
        tests.append(map(on_host.isdisjoint, map(get_device, seq_hashes, none)))
    if on_disk:
        tests.append(map(on_disk.issubset, map(get_disk, seq_hashes, none)))
        for get in (get_device, get_host):
            tests.append(map(on_disk.isdisjoint, map(get, seq_hashes, none)))
    if on_external:
        tests.append(map(external.__contains__, seq_hashes))
        for get in gets:
            tests.append(map(on_external.isdisjoint, map(get, seq_hashes, none)))
    passes = tests[0] if len(tests) == 1 else map(all, zip(*tests, strict=True))
    return len(list(takewhile(bool, passes)))


def _tier_overlap(num_blocks: int, num_lower: list[int] | None) -> TierOverlap:
    if num_lower is None:
        return TierOverlap(num_blocks)
    host, disk, external = num_lower
    return TierOverlap(num_blocks - host - disk - external, host, disk, external)


def _settle(
    lower: list[Holders],
    new: Sequence[Holders],
    since: dict[WorkerId, int],
    num_lower: dict[WorkerId, list[int]],
    depth: int,
) -> None:
    """Workers move from the lower classes `lower` to `new` at `depth`: each one leaving a
    class adds the blocks it spent there to `num_lower`, each one entering starts its count.
    Python runs per worker that changes class, not per worker in a class."""
    moved = [slot for slot in range(3) if lower[slot] != new[slot]]
    for slot in moved:  # every leaving first: a worker may leave one class for another
        for worker in lower[slot] - new[slot]:
            counts = num_lower.get(worker)
            if counts is None:
                counts = num_lower[worker] = [0, 0, 0]
            counts[slot] += depth - since.pop(worker)
    for slot in moved:
        for worker in new[slot] - lower[slot]:
            since[worker] = depth
        lower[slot] = new[slot]
