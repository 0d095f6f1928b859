"""JournaledStore on a shared directory: a reader learns what a writer put from the writer's
journal, not by listing the store (a block put without a journal stays unknown until the
whole listing is due); journal objects expire, a dead writer's are swept; a journal gone before
it was read, or not read for half the retention, makes the next round list everything; a
failed journal write keeps its names. Then two tier managers sharing a directory: the one
that reads learns the other's offloads while both run. (S3: test_s3_store.py.)"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from armature.kv.block_key import BlockKey
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictedBlock
from armature.kv.tier_policy import RemoteOffload, TierPolicy, TierPolicyConfig
from armature.protocols.kv_events import KvTier
from armature.protocols.kv_transfer import KvLayout
from armature.tiers.block_file import block_name
from armature.tiers.disk_store import JOURNAL_DIR, DiskStore
from armature.tiers.errors import StoreUnavailableError
from armature.tiers.journal import MAX_GAP_SHARE, JournaledStore
from armature.tiers.manager import KvTierManager

Block = Callable[[int], tuple[BlockKey, bytes]]
NS = "model-0123456789ab"
RETENTION_S = 100.0
WRITER, READER = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


class EncodingMover:
    """Encodes a G1 block as a few bytes; nothing else is asked of it here."""

    layout = KvLayout(num_layers=2, block_size=4, num_kv_heads=1, head_dim=2, dtype="float16")

    def encode(self, tier: KvTier, slot: int, key: BlockKey) -> bytes:
        return key.seq_hash.to_bytes(8, "little")


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def journaled(
    root: Path, writer_id: str, clock: Clock, store: DiskStore | None = None
) -> JournaledStore:
    return JournaledStore(
        store or DiskStore(root, NS),
        retention_s=RETENTION_S,
        full_listing_s=10 * RETENTION_S,
        clock=clock,
        wall_clock_s=lambda: 1_700_000_000.5,
        writer_id=writer_id,
    )


def journal_names(root: Path) -> list[str]:
    directory = root / NS / JOURNAL_DIR
    return sorted(os.listdir(directory)) if directory.is_dir() else []


def test_a_reader_learns_a_writers_puts_from_its_journal_not_from_a_listing(
    tmp_path: Path, block: Block
) -> None:
    clock = Clock()
    writer, reader = journaled(tmp_path, WRITER, clock), journaled(tmp_path, READER, clock)
    assert reader.list_keys() == writer.list_keys() == []  # the whole listing, at start
    (k0, d0), (k1, d1), (k2, d2) = block(0), block(1), block(2)
    writer.put(k0, d0)
    writer.put(k1, d1)
    DiskStore(tmp_path, NS).put(k2, d2)  # a block no journal names
    writer.flush_journal()
    name = f"1700000000500-{WRITER}-00000000.jnl"
    assert journal_names(tmp_path) == [name]
    assert (tmp_path / NS / JOURNAL_DIR / name).read_text() == (
        f"{block_name(k0)}\n{block_name(k1)}"
    )
    clock.now_s = 10.0
    assert reader.list_new_keys() == [k0, k1]  # not k2: the store was not listed
    assert reader.get(k1.seq_hash) == d1
    assert reader.list_new_keys() == []  # each journal object is read once
    writer.flush_journal()  # nothing put since: no object
    assert journal_names(tmp_path) == [name]
    assert writer.list_new_keys() == []  # its own journal is not read back
    clock.now_s = 10.0 + MAX_GAP_SHARE * RETENTION_S  # its objects may be gone: list it all
    assert sorted(reader.list_new_keys()) == [k0, k1, k2]
    assert reader.list_new_keys() == []


def test_the_whole_store_is_listed_every_full_listing_interval(
    tmp_path: Path, block: Block
) -> None:
    clock = Clock()
    reader = journaled(tmp_path, READER, clock)
    assert reader.list_keys() == []
    k0, d0 = block(0)
    DiskStore(tmp_path, NS).put(k0, d0)
    for step in range(1, 20):  # rounds of 10 % of the retention: the journal is read
        clock.now_s = step * RETENTION_S / 10
        assert reader.list_new_keys() == []
    clock.now_s = 10 * RETENTION_S  # the full listing's interval since the first one
    assert reader.list_new_keys() == [k0]


def test_own_objects_expire_and_a_dead_writers_are_swept(tmp_path: Path, block: Block) -> None:
    clock = Clock()
    writer, reader = journaled(tmp_path, WRITER, clock), journaled(tmp_path, READER, clock)
    reader.list_keys()
    writer.put(*block(0))
    writer.flush_journal()  # seq 0 at 0 s
    assert reader.list_new_keys() == [block(0)[0]]
    clock.now_s = 45.0
    assert reader.list_new_keys() == []
    clock.now_s = 90.0
    writer.put(*block(1))
    writer.flush_journal()  # seq 1 at 90 s; seq 0 not expired yet
    assert [n.split("-")[2] for n in journal_names(tmp_path)] == ["00000000.jnl", "00000001.jnl"]
    assert reader.list_new_keys() == [block(1)[0]]
    clock.now_s = RETENTION_S
    writer.flush_journal()  # nothing to write; seq 0 expired
    assert journal_names(tmp_path) == [f"1700000000500-{WRITER}-00000001.jnl"]
    other = journaled(tmp_path, "dddddddddddd", clock)
    other.put(*block(3))
    other.flush_journal()
    # a writer that died without deleting its object: 2 x the retention older than the
    # median of the objects listed
    dead = tmp_path / NS / JOURNAL_DIR / f"1600000000000-{'c' * 12}-00000007.jnl"
    dead.write_text(block_name(block(2)[0]))
    live_s = (tmp_path / NS / JOURNAL_DIR / journal_names(tmp_path)[0]).stat().st_mtime
    os.utime(dead, (live_s - 2 * RETENTION_S - 1, live_s - 2 * RETENTION_S - 1))
    assert reader.list_new_keys() == [block(2)[0], block(3)[0]]  # read (oldest first), swept
    assert journal_names(tmp_path) == [
        f"1700000000500-{WRITER}-00000001.jnl",
        "1700000000500-dddddddddddd-00000000.jnl",
    ]


class LosingStore(DiskStore):
    """A shared directory whose journal objects are deleted (a writer's expiry) between the
    reader's listing of them and its read."""

    def get_journal(self, name: str) -> bytes | None:
        self.delete_journal(name)
        return super().get_journal(name)


def test_a_journal_object_gone_before_its_read_makes_the_next_round_list_everything(
    tmp_path: Path, block: Block
) -> None:
    clock = Clock()
    writer = journaled(tmp_path, WRITER, clock)
    reader = journaled(tmp_path, READER, clock, LosingStore(tmp_path, NS))
    reader.list_keys()
    writer.put(*block(0))
    writer.flush_journal()
    assert reader.list_new_keys() == []  # its journal was gone
    assert reader.list_new_keys() == [block(0)[0]]  # so the store was listed


class FailingJournal(DiskStore):
    """A shared directory whose first journal write fails."""

    num_failures = 1

    def put_journal(self, name: str, data: bytes) -> None:
        if self.num_failures:
            self.num_failures -= 1
            raise StoreUnavailableError("a shared directory: unavailable")
        super().put_journal(name, data)


def test_a_failed_journal_write_keeps_its_names_for_the_next_flush(
    tmp_path: Path, block: Block
) -> None:
    clock = Clock()
    writer = journaled(tmp_path, WRITER, clock, FailingJournal(tmp_path, NS))
    reader = journaled(tmp_path, READER, clock)
    reader.list_keys()
    writer.put(*block(0))
    try:
        writer.flush_journal()
        raise AssertionError("the journal write did not fail")
    except StoreUnavailableError:
        pass
    assert journal_names(tmp_path) == []
    writer.put(*block(1))
    writer.flush_journal()
    assert journal_names(tmp_path) == [f"1700000000500-{WRITER}-00000001.jnl"]
    assert reader.list_new_keys() == [block(0)[0], block(1)[0]]


class NoDeletes(DiskStore):
    """A shared directory where journal objects cannot be deleted (a bucket policy without
    delete, an outage) until `deletes` is set."""

    deletes = False

    def delete_journal(self, name: str) -> None:
        if not self.deletes:
            raise StoreUnavailableError("a shared directory: delete refused")
        super().delete_journal(name)


def test_failing_deletes_lose_no_names_and_are_tried_again(tmp_path: Path, block: Block) -> None:
    clock = Clock()
    store = NoDeletes(tmp_path, NS)
    writer = journaled(tmp_path, WRITER, clock, store)
    reader = journaled(tmp_path, READER, clock, NoDeletes(tmp_path, NS))
    reader.list_keys()
    writer.put(*block(0))
    writer.flush_journal()
    dead = tmp_path / NS / JOURNAL_DIR / f"1600000000000-{'c' * 12}-00000007.jnl"
    dead.write_text(block_name(block(2)[0]))
    live_s = (tmp_path / NS / JOURNAL_DIR / journal_names(tmp_path)[-1]).stat().st_mtime
    os.utime(dead, (live_s - 3 * RETENTION_S, live_s - 3 * RETENTION_S))
    clock.now_s = RETENTION_S / 2  # the reader's sweep fails, and so the writer's expiry
    assert reader.list_new_keys() == [block(2)[0], block(0)[0]]
    writer.put(*block(1))
    clock.now_s = RETENTION_S
    writer.flush_journal()  # its first object expired: the delete fails, the flush does not
    assert reader.list_new_keys() == [block(1)[0]]
    assert len(journal_names(tmp_path)) == 3
    store.deletes = True
    writer.flush_journal()  # the expiry tried again
    assert journal_names(tmp_path) == [dead.name, f"1700000000500-{WRITER}-00000001.jnl"]


class FlakyJournalReads(DiskStore):
    """A shared directory whose journal reads fail while `failing` is set."""

    failing = False

    def get_journal(self, name: str) -> bytes | None:
        if self.failing:
            raise StoreUnavailableError("a shared directory: read timed out")
        return super().get_journal(name)


def test_a_round_that_fails_is_done_again(tmp_path: Path, block: Block) -> None:
    clock = Clock()
    writer = journaled(tmp_path, WRITER, clock)
    store = FlakyJournalReads(tmp_path, NS)
    reader = journaled(tmp_path, READER, clock, store)
    reader.list_keys()
    writer.put(*block(0))
    writer.flush_journal()
    store.failing = True
    try:
        reader.list_new_keys()
        raise AssertionError("the journal read did not fail")
    except StoreUnavailableError:
        pass
    store.failing = False
    assert reader.list_new_keys() == [block(0)[0]]


def test_a_journal_that_cannot_be_written_keeps_the_newest_names(
    tmp_path: Path, block: Block
) -> None:
    clock = Clock()
    store = FailingJournal(tmp_path, NS)
    store.num_failures = 3
    writer = JournaledStore(
        store, clock=clock, wall_clock_s=lambda: 1_700_000_000.0, max_pending_names=3
    )
    reader = journaled(tmp_path, READER, clock)
    reader.list_keys()
    writer.put(*block(0))
    for i in range(1, 4):
        writer.put(*block(i))
        try:
            writer.flush_journal()  # the third failure holds four names: the oldest goes
            raise AssertionError("the journal write did not fail")
        except StoreUnavailableError:
            pass
    writer.flush_journal()
    assert reader.list_new_keys() == [block(i)[0] for i in (1, 2, 3)]


def test_one_writers_clock_ahead_does_not_sweep_the_others(tmp_path: Path, block: Block) -> None:
    clock = Clock()
    reader = journaled(tmp_path, READER, clock)
    reader.list_keys()
    for i, writer_id in enumerate(("aaaaaaaaaaaa", "dddddddddddd", "eeeeeeeeeeee")):
        writer = journaled(tmp_path, writer_id, clock)
        writer.put(*block(i))
        writer.flush_journal()
    ahead = tmp_path / NS / JOURNAL_DIR / journal_names(tmp_path)[2]
    ahead_s = ahead.stat().st_mtime + 2 * RETENTION_S + 10
    os.utime(ahead, (ahead_s, ahead_s))  # its client's clock 20 minutes ahead
    assert sorted(reader.list_new_keys()) == [block(i)[0] for i in range(3)]
    assert len(journal_names(tmp_path)) == 3  # the two others not taken for dead


def remote_manager(root: Path, offload: RemoteOffload) -> KvTierManager:
    config = TierPolicyConfig(has_remote=True, num_remote_index_blocks=64, remote_offload=offload)
    return KvTierManager(
        TierPolicy(config, KvEventLog()),
        EncodingMover(),  # type: ignore[arg-type]
        {KvTier.EXTERNAL: JournaledStore(DiskStore(root, NS))},
        max_inflight_bytes=1 << 20,
        remote_refresh_s=0.01,
    )


def test_a_running_manager_learns_what_another_running_one_offloaded(tmp_path: Path) -> None:
    writer = remote_manager(tmp_path, RemoteOffload.ALL)
    reader = remote_manager(tmp_path, RemoteOffload.OFF)
    writer.on_evict([EvictedBlock(i, 0x100 + i, 0x200 + i, None) for i in range(3)])
    writer.flush()  # in the store; its journal is written by its lister's next round
    deadline_s = time.monotonic() + 30
    while len(reader.policy.get_keys(KvTier.EXTERNAL)) < 3:
        assert time.monotonic() < deadline_s, "the reader never learnt the writer's blocks"
        reader.take_finished()
        time.sleep(0.01)
    assert sorted(k.seq_hash for k in reader.policy.get_keys(KvTier.EXTERNAL)) == [
        0x100,
        0x101,
        0x102,
    ]
    assert journal_names(tmp_path)  # learnt from a journal object
    writer.close()
    reader.close()
