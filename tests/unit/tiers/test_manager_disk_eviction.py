"""A write-through disk tier over a real `DiskStore`: which block files stay when it is full.
A prompt's blocks are written parents first; the tier evicted the first of them first, which
left the rest of the prompt on disk and of no use (a lookup stops at its first missing block)."""

from __future__ import annotations

from pathlib import Path

from armature.kv.block_key import BlockKey
from armature.kv.event_log import KvEventLog
from armature.kv.tier_policy import OffloadMode, TierPolicy, TierPolicyConfig
from armature.protocols.kv_events import KvTier
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.disk_store import DiskStore
from armature.tiers.manager import KvTierManager

LAYOUT = KvLayout(num_layers=2, block_size=4, num_kv_heads=1, head_dim=2, dtype="float16")


class EncodingMover:
    """Encodes a G1 block as its seq hash; nothing else is asked of it here."""

    layout = LAYOUT

    def encode(self, tier: KvTier, slot: int, key: BlockKey) -> bytes:
        return key.seq_hash.to_bytes(8, "little")


def chain(first: int, num_blocks: int) -> list[tuple[int, BlockKey]]:
    """(G1 block id, key) of a prompt's blocks: seq hashes first, first + 1, ... chained."""
    return [
        (first + i, BlockKey(first + i, 1000 + first + i, first + i - 1 if i else None))
        for i in range(num_blocks)
    ]


def test_a_full_disk_tier_deletes_a_prompts_files_from_its_end(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, "ns")
    policy = TierPolicy(
        TierPolicyConfig(num_disk_blocks=5, offload=OffloadMode.WRITE_THROUGH), KvEventLog()
    )
    manager = KvTierManager(
        policy,
        EncodingMover(),  # type: ignore[arg-type]
        {KvTier.DISK: store},
        max_inflight_bytes=1 << 20,
    )
    manager.on_written(chain(10, 2))  # prompt A, in two steps
    manager.on_written(chain(10, 3)[2:])
    manager.on_written(chain(20, 2))  # prompt B: the tier is full
    manager.on_written(chain(30, 1))
    manager.flush()
    assert sorted(k.seq_hash for k in store.list_keys()) == [10, 11, 20, 21, 30]
    assert [hit.key.seq_hash for hit in manager.find([10, 11, 12])] == [10, 11]
    manager.on_written(chain(40, 2))
    manager.flush()
    assert sorted(k.seq_hash for k in store.list_keys()) == [20, 21, 30, 40, 41]
    manager.close()
