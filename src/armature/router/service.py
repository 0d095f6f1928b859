"""The router shell inside the frontend: picks a worker engine per request with a routing
policy, keeps the prefix index fed from the workers' KV events (router.event_sync), and
tracks each request's load on every path.

    app --generate(request, target)--> EngineRouter --policy.select--> worker engine
                                           ^    |
            KV events / dumps (sync task) -+    +-- ActiveLoad: start .. first token .. finish
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field

import msgspec

from armature.config import RouterConfig
from armature.engines.api import Engine, EngineDeadError
from armature.engines.validation import fits_kv_cache
from armature.kv.hashing import DEFAULT_HASH_SEED, hash_seed_for_salt
from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest, StepRecord
from armature.protocols.lora import LoraAdapter
from armature.router.event_sync import KvEventSync
from armature.router.load import ActiveLoad, WorkerLoad
from armature.router.policies import (
    DirectPolicy,
    KvPolicy,
    NoWorkerError,
    RouteDecision,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)
from armature.router.prefix_index import PrefixIndex
from armature.router.pressure import BusyWorkers, WorkerPressure
from armature.router.tier_weights import TierWeightBook

__all__ = ["EngineRouter", "RouteGroup", "RouterObserver"]

log = logging.getLogger(__name__)


class RouterObserver:
    """Hooks for metrics; the default records nothing."""

    def decision(self, worker: str, overlap_blocks: int, latency_s: float) -> None: ...

    def migration(self) -> None:
        """A request moved to another worker after its worker died mid-stream."""

    def prefill(self, where: str) -> None:
        """A prompt was prefilled `where`: "remote" (a prefill worker) or "local"."""


@dataclass
class RouteGroup:
    """Requests that share one prompt (the choices of n > 1) and follow the first of them to
    its worker, whose prefix cache holds the prompt once the first has its first token. The
    router sets `worker` when it routes a member by policy; the others go there while it
    lives (a dead one sends them back to the policy)."""

    worker: str | None = None
    # set once the member routed by policy has its first output there (or ended): the
    # prompt is in that worker's cache. Members wait for it: in disaggregated serving the
    # first's first token comes from a prefill worker, and members that went on at once
    # each computed the whole prompt on the decode worker before its KV arrived
    has_prompt: asyncio.Event = field(default_factory=asyncio.Event)


class _WorkerDied(Exception):
    def __init__(self, worker: str, cause: EngineDeadError):
        self.worker = worker
        self.cause = cause


class EngineRouter:
    """Presents several engines as one: `generate` routes, streams and tracks load."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        config: RouterConfig,
        observer: RouterObserver | None = None,
        busy: BusyWorkers | None = None,
        load_changed: asyncio.Event | None = None,
    ):
        """`observer` is told of decisions, migrations and prefills (metrics); `busy`: the
        overload thresholds past which a worker is avoided while another has room;
        `load_changed` is set whenever this router's own load changes (a routed request
        starts, has its first token or ends): frontend replicas publish it then."""
        self.engines = dict(engines)
        self.config = config
        self.observer = observer or RouterObserver()
        self.busy = busy
        self.index = PrefixIndex()
        self.load = ActiveLoad()
        self.load_changed = load_changed or asyncio.Event()
        # tier-aware routing: each worker's tier weights, from its load reports (see sync_events)
        self.tier_weights = TierWeightBook() if config.tier_aware else None
        self.policy = self._make_policy(config)
        # keeps the index fed from the workers' KV events (it reads `self.engines` as it is)
        self.events = KvEventSync(self.engines, self.index, self.tier_weights, config)

    def _make_policy(self, config: RouterConfig) -> RoutingPolicy:
        total_blocks = max(1, sum(e.get_load().num_total_blocks for e in self.engines.values()))
        return make_policy(
            config.policy,
            index=self.index,
            load=self.load,
            block_size=config.block_size_tokens,
            hash_seed=DEFAULT_HASH_SEED,
            overlap_weight=config.overlap_weight,
            decode_weight=config.decode_weight,
            load_bound=config.load_bound,
            share_bound=config.share_bound,
            share_window=config.share_window,
            temperature=config.temperature,
            seed=config.seed,
            routed_ttl_s=config.routed_ttl_s,
            routed_max_entries=total_blocks,
            tier_weights=self.tier_weights,
        )

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        for worker, engine in self.engines.items():
            engine.start()
            self.index.add_worker(worker, engine.get_load().num_total_blocks)
        self.events.start()

    def add_engine(self, worker: str, engine: Engine) -> None:
        """A worker joined: start routing to it (its blocks join the index as events come)."""
        if worker in self.engines:
            raise ValueError(f"worker {worker!r} is already routed to")
        self.index.check_room()  # before it starts: a refused worker is left as it was
        engine.start()
        self.index.add_worker(worker, engine.get_load().num_total_blocks)
        self.engines[worker] = engine
        self.events.add(worker, engine)
        if isinstance(self.policy, KvPolicy) and self.policy.routed is not None:
            # the routed predictions stay bounded by the total capacity
            total = sum(e.get_load().num_total_blocks for e in self.engines.values())
            self.policy.routed.max_entries = total

    async def remove_engine(self, worker: str) -> None:
        """A worker left: no new requests go to it and its blocks leave the index."""
        engine = self.engines.pop(worker, None)
        if engine is None:
            return
        await self.events.remove(worker)
        await engine.stop()

    async def stop(self) -> None:
        await self.events.stop()
        for engine in self.engines.values():
            await engine.stop()

    @property
    def is_alive(self) -> bool:
        return any(e.is_alive for e in self.engines.values())

    def get_workers(self) -> list[str]:
        return [w for w, e in self.engines.items() if e.is_alive]

    # ---- LoRA adapters -----------------------------------------------------------------
    def get_lora_adapters(self) -> dict[str, LoraAdapter]:
        """The adapters the live workers serve, by name (as the first holder has it)."""
        adapters: dict[str, LoraAdapter] = {}
        for engine in self.engines.values():
            if engine.is_alive:
                for adapter in engine.get_lora_adapters():
                    adapters.setdefault(adapter.name, adapter)
        return adapters

    def get_lora_salt(self, lora_name: str | None, workers: list[str]) -> str | None:
        """The block-hash salt of adapter `lora_name` on `workers` (the first holder's; None
        for the base model or an adapter none of them holds)."""
        if lora_name is None:
            return None
        for worker in workers:
            for adapter in self.engines[worker].get_lora_adapters():
                if adapter.name == lora_name:
                    return adapter.salt
        return None

    def get_hash_seed(self, request: EngineRequest) -> int:
        """The seed that `request`'s blocks are hashed with on the workers that serve it."""
        salt = self.get_lora_salt(request.lora_name, self.get_workers())
        return DEFAULT_HASH_SEED if salt is None else hash_seed_for_salt(salt)

    def _holds_lora(self, worker: str, lora_name: str | None) -> bool:
        if lora_name is None:
            return True
        return any(a.name == lora_name for a in self.engines[worker].get_lora_adapters())

    # ---- requests ----------------------------------------------------------------------
    def check_route(self, target_worker: str | None) -> None:
        """Raise RoutingError now if `generate` could not route (direct policy without a
        known target, or no live worker)."""
        workers = self.get_workers()
        if not workers:
            raise NoWorkerError("no workers are available")
        if isinstance(self.policy, DirectPolicy):
            self.policy.select(RouteRequest("check", [], target_worker), workers)

    def validate(self, request: EngineRequest) -> None:
        """The checks of the worker with the largest KV cache among those that serve
        `request`'s adapter (among all when none does): the workers of one model share its
        other limits (a worker of another context length or block size is not taken), and
        routing then keeps to the workers whose cache holds it (`_fits`)."""
        holders = [w for w in self.engines if self._holds_lora(w, request.lora_name)]
        workers = holders or list(self.engines)
        if workers:
            largest = max(workers, key=lambda w: self.engines[w].get_load().num_total_blocks)
            self.engines[largest].validate(request)

    def _fits(self, worker: str, request: EngineRequest) -> bool:
        """Whether `worker`'s KV cache holds `request` whole (prompt, output so far and
        max_tokens), as its engine's validation counts it."""
        num_blocks = self.engines[worker].get_load().num_total_blocks
        return fits_kv_cache(
            request, block_size=self.config.block_size_tokens, num_kv_blocks=num_blocks
        )

    async def generate(
        self,
        request: EngineRequest,
        target_worker: str | None = None,
        group: RouteGroup | None = None,
    ) -> AsyncGenerator[EngineOutput, None]:
        """Route `request` and stream its outputs; load is released however the stream ends.
        Raises RoutingError before anything starts when no worker fits. A worker found dead
        before it produced anything (killed, unreachable) is skipped and the request is routed
        again among the others, so a crash loses no request that had not started. A worker
        that dies mid-stream is migrated from: the request goes to another worker with the
        tokens generated so far appended (and max_tokens reduced), up to `migration_limit`
        times; the caller sees one uninterrupted stream."""
        if target_worker is not None and target_worker in self.engines:
            # its own checks: a worker whose KV cache cannot hold it says so (a 400), where
            # the capacity filter would leave it out as if it were unknown
            self.engines[target_worker].validate(request)
        # the worker instances that failed this request: a replacement that joins under the
        # same name (serve restarts worker-0 as worker-0; --instance-id) is another engine
        failed: dict[str, Engine | None] = {}
        generated: list[int] = []
        num_migrations = 0
        leg = request
        while True:
            workers = await self._candidates(failed, request)
            if not workers:
                live = [w for w in self.get_workers() if not self._has_failed(w, failed)]
                serving = [w for w in live if self._holds_lora(w, request.lora_name)]
                if live and not serving:
                    raise EngineDeadError(f"no worker serves LoRA adapter {request.lora_name!r}")
                if serving:
                    raise EngineDeadError("no live worker's KV cache holds this request whole")
                raise EngineDeadError("no worker engine is serving")
            try:
                async for output in self._generate_on(leg, workers, target_worker, group):
                    if generated and output.num_prompt_tokens:  # reported by the first leg
                        output = msgspec.structs.replace(
                            output, num_prompt_tokens=0, num_cached_tokens=0
                        )
                    generated.extend(output.new_token_ids)
                    yield output
                return
            except _WorkerDied as died:
                failed[died.worker] = self.engines.get(died.worker)
                if target_worker is not None:
                    raise EngineDeadError(str(died.cause)) from None
                if not generated:
                    log.warning(
                        "worker %s died before serving %s; rerouting",
                        died.worker,
                        request.request_id,
                    )
                    continue
                if num_migrations >= self.config.migration_limit:
                    raise EngineDeadError(
                        f"{died.cause} (request migrated {num_migrations} times, the limit)"
                    ) from None
                num_migrations += 1
                self.observer.migration()
                log.warning(
                    "worker %s died mid-stream for %s after %d tokens; migrating (%d of %d)",
                    died.worker,
                    request.request_id,
                    len(generated),
                    num_migrations,
                    self.config.migration_limit,
                )
                leg = _resumed(request, generated)

    def _has_failed(self, worker: str, failed: dict[str, Engine | None]) -> bool:
        """Whether `worker` is the instance that failed (not one that joined since)."""
        return worker in failed and self.engines.get(worker) is failed[worker]

    async def _candidates(
        self, failed: dict[str, Engine | None], request: EngineRequest
    ) -> list[str]:
        """Live workers not yet failed for this request that serve its LoRA adapter and whose
        KV cache holds it. After a failure, wait up to `failover_wait_s` for one
        (replacements join while a fleet recovers)."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + (self.config.failover_wait_s if failed else 0.0)
        lora_name = request.lora_name
        while True:
            workers = [
                w
                for w in self.get_workers()
                if not self._has_failed(w, failed)
                and self._holds_lora(w, lora_name)
                and self._fits(w, request)
            ]
            if workers or loop.time() >= deadline_s:
                busy = self.get_busy_workers() if len(workers) > 1 else set()
                return [w for w in workers if w not in busy] or workers
            await asyncio.sleep(0.05)

    async def _generate_on(
        self,
        request: EngineRequest,
        workers: list[str],
        target_worker: str | None,
        group: RouteGroup | None,
    ) -> AsyncGenerator[EngineOutput, None]:
        if group is not None and group.worker in workers:
            await group.has_prompt.wait()
        started_s = time.perf_counter()
        bs = self.config.block_size_tokens
        num_tokens = len(request.prompt_token_ids)
        led: RouteGroup | None = None  # the group this member leads (routed by policy)
        if group is not None and group.worker in workers:
            # the group's first member computed this prompt there: all of it but the block
            # holding the last token is cached (unless evicted since)
            decision = RouteDecision(group.worker, (num_tokens - 1) // bs)
        else:
            salt = self.get_lora_salt(request.lora_name, workers)
            route = RouteRequest(
                request.request_id, request.prompt_token_ids, target_worker, hash_salt=salt
            )
            decision = self.policy.select(route, workers)
            if group is not None:
                group.worker = decision.worker
                led = group
        if request.computes_whole_prompt:  # a scored prompt hits no cache
            decision = RouteDecision(decision.worker, 0)
        self.observer.decision(
            decision.worker, decision.overlap_blocks, time.perf_counter() - started_s
        )
        # what the worker computes before its first token: a migrated leg's carried output
        # too; of a decode leg after a remote prefill, only what its KV handle lacks
        num_context = num_tokens + len(request.output_token_ids)
        num_held = decision.overlap_blocks
        if request.kv_handle is not None:
            num_held = max(num_held, len(request.kv_handle.seq_hashes))
        uncached = max(0, num_context - num_held * bs)
        self.load.start(request.request_id, decision.worker, uncached, -(-num_context // bs))
        self.load_changed.set()
        num_output = 0
        # the caller closed the stream before the engine finished: the frontend's stop string,
        # a client that left, or a cancellation
        reason = "closed by the caller"
        try:
            stream = self.engines[decision.worker].generate(request)
            try:
                async for output in stream:
                    if output.new_token_ids:
                        if num_output == 0:
                            self.load.first_token(request.request_id)
                            self.load_changed.set()
                            if led is not None:
                                led.has_prompt.set()
                        num_output += len(output.new_token_ids)
                    if output.finish_reason is not None:
                        reason = output.finish_reason.value
                    yield output
            except EngineDeadError as exc:
                reason = "worker died"
                raise _WorkerDied(decision.worker, exc) from None
            finally:
                await stream.aclose()
        finally:
            if led is not None:  # ended without output: the members route by themselves
                led.has_prompt.set()
            self.load.finish(request.request_id)
            self.load_changed.set()
            log.info(
                "request %s on %s: %d prompt tokens (%d blocks cached), %d output, %s",
                request.request_id,
                decision.worker,
                num_tokens,
                decision.overlap_blocks,
                num_output,
                reason,
            )

    def get_pool_loads(self) -> dict[str, tuple[EngineLoad, int]]:
        """This pool's live workers: (load as last reported, prompt tokens in flight as the
        router counts them, which is fresher)."""
        return {
            w: (e.get_load(), self.load.get(w).active_prefill_tokens)
            for w, e in self.engines.items()
            if e.is_alive
        }

    def get_own_loads(self) -> dict[str, WorkerLoad]:
        """The load of the requests this router routed and that have not finished, by worker
        (what a frontend replica tells the others)."""
        return dict(self.load.get_own_loads())

    def get_peer_loads(self) -> dict[str, WorkerLoad]:
        """The load other frontend replicas add, by worker, as routing counts it."""
        return dict(self.load.get_peer_loads())

    def set_peer_loads(self, peers: Mapping[str, WorkerLoad]) -> None:
        """The load other frontend replicas add, by worker: routing counts it from now."""
        self.load.set_peer_loads(peers)

    def get_pressures(self) -> dict[str, WorkerPressure]:
        """Each live worker's pressure, for overload control."""
        return {
            w: WorkerPressure.of(load, routed)
            for w, (load, routed) in self.get_pool_loads().items()
        }

    def get_busy_workers(self) -> set[str]:
        """Live workers past the busy thresholds (none without overload control)."""
        if self.busy is None:
            return set()
        return self.busy.get_busy_workers(self.get_pressures())

    def take_step_records(self) -> dict[str, list[StepRecord]]:
        """Drain every worker's step records (what each engine step did), by worker: the
        planner's and profiler's input. Workers with none are left out."""
        taken = {w: e.take_step_records() for w, e in self.engines.items()}
        return {w: records for w, records in taken.items() if records}

    def get_index_blocks(self) -> tuple[int, int]:
        """(blocks in the prefix index, its bound: the workers' total capacity)."""
        return self.index.get_num_entries(), self.index.get_capacity_blocks()

    def get_worker_loads(self) -> dict[str, EngineLoad]:
        """Each live worker's load as last reported."""
        return {w: e.get_load() for w, e in self.engines.items() if e.is_alive}

    async def sync_events(self) -> int:
        """Apply every worker's pending KV events now (returns how many): `KvEventSync`."""
        return await self.events.sync_events()

    def get_load(self) -> EngineLoad:
        """The sum over workers."""
        loads = [e.get_load() for e in self.engines.values()]
        return EngineLoad(
            num_active_blocks=sum(x.num_active_blocks for x in loads),
            num_total_blocks=sum(x.num_total_blocks for x in loads),
            num_waiting=sum(x.num_waiting for x in loads),
            num_running=sum(x.num_running for x in loads),
            num_prefill_tokens_queued=sum(x.num_prefill_tokens_queued for x in loads),
        )


def _resumed(request: EngineRequest, generated: list[int]) -> EngineRequest:
    """`request` continued after `generated` tokens: they join its output so far, and its
    max_tokens shrinks by as many (the engine counts carried tokens toward min_tokens)."""
    sampling = request.sampling
    return msgspec.structs.replace(
        request,
        output_token_ids=request.output_token_ids + generated,
        sampling=msgspec.structs.replace(sampling, max_tokens=sampling.max_tokens - len(generated)),
        kv_handle=None,  # the blocks were imported (or recomputed) by the dead worker
    )
