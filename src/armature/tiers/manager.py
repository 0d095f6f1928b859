"""KvTierManager: the KV block manager's shell around the pure `TierPolicy`. It makes the copies
the policy asks for and loads blocks back into the engine's cache off the engine's thread.

    engine thread:  pool evicts ──on_evict──▶ policy ──ops──▶ host copies (now)
                                                          └─▶ encoded blocks ──▶ one writer
                                                              thread per store (FIFO)
                    scheduler ──reserve/submit──▶ loader threads ──▶ G1 blocks
                    step ◀──take_finished── results; write failures ──▶ policy

Every policy call happens on the engine thread. Writers and loaders only move bytes and
report back through queues. A block waiting to be written stays readable from memory
(`_pending`) until its store has it. A full or unreachable store disables that tier's writes
with one log line; reads of what it holds go on. A read that fails for the store (unreachable,
timed out) turns the tier's reads off for READS_OFF_S, doubling while they keep failing (each
read of a hung store cost a request the store's whole timeout): one log line, and again when
they come back. A block that fails its checks on load is refused: the policy forgets it and the
blocks of its tier after it in the prompt (reached only through it, they are stored again with
the prompt's rest, computed), and the count says why.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from armature.kv.block_key import BlockKey
from armature.kv.tier_policy import LOWER_TIERS, CopyOp, DropOp, TierHit, TierOp, TierPolicy
from armature.protocols.kv_events import KvTier
from armature.tiers.api import LoadResult
from armature.tiers.block_file import BlockRefusedError
from armature.tiers.errors import BlockMissingError, StoreError, StoreFullError
from armature.tiers.journal import JournaledStore
from armature.tiers.mover import BlockMover
from armature.tiers.policy_shell import TierPolicyShell
from armature.tiers.store import BlockStore

__all__ = ["KvTierManager"]

log = logging.getLogger(__name__)

READ_AHEAD_BLOCKS = 32  # stored blocks a load reads at once
READS_OFF_S = 10.0  # a tier's reads off after its store failed one; doubles while it fails
MAX_READS_OFF_S = 300.0
NUM_READER_THREADS = 8  # parallel reads of stored blocks (disk and store I/O overlap)


def _failure(exc: BlockRefusedError | StoreError) -> str:
    """Why a block did not load, as counted in `blocks_refused`."""
    if isinstance(exc, BlockRefusedError):
        return str(exc.reason)
    return "missing" if isinstance(exc, BlockMissingError) else "unavailable"


class KvTierManager(TierPolicyShell):
    """`KvTiers` that move real bytes (see the module docstring)."""

    def __init__(
        self,
        policy: TierPolicy,
        mover: BlockMover,
        stores: dict[KvTier, BlockStore],
        *,
        max_inflight_bytes: int,
        num_loader_threads: int = 2,
        remote_refresh_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`remote_refresh_s`: how often the shared store's (G4) journal is written and read
        for blocks other workers wrote (None: only at start; `armature.tiers.journal`).
        `clock` times the pauses of a failing tier's reads."""
        super().__init__(
            policy,
            bytes_per_block=mover.layout.bytes_per_block,
            max_inflight_bytes=max_inflight_bytes,
        )
        self.mover = mover
        self.stores = stores
        self._writers = {
            tier: ThreadPoolExecutor(1, thread_name_prefix=f"armature-kv-{tier}") for tier in stores
        }
        self._loaders = ThreadPoolExecutor(num_loader_threads, "armature-kv-load")
        self._readers = ThreadPoolExecutor(NUM_READER_THREADS, "armature-kv-read")
        self._pending: dict[KvTier, dict[int, bytes]] = {tier: {} for tier in stores}
        self._pending_lock = threading.Lock()
        self._failures: queue.SimpleQueue[tuple[KvTier, int, Exception]] = queue.SimpleQueue()
        self._writes_off: set[KvTier] = set()  # writer threads: tiers that failed a write
        self._finished: queue.SimpleQueue[LoadResult] = queue.SimpleQueue()
        self._load_done = threading.Event()
        self._num_inflight = 0
        self._listings: queue.SimpleQueue[list[BlockKey]] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._lister: threading.Thread | None = None
        # engine thread: tiers whose reads are off until a monotonic time, and the next wait
        self.clock = clock
        self._reads_off_until: dict[KvTier, float] = {}
        self._reads_off_s: dict[KvTier, float] = {}
        self._off_after_job: dict[KvTier, int] = {}  # the last job submitted when it went off
        self._last_job_id = -1  # job ids count up from 0
        if remote_refresh_s is not None and KvTier.EXTERNAL in stores:
            self._lister = threading.Thread(
                target=self._list_remote,
                args=(stores[KvTier.EXTERNAL], remote_refresh_s),
                name="armature-kv-list",
                daemon=True,
            )
            self._lister.start()

    # ---- onboarding (engine thread; find/reserve: TierPolicyShell) ----------------------
    def submit(self, hits: list[TierHit], g1_ids: list[int]) -> int:
        """Load reserved `hits` into `g1_ids` on a loader thread; returns the job id that
        `take_finished` reports."""
        assert len(hits) == len(g1_ids)
        self._last_job_id += 1
        job_id = self._last_job_id
        self._inflight_bytes += len(hits) * self.bytes_per_block
        self._num_inflight += 1
        self._loaders.submit(self._load, job_id, hits, g1_ids, time.perf_counter())
        return job_id

    def get_num_inflight(self) -> int:
        return self._num_inflight

    def wait_for_loads(self, timeout_s: float) -> None:
        """Block until a load finishes (or `timeout_s`): an engine with nothing else to do."""
        if self._load_done.wait(timeout_s):
            self._load_done.clear()

    def take_finished(self) -> list[LoadResult]:
        """Settle finished loads, failed writes and new listings of the shared store with the
        policy; the load results, oldest first."""
        self._settle_write_failures()
        self._take_listings()
        self._turn_reads_back_on()
        results: list[LoadResult] = []
        while True:
            try:
                result = self._finished.get_nowait()
            except queue.Empty:
                break
            self._num_inflight -= 1
            self._inflight_bytes -= len(result.hits) * self.bytes_per_block
            self._settle(result)
            results.append(result)
        return results

    def _settle(self, result: LoadResult) -> None:
        loaded = result.hits[: result.num_loaded]
        tier_load_s = result.tier_load_s if result.failure is None else None
        ops = self._onboarded(loaded, result.elapsed_s, tier_load_s)
        rest = result.hits[result.num_loaded :]
        failed = rest[0].tier if rest and result.failure == "unavailable" else None
        for tier in {hit.tier for hit in loaded} - {failed}:  # they answer: reset the pause
            self._reads_off_s.pop(tier, None)
        if rest:
            assert result.failure is not None
            self.counters.blocks_refused[result.failure] += 1
            if failed is not None:  # the store, not the block: try it later
                ops += self.policy.unpin(rest)
                # a load begun before the tier's reads last went off found it as it was then
                if result.job_id > self._off_after_job.get(failed, -1):
                    self._turn_reads_off(failed, result.error)
            else:
                log.warning(
                    "KV block %016x from %s refused (%s); computing it instead",
                    rest[0].key.seq_hash,
                    rest[0].tier,
                    result.failure,
                )
                ops += self.policy.refuse(rest[0])
                # the tier's blocks after it are reached only through it: forgotten too, they
                # are stored again with the prompt's recomputed rest, so that a run of bad
                # blocks heals in one request (it healed one a request)
                later = rest[1:]
                for hit in later:
                    if hit.tier is rest[0].tier:
                        ops += self.policy.refuse(hit)
                ops += self.policy.unpin([hit for hit in later if hit.tier is not rest[0].tier])
        self._run(ops)

    def _turn_reads_off(self, tier: KvTier, why: str | None) -> None:
        if tier in self._reads_off_until:  # loads begun before it was turned off
            return
        wait_s = self._reads_off_s.get(tier, READS_OFF_S)
        self._off_after_job[tier] = self._last_job_id
        self._reads_off_until[tier] = self.clock() + wait_s
        self._reads_off_s[tier] = min(MAX_READS_OFF_S, wait_s * 2)
        self.policy.set_readable(tier, False)
        log.warning(
            "KV %s tier: reading %s failed (%s); not read for %g s, its blocks computed instead",
            tier,
            self.stores[tier].describe(),
            why,
            wait_s,
        )

    def _turn_reads_back_on(self) -> None:
        now_s = self.clock()
        for tier, until_s in list(self._reads_off_until.items()):
            if now_s >= until_s:
                del self._reads_off_until[tier]
                self.policy.set_readable(tier, True)
                log.info("KV %s tier: reading %s again", tier, self.stores[tier].describe())

    def _settle_write_failures(self) -> None:
        while True:
            try:
                tier, seq_hash, exc = self._failures.get_nowait()
            except queue.Empty:
                return
            self.counters.write_failures[tier] += 1
            if self.policy.is_writable(tier):
                what = "full" if isinstance(exc, StoreFullError) else "unavailable"
                log.warning("KV %s tier %s: its writes are off from now on (%s)", tier, what, exc)
            self.policy.on_write_failed(tier, seq_hash, disable=True)

    def _take_listings(self) -> None:
        while True:
            try:
                keys = self._listings.get_nowait()
            except queue.Empty:
                return
            self.add_existing(KvTier.EXTERNAL, keys)

    def _list_remote(self, store: BlockStore, every_s: float) -> None:
        """Lister thread, every `every_s`: our puts to the shared store into its journal, and
        what the others put there (journalled, or the whole store where it keeps none), for
        the engine thread."""
        while not self._closing.wait(every_s):
            self._flush_journal()
            try:
                if isinstance(store, JournaledStore):
                    self._listings.put(store.list_new_keys())
                else:
                    self._listings.put(store.list_keys())
            except StoreError as exc:
                log.debug("listing %s failed: %s", store.describe(), exc)
            except Exception:  # a store client's own bug: the next round may do better
                log.exception("listing %s failed unexpectedly", store.describe())

    def _flush_journal(self) -> None:
        """Our puts to the shared store since the last flush into its journal, if it keeps
        one (a failure keeps them for the next flush)."""
        store = self.stores.get(KvTier.EXTERNAL)
        if not isinstance(store, JournaledStore):
            return
        try:
            store.flush_journal()
        except StoreError as exc:
            log.debug("writing the journal of %s failed: %s", store.describe(), exc)
        except Exception:  # a store client's own bug: the next round may do better
            log.exception("writing the journal of %s failed unexpectedly", store.describe())

    # ---- loader threads ----------------------------------------------------------------
    def _load(self, job_id: int, hits: list[TierHit], g1_ids: list[int], started_s: float) -> None:
        num_loaded, failure, error = 0, None, None
        tier_load_s: dict[KvTier, float] = {}
        try:
            while num_loaded < len(hits) and failure is None:
                tier, run_started_s = hits[num_loaded].tier, time.perf_counter()
                num_done, failure, error = self._load_run(hits, g1_ids, num_loaded)
                num_loaded += num_done
                tier_load_s[tier] = tier_load_s.get(tier, 0.0) + time.perf_counter() - run_started_s
        except Exception:  # a bug must not leave its request waiting forever
            log.exception("loading KV blocks failed")
            failure = "error"
        try:
            wait_started_s = time.perf_counter()
            self.mover.finish_loads()
            waited_s = time.perf_counter() - wait_started_s
            for hit in hits[:num_loaded]:  # copies in cost the same per block from any tier
                tier_load_s[hit.tier] += waited_s / num_loaded
        finally:
            elapsed_s = time.perf_counter() - started_s
            result = LoadResult(
                job_id, hits, g1_ids, num_loaded, failure, elapsed_s, tier_load_s, error
            )
            self._finished.put(result)
            self._load_done.set()

    def _load_run(
        self, hits: list[TierHit], g1_ids: list[int], start: int
    ) -> tuple[int, str | None, str | None]:
        """Load hits[start] and the hits of the same tier after it: host blocks as one copy,
        stored ones up to READ_AHEAD_BLOCKS at a time, read in parallel and applied in order.
        Returns how many loaded, why the next one did not (None: it was not tried) and what
        the store or the check said."""
        tier = hits[start].tier
        end = start
        while end < len(hits) and hits[end].tier is tier:
            end += 1
        if tier is KvTier.HOST:
            self.mover.load_from_host([h.slot for h in hits[start:end]], g1_ids[start:end])
            return end - start, None, None
        run = hits[start : min(end, start + READ_AHEAD_BLOCKS)]
        reads = [self._readers.submit(self._read, tier, h.key.seq_hash) for h in run]
        for i, (hit, read) in enumerate(zip(run, reads, strict=True)):
            try:
                self.mover.load_encoded(read.result(), hit.key.seq_hash, g1_ids[start + i])
            except (BlockRefusedError, StoreError) as exc:
                for later in reads[i + 1 :]:
                    later.cancel()
                return i, _failure(exc), str(exc)
        return len(run), None, None

    def _read(self, tier: KvTier, seq_hash: int) -> bytes:
        with self._pending_lock:
            data = self._pending[tier].get(seq_hash)
        return data if data is not None else self.stores[tier].get(seq_hash)

    # ---- executing the policy's ops (engine thread) ------------------------------------
    def _run(self, ops: list[TierOp]) -> None:
        """Execute `ops` in order; consecutive host copies of one kind go as one batch."""
        batch: list[CopyOp] = []
        for op in ops:
            if isinstance(op, CopyOp) and op.dst is KvTier.HOST:
                if batch and (
                    batch[0].src is not op.src or op.dst_slot in {b.dst_slot for b in batch}
                ):
                    self._copy_to_host(batch)
                    batch = []
                batch.append(op)
                continue
            if batch:
                self._copy_to_host(batch)
                batch = []
            if isinstance(op, DropOp):
                self._writers[op.tier].submit(self._delete, op.tier, op.key)
            else:
                self._copy_to_store(op)
        if batch:
            self._copy_to_host(batch)

    def _copy_to_host(self, batch: list[CopyOp]) -> None:
        self.mover.copy_blocks(
            batch[0].src, [op.src_slot for op in batch], KvTier.HOST, [op.dst_slot for op in batch]
        )
        self.counters.blocks_offloaded[(batch[0].src, KvTier.HOST)] += len(batch)

    def _copy_to_store(self, op: CopyOp) -> None:
        if op.src in (KvTier.DEVICE, KvTier.HOST):
            data = self.mover.encode(op.src, op.src_slot, op.key)
            with self._pending_lock:
                self._pending[op.dst][op.key.seq_hash] = data
            self._writers[op.dst].submit(self._put, op.dst, op.key, data, op.src)
        else:  # store to store: read it in the source's writer, so a later drop waits for it
            self._writers[op.src].submit(self._forward, op.src, op.dst, op.key)

    # ---- writer threads ----------------------------------------------------------------
    def _put(self, tier: KvTier, key: BlockKey, data: bytes, src: KvTier) -> None:
        """Writer thread of `tier`: the block's bytes into its store, counted once they are
        there (each path is counted by one thread: its destination's writer)."""
        try:
            if tier in self._writes_off:  # the first failure turns the tier's writes off:
                # the puts queued behind it are not tried (each could wait out a timeout)
                skipped = StoreError(f"not written: the {tier} tier's writes are off")
                self._failures.put((tier, key.seq_hash, skipped))
                return
            self.stores[tier].put(key, data)
            self.counters.blocks_offloaded[(src, tier)] += 1
        except StoreError as exc:
            self._writes_off.add(tier)
            self._failures.put((tier, key.seq_hash, exc))
        finally:
            with self._pending_lock:
                if self._pending[tier].get(key.seq_hash) is data:
                    del self._pending[tier][key.seq_hash]

    def _forward(self, src: KvTier, dst: KvTier, key: BlockKey) -> None:
        try:
            data = self._read(src, key.seq_hash)
        except StoreError as exc:  # G4 will not have it; a load from there finds it missing
            log.warning("could not read KV block %016x from %s: %s", key.seq_hash, src, exc)
            return
        with self._pending_lock:
            self._pending[dst][key.seq_hash] = data
        self._writers[dst].submit(self._put, dst, key, data, src)

    def _delete(self, tier: KvTier, key: BlockKey) -> None:
        try:
            self.stores[tier].delete(key.seq_hash)
        except StoreError as exc:
            log.warning("could not delete KV block %016x from %s: %s", key.seq_hash, tier, exc)

    # ---- lifecycle ---------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every write and drop submitted so far has reached its store."""
        for tier in LOWER_TIERS:  # disk first: it may still hand blocks to the G4 writer
            if tier in self._writers:
                self._writers[tier].submit(lambda: None).result()

    def finish_loads(self) -> None:
        """Stop listing the shared store and wait for the loads in flight: what they leave to
        settle (`take_finished`) may still queue drops on the writers, which `close` stops."""
        self._closing.set()
        if self._lister is not None:
            self._lister.join()
        self._loaders.shutdown(wait=True)
        self._readers.shutdown(wait=True)

    def close(self) -> None:
        """Wait for loads and writes in flight, then stop the threads."""
        self.finish_loads()
        for tier in LOWER_TIERS:  # a disk writer may still hand blocks to the G4 writer
            if tier in self._writers:
                self._writers[tier].shutdown(wait=True)
        self._flush_journal()  # the other workers learn our last puts
