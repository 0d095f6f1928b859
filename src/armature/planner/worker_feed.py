"""The workers' step records for the planner: follows discovery's worker cards and subscribes
to each worker's event-plane `WorkerUpdate`s, as the frontend's fleet does.

Records are kept per window name (the load rule's and the throughput plan's windows are
drained separately, each at its own cadence): `take_steps(window)` returns every live
worker's records since that window was last taken. A worker that leaves discovery is
dropped with its records. A worker whose card differs from what the timing profile was
measured on (`profiled`; a prefill worker's: `prefill_profiled` where the prefill workers
have a profile of their own) is logged once as it joins and listed by `get_mismatches`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import aclosing

import msgspec

from armature.planner.observation import WorkerSteps
from armature.planner.profile_match import ProfiledWorker, get_card_mismatches
from armature.protocols.engine import StepRecord
from armature.protocols.worker import WorkerCard, WorkerRole, WorkerUpdate, worker_prefix
from armature.runtime.discovery import Discovery
from armature.runtime.events import EventPlane, EventPlaneError

__all__ = ["WorkerStepFeed"]

log = logging.getLogger(__name__)

_MAX_RECORDS = 100_000  # per worker and window: a window never taken must not grow forever


class WorkerStepFeed:
    """Owns one subscription task per live worker and their buffered records."""

    def __init__(
        self,
        discovery: Discovery,
        event_plane: EventPlane,
        namespace: str,
        windows: Sequence[str],
        profiled: ProfiledWorker | None = None,
        prefill_profiled: ProfiledWorker | None = None,
    ) -> None:
        self._discovery = discovery
        self._profiled = profiled
        self._prefill_profiled = prefill_profiled or profiled  # the prefill workers'
        self._mismatches: dict[str, list[str]] = {}  # worker id -> what differs
        self._event_plane = event_plane
        self._namespace = namespace
        self._windows = tuple(windows)
        self._cards: dict[str, WorkerCard] = {}  # discovery key -> card
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._records: dict[str, dict[str, list[StepRecord]]] = {w: {} for w in windows}
        self.changed = asyncio.Event()  # set whenever a worker joins or leaves

    def get_num_workers(self) -> dict[WorkerRole, int]:
        """Live workers in discovery, by role."""
        counts: dict[WorkerRole, int] = {}
        for card in self._cards.values():
            counts[card.role] = counts.get(card.role, 0) + 1
        return counts

    def get_mismatches(self) -> dict[str, list[str]]:
        """The live workers that differ from the profile, and how."""
        return dict(self._mismatches)

    def get_worker_ids(self) -> list[str]:
        return sorted(card.worker_id for card in self._cards.values())

    def take_steps(self, window: str) -> list[WorkerSteps]:
        """Each live worker's records since `window` was last taken (cleared)."""
        buffers = self._records[window]
        out = []
        for card in sorted(self._cards.values(), key=lambda c: c.worker_id):
            records = buffers.pop(card.worker_id, [])
            out.append(WorkerSteps(worker_id=card.worker_id, role=card.role, step_records=records))
        return out

    async def run(self) -> None:
        """Follow discovery until cancelled."""
        try:
            async for event in self._discovery.watch(worker_prefix(self._namespace)):
                if event.kind == "put":
                    self._joined(event.key, event.value)
                else:
                    self._left(event.key)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self._tasks = {}

    def _joined(self, key: str, value: bytes) -> None:
        try:
            card = msgspec.msgpack.decode(value, type=WorkerCard)
        except msgspec.DecodeError as exc:
            log.error("ignoring an unreadable worker card at %s: %s", key, exc)
            return
        old = self._cards.get(key)
        if old is not None and old.events_url == card.events_url:
            return  # a renewal
        self._left(key)
        self._cards[key] = card
        self._tasks[key] = asyncio.get_running_loop().create_task(self._subscribe(card))
        log.info("worker %s (%s) joined", card.worker_id, card.role)
        profiled = self._prefill_profiled if card.role is WorkerRole.PREFILL else self._profiled
        mismatches = [] if profiled is None else get_card_mismatches(card, profiled)
        if mismatches:
            self._mismatches[card.worker_id] = mismatches
            log.warning(
                "worker %s runs %s: the planner's timing profile was measured otherwise, so "
                "its plans for this worker may be off (run workers as profiled, or profile "
                "them again)",
                card.worker_id,
                ", ".join(mismatches),
            )
        self.changed.set()

    def _left(self, key: str) -> None:
        card = self._cards.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        if card is not None:
            self._mismatches.pop(card.worker_id, None)
            for buffers in self._records.values():
                buffers.pop(card.worker_id, None)
            log.info("worker %s (%s) left", card.worker_id, card.role)
            self.changed.set()

    async def _subscribe(self, card: WorkerCard) -> None:
        try:
            async with aclosing(self._event_plane.subscribe(card.events_url)) as updates:
                async for payload in updates:
                    try:
                        update = msgspec.msgpack.decode(payload, type=WorkerUpdate)
                    except msgspec.DecodeError as exc:
                        log.warning("bad update from %s: %s", card.worker_id, exc)
                        continue
                    if update.step_records:
                        self._add(card.worker_id, update.step_records)
        except EventPlaneError as exc:
            log.error("no step records from %s: %s", card.worker_id, exc)

    def _add(self, worker_id: str, records: list[StepRecord]) -> None:
        for buffers in self._records.values():
            buffer = buffers.setdefault(worker_id, [])
            buffer.extend(records)
            if len(buffer) > _MAX_RECORDS:
                del buffer[: len(buffer) - _MAX_RECORDS]
