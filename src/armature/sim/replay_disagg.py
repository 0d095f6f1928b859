"""Disaggregated replay: prefill and decode mocker workers on the virtual clock.

    arrival --conditional--> local:  a decode worker prefills and decodes (Simulation)
                      \\--> remote: prefill worker (KV-routed) -> first token, pinned blocks
                                   -> transfer (missing blocks x bytes / bandwidth)
                                   -> decode worker imports the blocks and continues

The real engine code does each part: `remote_prefill` pins the prompt, `plan_import` /
`import_kv` bring the blocks the decode worker lacks, the prefill frees them on release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from armature.config import DisaggConfig
from armature.errors import InvalidRequestError
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_seq_hashes
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.worker import WorkerRole
from armature.router.load import ActiveLoad
from armature.router.policies import RouteRequest
from armature.router.prefill_decision import PrefillDecision, decide_prefill
from armature.router.prefix_index import PrefixIndex
from armature.sim.replay_config import ReplayConfig
from armature.sim.sim_report import Tracked
from armature.sim.simulation import Simulation
from armature.sim.timing import TimingModel
from armature.transfer.blocks import KvBlocks
from armature.workload.traces import TraceRequest, synthesize_prompt

__all__ = ["DisaggSimulation"]

_TRANSFER = "transfer:"


@dataclass
class _Transfer:
    request: EngineRequest  # the decode leg, carrying the handle
    prefill_worker: str
    decode_worker: str


class DisaggSimulation(Simulation):
    def __init__(
        self,
        requests: Sequence[TraceRequest],
        config: ReplayConfig,
        timing: TimingModel,
        prefill_timing: TimingModel | None = None,
    ):
        super().__init__(requests, config, timing, prefill_timing)
        self.prefill_index = PrefixIndex()
        for worker in self.prefill_workers:
            self.prefill_index.add_worker(worker, config.num_kv_blocks)
        self.prefill_load = ActiveLoad()
        # every prefill worker ever in routing (a draining one still delivers first tokens)
        self._prefill_names = set(self.prefill_workers)
        self.prefill_policy = self._policy(self.prefill_index, self.prefill_load)
        self.disagg = DisaggConfig(
            max_local_prefill_tokens=config.max_local_prefill_tokens,
            max_prefill_queue_tokens=config.max_prefill_queue_tokens,
        )
        self.prompts: dict[str, list[int]] = {}
        self.transfers: dict[str, _Transfer] = {}
        self.prefill_of: dict[str, str] = {}
        self.max_tokens_of: dict[str, int] = {}

    def _decide_prefill(self, tokens: list[int]) -> PrefillDecision:
        """The frontend's decision (router.prefill_decision) over this simulation's pools."""
        bs = self.config.block_size

        def get_num_cached_blocks() -> int:
            hashes = compute_seq_hashes(tokens, bs, DEFAULT_HASH_SEED)
            return max(self.index.find_overlaps(hashes).values(), default=0)

        return decide_prefill(
            num_prompt_tokens=len(tokens),
            get_num_cached_blocks=get_num_cached_blocks,
            block_size=bs,
            prefill_queue_tokens=[
                self.prefill_load.get(w).active_prefill_tokens for w in self.prefill_workers
            ],
            config=self.disagg,
        )

    def _arrive(self, trace: TraceRequest, number: int, now_ms: float) -> None:
        tokens = synthesize_prompt(trace, vocab_size=self.config.vocab_size, seed=self.config.seed)
        request_id = self._request_id(trace, number)
        if not self.prefill_workers or not self._decide_prefill(tokens).is_remote:
            self._admit(request_id, tokens, trace.output_length, now_ms)
            return
        decision = self.prefill_policy.select(
            RouteRequest(request_id, tokens), self.prefill_workers
        )
        request = EngineRequest(
            request_id=request_id,
            prompt_token_ids=tokens,
            sampling=SamplingParams(
                max_tokens=trace.output_length, temperature=0.0, ignore_eos=True
            ),
            remote_prefill=True,
        )
        try:
            self.cores[decision.worker].add_request(request)
        except InvalidRequestError:
            self.num_rejected += 1
            return
        self.num_remote_prefills += 1
        bs = self.config.block_size
        uncached = max(0, len(tokens) - decision.overlap_blocks * bs)
        self.prefill_load.start(request_id, decision.worker, uncached, -(-len(tokens) // bs))
        self._track(request_id, Tracked(now_ms, len(tokens), decision.worker))
        self.prompts[request_id] = tokens
        self.max_tokens_of[request_id] = trace.output_length
        self.prefill_of[request_id] = decision.worker
        if decision.worker not in self.busy:
            self._start_step(decision.worker, now_ms)

    def _deliver(self, output: EngineOutput, now_ms: float) -> None:
        rid = output.request_id
        if rid in self.prefill_of and self.tracked[rid].first_token_ms is None:
            self._prefill_done(output, now_ms)
            return
        super()._deliver(output, now_ms)

    def _prefill_done(self, output: EngineOutput, now_ms: float) -> None:
        rid = output.request_id
        t = self.tracked[rid]
        t.add_tokens(now_ms, len(output.new_token_ids), output.num_cached_tokens)  # the first
        self.prefill_load.finish(rid)
        prefill_worker = self.prefill_of.pop(rid)
        tokens = self.prompts.pop(rid)
        if self.monitor is not None:
            self.monitor.on_first_token(now_ms - t.arrival_ms, t.num_cached_tokens, len(tokens))
        if output.finish_reason is not FinishReason.TRANSFER:
            self.max_tokens_of.pop(rid, None)
            if self.monitor is not None:
                self.monitor.on_finish(t.as_finished())
            return  # finished with its first token
        handle: KvHandle | None = output.kv_handle
        assert handle is not None
        decision = self.policy.select(RouteRequest(rid, tokens), self.workers)
        request = EngineRequest(
            request_id=rid,
            prompt_token_ids=tokens,
            output_token_ids=list(output.new_token_ids),
            sampling=SamplingParams(
                max_tokens=self.max_tokens_of.pop(rid) - len(output.new_token_ids),
                temperature=0.0,
                ignore_eos=True,
            ),
            kv_handle=handle,
        )
        hashes, start = self.cores[decision.worker].plan_import(request)
        num_missing = len(hashes) - start
        c = self.config
        delay_ms = num_missing * c.kv_bytes_per_block / c.transfer_bandwidth_bytes_s * 1000.0
        self.transfers[rid] = _Transfer(request, prefill_worker, decision.worker)
        self._schedule(now_ms + delay_ms / c.speedup_ratio, _TRANSFER + rid)

    def _on_event(self, key: str, now_ms: float) -> None:
        if not key.startswith(_TRANSFER):
            super()._on_event(key, now_ms)
            return
        rid = key.removeprefix(_TRANSFER)
        transfer = self.transfers.pop(rid)
        request, worker = transfer.request, transfer.decode_worker
        core = self.cores[worker]
        hashes, start = core.plan_import(request)
        held: list[int] = []
        if start < len(hashes):
            blocks = KvBlocks(list(range(len(hashes) - start)), None, None)
            held = core.import_kv(hashes, start, blocks)
        core.add_request(request, held)
        assert request.kv_handle is not None
        prefill = self.cores[transfer.prefill_worker]
        prefill.pins.release(request.kv_handle.handle_id)
        prefill.free_unpinned()
        self._index_events(worker)
        bs = self.config.block_size
        num_tokens = len(request.prompt_token_ids) + 1
        tail = num_tokens - len(held) * bs
        self.load.start(rid, worker, tail, -(-num_tokens // bs))
        self.load.first_token(rid)
        self.tracked[rid].worker = worker
        if worker not in self.busy:
            self._start_step(worker, now_ms)

    def _get_prefill_names(self) -> frozenset[str]:
        return frozenset(self._prefill_names)

    def join(self, worker: str, role: WorkerRole) -> None:
        if role is not WorkerRole.PREFILL:
            super().join(worker, role)
            return
        self.prefill_workers.append(worker)
        self._prefill_names.add(worker)
        self.prefill_index.add_worker(worker, self.config.num_kv_blocks)

    def leave(self, worker: str, role: WorkerRole) -> None:
        if role is not WorkerRole.PREFILL:
            super().leave(worker, role)
            return
        self.prefill_workers.remove(worker)
        self.prefill_index.remove_worker(worker)
        self._drain(worker, self.now_ms)

    def _reads_index(self) -> bool:
        """Always: the frontend's local-or-remote prefill decision reads the decode workers'
        cached prefixes, whatever the router."""
        return True

    def _defers_runs(self) -> bool:
        """Never: a decode worker's requests also join it from prefill workers' transfers,
        which no deferred run is caught up for."""
        return False

    def _is_observer(self, worker: str) -> bool:
        """A prefill worker's step end routes its requests' decode legs."""
        return worker in self._prefill_names

    def _index_events(self, worker: str) -> None:
        if worker not in self.prefill_index.get_workers():
            super()._index_events(worker)
            return
        core = self.cores[worker]
        for event in core.take_kv_events():
            if not self.prefill_index.apply(worker, event):
                dump = core.dump_kv_blocks()
                self.prefill_index.load_dump(worker, dump.seq_hashes, dump.last_event_id)
