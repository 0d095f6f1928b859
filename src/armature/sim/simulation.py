"""Aggregated replay: a discrete-event simulation of N mocker workers behind the real router, on
a virtual clock, driven by a trace's arrivals.

    time ->  arrival  arrival      step ends (outputs delivered, KV events indexed)
    worker0  [== step ==][== step ==]       each step's length is the timing model's
    worker1        [====== step ======]     a worker starts its next step when one ends
                                            and it has work; an idle worker wakes on arrival

A step's scheduling happens when it starts (the real EngineCore.step), its outputs land when it
ends. Routing uses the real policies over a PrefixIndex fed by the workers' KV events and an
ActiveLoad updated on every path. Deterministic: a seed gives the same report.

A worker's steps change nothing that others read until the next event that reads the fleet
(an arrival, a timer, a transfer, a prefill worker's step end: the *observers*). So a batch of
decodes runs, in one `EngineCore.run_decodes` call, every step that starts before the next
observer (or until one finishes a request or would preempt), with the same effects as step
after step; its last step ends as an event like any other. A run cut by the horizon is
suspended, not ended: at that event it goes on to the next horizon when no request joined its
worker meanwhile (`_go_on`), so a run's per-request work (its last step's outputs, its tokens
landing in the requests at their steps' ends) is done once however dense the fleet's
arrivals. And a suspended run whose next steps nobody else could see (they only cache blocks
of generated tokens) is left past the arrivals until its first step that could be seen, or a
request joining its worker, or a timer (`_go_on`): a worker is taken up once per stretch of
its own, not once per arrival in the fleet. `ReplayConfig.reference_steps` runs every step on
its own (the reference the fast path is tested against).

With lower KV tiers (`ReplayConfig.tiers`) each worker runs `ModeledTiers` on the simulation's
time: a load submitted in a step is done n blocks x bytes / bandwidth later. A worker whose
step finds nothing to run (its requests wait for loads) is idle, not busy: an arrival starts
its next step at once, and a wake event starts one when its next load is done.
"""

from __future__ import annotations

import heapq
import operator
from array import array
from collections.abc import Callable, MutableSequence, Sequence
from typing import cast

from armature.engines.native.core import EngineCore
from armature.engines.native.decode_run import DecodeRun
from armature.errors import InvalidRequestError
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_and_seq_hashes
from armature.protocols.engine import EngineOutput, EngineRequest, SamplingParams
from armature.protocols.worker import WorkerRole
from armature.router.load import ActiveLoad
from armature.router.policies import (
    RouteRequest,
    RoutingPolicy,
    make_policy,
)
from armature.router.prefix_index import PrefixIndex
from armature.router.tier_weights import TierWeightBook
from armature.sim.clock import EventClock
from armature.sim.fleet_monitor import FleetMonitor
from armature.sim.mocker import MockerRunner
from armature.sim.mocker_worker import MockerWorkerFactory
from armature.sim.modeled_tiers import ModeledTiers
from armature.sim.replay_config import REPLAY_POLICIES, ReplayConfig, ReplayReport
from armature.sim.sim_report import ReportInputs, Tracked, build_report
from armature.sim.timing import TimingModel
from armature.workload.traces import TraceRequest, synthesize_prompt_ids

__all__ = ["MIN_RETRY_MS", "Simulation"]

_WAKE = "wake:"
_TIMER = "timer:"
_DEFER = "defer:"
# a worker whose step ran nothing with requests queued (all of them preempted) tries again
# after its last step's time, and at least this long
MIN_RETRY_MS = 1.0


class Simulation:
    def __init__(
        self,
        requests: Sequence[TraceRequest],
        config: ReplayConfig,
        timing: TimingModel,
        prefill_timing: TimingModel | None = None,
    ):
        """`prefill_timing`: the prefill workers' step times, when they differ from the
        others' (another tensor parallelism, say)."""
        self.config = config
        self.requests = sorted(requests, key=lambda r: r.arrival_ms)
        max_len = max((r.input_length + r.output_length for r in requests), default=1)
        if not 0 <= config.num_prefill_workers < config.num_workers:
            raise ValueError("num_prefill_workers must leave at least one decode worker")
        self.prefill_workers = [f"prefill-{i}" for i in range(config.num_prefill_workers)]
        self.workers = [
            f"worker-{i}" for i in range(config.num_workers - config.num_prefill_workers)
        ]
        self.cores: dict[str, EngineCore] = {}
        self.runners: dict[str, MockerRunner] = {}
        self.tiers: dict[str, ModeledTiers] = {}
        self.clock = EventClock(lambda: self.now_ms / 1000.0)
        self._worker_factory = MockerWorkerFactory(
            config, max_len + 1, timing, prefill_timing or timing, self.clock
        )
        for worker in [*self.prefill_workers, *self.workers]:
            self.make_worker(worker)
        self.index = PrefixIndex()
        for worker in self.workers:
            self.index.add_worker(worker, config.num_kv_blocks)
        # the workers' KV events go into the index only where something reads it
        self.index_is_read = self._reads_index()
        self.defers_runs = self._defers_runs()
        # tier-aware routing weighs lower-tier hits from the workers' load reports
        self.tier_weights = (
            TierWeightBook() if config.tiers.is_enabled and config.tier_aware else None
        )
        self.load = ActiveLoad()
        self.policy = self._policy()
        self.tracked: dict[str, Tracked] = {}
        self.traces: dict[str, TraceRequest] = {}  # by request id, as they arrived
        self.num_rejected = 0
        self.num_remote_prefills = 0
        # (time ms, sequence, key): scheduled events, in two heaps: the ends of busy routed
        # workers' steps and their wakes, which read nothing outside their worker, and the
        # events that read or change the fleet (`_is_observer`); the loop takes the earlier
        self.step_ends: list[tuple[float, int, str]] = []
        self.observers: list[tuple[float, int, str]] = []
        self.pending: dict[str, list[EngineOutput]] = {}
        self.runs: dict[str, DecodeRun] = {}  # suspended decode runs, by worker
        # suspended runs left past arrivals, by worker: until when (`_go_on`)
        self.deferred: dict[str, float] = {}
        self.num_deferrals = 0
        self.busy: set[str] = set()
        self.wake_ms: dict[str, float] = {}  # an idle worker's next wake event
        self._sequence = 0
        self.now_ms = 0.0
        # the last arrival or event other than a timer: where the work ended (a timer after
        # it, as the fleet monitor's last tick, does not lengthen the replay's span)
        self.work_end_ms = 0.0
        self.next_arrival = 0
        # callbacks on the virtual clock (`call_at`), and what a planned fleet watches
        self.timers: dict[str, Callable[[float], None]] = {}
        self.monitor: FleetMonitor | None = None
        self.draining: set[str] = set()  # out of routing, finishing their requests
        self.on_drained: Callable[[str, float], None] | None = None

    def make_worker(self, worker: str) -> None:
        """A mocker worker named `worker`, out of routing (see `join`)."""
        made = self._worker_factory.make(worker)
        self.cores[worker] = made.core
        self.runners[worker] = made.runner
        if made.tiers is not None:
            self.tiers[worker] = made.tiers

    def join(self, worker: str, role: WorkerRole) -> None:
        """Route to `worker` (made by `make_worker`) as a `role` worker."""
        assert role is not WorkerRole.PREFILL, "prefill workers are disaggregated"
        self.workers.append(worker)
        self.index.add_worker(worker, self.config.num_kv_blocks)

    def leave(self, worker: str, role: WorkerRole) -> None:
        """Stop routing to `worker`; it finishes what it holds, then `on_drained` is called."""
        self.workers.remove(worker)
        self.index.remove_worker(worker)
        self._drain(worker, self.now_ms)

    def _drain(self, worker: str, now_ms: float) -> None:
        if worker in self.busy or self.cores[worker].has_work():
            self.draining.add(worker)
        elif self.on_drained is not None:
            self.on_drained(worker, now_ms)

    def call_at(self, at_ms: float, name: str, callback: Callable[[float], None]) -> None:
        """Call `callback(now_ms)` at `at_ms` on the virtual clock."""
        self.timers[name] = callback
        self._schedule(at_ms, _TIMER + name)

    def has_work_left(self) -> bool:
        """Arrivals still to come, or events other than timers still to happen."""
        num_events = len(self.step_ends) + len(self.observers)
        return self.next_arrival < len(self.requests) or num_events > len(self.timers)

    def _policy(
        self, index: PrefixIndex | None = None, load: ActiveLoad | None = None
    ) -> RoutingPolicy:
        c = self.config
        if c.router not in REPLAY_POLICIES:
            raise ValueError(
                f"unknown router {c.router!r}; choose from {', '.join(REPLAY_POLICIES)}"
            )
        return make_policy(
            c.router,
            index=index or self.index,
            load=load or self.load,
            block_size=c.block_size,
            hash_seed=DEFAULT_HASH_SEED,
            overlap_weight=c.overlap_weight,
            decode_weight=c.decode_weight,
            load_bound=c.load_bound,
            share_bound=c.share_bound,
            share_window=c.share_window,
            temperature=c.router_temperature,
            seed=c.seed,
            routed_ttl_s=c.routed_ttl_s,
            routed_max_entries=c.num_workers * c.num_kv_blocks,
            clock=lambda: self.now_ms / 1000.0,
            tier_weights=self.tier_weights,
        )

    def run(self) -> float:
        """Simulate to the end; returns when the work ended (ms): the last arrival or event
        other than a timer."""
        step_ends, observers = self.step_ends, self.observers
        while self.next_arrival < len(self.requests) or step_ends or observers:
            if step_ends and (not observers or step_ends[0] < observers[0]):
                heap = step_ends
            else:
                heap = observers
            event_ms = heap[0][0] if heap else float("inf")
            if self._get_next_arrival_ms() <= event_ms:
                number = self.next_arrival
                trace = self.requests[number]
                self.now_ms = trace.arrival_ms
                self.next_arrival += 1
                self._arrive(trace, number, self.now_ms)
                self.work_end_ms = self.now_ms
            else:
                self.now_ms, _, key = heapq.heappop(heap)
                self._on_event(key, self.now_ms)
                if not key.startswith(_TIMER):
                    self.work_end_ms = self.now_ms
        return self.work_end_ms

    def _get_next_arrival_ms(self) -> float:
        if self.next_arrival < len(self.requests):
            return self.requests[self.next_arrival].arrival_ms
        return float("inf")

    def _get_horizon_ms(self) -> float:
        """When the next observer happens (an arrival or an observer event): a worker's steps
        that start before it are seen by nobody else before they end."""
        event_ms = self.observers[0][0] if self.observers else float("inf")
        return min(self._get_next_arrival_ms(), event_ms)

    def _get_prefill_names(self) -> frozenset[str]:
        """Every prefill worker there was (none: an aggregated fleet)."""
        return frozenset()

    def _reads_index(self) -> bool:
        """Whether anything reads the routed workers' prefix index: the kv router (the other
        policies route without it, kv-approx on its routed predictions alone)."""
        return self.config.router == "kv"

    def _defers_runs(self) -> bool:
        """Whether a suspended run may be left past arrivals while nothing it does can be
        seen (`_go_on`): not on the reference path, nor where the kv router breaks exact
        ties by the index's per-worker totals (temperature 0), which count the blocks a run
        caches."""
        c = self.config
        return not c.reference_steps and not (self.index_is_read and c.router_temperature <= 0)

    def _is_observer(self, worker: str) -> bool:
        """Whether `worker`'s step ends read or change the rest of the fleet (not here: a
        routed worker's outputs only reach its own requests)."""
        return False

    def _on_event(self, key: str, now_ms: float) -> None:
        """A scheduled event: the end of worker `key`'s step, an idle worker's wake, or a
        timer."""
        if key.startswith(_TIMER):
            for worker in list(self.deferred):  # a timer may read any worker's steps
                self._catch_up(worker, now_ms)
            self.timers.pop(key.removeprefix(_TIMER))(now_ms)
            return
        if key.startswith(_DEFER):
            worker = key.removeprefix(_DEFER)
            if self.deferred.get(worker) == now_ms:  # else caught up since
                del self.deferred[worker]
                self._finish_step(worker, now_ms)
            return
        if not key.startswith(_WAKE):
            self._finish_step(key, now_ms)
            return
        worker = key.removeprefix(_WAKE)
        if self.wake_ms.get(worker) != now_ms:
            return  # an earlier wake replaced this one
        del self.wake_ms[worker]
        if worker not in self.busy and self.cores[worker].has_work():
            self._start_step(worker, now_ms)

    def _schedule(self, at_ms: float, key: str, worker: str | None = None) -> None:
        """Schedule event `key` at `at_ms`; `worker`: it is that worker's step end or wake."""
        self._sequence += 1
        private = worker is not None and not self._is_observer(worker)
        heapq.heappush(self.step_ends if private else self.observers, (at_ms, self._sequence, key))

    def _arrive(self, trace: TraceRequest, number: int, now_ms: float) -> None:
        # an array('I'): four bytes a token, read as it is by the hashing and the engine
        tokens = synthesize_prompt_ids(
            trace, vocab_size=self.config.vocab_size, seed=self.config.seed
        )
        self._admit(self._request_id(trace, number), tokens, trace.output_length, now_ms)

    def _request_id(self, trace: TraceRequest, number: int) -> str:
        """The id of the `number`th request (its trace kept for the report)."""
        request_id = f"req-{number}"
        self.traces[request_id] = trace
        return request_id

    def _admit(
        self, request_id: str, tokens: MutableSequence[int], max_tokens: int, now_ms: float
    ) -> None:
        """Route a request to a worker of `self.workers` and queue it there; the engine takes
        `tokens` over as its token list."""
        bs = self.config.block_size
        # hashed once for the router and the engine (both use the default seed: no adapters)
        pairs, seq_hashes = compute_block_and_seq_hashes(tokens, bs, DEFAULT_HASH_SEED)
        block_hashes = cast("list[tuple[int, int]]", pairs)
        decision = self.policy.select(
            RouteRequest(request_id, tokens, seq_hashes=seq_hashes), self.workers
        )
        if decision.worker in self.deferred:
            self._catch_up(decision.worker, now_ms)
        core = self.cores[decision.worker]
        request = EngineRequest(
            request_id=request_id,
            # in process only, never encoded: the engine takes the array over (take_prompt)
            prompt_token_ids=cast("list[int]", tokens),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        try:
            core.add_request(request, take_prompt=True, block_hashes=block_hashes)
        except InvalidRequestError:
            self.num_rejected += 1  # larger than a worker's KV cache or context
            return
        uncached = max(0, len(tokens) - decision.overlap_blocks * bs)
        self.load.start(request_id, decision.worker, uncached, -(-len(tokens) // bs))
        self._track(request_id, Tracked(now_ms, len(tokens), decision.worker))
        if decision.worker not in self.busy:
            self._start_step(decision.worker, now_ms)

    def _track(self, request_id: str, tracked: Tracked) -> None:
        """A request a worker took: tracked, and an arrival for the monitor (one a worker
        refused is not, as a frontend does not count a request it answered with a 4xx)."""
        self.tracked[request_id] = tracked
        if self.monitor is not None:
            self.monitor.on_arrival()

    def _start_step(self, worker: str, now_ms: float) -> None:
        core = self.cores[worker]
        runner = self.runners[worker]
        if not self.config.reference_steps:
            run = core.run_decodes(runner, now_ms, self._get_horizon_ms())
            if run is not None:
                self._index_events(worker)
                self._began_decodes(worker, run)
                return
        num_batches = runner.num_batches
        outputs = core.step()
        self._index_events(worker)
        if runner.num_batches == num_batches:  # nothing could run: idle until woken
            assert not outputs
            self._wake_idle(worker, now_ms)
            return
        self.pending[worker] = outputs
        self.busy.add(worker)
        self._schedule(now_ms + runner.last_step_ms, worker, worker)

    def _began_decodes(self, worker: str, run: DecodeRun) -> None:
        """`worker` is busy with decode run `run` until its last step's end: a suspended run
        goes on or ends there (`_go_on`), a done one delivers its tokens."""
        self.busy.add(worker)
        if run.outputs is None:
            self.runs[worker] = run
        else:
            self._deliver_decodes(run)
            self.pending[worker] = run.outputs
        self._schedule(run.step_end_ms[-1], worker, worker)

    def _go_on(self, worker: str, run: DecodeRun) -> bool:
        """At suspended `run`'s last step's end: run on when nothing joined the worker since
        (True), else end the run there with that step's outputs pending (False).

        Running on stops at the next arrival anywhere in the fleet, which must see every
        worker's KV events. But until the run's next step that others could see (it finishes
        a request or evicts a cached block: `DecodeRun.get_quiet_until_ms`), its steps only
        cache blocks of generated tokens, which no prompt's prefix holds. So where that is
        past the next arrival the run is left (`deferred`) until then, or until a request
        is routed to its worker or a timer reads the fleet (`_catch_up`), and runs on from
        its last step's end as it would have: the same steps, events and records."""
        if run.can_extend():
            horizon_ms = self._get_horizon_ms()
            if self.defers_runs:
                until_ms = run.get_quiet_until_ms()
                if until_ms is not None and until_ms > horizon_ms:
                    self.runs[worker] = run
                    self.busy.add(worker)
                    self.deferred[worker] = until_ms
                    self.num_deferrals += 1
                    self._schedule(until_ms, _DEFER + worker, worker)
                    return True
            num_steps = run.num_steps
            self.cores[worker].extend_decodes(run, horizon_ms)
            if run.num_steps > num_steps:
                self._index_events(worker)
                self._began_decodes(worker, run)
                return True
        outputs = run.outputs if run.outputs is not None else run.end()
        self._deliver_decodes(run)
        self.pending[worker] = outputs
        return False

    def _catch_up(self, worker: str, now_ms: float) -> None:
        """Run `worker`'s deferred run on to `now_ms` (its steps that start before it), as at
        the arrivals it was left past; its last step's end is then its next event."""
        del self.deferred[worker]
        run = self.runs[worker]
        if run.step_end_ms[-1] < now_ms:
            self.cores[worker].extend_decodes(run, now_ms)
            self._index_events(worker)
        end_ms = run.step_end_ms[-1]
        assert end_ms >= now_ms, "a deferred run was left past a step others could see"
        self._schedule(end_ms, worker, worker)

    def _deliver_decodes(self, run: DecodeRun) -> None:
        """The tokens of an ended decode run's steps but its last, each at its step's end (as
        `_deliver` would: none is a first token or a finish)."""
        ends_ms = run.step_end_ms[:-1]
        if ends_ms:
            gaps_ms = array("d", map(operator.sub, ends_ms[1:], ends_ms[:-1]))  # the batch's own
            for request_id in run.request_ids:
                self.tracked[request_id].add_later_tokens(ends_ms, gaps_ms)

    def _wake_idle(self, worker: str, now_ms: float) -> None:
        """Wake idle `worker` when its next load is done; with none in flight and requests
        queued (a step that preempted all it ran), after a step's time. An arrival wakes it
        sooner."""
        tiers = self.tiers.get(worker)
        done_s = tiers.get_next_done_s() if tiers is not None else None
        if done_s is not None:
            at_ms = done_s * 1000.0
        elif self.cores[worker].has_work():
            at_ms = now_ms + max(self.runners[worker].last_step_ms, MIN_RETRY_MS)
        else:
            return
        if at_ms < self.wake_ms.get(worker, float("inf")):
            self.wake_ms[worker] = at_ms
            self._schedule(at_ms, _WAKE + worker, worker)

    def _finish_step(self, worker: str, now_ms: float) -> None:
        self.busy.discard(worker)
        run = self.runs.pop(worker, None)
        if run is not None and self._go_on(worker, run):
            return
        for output in self.pending.pop(worker, []):
            self._deliver(output, now_ms)
        if self.cores[worker].has_work():
            self._start_step(worker, now_ms)
        elif worker in self.draining:
            self.draining.discard(worker)
            self._drain(worker, now_ms)

    def _deliver(self, output: EngineOutput, now_ms: float) -> None:
        t = self.tracked[output.request_id]
        if output.new_token_ids:
            num_tokens = len(output.new_token_ids)
            if t.add_tokens(now_ms, num_tokens, output.num_cached_tokens):
                self.load.first_token(output.request_id)
                if self.monitor is not None:
                    self.monitor.on_first_token(
                        now_ms - t.arrival_ms, t.num_cached_tokens, t.num_prompt_tokens
                    )
        if output.finish_reason is not None:
            self.load.finish(output.request_id)
            if self.monitor is not None:
                self.monitor.on_finish(t.as_finished())

    def _index_events(self, worker: str) -> None:
        """The worker's KV events into the index; with lower tiers, first its load report's
        tier capacities and costs (as the router service reads them)."""
        core = self.cores[worker]
        if not self.index_is_read or not self.index.has_worker(worker):
            core.take_kv_events()  # nobody reads the index, or a worker out of routing
            return
        if self.config.tiers.is_enabled:
            load = core.get_load()
            self.index.set_tier_capacities(worker, load.num_tier_total_blocks)
            if self.tier_weights is not None:
                self.tier_weights.update(worker, load.prefill_s_per_block, load.onboard_s_per_block)
        for event in core.take_kv_events():
            if not self.index.apply(worker, event):
                dump = core.dump_kv_blocks()
                self.index.load_dump(
                    worker, dump.seq_hashes, dump.last_event_id, dump.tier_seq_hashes
                )

    def report(self, end_ms: float, wall_time_s: float) -> ReplayReport:
        start_ms = self.requests[0].arrival_ms if self.requests else 0.0
        return build_report(
            ReportInputs(
                tracked=self.tracked,
                traces=self.traces,
                workers=self.workers,
                tier_stats=[tiers.get_stats() for tiers in self.tiers.values()],
                config=self.config,
                num_rejected=self.num_rejected,
                num_remote_prefills=self.num_remote_prefills,
                prefill_workers=self._get_prefill_names(),
            ),
            start_ms,
            end_ms,
            wall_time_s,
        )
