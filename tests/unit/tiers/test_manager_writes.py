"""The tier manager's writers. A block is counted offloaded once its store holds it (it was
counted when queued, failed writes too). After a failed write the tier's writes are off, and
the puts queued behind it are not tried (against a store that would make each wait out its
timeout: on a stalled shared store, hours of queued puts, their bytes held); every block not
written is forgotten by the policy when the engine thread settles the failures."""

from __future__ import annotations

import threading

from armature.kv.block_key import BlockKey
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import TierPolicy, TierPolicyConfig
from armature.protocols.kv_events import KvTier
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.errors import StoreError
from armature.tiers.manager import KvTierManager

LAYOUT = KvLayout(num_layers=2, block_size=4, num_kv_heads=1, head_dim=2, dtype="float16")
NUM_BLOCKS = 5


class StalledStore:
    """A store whose first put waits for `release`, then fails; it counts the puts tried."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.num_puts = 0

    def describe(self) -> str:
        return "a stalled store"

    def put(self, key: BlockKey, data: bytes) -> None:
        self.num_puts += 1
        self.release.wait(30)
        raise StoreError("a stalled store: timed out")

    def get(self, seq_hash: int) -> bytes:
        raise StoreError("a stalled store: nothing")

    def delete(self, seq_hash: int) -> None:
        return None

    def list_keys(self) -> list[BlockKey]:
        return []


class EncodingMover:
    """Encodes a G1 block as a few bytes; nothing else is asked of it here."""

    layout = LAYOUT

    def encode(self, tier: KvTier, slot: int, key: BlockKey) -> bytes:
        return key.seq_hash.to_bytes(8, "little")


def disk_manager(store: StalledStore) -> KvTierManager:
    """A manager of one disk tier of 16 blocks over `store`."""
    return KvTierManager(
        TierPolicy(TierPolicyConfig(num_disk_blocks=16), KvEventLog()),
        EncodingMover(),  # type: ignore[arg-type]
        {KvTier.DISK: store},  # type: ignore[dict-item]
        max_inflight_bytes=1 << 20,
    )


def test_puts_queued_behind_a_failed_one_are_not_tried() -> None:
    store = StalledStore()
    manager = disk_manager(store)
    policy = manager.policy
    blocks = [EvictedBlock(i, 100 + i, 200 + i, None) for i in range(NUM_BLOCKS)]
    manager.on_evict(blocks)  # five puts queued on the disk writer; the first stalls
    assert len(policy.get_keys(KvTier.DISK)) == NUM_BLOCKS
    store.release.set()
    manager.flush()
    assert store.num_puts == 1
    assert manager.counters.blocks_offloaded == {}  # none of them was copied down
    manager.take_finished()  # the engine thread settles the failures
    assert manager.counters.write_failures == {KvTier.DISK: NUM_BLOCKS}
    assert policy.get_keys(KvTier.DISK) == []  # none of them is on disk
    assert not policy.is_writable(KvTier.DISK)
    assert manager._pending[KvTier.DISK] == {}  # no bytes held for them
    manager.close()


class ListStore(StalledStore):
    """A store that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[int, bytes] = {}

    def put(self, key: BlockKey, data: bytes) -> None:
        self.blocks[key.seq_hash] = data


def test_blocks_are_counted_offloaded_once_they_are_stored() -> None:
    store = ListStore()
    manager = disk_manager(store)
    manager.on_evict([EvictedBlock(i, 100 + i, 200 + i, None) for i in range(NUM_BLOCKS)])
    manager.flush()
    assert sorted(store.blocks) == [100 + i for i in range(NUM_BLOCKS)]
    assert manager.counters.blocks_offloaded == {(KvTier.DEVICE, KvTier.DISK): NUM_BLOCKS}
    manager.close()
