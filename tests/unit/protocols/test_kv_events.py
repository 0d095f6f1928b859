"""KV event wire format: the tier is a `KvTier` that travels as its string value."""

from __future__ import annotations

import msgspec
import pytest

from armature.protocols.engine import EngineLoad
from armature.protocols.kv_events import (
    KvCleared,
    KvDump,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
    merge_dumps,
    split_dump,
)
from armature.protocols.worker import WorkerUpdate


def test_tiers_and_their_wire_values() -> None:
    assert [(t.name, t.value) for t in KvTier] == [
        ("DEVICE", "device"),
        ("HOST", "host"),
        ("DISK", "disk"),
        ("EXTERNAL", "external"),
    ]
    assert KvStored(0, None, []).tier is KvTier.DEVICE
    assert KvRemoved(0, []).tier is KvTier.DEVICE


@pytest.mark.parametrize("tier", list(KvTier))
def test_events_round_trip_with_each_tier(tier: KvTier) -> None:
    events: list[KvEvent] = [
        KvStored(7, 41, [StoredBlock(42, 1042), StoredBlock(43, 1043)], tier),
        KvRemoved(8, [42, 43], tier),
        KvCleared(9),
    ]
    payload = msgspec.msgpack.encode(events)
    # On the wire: tagged maps with the tier's value as a plain string.
    assert msgspec.msgpack.decode(payload) == [
        {
            "type": "stored",
            "event_id": 7,
            "parent_hash": 41,
            "blocks": [
                {"seq_hash": 42, "local_hash": 1042},
                {"seq_hash": 43, "local_hash": 1043},
            ],
            "tier": tier.value,
        },
        {"type": "removed", "event_id": 8, "seq_hashes": [42, 43], "tier": tier.value},
        {"type": "cleared", "event_id": 9},
    ]
    decoded = msgspec.msgpack.decode(payload, type=list[KvEvent])
    assert decoded == events
    assert isinstance(decoded[0], KvStored) and decoded[0].tier is tier
    assert isinstance(decoded[1], KvRemoved) and decoded[1].tier is tier


def test_a_missing_tier_decodes_as_device() -> None:
    payload = msgspec.msgpack.encode({"type": "removed", "event_id": 3, "seq_hashes": [5]})
    event = msgspec.msgpack.decode(payload, type=KvEvent)
    assert event == KvRemoved(3, [5], KvTier.DEVICE)


@pytest.mark.parametrize("wire_tier", ["G1", "gpu", "Device", ""])
def test_an_unknown_tier_is_refused(wire_tier: str) -> None:
    payload = msgspec.msgpack.encode(
        {"type": "removed", "event_id": 3, "seq_hashes": [5], "tier": wire_tier}
    )
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value"):
        msgspec.msgpack.decode(payload, type=KvEvent)


def test_worker_update_carries_tiers() -> None:
    load = EngineLoad(
        num_active_blocks=1,
        num_total_blocks=8,
        num_waiting=0,
        num_running=1,
        num_prefill_tokens_queued=0,
    )
    update = WorkerUpdate(
        kv_events=[KvStored(0, None, [StoredBlock(1, 2)], KvTier.HOST)], load=load
    )
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(update), type=WorkerUpdate)
    assert decoded == update
    assert isinstance(decoded.kv_events[0], KvStored)
    assert decoded.kv_events[0].tier is KvTier.HOST


def test_a_dump_is_sent_in_parts_each_within_a_message() -> None:
    """A dump was one request-plane message: past ~116k blocks it passed NATS's 1 MiB, could
    never be sent, and the router's index stayed stale. Parts of DUMP_PART_HASHES, merged
    back to the same dump; an empty dump is one part."""
    big = KvDump(
        list(range(2**63 - 130_000, 2**63 - 1)),
        last_event_id=41,
        tier_seq_hashes={KvTier.HOST: list(range(60_000)), KvTier.DISK: []},
    )
    parts = split_dump(big)
    assert len(parts) == 3 + 2 + 1  # G1 in three, the host tier in two, the empty disk one
    assert all(len(msgspec.msgpack.encode(p)) < 1 << 19 for p in parts)
    assert {p.last_event_id for p in parts} == {41}
    merged = merge_dumps(parts)
    assert merged.seq_hashes == big.seq_hashes and merged.last_event_id == 41
    assert merged.tier_seq_hashes == big.tier_seq_hashes
    empty = KvDump([], 7)
    assert split_dump(empty) == [empty] and merge_dumps([empty]) == empty
