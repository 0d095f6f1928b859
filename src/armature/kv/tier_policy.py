"""Which KV block sits in which lower tier (G2 host, G3 disk, G4 shared store), and what must
be copied where: the pure core of the KV block manager. The shell (armature.tiers) makes the
copies this policy asks for, in order, and reports back what failed.

    G1 device ──evict (or write-through)──▶ G2 host ──LRU victim reused ≥ 2×──▶ G3 disk
                                              │ (no disk tier)                    │
                                              └──────── --kv-remote-offload ──────┴──▶ G4 store

- A block enters the first lower tier when the engine's pool evicts it (`on_evict`), or as
  soon as it is written with `OffloadMode.WRITE_THROUGH` (`on_written`). With no host tier the
  first lower tier is the disk; with neither, G4 (when remote offload is on).
- Every tier evicts least-recently-used first and holds at most one copy of a block. A block
  is evicted only once no block there extends it (`_Tier.find_victim`): a prompt's blocks go
  from its end, its first block last (a prefix lookup stops at its first missing block, so
  the rest would stay stored and of no use). A block pinned by an onboarding in flight is
  never evicted; when that leaves a full tier nothing to evict, the incoming block is not
  stored.
- A host victim goes down to disk only if it served at least `MIN_DISK_REUSE_HITS` prefix hits
  (any with `DiskOffload.ALL`). The lowest local tier's blocks go to G4 as they leave it
  (`RemoteOffload.EVICTED`) or as they enter it (`RemoteOffload.ALL`). G4 is shared: this
  policy keeps a bounded index of what it holds and never deletes from it.
- Onboarding looks a prompt's hashes up tier by tier (`find`), pins the hits while the shell
  loads them, then `on_onboarded` (loaded) or `refuse` (bad block) settles them.

Tiers stay inclusive: onboarding copies a block up and leaves it where it was. Stored and
Removed events name the tier; they share the engine pool's event log.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from armature.kv.block_key import BlockKey
from armature.kv.chain_order import children_first
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.protocols.kv_events import KvTier

__all__ = [
    "LOWER_TIERS",
    "MIN_DISK_REUSE_HITS",
    "CopyOp",
    "DiskOffload",
    "DropOp",
    "OffloadMode",
    "RemoteOffload",
    "TierHit",
    "TierOp",
    "TierPolicy",
    "TierPolicyConfig",
]

MIN_DISK_REUSE_HITS = 2
LOWER_TIERS = (KvTier.HOST, KvTier.DISK, KvTier.EXTERNAL)  # fastest first
NO_SLOT = -1  # disk and external blocks are found by key, not by slot
DEFAULT_REMOTE_INDEX_BLOCKS = 1 << 20


class OffloadMode(enum.StrEnum):
    EVICTED = "evicted"  # a block leaves G1 for G2 when the pool evicts it
    WRITE_THROUGH = "write-through"  # every completed block is copied down when written


class DiskOffload(enum.StrEnum):
    REUSED = "reused"  # host victims that served at least MIN_DISK_REUSE_HITS hits
    ALL = "all"  # every host victim


class RemoteOffload(enum.StrEnum):
    OFF = "off"  # G4 is read only: onboard what other workers wrote
    EVICTED = "evicted"  # blocks leaving the lowest local tier go to G4
    ALL = "all"  # blocks entering the lowest local tier also go to G4 at once


@dataclass(frozen=True)
class TierPolicyConfig:
    num_host_blocks: int = 0  # 0: no G2
    num_disk_blocks: int = 0  # 0: no G3
    has_remote: bool = False  # G4
    num_remote_index_blocks: int = DEFAULT_REMOTE_INDEX_BLOCKS  # G4 blocks this worker knows
    offload: OffloadMode = OffloadMode.EVICTED
    disk_offload: DiskOffload = DiskOffload.REUSED
    remote_offload: RemoteOffload = RemoteOffload.OFF

    def __post_init__(self) -> None:
        if self.num_host_blocks < 0 or self.num_disk_blocks < 0:
            raise ValueError("tier sizes must be non-negative")
        if self.num_remote_index_blocks <= 0:
            raise ValueError("num_remote_index_blocks must be positive")


class CopyOp(NamedTuple):
    """Copy `key`'s contents from (src, src_slot) to (dst, dst_slot). A slot is a G1 block id
    or a host slot; NO_SLOT for disk and external blocks (found by key)."""

    key: BlockKey
    src: KvTier
    src_slot: int
    dst: KvTier
    dst_slot: int


class DropOp(NamedTuple):
    """Delete `key` from `tier`'s storage (a disk block the tier evicted or refused)."""

    key: BlockKey
    tier: KvTier


TierOp = CopyOp | DropOp


class TierHit(NamedTuple):
    key: BlockKey
    tier: KvTier
    slot: int


@dataclass
class _Entry:
    key: BlockKey
    slot: int
    num_hits: int = 0
    num_pins: int = 0
    is_refused: bool = False  # a loader found it bad; removed when the last pin goes
    is_passed_over: bool = False  # an eviction passed it over (a parent) since last requeued


@dataclass
class _Tier:
    name: KvTier
    capacity: int
    entries: OrderedDict[int, _Entry] = field(default_factory=OrderedDict)  # LRU head first
    # host only: slots freed (reused last freed first), then fresh ones from `num_fresh_used`
    # up (a list of every slot up front took ~80 bytes a slot: a modeled host tier of 2**31
    # blocks took all of a machine's memory)
    free_slots: list[int] = field(default_factory=list)
    num_fresh_used: int = 0
    writes_enabled: bool = True
    # seq hash -> how many blocks held here have it as parent; a block absent is a leaf
    num_children: dict[int, int] = field(default_factory=dict)

    def take_slot(self) -> int:
        if self.free_slots:
            return self.free_slots.pop()
        self.num_fresh_used += 1
        return self.num_fresh_used - 1

    def add(self, entry: _Entry) -> None:
        """Hold `entry`, as the most recent."""
        self.entries[entry.key.seq_hash] = entry
        parent = entry.key.parent_hash
        if parent is not None:
            self.num_children[parent] = self.num_children.get(parent, 0) + 1

    def pop(self, seq_hash: int) -> _Entry:
        entry = self.entries.pop(seq_hash)
        parent = entry.key.parent_hash
        if parent is not None:
            self.num_children[parent] -= 1
            if not self.num_children[parent]:
                del self.num_children[parent]
        return entry

    def renew(self, keys: Sequence[BlockKey]) -> None:
        """Make the held blocks of `keys` the most recent, each after its children among them
        (`children_first`), whatever order they came in."""
        for key in children_first(keys):
            entry = self.entries.get(key.seq_hash)
            if entry is not None:
                entry.is_passed_over = False
                self.entries.move_to_end(key.seq_hash)

    def find_victim(self) -> _Entry | None:
        """The least recently used unpinned leaf (no block held here extends it), or None
        when each is pinned. Only leaves are evicted, so a chain goes from its end.

        A parent is as recent as its newest descendant; keeping that exactly would renew every
        ancestor of each block stored or served, O(depth) a block (a prompt's blocks come a
        step at a time, each step's the children of the last). So a parent keeps its own
        recency, and the parents an eviction passes over (before the least recent leaf, so
        their descendants are no older than it) are requeued, children first: the first time
        at the least recent end, whence they go as soon as their last child has gone (the
        leaf's recency is theirs then); passed over again (still extended, as a system prompt
        shared by many prompts is), at the most recent end. Each parent is passed over at most
        twice a round through the tier: O(1) amortised a block."""
        first_passes: list[BlockKey] = []
        second_passes: list[BlockKey] = []
        victim = None
        for seq_hash, entry in self.entries.items():
            if entry.num_pins:
                continue
            if seq_hash not in self.num_children:
                victim = entry
                break
            (second_passes if entry.is_passed_over else first_passes).append(entry.key)
        if first_passes:
            for key in reversed(children_first(first_passes)):
                self.entries[key.seq_hash].is_passed_over = True
                self.entries.move_to_end(key.seq_hash, last=False)
        if second_passes:
            self.renew(second_passes)
        return victim


class TierPolicy:
    """Pure; one owner thread (the engine's). Every mutating call returns the copies and drops
    the shell must make, in order: a later op may overwrite the slot an earlier one reads."""

    def __init__(self, config: TierPolicyConfig, event_log: KvEventLog):
        self.config = config
        self._log = event_log
        self._tiers: dict[KvTier, _Tier] = {}
        if config.num_host_blocks:
            self._tiers[KvTier.HOST] = _Tier(KvTier.HOST, config.num_host_blocks)
        if config.num_disk_blocks:
            self._tiers[KvTier.DISK] = _Tier(KvTier.DISK, config.num_disk_blocks)
        if config.has_remote:
            self._tiers[KvTier.EXTERNAL] = _Tier(KvTier.EXTERNAL, config.num_remote_index_blocks)
        local = [t for t in (KvTier.HOST, KvTier.DISK) if t in self._tiers]
        self._first_local = local[0] if local else None
        self._lowest_local = local[-1] if local else None
        self._pending: list[BlockKey] = []  # a run of Stored keys not yet logged
        self._pending_tier: KvTier | None = None
        self._touched: dict[KvTier, list[BlockKey]] = {}  # blocks the call stored or served
        self._unreadable: set[KvTier] = set()  # tiers whose store failed a read: not found

    # ---- reads -------------------------------------------------------------------------
    def get_tiers(self) -> list[KvTier]:
        return [t for t in LOWER_TIERS if t in self._tiers]

    def get_num_blocks(self, tier: KvTier) -> int:
        return len(self._tiers[tier].entries) if tier in self._tiers else 0

    def get_capacity_blocks(self, tier: KvTier) -> int:
        return self._tiers[tier].capacity if tier in self._tiers else 0

    def get_keys(self, tier: KvTier) -> list[BlockKey]:
        """Blocks in `tier`, least recently used first (a parent goes only after its children
        there: `_Tier.find_victim`)."""
        if tier not in self._tiers:
            return []
        return [e.key for e in self._tiers[tier].entries.values()]

    def get_slot(self, tier: KvTier, seq_hash: int) -> int | None:
        entry = self._tiers[tier].entries.get(seq_hash) if tier in self._tiers else None
        return None if entry is None else entry.slot

    def get_num_hits(self, tier: KvTier, seq_hash: int) -> int:
        return self._tiers[tier].entries[seq_hash].num_hits

    def get_num_pinned_blocks(self) -> int:
        return sum(1 for t in self._tiers.values() for e in t.entries.values() if e.num_pins)

    def is_writable(self, tier: KvTier) -> bool:
        return tier in self._tiers and self._tiers[tier].writes_enabled

    def find(self, seq_hashes: Sequence[int]) -> list[TierHit]:
        """The longest prefix of `seq_hashes` held in lower tiers, each block from the
        fastest tier that holds it (takes no pin)."""
        out: list[TierHit] = []
        tiers = [
            self._tiers[t] for t in LOWER_TIERS if t in self._tiers and t not in self._unreadable
        ]
        for seq_hash in seq_hashes:
            for tier in tiers:
                entry = tier.entries.get(seq_hash)
                if entry is not None and not entry.is_refused:
                    out.append(TierHit(entry.key, tier.name, entry.slot))
                    break
            else:
                break
        return out

    # ---- blocks leaving or written in G1 -----------------------------------------------
    def on_evict(self, blocks: Sequence[EvictedBlock]) -> list[TierOp]:
        """The engine's pool is about to reuse `blocks` (their contents are still there)."""
        ops: list[TierOp] = []
        for b in blocks:
            key = BlockKey(b.seq_hash, b.local_hash, b.parent_hash)
            self._enter_below_device(key, b.block_id, b.num_hits, ops)
        self._renew_touched()
        self._flush()
        return ops

    def on_written(self, blocks: Sequence[tuple[int, BlockKey]]) -> list[TierOp]:
        """(G1 block id, key) of blocks just completed in the pool; copied down at once with
        OffloadMode.WRITE_THROUGH, else nothing."""
        ops: list[TierOp] = []
        if self.config.offload is OffloadMode.WRITE_THROUGH:
            for block_id, key in blocks:
                self._enter_below_device(key, block_id, 0, ops)
        self._renew_touched()
        self._flush()
        return ops

    def _enter_below_device(
        self, key: BlockKey, block_id: int, hits: int, ops: list[TierOp]
    ) -> None:
        if self._first_local is not None:
            self._insert(self._first_local, key, KvTier.DEVICE, block_id, hits, ops)
        elif self.config.remote_offload is not RemoteOffload.OFF:
            self._insert(KvTier.EXTERNAL, key, KvTier.DEVICE, block_id, hits, ops)

    # ---- onboarding --------------------------------------------------------------------
    def pin(self, hits: Sequence[TierHit]) -> None:
        """Keep `hits` from eviction while the shell loads them."""
        for hit in hits:
            self._tiers[hit.tier].entries[hit.key.seq_hash].num_pins += 1

    def unpin(self, hits: Sequence[TierHit]) -> list[TierOp]:
        """Release pins taken by `pin` (a load that did not happen)."""
        ops: list[TierOp] = []
        for hit in hits:
            self._release_pin(hit, ops)
        self._flush()
        return ops

    def on_onboarded(self, hits: Sequence[TierHit]) -> list[TierOp]:
        """Pinned `hits` were loaded into G1: unpin them, count a hit, make them most recent."""
        ops: list[TierOp] = []
        for hit in hits:
            tier = self._tiers[hit.tier]
            entry = tier.entries[hit.key.seq_hash]
            if not entry.is_refused:
                entry.num_hits += 1
                self._touch(tier, entry.key)
            self._release_pin(hit, ops)
        self._renew_touched()
        self._flush()
        return ops

    def refuse(self, hit: TierHit) -> list[TierOp]:
        """A pinned `hit` could not be loaded (missing, corrupt, foreign): never find it again;
        it is forgotten once its last pin goes. A local disk file is then deleted; a G4 object
        is only forgotten (it is not ours alone)."""
        entry = self._tiers[hit.tier].entries[hit.key.seq_hash]
        entry.is_refused = True
        ops: list[TierOp] = []
        self._release_pin(hit, ops)
        self._flush()
        return ops

    def _release_pin(self, hit: TierHit, ops: list[TierOp]) -> None:
        state = self._tiers[hit.tier]
        entry = state.entries[hit.key.seq_hash]
        assert entry.num_pins > 0, f"unpin of an unpinned block {hit}"
        entry.num_pins -= 1
        if entry.is_refused and entry.num_pins == 0:
            self._remove(state, entry.key.seq_hash)
            if hit.tier is KvTier.DISK:
                ops.append(DropOp(entry.key, KvTier.DISK))

    # ---- feedback from the shell -------------------------------------------------------
    def set_readable(self, tier: KvTier, readable: bool) -> None:
        """Whether `find` offers `tier`'s blocks: a store that failed a read (unreachable,
        hung) is not read for a while; what it holds stays known."""
        if readable:
            self._unreadable.discard(tier)
        else:
            self._unreadable.add(tier)

    def on_write_failed(self, tier: KvTier, seq_hash: int, *, disable: bool) -> None:
        """The shell could not store `seq_hash` in `tier`: forget it (if still known; a pinned
        block stays until its loader refuses it); `disable` stops all further writes there
        (a full disk, an unreachable store)."""
        state = self._tiers[tier]
        entry = state.entries.get(seq_hash)
        if entry is not None:
            if entry.num_pins == 0:
                self._remove(state, seq_hash)
            else:
                entry.is_refused = True
        if disable:
            state.writes_enabled = False
        self._flush()

    def add_existing(self, tier: KvTier, keys: Sequence[BlockKey]) -> list[TierOp]:
        """Blocks found in `tier`'s storage (a disk tier at restart, oldest first; a listing of
        the shared store): known from now on, with no copy. On disk, beyond capacity the
        oldest go; a shared store's listing only fills the room left (a store larger than
        the index evicted known blocks for listed ones, and took them back at the next
        listing, every round)."""
        assert tier in (KvTier.DISK, KvTier.EXTERNAL)
        ops: list[TierOp] = []
        state = self._tiers[tier]
        new = [key for key in keys if key.seq_hash not in state.entries]
        if tier is KvTier.EXTERNAL:
            del new[max(0, state.capacity - len(state.entries)) :]
        for key in new:
            self._insert(tier, key, None, NO_SLOT, 0, ops, force=True)
        self._renew_touched()
        self._flush()
        return ops

    # ---- internals ---------------------------------------------------------------------
    def _insert(
        self,
        tier: KvTier,
        key: BlockKey,
        src: KvTier | None,
        src_slot: int,
        hits: int,
        ops: list[TierOp],
        *,
        force: bool = False,
    ) -> None:
        """Put `key` into `tier` (copied from `src`; None: it is there already)."""
        state = self._tiers[tier]
        entry = state.entries.get(key.seq_hash)
        if entry is not None and not entry.is_refused:
            entry.num_hits += hits
            self._touch(state, key)
            return
        if entry is not None or (not state.writes_enabled and not force):
            return  # a refused copy is still being read: not replaced until it goes
        if len(state.entries) >= state.capacity and not self._evict_one(state, ops):
            # every leaf is pinned (loads in flight): this one is not stored here; where the
            # lowest local tier passes blocks on to G4, it goes there now (it was dropped)
            if tier is self._lowest_local and src is not None and self._offloads_to_remote():
                self._insert(KvTier.EXTERNAL, key, src, src_slot, hits, ops)
            return
        slot = state.take_slot() if tier is KvTier.HOST else NO_SLOT
        state.add(_Entry(key, slot, hits))
        self._touch(state, key)
        if src is not None:
            ops.append(CopyOp(key, src, src_slot, tier, slot))
        self._log_stored(tier, key)
        if (
            tier is self._lowest_local
            and self.config.remote_offload is RemoteOffload.ALL
            and src is not None
        ):
            self._insert(KvTier.EXTERNAL, key, src, src_slot, 0, ops)

    def _evict_one(self, state: _Tier, ops: list[TierOp]) -> bool:
        """Evict `state`'s least recently used unpinned leaf (`_Tier.find_victim`), sending
        it down a tier first."""
        victim = state.find_victim()
        if victim is None:
            return False
        self._remove(state, victim.key.seq_hash)
        below = self._tier_below(state.name, victim)
        if below is not None:
            self._insert(below, victim.key, state.name, victim.slot, victim.num_hits, ops)
        if state.name is KvTier.DISK:
            ops.append(DropOp(victim.key, KvTier.DISK))
        return True

    def _offloads_to_remote(self) -> bool:
        return (
            KvTier.EXTERNAL in self._tiers and self.config.remote_offload is not RemoteOffload.OFF
        )

    def _tier_below(self, tier: KvTier, victim: _Entry) -> KvTier | None:
        """Where a victim of `tier` goes (None: dropped)."""
        if tier is KvTier.HOST and KvTier.DISK in self._tiers:
            reused = victim.num_hits >= MIN_DISK_REUSE_HITS
            if reused or self.config.disk_offload is DiskOffload.ALL:
                return KvTier.DISK
            return None
        if tier is self._lowest_local and self.config.remote_offload is RemoteOffload.EVICTED:
            return KvTier.EXTERNAL
        return None

    def _remove(self, state: _Tier, seq_hash: int) -> _Entry:
        entry = state.pop(seq_hash)
        if state.name is KvTier.HOST:
            state.free_slots.append(entry.slot)
        self._flush()
        self._log.removed([seq_hash], state.name)
        return entry

    def _touch(self, state: _Tier, key: BlockKey) -> None:
        """`key`, stored or served in `state`, is the most recent there now, and is renewed
        again at the end of the call with the call's other blocks, each after its children
        (a prompt's blocks come parents first, which would leave its first block the least
        recent)."""
        state.entries.move_to_end(key.seq_hash)
        self._touched.setdefault(state.name, []).append(key)

    def _renew_touched(self) -> None:
        if not self._touched:
            return
        for tier, keys in self._touched.items():
            self._tiers[tier].renew(keys)
        self._touched = {}

    def _log_stored(self, tier: KvTier, key: BlockKey) -> None:
        if self._pending_tier is not tier:
            self._flush()
            self._pending_tier = tier
        self._pending.append(key)

    def _flush(self) -> None:
        if self._pending and self._pending_tier is not None:
            self._log.stored_keys(self._pending, self._pending_tier)
        self._pending = []
        self._pending_tier = None

    def check_integrity(self) -> None:
        """Assert the policy's invariants (tests and debug builds)."""
        assert not self._pending and not self._touched
        for state in self._tiers.values():
            assert len(state.entries) <= state.capacity, state.name
            parents = [e.key.parent_hash for e in state.entries.values()]
            assert state.num_children == Counter(p for p in parents if p is not None)
            assert all(e.num_pins >= 0 for e in state.entries.values())
            assert all(h == e.key.seq_hash for h, e in state.entries.items())
            if state.name is KvTier.HOST:
                used = [e.slot for e in state.entries.values()]
                assert len(set(used)) == len(used)
                assert state.num_fresh_used <= state.capacity
                assert sorted(used + state.free_slots) == list(range(state.num_fresh_used))
            else:
                assert all(e.slot == NO_SLOT for e in state.entries.values())
