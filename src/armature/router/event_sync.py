"""The router's prefix index, fed from its workers' KV events: a task per worker engine
waits for its news, and a round applies every worker's pending events, asking a worker for
a dump of its blocks when its event ids show a gap.

    engine.wait_for_update --news--> round (at most every event_sync_interval_s,
                                     at least every event_sync_idle_interval_s)
                                       per worker: load report -> tier capacities, weights
                                                   take_kv_events -> index.apply
                                                   a gap -> dump_kv_blocks -> index.load_dump
"""

from __future__ import annotations

import asyncio
import logging

from armature.config import RouterConfig
from armature.engines.api import Engine, EngineDeadError, wait_for_event
from armature.router.prefix_index import PrefixIndex
from armature.router.tier_weights import TierWeightBook

__all__ = ["DUMP_TIMEOUT_S", "KvEventSync"]

log = logging.getLogger(__name__)

# how long an engine's watcher waits for news before it asks again (any length works: the
# KV-event round has its own idle interval; a long one keeps idle watchers asleep)
WATCH_TIMEOUT_S = 5.0
DUMP_TIMEOUT_S = 60.0  # a worker's dump of its KV blocks after a gap; longer: it hangs


class KvEventSync:
    """Keeps `index` (and `tier_weights`) fed from the events of the engines in `engines`,
    a mapping its owner changes as workers join and leave (it is read, never written)."""

    def __init__(
        self,
        engines: dict[str, Engine],
        index: PrefixIndex,
        tier_weights: TierWeightBook | None,
        config: RouterConfig,
    ):
        self.engines = engines
        self.index = index
        self.tier_weights = tier_weights
        self.config = config
        self._sync_task: asyncio.Task[None] | None = None
        # a task per engine waits for its news (`Engine.wait_for_update`) and sets `_news`,
        # which wakes the round
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._news = asyncio.Event()

    def start(self) -> None:
        """Watch every engine and run rounds until `stop`."""
        for worker, engine in self.engines.items():
            self._watch(worker, engine)
        self._sync_task = asyncio.get_running_loop().create_task(self._sync_forever())

    def add(self, worker: str, engine: Engine) -> None:
        """`worker` joined `engines`: watched as the others once started."""
        if self._sync_task is not None:
            self._watch(worker, engine)

    async def remove(self, worker: str) -> None:
        """`worker` left `engines`: its blocks leave the index, its watcher stops."""
        self._forget(worker)
        await self._unwatch(worker)

    async def stop(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
            self._sync_task = None
        for worker in list(self._watchers):
            await self._unwatch(worker)

    async def sync_events(self) -> int:
        """Apply every worker's pending KV events (returns how many); a gap triggers a dump
        from that worker (a worker that leaves meanwhile, or sends none in DUMP_TIMEOUT_S,
        holds no other worker's events). First each worker's load report refreshes its
        lower tiers' capacities in the index and its tier weights."""
        num_applied = 0
        for worker, engine in list(self.engines.items()):
            try:
                num_applied += await self._sync_worker(worker, engine)
            except EngineDeadError as exc:
                log.warning("worker %s died during its KV sync: %s", worker, exc)
            except TimeoutError:
                log.warning(
                    "worker %s sent no KV dump within %g s; its index entries wait for its "
                    "next gap",
                    worker,
                    DUMP_TIMEOUT_S,
                )
        return num_applied

    async def _sync_worker(self, worker: str, engine: Engine) -> int:
        if not engine.is_alive:
            self._forget(worker)  # a dead worker's blocks are gone
            return 0
        load = engine.get_load()
        if not self.index.has_worker(worker):  # alive again after it was dropped:
            self.index.add_worker(worker, load.num_total_blocks)  # its next event is a gap
        self.index.set_tier_capacities(worker, load.num_tier_total_blocks)
        if self.tier_weights is not None:
            self.tier_weights.update(worker, load.prefill_s_per_block, load.onboard_s_per_block)
        num_applied = 0
        for event in engine.take_kv_events():
            if not self.index.apply(worker, event):
                log.warning("KV event gap from worker %s; asking for a dump", worker)
                dump = await asyncio.wait_for(engine.dump_kv_blocks(), DUMP_TIMEOUT_S)
                if self.engines.get(worker) is not engine or not self.index.has_worker(worker):
                    return num_applied  # it left while it dumped: nothing of it to index
                self.index.load_dump(
                    worker, dump.seq_hashes, dump.last_event_id, dump.tier_seq_hashes
                )
            num_applied += 1
        return num_applied

    def _forget(self, worker: str) -> None:
        """Drop a worker that left or died from the index and the tier weights."""
        if self.index.has_worker(worker):
            self.index.remove_worker(worker)
        if self.tier_weights is not None:
            self.tier_weights.remove(worker)

    def _watch(self, worker: str, engine: Engine) -> None:
        task = asyncio.get_running_loop().create_task(self._watch_engine(engine))
        self._watchers[worker] = task

    async def _unwatch(self, worker: str) -> None:
        task = self._watchers.pop(worker, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch_engine(self, engine: Engine) -> None:
        while True:
            if await engine.wait_for_update(WATCH_TIMEOUT_S):
                self._news.set()

    async def _sync_forever(self) -> None:
        """A round whenever an engine has news, at most once every `event_sync_interval_s`,
        and at least every `event_sync_idle_interval_s` (which notices dead workers)."""
        loop = asyncio.get_running_loop()
        while True:
            started_s = loop.time()
            try:
                await self.sync_events()
            except Exception:  # a bug must not end every later round: the index would freeze
                log.exception("a KV event round failed; the next one tries again")
            await wait_for_event(self._news, self.config.event_sync_idle_interval_s)
            # news during a round, or right after it, waits for the next (they come together)
            await asyncio.sleep(
                max(0.0, started_s + self.config.event_sync_interval_s - loop.time())
            )
            self._news.clear()
