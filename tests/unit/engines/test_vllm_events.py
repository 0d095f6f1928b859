"""vLLM KV events -> ours, without vLLM: payloads are built the way vLLM's publisher encodes
them (msgpack of `[ts, [{"type": ..., ...}], dp_rank]`, seq as 8-byte big-endian)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from armature.engines.vllm.events import (
    KvEventTranslator,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventError,
    decode_batch,
)
from armature.engines.vllm.subscriber import KvEventSubscriber
from armature.kv.hashing import compute_block_hashes, compute_seq_hashes, hash_seed_for_salt
from armature.protocols.kv_events import KvCleared, KvRemoved, KvStored, KvTier, StoredBlock
from armature.router.prefix_index import PrefixIndex

BS = 4


def stored(
    hashes: list[Any], parent: Any, tokens: list[int], medium: str = "GPU"
) -> VllmBlockStored:
    return VllmBlockStored(hashes, parent, tokens, BS, medium=medium)


def payload(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events), 0])


def stored_dict(hashes: list[Any], parent: Any, tokens: list[int]) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def test_stored_recomputes_our_chained_hashes() -> None:
    t = KvEventTranslator(block_size=BS)
    tokens = list(range(100, 112))
    (event,) = t.translate(stored([b"a", b"b", b"c"], None, tokens))
    expected = compute_block_hashes(tokens, BS)
    assert event == KvStored(0, None, [StoredBlock(s, loc) for s, loc in expected], KvTier.DEVICE)


def test_child_chains_from_the_parents_hash_as_we_computed_it() -> None:
    t = KvEventTranslator(block_size=BS)
    tokens = list(range(100, 116))
    t.translate(stored([11, 12], None, tokens[:8]))
    (child,) = t.translate(stored([13, 14], 12, tokens[8:]))
    full = compute_seq_hashes(tokens, BS)
    assert isinstance(child, KvStored)
    assert child.event_id == 1
    assert child.parent_hash == full[1]
    assert [b.seq_hash for b in child.blocks] == full[2:]


def test_removed_once_every_copy_is_gone() -> None:
    t = KvEventTranslator(block_size=BS)
    tokens = list(range(8))
    seq = compute_seq_hashes(tokens, BS)
    t.translate(stored([1, 2], None, tokens))
    t.translate(stored([1, 2], None, tokens))  # vLLM computed the same blocks twice
    assert t.translate(VllmBlockRemoved([2], "GPU")) == []
    assert t.translate(VllmBlockRemoved([2], "GPU")) == [KvRemoved(2, [seq[1]], KvTier.DEVICE)]
    assert t.dump().seq_hashes == [seq[0]]
    assert t.dump().last_event_id == 2


def test_cleared_forgets_everything() -> None:
    t = KvEventTranslator(block_size=BS)
    t.translate(stored([1], None, [1, 2, 3, 4]))
    assert t.translate(VllmAllBlocksCleared()) == [KvCleared(1)]
    assert t.get_num_cached_blocks() == 0
    assert t.dump().seq_hashes == []


def test_lower_tiers_and_lora_salt() -> None:
    t = KvEventTranslator(block_size=BS)
    (cpu,) = t.translate(stored([1], None, [1, 2, 3, 4], medium="CPU"))
    assert isinstance(cpu, KvStored) and cpu.tier is KvTier.HOST
    (disk,) = t.translate(stored([1], None, [1, 2, 3, 4], medium="STORAGE"))
    assert isinstance(disk, KvStored) and disk.tier is KvTier.DISK
    assert t.dump().seq_hashes == []  # the dump covers device memory only
    seq = compute_seq_hashes([1, 2, 3, 4], BS)
    assert t.translate(VllmBlockRemoved([1], "CPU")) == [KvRemoved(2, seq, KvTier.HOST)]
    lora = VllmBlockStored([2], None, [1, 2, 3, 4], BS, medium="GPU", lora_name="ad")
    (event,) = t.translate(lora)
    assert isinstance(event, KvStored)
    seed = hash_seed_for_salt("ad")
    assert event.blocks[0].seq_hash == compute_seq_hashes([1, 2, 3, 4], BS, seed)[0]


@pytest.mark.parametrize(
    "event",
    [
        VllmBlockStored([1], None, [1, 2, 3, 4], 8),  # another block size
        VllmBlockStored([1, 2], None, [1, 2, 3, 4], BS),  # tokens for one block only
        VllmBlockStored([2], 99, [1, 2, 3, 4], BS),  # unknown parent
        VllmBlockRemoved([99], "GPU"),  # never stored
    ],
)
def test_untranslatable_events_raise(event: Any) -> None:
    with pytest.raises(VllmEventError):
        KvEventTranslator(block_size=BS).translate(event)


def test_decode_vllm_payload_ignores_fields_we_do_not_read() -> None:
    batch = decode_batch(
        payload(
            stored_dict([7], None, [1, 2, 3, 4]),
            {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0},
            {"type": "AllBlocksCleared"},
        )
    )
    assert batch.events == [
        VllmBlockStored([7], None, [1, 2, 3, 4], BS, medium="GPU"),
        VllmBlockRemoved([7], "GPU"),
        VllmAllBlocksCleared(),
    ]
    with pytest.raises(VllmEventError):
        decode_batch(b"\x01not msgpack")


def _subscriber(directory: Path) -> KvEventSubscriber:
    # connect() to an ipc path nobody binds: fine for zmq, and handle() needs no socket
    endpoint = f"ipc://{directory / 'unbound'}"
    return KvEventSubscriber(endpoint, KvEventTranslator(BS))


def test_subscriber_resets_on_a_lost_batch(tmp_path: Path) -> None:
    sub = _subscriber(tmp_path)
    try:
        first = sub.handle([b"", (0).to_bytes(8, "big"), payload(stored_dict([1], None, [0] * 4))])
        assert [type(e) for e in first] == [KvStored]
        # batch 1 was lost: whatever it held is unknown, so everything is forgotten
        later = sub.handle([b"", (2).to_bytes(8, "big"), payload(stored_dict([5], None, [9] * 4))])
        assert [type(e) for e in later] == [KvCleared, KvStored]
        assert [e.event_id for e in later] == [1, 2]
        assert sub.num_resets == 1
        bad = sub.handle([b"", (3).to_bytes(8, "big"), b"\xc1"])
        assert [type(e) for e in bad] == [KvCleared]
    finally:
        sub.stop()


def test_index_from_translated_events_matches_shared_prefixes() -> None:
    """What the router indexes from vLLM's events is exactly the prompts' shared blocks."""
    t = KvEventTranslator(block_size=BS)
    index = PrefixIndex()
    index.add_worker("w", 100)
    a = list(range(16))  # four blocks
    b = [*a[:8], 50, 51, 52, 53, 54, 55, 56, 57]  # shares two blocks with a
    for event in t.translate(stored([1, 2, 3, 4], None, a)):
        assert index.apply("w", event)
    for event in t.translate(stored([5, 6], 2, b[8:])):
        assert index.apply("w", event)
    assert index.find_overlaps(compute_seq_hashes(a, BS)) == {"w": 4}
    assert index.find_overlaps(compute_seq_hashes(b, BS)) == {"w": 4}
    c = [*a[:8], *[99] * 8]
    assert index.find_overlaps(compute_seq_hashes(c, BS)) == {"w": 2}
    for event in t.translate(VllmBlockRemoved([2, 3, 4, 5, 6], "GPU")):
        assert index.apply("w", event)
    assert index.find_overlaps(compute_seq_hashes(b, BS)) == {"w": 1}
