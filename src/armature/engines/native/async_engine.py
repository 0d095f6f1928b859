"""AsyncEngine: runs an EngineCore's step loop on its own thread and streams outputs to
asyncio callers, so the event loop (HTTP) stays responsive while the model computes.

    caller task --add/abort--> command queue --> engine thread: step(), step(), ...
    caller task <--EngineOutput-- per-request asyncio.Queue <--call_soon_threadsafe--

Leaving `generate` early (client disconnect, stop string, task cancelled) aborts the request,
which frees its KV blocks on the engine thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from armature.engines.api import EngineDeadError, InvalidRequestError, wait_and_clear
from armature.engines.native.core import EngineCore
from armature.model.lora_names import LoraError
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    EngineStats,
    KvTierStats,
    StepRecord,
    merge_outputs,
)
from armature.protocols.kv_events import KvDump, KvEvent
from armature.protocols.kv_transfer import KvHandle, NativeTransfer
from armature.protocols.lora import LoraAdapter, LoraNotFoundError
from armature.transfer.agent import KvTransferAgent
from armature.transfer.blocks import KvBlocks
from armature.transfer.wire import TransferError

__all__ = ["AsyncEngine", "EngineDeadError"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Import:
    hashes: Sequence[tuple[int, int]]
    start: int
    blocks: KvBlocks


@dataclass(frozen=True)
class _Add:
    request: EngineRequest
    imported: _Import | None = None
    on_added: Callable[[], None] | None = None  # called on the event loop once processed


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Dump:
    future: asyncio.Future[KvDump]


_STOP = object()
_WAKE = object()  # a pinned handle was released: free its blocks now
# while blocks are pinned, an idle engine thread looks for released ones this often (a release
# through a peer's KV transfer server does not reach the command queue)
PIN_POLL_S = 0.02
MAX_BUFFERED_KV_EVENTS = 65536
MAX_BUFFERED_STEP_RECORDS = 4096


class AsyncEngine:
    def __init__(self, core: EngineCore, transfer: KvTransferAgent | None = None):
        self.core = core
        # pulls a peer's KV blocks for requests with a kv_handle; owned: stopped with the engine
        self.transfer = transfer
        self.num_kv_pulls = 0
        self.num_kv_pull_failures = 0
        self.num_kv_blocks_pulled = 0
        self._releases: set[asyncio.Task[None]] = set()
        self._commands: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[EngineOutput | BaseException]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._load = core.get_load()
        self._tier_stats: KvTierStats | None = self._take_tier_stats()
        # bounded: with no consumer, old events drop and a later consumer sees an id gap;
        # old step records drop silently. Filled by the engine thread, drained by the loop.
        self._events: deque[KvEvent] = deque(maxlen=MAX_BUFFERED_KV_EVENTS)
        self._step_records: deque[StepRecord] = deque(maxlen=MAX_BUFFERED_STEP_RECORDS)
        # guards _events, _step_records, _undelivered, _news and _wake_pending
        self._buffers_lock = threading.Lock()
        # outputs of steps the event loop has not taken yet; while it has not, a step adds to
        # them without waking it again (one wake-up per turn of the loop, not per step)
        self._undelivered: list[EngineOutput] = []
        self._news = False  # events, records or load the loop has not been told of
        self._wake_pending = False  # a `_wake` is scheduled on the loop
        self._updated: asyncio.Event | None = None  # set by `_wake` when there was news
        self._dead: BaseException | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._updated = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="armature-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._commands.put(_STOP)
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        await asyncio.to_thread(self.core.close)  # waits for KV tier loads and writes
        self._check_pool()
        if self.transfer is not None:  # owned: no peer pulls from a stopped engine
            self.transfer.stop()

    def _check_pool(self) -> None:
        """Log the block pool's integrity once the engine thread is gone (chaos tests read
        this line from the logs of the workers that survive)."""
        pool = self.core.pool
        try:
            pool.check_integrity()
        except AssertionError as exc:
            log.error("KV block pool integrity check FAILED: %s", exc)
            return
        log.info(
            "KV block pool integrity ok: %d of %d blocks in use, %d pinned",
            pool.get_num_active_blocks(),
            pool.num_blocks,
            self.core.pins.get_num_pinned_blocks(),
        )

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    # ---- requests ----------------------------------------------------------------------
    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream outputs for `request` until one carries a finish_reason. Raises
        InvalidRequestError before anything is queued if the request can't be served."""
        if self._dead is not None or self._loop is None:
            raise EngineDeadError("the engine is not running")
        self.core.validate(request)
        if request.request_id in self._streams:
            raise InvalidRequestError(f"duplicate request id {request.request_id!r}")
        add = _Add(request)
        if request.kv_handle is not None:
            add = await self._with_pulled_kv(request)
        stream: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()
        self._streams[request.request_id] = stream
        self._commands.put(add)
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                # A consumer that fell behind gets every output that is already waiting as
                # one (fewer frames, SSE events and writes downstream); an error stays queued
                # and is raised on the next call.
                batch = [item]
                while item.finish_reason is None and not stream.empty():
                    waiting = stream.get_nowait()
                    if isinstance(waiting, BaseException):
                        stream.put_nowait(waiting)
                        break
                    batch.append(waiting)
                    item = waiting
                merged = batch[0] if len(batch) == 1 else merge_outputs(batch)
                if merged.finish_reason is not None:
                    finished = True
                yield merged
                if finished:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                self._commands.put(_Abort(request.request_id))

    def validate(self, request: EngineRequest) -> None:
        self.core.validate(request)

    async def _with_pulled_kv(self, request: EngineRequest) -> _Add:
        """The add command for a request that continues a remote prefill: the prompt blocks
        this engine lacks are pulled first; the handle is released once they are copied in.
        Any transfer failure leaves the prompt to be computed here (same output, slower), as
        does a handle whose blocks a third-party engine's connector holds (not ours to pull)."""
        handle = request.kv_handle
        assert handle is not None
        if not isinstance(handle.transfer, NativeTransfer):
            log.debug(
                "request %s: a %r handle; computing the prompt here",
                request.request_id,
                handle.transfer.connector,
            )
            return _Add(request)
        loop = asyncio.get_running_loop()

        def release() -> None:
            if self.transfer is not None and handle.seq_hashes:
                task = loop.create_task(asyncio.to_thread(self.transfer.release, handle))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)

        try:
            hashes, start = self.core.plan_import(request)
            if start >= len(hashes) or self.transfer is None:
                release()
                return _Add(request)
            started_s = time.monotonic()
            blocks = await asyncio.to_thread(self.transfer.pull, handle, start)
            delay_s = self.core.kv_store.transfer_delay_s(blocks.num_blocks)
            await asyncio.sleep(max(0.0, delay_s - (time.monotonic() - started_s)))
        except TransferError as exc:
            self.num_kv_pull_failures += 1
            log.warning(
                "request %s: KV transfer from %s failed, computing the prompt here: %s",
                request.request_id,
                handle.worker_id,
                exc,
            )
            release()
            return _Add(request)
        except asyncio.CancelledError:  # the caller left before the copy: nothing was read
            release()
            raise
        self.num_kv_pulls += 1
        self.num_kv_blocks_pulled += blocks.num_blocks
        return _Add(request, _Import(hashes, start, blocks), release)

    def get_load(self) -> EngineLoad:
        return self._load

    # ---- LoRA adapters -----------------------------------------------------------------
    def get_lora_adapters(self) -> list[LoraAdapter]:
        return self.core.loras.get_adapters()

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        """Read the adapter off the event loop, then serve it: requests admitted from now on
        may name it. InvalidRequestError (naming the problem) if it cannot be served."""
        try:
            served = await asyncio.to_thread(self.core.runner.read_lora, name, Path(path))
            self.core.loras.add(served)
        except LoraError as exc:
            raise InvalidRequestError(str(exc), param="lora_path") from None
        log.info("LoRA adapter %r loaded from %r (salt %s)", name, path, served.adapter.salt)
        return served.adapter

    async def unload_lora(self, name: str) -> None:
        """Stop admitting requests for `name`; those running finish with it.
        LoraNotFoundError if it is not loaded."""
        if not self.core.loras.remove(name):
            raise LoraNotFoundError(f"no LoRA adapter named {name!r} is loaded", param="lora_name")
        log.info("LoRA adapter %r unloaded", name)

    def stats(self) -> EngineStats:
        by_backend = self.transfer.num_pulls if self.transfer is not None else {}
        return EngineStats(
            num_kv_pulls_by_backend=dict(by_backend),
            num_kv_pull_failures=self.num_kv_pull_failures,
            num_kv_blocks_pulled=self.num_kv_blocks_pulled,
            num_kv_pinned_blocks=self.core.pins.get_num_pinned_blocks(),
            num_kv_expired_pins=self.core.pins.num_expired,
            tiers=self._tier_stats,
        )

    def _take_tier_stats(self) -> KvTierStats | None:
        """A snapshot of the KV tiers' counters (engine thread, or before it starts)."""
        return self.core.tiers.get_stats() if self.core.tiers is not None else None

    async def release_kv(self, handle: KvHandle) -> None:
        if self.core.pins.release(handle.handle_id):
            self._commands.put(_WAKE)  # the engine thread frees them now

    async def dump_kv_blocks(self) -> KvDump:
        """Every block this engine caches, as of its newest event (answers an event gap)."""
        if self._dead is not None or self._loop is None:
            raise EngineDeadError("the engine is not running")
        future: asyncio.Future[KvDump] = self._loop.create_future()
        self._commands.put(_Dump(future))
        return await future

    def take_kv_events(self) -> list[KvEvent]:
        with self._buffers_lock:
            events = list(self._events)
            self._events.clear()
        return events

    def take_step_records(self) -> list[StepRecord]:
        with self._buffers_lock:
            records = list(self._step_records)
            self._step_records.clear()
        return records

    async def wait_for_update(self, timeout_s: float) -> bool:
        """True when the engine thread has buffered KV events or step records or changed the
        load since the last return (it wakes the loop once for a run of such steps); False
        after `timeout_s` without."""
        updated = self._updated
        if updated is None:  # not started: nothing will come
            await asyncio.sleep(max(0.0, timeout_s))
            return False
        return await wait_and_clear(updated, timeout_s)

    # ---- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                block = not self.core.has_work()
                if not self._drain_commands(block):
                    return
                if len(self.core.pins):
                    self.core.free_unpinned()
                self._post([], news=self._set_load())
                if self.core.has_work():
                    outputs = self.core.step()
                    self._publish(outputs)
        except BaseException as exc:
            log.exception("engine thread died")
            self._dead = exc
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._fail_all, EngineDeadError(f"engine died: {exc}"))

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued add/abort commands; with `block`, wait for at least one. False on stop."""
        timeout_s = None
        deadline_s = self.core.pins.next_deadline_s() if block else None
        if deadline_s is not None:  # wake up to free released and expired pins
            timeout_s = min(PIN_POLL_S, max(0.0, deadline_s - time.monotonic()) + 0.001)
        try:
            command = self._commands.get(block=block, timeout=timeout_s)
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Abort):
                self.core.abort_request(command.request_id)
            elif isinstance(command, _Dump):
                self._buffer_events()  # events up to the dump stay ahead of it
                dump = self.core.dump_kv_blocks()
                assert self._loop is not None
                self._loop.call_soon_threadsafe(_resolve, command.future, dump)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, command: _Add) -> None:
        held: list[int] = []
        if command.imported is not None:
            imported = command.imported
            held = self.core.import_kv(imported.hashes, imported.start, imported.blocks)
        try:
            self.core.add_request(command.request, held)
        except InvalidRequestError as exc:
            if held:
                self.core.pool.free(list(reversed(held)))
            self._publish_error(command.request.request_id, exc)
        if command.on_added is not None:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(command.on_added)

    def _buffer_events(self) -> bool:
        """Move the core's KV events to the loop's buffer; whether there were any."""
        events = self.core.take_kv_events()
        if events:
            with self._buffers_lock:
                self._events.extend(events)
        return bool(events)

    def _set_load(self) -> bool:
        """Take the core's load; whether it changed."""
        load = self.core.get_load()
        changed = load != self._load
        self._load = load
        return changed

    def _publish(self, outputs: list[EngineOutput]) -> None:
        news = self._set_load()
        if self.core.tiers is not None:
            self._tier_stats = self._take_tier_stats()
        news = self._buffer_events() or news
        records = self.core.take_step_records()
        if records:
            with self._buffers_lock:
                self._step_records.extend(records)
        self._post(outputs, news=news or bool(records))

    def _post(self, outputs: list[EngineOutput], *, news: bool) -> None:
        """Hand `outputs` to the loop and tell it of `news` (events, records, load): one
        wake-up of the loop until it has taken what is pending, however many steps."""
        if not outputs and not news:
            return
        with self._buffers_lock:
            self._undelivered.extend(outputs)
            self._news = self._news or news
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._wake)

    def _publish_error(self, request_id: str, exc: BaseException) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver_error, request_id, exc)

    # ---- event-loop side ---------------------------------------------------------------
    def _wake(self) -> None:
        with self._buffers_lock:
            outputs, self._undelivered = self._undelivered, []
            news, self._news = self._news, False
            self._wake_pending = False
        if news and self._updated is not None:
            self._updated.set()
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put_nowait(output)

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.put_nowait(exc)


def _resolve(future: asyncio.Future[KvDump], dump: KvDump) -> None:
    if not future.done():
        future.set_result(dump)
