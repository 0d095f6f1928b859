"""vLLM's KV events -> ours (DESIGN §3). Pure: decoding and translation, no socket, no vLLM.

vLLM publishes on zmq `(topic, seq as 8-byte big-endian, msgpack(KVEventBatch))`; a batch is
`[ts, [event, ...], dp_rank]` and each event a map tagged by `type` with its class name:

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | None,
     "token_ids": [...], "block_size": n, "medium": "GPU", ...}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU", ...}
    {"type": "AllBlocksCleared"}

Fields we do not read (lora_id, extra_keys, group_idx...) are ignored.

vLLM's block hashes are opaque (its own seeded sha256), so `KvEventTranslator` recomputes our
chained hashes from each stored event's token ids, chained from the parent's hash as we
computed it, and keeps vLLM hash -> our hash to translate removals. vLLM can hold the same
block twice (a block computed by two requests at once); each copy is stored and removed
once, so a vLLM hash is counted and our Removed is sent only when its last copy goes.

Blocks vLLM stores in lower tiers (medium "CPU" or "STORAGE" from its offloading connector)
carry tiers HOST and DISK; everything else is the engine's own memory, DEVICE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from armature.errors import ArmatureError
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes, hash_seed_for_salt
from armature.protocols.kv_events import (
    KvCleared,
    KvDump,
    KvEvent,
    KvRemoved,
    KvStored,
    KvTier,
    StoredBlock,
)

__all__ = [
    "KvEventTranslator",
    "VllmAllBlocksCleared",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "VllmEvent",
    "VllmEventBatch",
    "VllmEventError",
    "decode_batch",
]

VllmHash = bytes | int  # vLLM's ExternalBlockHash


class VllmEventError(ArmatureError, ValueError):
    """An event we cannot translate (malformed, or it breaks the hash chain)."""


class VllmBlockStored(msgspec.Struct, tag="BlockStored", frozen=True):
    block_hashes: list[VllmHash]
    parent_block_hash: VllmHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None


class VllmBlockRemoved(msgspec.Struct, tag="BlockRemoved", frozen=True):
    block_hashes: list[VllmHash]
    medium: str | None = None


class VllmAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", frozen=True):
    pass


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared


class VllmEventBatch(msgspec.Struct, array_like=True, frozen=True):
    ts: float
    events: list[VllmEvent]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(VllmEventBatch)
_TIERS = {"CPU": KvTier.HOST, "STORAGE": KvTier.DISK}


def decode_batch(payload: bytes) -> VllmEventBatch:
    """One zmq payload from vLLM's publisher; VllmEventError when it is not a KV batch."""
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise VllmEventError(f"cannot decode a vLLM KV event batch: {exc}") from None


def tier_of(medium: str | None) -> KvTier:
    return _TIERS.get(medium or "", KvTier.DEVICE)


@dataclass
class _Cached:
    seq_hash: int
    num_copies: int


@dataclass
class KvEventTranslator:
    """Translates one vLLM engine's events, in publishing order, into ours.

    Owns the map vLLM hash -> our sequence hash per tier; `event_id`s it assigns start at 0
    and increase by one per event returned. Not thread-safe: one consumer feeds it.
    """

    block_size: int
    seed: int = DEFAULT_HASH_SEED
    _cached: dict[tuple[KvTier, VllmHash], _Cached] = field(default_factory=dict)
    _next_event_id: int = 0

    def translate(self, event: VllmEvent) -> list[KvEvent]:
        """Our events for one vLLM event (none when it changes nothing we index)."""
        if isinstance(event, VllmBlockStored):
            return self._stored(event)
        if isinstance(event, VllmBlockRemoved):
            return self._removed(event)
        return self.reset()

    def reset(self) -> list[KvEvent]:
        """Forget every block (vLLM cleared its cache, or events were lost): one Cleared."""
        self._cached.clear()
        return [KvCleared(self._take_event_id())]

    def dump(self) -> KvDump:
        """Every block cached in device memory as of the last event returned."""
        hashes = [c.seq_hash for (tier, _), c in self._cached.items() if tier is KvTier.DEVICE]
        return KvDump(seq_hashes=hashes, last_event_id=self._next_event_id - 1)

    def get_num_cached_blocks(self) -> int:
        return len(self._cached)

    def _stored(self, event: VllmBlockStored) -> list[KvEvent]:
        if event.block_size != self.block_size:
            raise VllmEventError(
                f"vLLM stored blocks of {event.block_size} tokens; this worker registered "
                f"{self.block_size}"
            )
        num_blocks = len(event.block_hashes)
        if len(event.token_ids) != num_blocks * self.block_size:
            raise VllmEventError(
                f"a stored event has {len(event.token_ids)} tokens for {num_blocks} blocks "
                f"of {self.block_size}"
            )
        tier = tier_of(event.medium)
        parent: int | None = None
        if event.parent_block_hash is not None:
            cached_parent = self._cached.get((tier, event.parent_block_hash))
            if cached_parent is None:
                raise VllmEventError("a stored event's parent block was never stored")
            parent = cached_parent.seq_hash
        seed = hash_seed_for_salt(event.lora_name) if event.lora_name else self.seed
        hashes = compute_block_hashes(event.token_ids, self.block_size, seed, parent)
        for vllm_hash, (seq_hash, _) in zip(event.block_hashes, hashes, strict=True):
            key = (tier, vllm_hash)
            cached = self._cached.get(key)
            if cached is None:
                self._cached[key] = _Cached(seq_hash, 1)
            else:
                cached.num_copies += 1
        if not hashes:
            return []
        blocks = [StoredBlock(seq_hash=s, local_hash=local) for s, local in hashes]
        return [KvStored(self._take_event_id(), parent, blocks, tier)]

    def _removed(self, event: VllmBlockRemoved) -> list[KvEvent]:
        tier = tier_of(event.medium)
        gone: list[int] = []
        for vllm_hash in event.block_hashes:
            key = (tier, vllm_hash)
            cached = self._cached.get(key)
            if cached is None:
                raise VllmEventError("a removed block was never stored")
            cached.num_copies -= 1
            if cached.num_copies == 0:
                del self._cached[key]
                gone.append(cached.seq_hash)
        if not gone:
            return []
        return [KvRemoved(self._take_event_id(), gone, tier)]

    def _take_event_id(self) -> int:
        event_id = self._next_event_id
        self._next_event_id += 1
        return event_id
