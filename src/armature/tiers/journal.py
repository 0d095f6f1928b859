"""`JournaledStore`: the shared store (G4) learnt incrementally, not listed whole each round.

Every worker sharing a store must learn the blocks the others write there. Listing the whole
store every `--kv-remote-refresh-s` costs each worker one LIST call per 1,000 blocks (S3) or a
scan of the whole directory, every round, however little changed. Instead, each worker's store
keeps a journal beside its blocks:

    writer:  put(block) ──▶ pending names ──flush (each lister round, and at close)──▶
             one journal object `<unix ms>-<writer id>-<seq>.jnl`: the round's block names
    reader:  list the journal objects ──▶ read those not read before ──▶ their blocks' keys

The journal objects are few (each writer deletes its own `retention_s` after writing them;
any reader deletes, best effort, one 2 x `retention_s` older than the median of those listed,
by the store's clock: its writer stopped before deleting it), so a round costs a listing of
them and a read per new one. A reader falls back to the whole listing when its last listing of
the journal began `MAX_GAP_SHARE` x `retention_s` ago or more (objects it never read may be
gone), when a journal object it listed was gone before it read it, and every
`full_listing_s` (blocks written by anything that keeps no journal, or by a worker that died
between a put and its flush). `list_keys` is that whole listing; the journal objects listed
just before it count as read. A round's read state is kept only once it has its keys: a
round that fails is done again. Names go into a journal only after their put succeeded, so a
journal never names a block that was not written; it may name one deleted since (a load then
finds it missing, as with a listing). A writer whose journal writes keep failing keeps at most
`MAX_PENDING_NAMES` names for the next flush, the newest (the others' readers find the rest
at their next whole listing).

On a shared directory the objects' times are the file system's: a writer whose clock runs
2 x `retention_s` behind the others' (where the clients set the times) has its objects swept
as a dead writer's.
"""

from __future__ import annotations

import logging
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from armature.kv.block_key import BlockKey
from armature.tiers.block_file import block_name
from armature.tiers.errors import StoreError
from armature.tiers.store import BlockStore

__all__ = [
    "FULL_LISTING_S",
    "JOURNAL_RETENTION_S",
    "JOURNAL_SUFFIX",
    "MAX_GAP_SHARE",
    "MAX_PENDING_NAMES",
    "JournalObjects",
    "JournaledStore",
    "SharedStore",
]

JOURNAL_RETENTION_S = 600.0  # a writer deletes its journal objects this long after writing
FULL_LISTING_S = 3600.0  # the whole store is listed at least this often
# a reader whose last listing of the journal began this share of the retention ago lists the
# whole store instead (kept below 1: clocks run at slightly different rates)
MAX_GAP_SHARE = 0.75
MAX_PENDING_NAMES = 100_000  # names kept for a journal write that keeps failing (~7 MB)
JOURNAL_SUFFIX = ".jnl"

log = logging.getLogger(__name__)


class JournalObjects(Protocol):
    """A shared store's journal objects: small, named, beside its blocks (not among them:
    `list_keys` never returns one)."""

    def put_journal(self, name: str, data: bytes) -> None:
        """Write journal object `name` whole (a reader never sees part of it). Raises
        StoreError."""
        ...

    def get_journal(self, name: str) -> bytes | None:
        """Journal object `name`'s bytes; None when it is gone. Raises StoreError."""
        ...

    def list_journals(self) -> list[tuple[float, str]]:
        """(modification time by the store's clock in s, name) of every journal object.
        Raises StoreError."""
        ...

    def delete_journal(self, name: str) -> None:
        """Remove journal object `name`; a missing one is not an error. Raises StoreError."""
        ...

    def learn_names(self, names: Iterable[str]) -> list[BlockKey]:
        """The keys of the block names among `names` (others skipped), remembered where their
        blocks are, as a listing would."""
        ...


class SharedStore(BlockStore, JournalObjects, Protocol):
    """A store several workers share: blocks and a journal."""


class JournaledStore:
    """A `BlockStore` over a shared store that journals its own puts and learns the others'
    from their journals (see the module's comment). Thread-safe: puts come from the tier's
    writer thread, flushes and listings from the lister thread, the start and the close (one
    listing at a time)."""

    def __init__(
        self,
        store: SharedStore,
        *,
        retention_s: float = JOURNAL_RETENTION_S,
        full_listing_s: float = FULL_LISTING_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_s: Callable[[], float] = time.time,
        writer_id: str | None = None,
        max_pending_names: int = MAX_PENDING_NAMES,
    ) -> None:
        assert retention_s > 0 and full_listing_s > 0 and max_pending_names > 0
        self.store = store
        self.retention_s = retention_s
        self.full_listing_s = full_listing_s
        self.clock = clock
        self.wall_clock_s = wall_clock_s
        self.writer_id = writer_id or secrets.token_hex(6)
        self.max_pending_names = max_pending_names
        self._lock = threading.Lock()  # the writer's state (pending, written)
        self._listing = threading.Lock()  # one listing at a time (the reader's state)
        self._num_dropped = 0  # names a failing journal write could not keep
        self._pending: list[str] = []  # block names put since the last flush
        self._num_flushed = 0
        self._written: list[tuple[float, str]] = []  # (clock s, name) of our own, oldest first
        self._read: set[str] = set()  # journal objects read (or covered by a whole listing)
        self._last_pass_s: float | None = None  # clock s of the last listing of the journal
        self._last_full_s: float | None = None
        self._must_list_all = False

    # ---- BlockStore ----------------------------------------------------------------------
    def describe(self) -> str:
        return self.store.describe()

    def put(self, key: BlockKey, data: bytes) -> None:
        self.store.put(key, data)
        with self._lock:
            self._pending.append(block_name(key))

    def get(self, seq_hash: int) -> bytes:
        return self.store.get(seq_hash)

    def delete(self, seq_hash: int) -> None:
        self.store.delete(seq_hash)

    def list_keys(self) -> list[BlockKey]:
        """Every block in the store (the whole listing); the journal objects there before it
        count as read."""
        with self._listing:
            return self._list_all()

    def _list_all(self) -> list[BlockKey]:
        started_s = self.clock()
        listed = self.store.list_journals()
        keys = self.store.list_keys()
        self._read = {name for _, name in listed}
        self._last_pass_s = self._last_full_s = started_s
        self._must_list_all = False
        self._sweep_dead(listed)
        return keys

    # ---- the journal -----------------------------------------------------------------------
    def flush_journal(self) -> None:
        """Write the names put since the last flush as one journal object (none: nothing),
        then delete our own objects past the retention. Raises StoreError; the names are
        kept for the next flush."""
        with self._lock:
            names, self._pending = self._pending, []
            seq = self._num_flushed
            self._num_flushed += 1
        if names:
            stamp_ms = int(self.wall_clock_s() * 1000)
            name = f"{stamp_ms:013d}-{self.writer_id}-{seq:08d}{JOURNAL_SUFFIX}"
            try:
                self.store.put_journal(name, "\n".join(names).encode())
            except Exception:
                self._keep_pending(names)
                raise
            with self._lock:
                self._written.append((self.clock(), name))
        self._delete_own_expired()

    def _keep_pending(self, names: list[str]) -> None:
        """`names` back before the names put since, the newest `max_pending_names` of all."""
        with self._lock:
            self._pending[:0] = names
            excess = len(self._pending) - self.max_pending_names
            if excess <= 0:
                return
            del self._pending[:excess]
            first = self._num_dropped == 0
            self._num_dropped += excess
        if first:
            log.warning(
                "the journal of %s cannot be written: names of blocks put there are dropped "
                "beyond the newest %d (other workers find those blocks at their next whole "
                "listing of the store)",
                self.store.describe(),
                self.max_pending_names,
            )

    def list_new_keys(self) -> list[BlockKey]:
        """The blocks other workers journalled since the last call, oldest first; the whole
        listing instead where the journal cannot tell (see the module's comment). Raises
        StoreError."""
        with self._listing:
            return self._list_new()

    def _list_new(self) -> list[BlockKey]:
        started_s = self.clock()
        if (
            self._must_list_all
            or self._last_pass_s is None
            or self._last_full_s is None
            or started_s - self._last_pass_s >= MAX_GAP_SHARE * self.retention_s
            or started_s - self._last_full_s >= self.full_listing_s
        ):
            return self._list_all()
        listed = self.store.list_journals()
        own = f"-{self.writer_id}-"
        names: list[str] = []
        for _, name in sorted(listed):
            if name in self._read or own in name:
                continue
            data = self.store.get_journal(name)
            if data is None:  # deleted before we read it: what it named is not known here
                self._must_list_all = True
                continue
            names += data.decode("utf-8", "replace").split()
        keys = self.store.learn_names(names)
        self._read = {name for _, name in listed}
        self._last_pass_s = started_s
        self._sweep_dead(listed)
        return keys

    def _delete_own_expired(self) -> None:
        """Delete our journal objects past the retention; one that fails is tried again at
        the next flush."""
        now_s = self.clock()
        with self._lock:
            expired = [name for at_s, name in self._written if now_s - at_s >= self.retention_s]
        for name in expired:
            try:
                self.store.delete_journal(name)
            except StoreError as exc:
                log.debug("deleting journal object %s failed: %s", name, exc)
                continue
            with self._lock:
                self._written = [(at_s, n) for at_s, n in self._written if n != name]

    def _sweep_dead(self, listed: list[tuple[float, str]]) -> None:
        """Delete, best effort, journal objects 2 x the retention older than the median of
        those listed (by the store's clock; the median, so that one writer's skewed clock
        does not make the others' look old): their writers stopped without deleting them."""
        if not listed:
            return
        median_s = statistics.median_low(at_s for at_s, _ in listed)
        for at_s, name in listed:
            if median_s - at_s > 2 * self.retention_s:
                try:
                    self.store.delete_journal(name)
                except StoreError as exc:  # no right to delete, a hiccup: another round may
                    log.debug("deleting journal object %s failed: %s", name, exc)
