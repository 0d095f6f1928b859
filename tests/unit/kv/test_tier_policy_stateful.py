"""TierPolicy against a naive model of the tiers (plain lists in LRU order) over random runs.

Three checks after every step:
- each tier holds exactly the blocks, in the LRU order, that the naive model says;
- the ops, executed in order on a simulated storage (G1 blocks, host slots, disk and store
  sets), always read a location that holds the block named, and leave each host slot and the
  disk holding exactly what the policy thinks;
- replaying the Stored/Removed events gives each tier's contents.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from armature.kv.block_key import BlockKey
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import (
    MIN_DISK_REUSE_HITS,
    CopyOp,
    DiskOffload,
    DropOp,
    OffloadMode,
    RemoteOffload,
    TierHit,
    TierOp,
    TierPolicy,
    TierPolicyConfig,
)
from armature.protocols.kv_events import KvRemoved, KvStored, KvTier

D, H, S, X = KvTier.DEVICE, KvTier.HOST, KvTier.DISK, KvTier.EXTERNAL
HASHES = list(range(10))


def key(i: int) -> BlockKey:
    return BlockKey(i, 1000 + i, None)


@dataclass
class NaiveEntry:
    key: BlockKey
    hits: int
    pins: int = 0
    refused: bool = False


class NaiveTiers:
    """The tier rules written the plain way: one list per tier, least recent first."""

    def __init__(self, cfg: TierPolicyConfig):
        self.cfg = cfg
        self.cap = {H: cfg.num_host_blocks, S: cfg.num_disk_blocks}
        if cfg.has_remote:
            self.cap[X] = cfg.num_remote_index_blocks
        self.tiers: dict[KvTier, list[NaiveEntry]] = {t: [] for t, c in self.cap.items() if c}
        self.writable = dict.fromkeys(self.tiers, True)
        local = [t for t in (H, S) if t in self.tiers]
        self.first = local[0] if local else None
        self.lowest = local[-1] if local else None

    def get(self, tier: KvTier, h: int) -> NaiveEntry | None:
        return next((e for e in self.tiers.get(tier, []) if e.key.seq_hash == h), None)

    def insert(self, tier: KvTier, k: BlockKey, copied: bool, hits: int, force: bool = False):
        entries = self.tiers[tier]
        e = self.get(tier, k.seq_hash)
        if e is not None and not e.refused:
            e.hits += hits
            entries.remove(e)
            entries.append(e)
            return
        if e is not None or (not self.writable[tier] and not force):
            return
        if len(entries) >= self.cap[tier]:
            unpinned = [v for v in entries if v.pins == 0]
            if not unpinned:  # all pinned: what the lowest local tier passes on goes on now
                remote = X in self.tiers and self.cfg.remote_offload is not RemoteOffload.OFF
                if tier is self.lowest and copied and remote:
                    self.insert(X, k, True, hits)
                return
            victim = unpinned[0]
            entries.remove(victim)
            below = None
            if tier is H and S in self.tiers:
                if victim.hits >= MIN_DISK_REUSE_HITS or self.cfg.disk_offload is DiskOffload.ALL:
                    below = S
            elif tier is self.lowest and self.cfg.remote_offload is RemoteOffload.EVICTED:
                below = X
            if below is not None:
                self.insert(below, victim.key, True, victim.hits)
        entries.append(NaiveEntry(k, hits))
        if tier is self.lowest and self.cfg.remote_offload is RemoteOffload.ALL and copied:
            self.insert(X, k, True, 0)

    def below_device(self, k: BlockKey, hits: int) -> None:
        if self.first is not None:
            self.insert(self.first, k, True, hits)
        elif self.cfg.remote_offload is not RemoteOffload.OFF:
            self.insert(X, k, True, hits)

    def find(self, hashes: list[int]) -> list[tuple[int, KvTier]]:
        out = []
        for h in hashes:
            tier = next(
                (t for t in (H, S, X) if (e := self.get(t, h)) is not None and not e.refused),
                None,
            )
            if tier is None:
                break
            out.append((h, tier))
        return out

    def release(self, tier: KvTier, h: int, loaded: bool) -> None:
        e = self.get(tier, h)
        assert e is not None
        if loaded and not e.refused:
            e.hits += 1
            self.tiers[tier].remove(e)
            self.tiers[tier].append(e)
        e.pins -= 1
        if e.refused and e.pins == 0:
            self.tiers[tier].remove(e)


class Storage:
    """Where the bytes would be: executes ops and checks that each reads what it names."""

    def __init__(self) -> None:
        self.device: dict[int, BlockKey] = {}
        self.host: dict[int, BlockKey] = {}
        self.disk: set[BlockKey] = set()
        self.store: set[BlockKey] = set()
        self.failed: set[BlockKey] = set()  # disk writes that never landed

    def holds(self, tier: KvTier, slot: int, k: BlockKey) -> bool:
        if tier is D:
            return self.device.get(slot) == k
        if tier is H:
            return self.host.get(slot) == k
        return k in (self.disk if tier is S else self.store)

    def run(self, ops: list[TierOp]) -> None:
        for op in ops:
            if isinstance(op, DropOp):
                assert op.tier is S and (op.key in self.disk or op.key in self.failed), op
                self.disk.discard(op.key)
                continue
            assert isinstance(op, CopyOp)
            assert self.holds(op.src, op.src_slot, op.key), op
            if op.dst is H:
                self.host[op.dst_slot] = op.key
            elif op.dst is S:
                self.disk.add(op.key)
            else:
                self.store.add(op.key)


configs = st.builds(
    TierPolicyConfig,
    num_host_blocks=st.integers(0, 3),
    num_disk_blocks=st.integers(0, 3),
    has_remote=st.booleans(),
    num_remote_index_blocks=st.integers(1, 4),
    offload=st.sampled_from(OffloadMode),
    disk_offload=st.sampled_from(DiskOffload),
    remote_offload=st.sampled_from(RemoteOffload),
)


class TierMachine(RuleBasedStateMachine):
    @initialize(cfg=configs)
    def setup(self, cfg: TierPolicyConfig) -> None:
        if not cfg.has_remote and cfg.remote_offload is not RemoteOffload.OFF:
            cfg = TierPolicyConfig(**{**cfg.__dict__, "remote_offload": RemoteOffload.OFF})
        self.log = KvEventLog()
        self.policy = TierPolicy(cfg, self.log)
        self.model = NaiveTiers(cfg)
        self.storage = Storage()
        self.inflight: list[list[TierHit]] = []
        self.next_block_id = 0
        self.seen: dict[KvTier, set[int]] = {t: set() for t in (H, S, X)}

    def _g1_block(self, h: int) -> int:
        block_id = self.next_block_id
        self.next_block_id += 1
        self.storage.device[block_id] = key(h)
        return block_id

    @rule(
        hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=3, unique=True),
        hits=st.integers(0, 3),
    )
    def evict(self, hashes: list[int], hits: int) -> None:
        blocks = [EvictedBlock(self._g1_block(h), h, 1000 + h, None, hits) for h in hashes]
        self.storage.run(self.policy.on_evict(blocks))
        for h in hashes:
            self.model.below_device(key(h), hits)

    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=3, unique=True))
    def write(self, hashes: list[int]) -> None:
        blocks = [(self._g1_block(h), key(h)) for h in hashes]
        self.storage.run(self.policy.on_written(blocks))
        if self.model.cfg.offload is OffloadMode.WRITE_THROUGH:
            for h in hashes:
                self.model.below_device(key(h), 0)

    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=4, unique=True))
    def start_onboard(self, hashes: list[int]) -> None:
        hits = self.policy.find(hashes)
        assert [(hit.key.seq_hash, hit.tier) for hit in hits] == self.model.find(hashes)
        for hit in hits:
            assert self.storage.holds(hit.tier, hit.slot, hit.key), hit
        if hits:
            self.policy.pin(hits)
            for hit in hits:
                entry = self.model.get(hit.tier, hit.key.seq_hash)
                assert entry is not None
                entry.pins += 1
            self.inflight.append(hits)

    @precondition(lambda self: bool(self.inflight))
    @rule(index=st.integers(0, 10), num_ok=st.integers(0, 4))
    def finish_onboard(self, index: int, num_ok: int) -> None:
        """The first num_ok blocks loaded; the next one is refused; the rest are unpinned."""
        hits = self.inflight.pop(index % len(self.inflight))
        ok, rest = hits[:num_ok], hits[num_ok:]
        self.storage.run(self.policy.on_onboarded(ok))
        for hit in ok:
            self.model.release(hit.tier, hit.key.seq_hash, loaded=True)
        if rest:
            self.storage.run(self.policy.refuse(rest[0]))
            bad = self.model.get(rest[0].tier, rest[0].key.seq_hash)
            assert bad is not None
            bad.refused = True
            self.model.release(rest[0].tier, rest[0].key.seq_hash, loaded=False)
            self.storage.run(self.policy.unpin(rest[1:]))
            for hit in rest[1:]:
                self.model.release(hit.tier, hit.key.seq_hash, loaded=False)

    @rule(tier=st.sampled_from([S, X]), h=st.sampled_from(HASHES), disable=st.booleans())
    def write_fails(self, tier: KvTier, h: int, disable: bool) -> None:
        if tier not in self.model.tiers:
            return
        self.policy.on_write_failed(tier, h, disable=disable)
        entry = self.model.get(tier, h)
        if entry is not None:
            if entry.pins == 0:
                self.model.tiers[tier].remove(entry)
            else:
                entry.refused = True
        if disable:
            self.model.writable[tier] = False
        if tier is S and key(h) in self.storage.disk:  # the write never landed
            self.storage.disk.discard(key(h))
            self.storage.failed.add(key(h))

    @rule(
        tier=st.sampled_from([S, X]),
        hashes=st.lists(st.sampled_from(HASHES), max_size=3, unique=True),
    )
    def found_existing(self, tier: KvTier, hashes: list[int]) -> None:
        if tier not in self.model.tiers:
            return
        keys = [key(h) for h in hashes]
        (self.storage.disk if tier is S else self.storage.store).update(keys)
        self.storage.run(self.policy.add_existing(tier, keys))
        new = [k for k in keys if self.model.get(tier, k.seq_hash) is None]
        if tier is X:  # a shared store's listing only fills the room left
            new = new[: max(0, self.model.cap[X] - len(self.model.tiers[X]))]
        for k in new:
            self.model.insert(tier, k, False, 0, force=True)

    @invariant()
    def same_as_the_model(self) -> None:
        for tier in (H, S, X):
            expected = [e.key for e in self.model.tiers.get(tier, [])]
            assert self.policy.get_keys(tier) == expected, tier

    @invariant()
    def storage_matches(self) -> None:
        self.policy.check_integrity()
        for k in self.policy.get_keys(H):
            slot = self.policy.get_slot(H, k.seq_hash)
            assert slot is not None and self.storage.host.get(slot) == k
        on_disk = {e.key for e in self.model.tiers.get(S, []) if not e.refused}
        assert on_disk <= self.storage.disk

    @invariant()
    def events_replay_to_the_contents(self) -> None:
        for event in self.log.take():
            if isinstance(event, KvStored):
                self.seen[event.tier].update(b.seq_hash for b in event.blocks)
            elif isinstance(event, KvRemoved):
                assert set(event.seq_hashes) <= self.seen[event.tier]
                self.seen[event.tier].difference_update(event.seq_hashes)
        for tier in (H, S, X):
            assert self.seen[tier] == {k.seq_hash for k in self.policy.get_keys(tier)}, tier


TierMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=40, deadline=None)
test_tier_policy_matches_the_naive_model = TierMachine.TestCase
