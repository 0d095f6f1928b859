"""TierPolicy: exact tier contents, copy/drop ops in order, and events after scripted runs."""

from __future__ import annotations

import pytest

from armature.kv.block_key import BlockKey
from armature.kv.block_pool import make_block_pool
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import (
    NO_SLOT,
    CopyOp,
    DiskOffload,
    DropOp,
    OffloadMode,
    RemoteOffload,
    TierHit,
    TierPolicy,
    TierPolicyConfig,
)
from armature.protocols.kv_events import KvRemoved, KvStored, KvTier, StoredBlock

D, H, S, X = KvTier.DEVICE, KvTier.HOST, KvTier.DISK, KvTier.EXTERNAL


def key(i: int) -> BlockKey:
    """Block i of one chain: seq hash i, local hash 1000 + i, parent i - 1."""
    return BlockKey(i, 1000 + i, i - 1 if i > 0 else None)


def evicted(i: int, block_id: int | None = None, hits: int = 0) -> EvictedBlock:
    k = key(i)
    return EvictedBlock(i if block_id is None else block_id, *k, num_hits=hits)


def make(**kwargs: object) -> tuple[TierPolicy, KvEventLog]:
    log = KvEventLog()
    policy = TierPolicy(TierPolicyConfig(**kwargs), log)  # type: ignore[arg-type]
    return policy, log


def test_host_tier_keeps_the_most_recent_evictions_in_slot_order() -> None:
    policy, log = make(num_host_blocks=2)
    assert policy.on_evict([evicted(0), evicted(1)]) == [
        CopyOp(key(0), D, 0, H, 0),
        CopyOp(key(1), D, 1, H, 1),
    ]
    # another prompt's block takes the least recently used slot of a chain's end (block 1's:
    # block 0 is its prefix, as recent as it)
    other = BlockKey(50, 1050, None)
    assert policy.on_evict([EvictedBlock(7, *other)]) == [CopyOp(other, D, 7, H, 1)]
    assert policy.get_keys(H) == [key(0), other]
    assert [policy.get_slot(H, i) for i in (0, 50)] == [0, 1]
    assert log.take() == [
        KvStored(0, None, [StoredBlock(0, 1000), StoredBlock(1, 1001)], H),
        KvRemoved(1, [1], H),
        KvStored(2, None, [StoredBlock(50, 1050)], H),
    ]
    policy.check_integrity()


def test_an_evicted_block_already_in_host_is_not_copied_again_and_becomes_recent() -> None:
    policy, log = make(num_host_blocks=2)
    policy.on_evict([evicted(0), evicted(1)])
    assert policy.on_evict([evicted(0, hits=3)]) == []
    assert policy.get_keys(H) == [key(1), key(0)]
    assert policy.get_num_hits(H, 0) == 3
    log.take()
    policy.on_evict([evicted(2)])  # now block 1 is the victim
    assert policy.get_keys(H) == [key(0), key(2)]


def test_host_victims_go_to_disk_only_when_reused_twice() -> None:
    policy, _ = make(num_host_blocks=1, num_disk_blocks=4)
    policy.on_evict([evicted(0, hits=2)])
    ops = policy.on_evict([evicted(1, hits=1)])
    # block 0 (2 hits) is copied from its host slot to disk before block 1 overwrites it
    assert ops == [CopyOp(key(0), H, 0, S, NO_SLOT), CopyOp(key(1), D, 1, H, 0)]
    ops = policy.on_evict([evicted(2)])
    assert ops == [CopyOp(key(2), D, 2, H, 0)]  # block 1 (1 hit) is dropped
    assert policy.get_keys(S) == [key(0)]
    assert policy.get_keys(H) == [key(2)]


def test_disk_offload_all_takes_every_host_victim() -> None:
    policy, _ = make(num_host_blocks=1, num_disk_blocks=4, disk_offload=DiskOffload.ALL)
    policy.on_evict([evicted(0), evicted(1), evicted(2)])
    assert policy.get_keys(S) == [key(1), key(0)]  # a chain's end is the first to go


def test_onboard_hits_count_towards_disk_reuse() -> None:
    policy, _ = make(num_host_blocks=1, num_disk_blocks=4)
    policy.on_evict([evicted(0, hits=1)])
    hits = policy.find([0])
    policy.pin(hits)
    policy.on_onboarded(hits)
    assert policy.get_num_hits(H, 0) == 2
    policy.on_evict([evicted(1)])
    assert policy.get_keys(S) == [key(0)]


def test_disk_only_takes_every_eviction_and_drops_its_lru_file() -> None:
    policy, _ = make(num_disk_blocks=2)
    policy.on_evict([evicted(0), evicted(1)])
    other = BlockKey(50, 1050, None)
    ops = policy.on_evict([EvictedBlock(2, *other)])
    assert ops == [DropOp(key(1), S), CopyOp(other, D, 2, S, NO_SLOT)]  # block 0's child first


def test_find_takes_the_fastest_tier_and_stops_at_the_first_miss() -> None:
    policy, _ = make(num_host_blocks=2, num_disk_blocks=4, disk_offload=DiskOffload.ALL)
    policy.on_evict([evicted(0), evicted(1), evicted(2)])  # 1 -> disk; 0 (its prefix), 2 in host
    policy.on_evict([evicted(4)])  # 2 -> disk
    assert policy.find([0, 1, 2, 3, 4]) == [
        TierHit(key(0), H, 0),
        TierHit(key(1), S, NO_SLOT),
        TierHit(key(2), S, NO_SLOT),
    ]
    assert policy.find([3, 0]) == []


def test_pinned_blocks_are_never_evicted() -> None:
    policy, _ = make(num_host_blocks=2)
    policy.on_evict([evicted(0), evicted(1)])
    hits = policy.find([0])
    policy.pin(hits)
    assert policy.on_evict([evicted(2)]) == [CopyOp(key(2), D, 2, H, 1)]  # 1 goes, not 0
    policy.pin(policy.find([2]))
    assert policy.on_evict([evicted(3)]) == []  # all pinned: not stored
    assert policy.get_keys(H) == [key(0), key(2)]
    policy.unpin(hits)
    assert policy.on_evict([evicted(3)]) == [CopyOp(key(3), D, 3, H, 0)]


def test_a_refused_block_is_forgotten_after_its_last_pin_and_its_file_deleted() -> None:
    policy, log = make(num_disk_blocks=2)
    policy.on_evict([evicted(0)])
    log.take()
    (hit,) = policy.find([0])
    policy.pin([hit])
    policy.pin([hit])  # two requests load it
    assert policy.refuse(hit) == []
    assert policy.find([0]) == []  # never found again
    assert policy.get_keys(S) == [key(0)]  # still being read by the other loader
    assert policy.on_onboarded([hit]) == [DropOp(key(0), S)]
    assert policy.get_keys(S) == []
    assert log.take() == [KvRemoved(1, [0], S)]
    policy.check_integrity()


def test_write_through_copies_at_once_and_eviction_then_costs_nothing() -> None:
    policy, _ = make(num_host_blocks=4, offload=OffloadMode.WRITE_THROUGH)
    ops = policy.on_written([(5, key(0)), (6, key(1))])
    assert ops == [CopyOp(key(0), D, 5, H, 0), CopyOp(key(1), D, 6, H, 1)]
    assert policy.on_evict([evicted(0, block_id=5)]) == []


def test_evicted_mode_ignores_written_blocks() -> None:
    policy, _ = make(num_host_blocks=4)
    assert policy.on_written([(5, key(0))]) == []
    assert policy.get_keys(H) == []


def test_remote_all_copies_blocks_entering_the_lowest_local_tier() -> None:
    policy, _ = make(
        num_host_blocks=1, num_disk_blocks=2, has_remote=True, remote_offload=RemoteOffload.ALL
    )
    policy.on_evict([evicted(0, hits=2)])
    ops = policy.on_evict([evicted(1)])
    assert ops == [
        CopyOp(key(0), H, 0, S, NO_SLOT),
        CopyOp(key(0), H, 0, X, NO_SLOT),
        CopyOp(key(1), D, 1, H, 0),
    ]


def test_remote_evicted_copies_disk_victims_before_deleting_them() -> None:
    policy, _ = make(num_disk_blocks=1, has_remote=True, remote_offload=RemoteOffload.EVICTED)
    policy.on_evict([evicted(0)])
    ops = policy.on_evict([evicted(1)])
    assert ops == [
        CopyOp(key(0), S, NO_SLOT, X, NO_SLOT),
        DropOp(key(0), S),
        CopyOp(key(1), D, 1, S, NO_SLOT),
    ]
    assert policy.find([0, 1]) == [TierHit(key(0), X, NO_SLOT), TierHit(key(1), S, NO_SLOT)]


@pytest.mark.parametrize("mode", [RemoteOffload.EVICTED, RemoteOffload.ALL])
def test_a_block_the_pinned_lowest_tier_cannot_take_goes_to_the_store(mode: RemoteOffload) -> None:
    """The disk tier full of blocks pinned for loads: a host victim bound for it was dropped,
    though G4 takes what the disk tier passes on; it goes to G4 straight from host memory."""
    policy, _ = make(num_host_blocks=1, num_disk_blocks=1, has_remote=True, remote_offload=mode)
    policy.add_existing(S, [key(5)])
    policy.pin(policy.find([5]))  # its load is in flight
    policy.on_evict([evicted(0, hits=2)])
    ops = policy.on_evict([evicted(1)])  # 0 leaves host memory; the disk tier is all pinned
    assert ops == [CopyOp(key(0), H, 0, X, NO_SLOT), CopyOp(key(1), D, 1, H, 0)]
    assert policy.find([0]) == [TierHit(key(0), X, NO_SLOT)]
    assert policy.get_keys(S) == [key(5)]


def test_remote_without_local_tiers_takes_g1_evictions() -> None:
    policy, _ = make(has_remote=True, remote_offload=RemoteOffload.EVICTED)
    assert policy.on_evict([evicted(0)]) == [CopyOp(key(0), D, 0, X, NO_SLOT)]


def test_remote_off_is_read_only() -> None:
    policy, _ = make(has_remote=True)
    assert policy.on_evict([evicted(0)]) == []
    assert policy.add_existing(X, [key(7)]) == []
    assert policy.find([7]) == [TierHit(key(7), X, NO_SLOT)]


def test_a_failed_write_forgets_the_block_and_disable_stops_the_tier() -> None:
    policy, log = make(num_disk_blocks=4)
    policy.on_evict([evicted(0), evicted(1)])
    policy.on_write_failed(S, 1, disable=True)
    assert policy.get_keys(S) == [key(0)]
    assert not policy.is_writable(S)
    assert policy.on_evict([evicted(2)]) == []
    assert policy.find([0]) == [TierHit(key(0), S, NO_SLOT)]  # reads go on
    assert [type(e) for e in log.take()] == [KvStored, KvRemoved]


def test_existing_disk_blocks_are_known_without_copies_and_trimmed_to_capacity() -> None:
    policy, _ = make(num_disk_blocks=2)
    # oldest first, a chain's end before its prefix (`disk_store.prefix_order`)
    ops = policy.add_existing(S, [key(2), key(1), key(0)])
    assert ops == [DropOp(key(2), S)]
    assert policy.get_keys(S) == [key(1), key(0)]


def test_a_huge_host_tier_takes_memory_as_it_fills() -> None:
    """A replay's modeled host tier of 2**40 blocks: its slots were listed up front (~80
    bytes each: the kernel killed the replay), now taken as blocks arrive."""
    policy, _ = make(num_host_blocks=2**40)
    ops = policy.on_evict([evicted(0), evicted(1), evicted(2)])
    assert [op.dst_slot for op in ops if isinstance(op, CopyOp)] == [0, 1, 2]
    policy.check_integrity()


def test_a_shared_store_larger_than_the_index_does_not_churn_it() -> None:
    """The store holds 5 blocks, the index 3: the first listing fills the index, later ones
    change nothing (each evicted known blocks for listed ones, and took those back next
    time: a Stored and a Removed event per block every round)."""
    policy, log = make(has_remote=True, num_remote_index_blocks=3)
    listing = [key(i) for i in range(5)]
    assert policy.add_existing(X, listing) == []
    assert policy.get_keys(X) == [key(2), key(1), key(0)]  # a chain's end the first to go
    log.take()
    for _ in range(3):
        assert policy.add_existing(X, listing) == []
        assert policy.get_keys(X) == [key(2), key(1), key(0)]
        assert log.take() == []
    # room made by a block the engine forgets is filled at the next listing, in its order
    policy.on_write_failed(X, 1, disable=False)
    policy.add_existing(X, listing[2:])
    assert policy.get_keys(X) == [key(2), key(0), key(3)]


def test_events_of_the_pool_and_the_tiers_share_one_id_sequence() -> None:
    log = KvEventLog()
    policy = TierPolicy(TierPolicyConfig(num_host_blocks=4), log)
    pool = make_block_pool(2, 4, eviction_observer=_Observer(policy), event_log=log)
    ids = pool.allocate(2)
    pool.cache_blocks(ids, [(10, 110), (11, 111)], None)
    pool.free(list(reversed(ids)))
    pool.allocate(1)  # evicts block 1 (freed first): copied to host, then removed from G1
    events = pool.take_events()
    assert [e.event_id for e in events] == [0, 1, 2]
    assert events[1:] == [
        KvStored(1, 10, [StoredBlock(11, 111)], H),
        KvRemoved(2, [11], D),
    ]


class _Observer:
    def __init__(self, policy: TierPolicy):
        self.policy = policy

    def on_evict(self, blocks: list[EvictedBlock]) -> None:
        self.policy.on_evict(blocks)


def chain(first: int, num_blocks: int) -> list[BlockKey]:
    """A prompt's blocks: seq hashes first, first + 1, ..., each the parent of the next."""
    return [
        BlockKey(first + i, 1000 + first + i, first + i - 1 if i else None)
        for i in range(num_blocks)
    ]


def written(keys: list[BlockKey]) -> list[tuple[int, BlockKey]]:
    """(G1 block id, key) of freshly written blocks: each in the G1 block of its seq hash."""
    return [(k.seq_hash, k) for k in keys]


def removed(log: KvEventLog) -> list[int]:
    """The seq hashes the tiers removed since the last call, in order."""
    return [h for e in log.take() if isinstance(e, KvRemoved) for h in e.seq_hashes]


def one_tier(tier: KvTier, num_blocks: int) -> dict[str, object]:
    """`make`'s arguments for write-through into `tier` alone, of `num_blocks` blocks."""
    if tier is H:
        return {"num_host_blocks": num_blocks}
    if tier is S:
        return {"num_disk_blocks": num_blocks}
    return {
        "has_remote": True,
        "num_remote_index_blocks": num_blocks,
        "remote_offload": RemoteOffload.ALL,
    }


@pytest.mark.parametrize("tier", [H, S, X])
def test_a_prompt_written_through_leaves_a_tier_from_its_end(tier: KvTier) -> None:
    """Prompt A (3 blocks), then B (2), fill the tier; each new block then evicts A's last
    block. Written parents first, A's first block was the least recent: evicted first, it
    left A's other blocks stored and of no use (a lookup stops at the first missing one)."""
    policy, log = make(offload=OffloadMode.WRITE_THROUGH, **one_tier(tier, 5))
    a, b = chain(10, 3), chain(20, 2)
    policy.on_written(written(a))
    policy.on_written(written(b))
    log.take()
    policy.on_written(written(chain(30, 1)))
    assert removed(log) == [12]
    assert [hit.key for hit in policy.find([10, 11, 12])] == a[:2]  # A's head still serves
    policy.on_written(written(chain(40, 1)))
    policy.on_written(written(chain(50, 1)))
    assert removed(log) == [11, 10]
    assert policy.get_keys(tier) == [b[1], b[0], *chain(30, 1), *chain(40, 1), *chain(50, 1)]
    policy.check_integrity()


def test_disk_files_of_a_prompt_are_deleted_from_its_end() -> None:
    policy, _ = make(offload=OffloadMode.WRITE_THROUGH, num_disk_blocks=5)
    a = chain(10, 3)
    policy.on_written(written(a))
    policy.on_written(written(chain(20, 2)))
    c = chain(30, 1)
    assert policy.on_written(written(c)) == [DropOp(a[2], S), CopyOp(c[0], D, 30, S, NO_SLOT)]


@pytest.mark.parametrize("tier", [H, S, X])
def test_a_prompt_written_step_by_step_leaves_a_tier_from_its_end(tier: KvTier) -> None:
    """A's blocks come in three steps ([0, 1], [2], [3]: each step's are children of the
    last's), then B's. A later step's block was the most recent, its parents older: even
    with each step's own blocks ordered, A went from its head. Now A, the older prompt,
    goes from its end, then B."""
    policy, log = make(offload=OffloadMode.WRITE_THROUGH, **one_tier(tier, 6))
    a, b = chain(10, 4), chain(20, 2)
    for step in (a[:2], a[2:3], a[3:]):
        policy.on_written(written(step))
    policy.on_written(written(b))
    log.take()
    for first in range(30, 90, 10):
        policy.on_written(written(chain(first, 1)))
        if first == 30:
            assert [hit.key for hit in policy.find([10, 11, 12, 13])] == a[:3]
    assert removed(log) == [13, 12, 11, 10, 21, 20]
    policy.check_integrity()


def test_an_onboarded_prefix_is_evicted_after_the_rest_of_its_prompt() -> None:
    """A (3 blocks) then B (2) in a host tier of 5; A's first two blocks are onboarded:
    they are the most recent, the first of them last to go (it went before the second)."""
    policy, log = make(offload=OffloadMode.WRITE_THROUGH, num_host_blocks=5)
    policy.on_written(written(chain(10, 3)))
    policy.on_written(written(chain(20, 2)))
    hits = policy.find([10, 11, 99])
    policy.pin(hits)
    policy.on_onboarded(hits)
    log.take()
    for first in range(30, 80, 10):
        policy.on_written(written(chain(first, 1)))
    assert removed(log) == [12, 21, 20, 11, 10]
    policy.check_integrity()


def test_a_prefix_shared_by_a_later_prompt_goes_after_its_ends() -> None:
    """X = [s0, s1, x2]; A, B unrelated; Y = [y2] (a child of s1, s0 and s1 hit in G1) fill a
    host tier of 6. An eviction passing over s0 and s1 (y2 extends them) requeues them at the
    least recent end, the next one (still extended) at the most recent: each is passed over
    at most twice a round, not at every eviction. They go after y2, s1 first; 40 and 50,
    newer than y2, went before them (the price of parents not renewed with their children)."""
    policy, log = make(offload=OffloadMode.WRITE_THROUGH, num_host_blocks=6)
    x = [BlockKey(1, 1001, None), BlockKey(2, 1002, 1), BlockKey(3, 1003, 2)]
    for keys in (x, chain(20, 1), chain(30, 1), [BlockKey(4, 1004, 2)]):
        policy.on_written(written(keys))
    log.take()
    for first in range(40, 120, 10):
        policy.on_written(written(chain(first, 1)))
    assert removed(log) == [3, 20, 30, 4, 40, 50, 2, 1]
    policy.check_integrity()


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        TierPolicyConfig(num_host_blocks=-1)
