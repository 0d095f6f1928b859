"""EngineCore: one synchronous engine step = schedule, run the model, sample, finish.

The core owns the requests and wires the step's parts: the scheduler, the model runner, what
the result does to its requests (`outputs`), the decode fast path (`decode_run`) and the KV
handoff of disaggregated serving (`kv_handoff`). Not thread-safe: one thread (the
AsyncEngine's, or a test) owns it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from armature.engines.api import InvalidRequestError
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.decode_run import DecodeRun, DecodeRunner, can_run_decodes, run_decodes
from armature.engines.native.kv_handoff import free_unpinned, import_kv, pin_prompt, plan_import
from armature.engines.native.kv_manager import KvCacheManager
from armature.engines.native.lora_set import LoraSet
from armature.engines.native.onboarding import Onboarding
from armature.engines.native.outputs import fail_batch, sample_and_finish
from armature.engines.native.request import RequestState
from armature.engines.native.runner_api import ModelRunner
from armature.engines.native.scheduler import Scheduler
from armature.engines.native.step_stats import StepStats
from armature.engines.validation import check_structured_output, validate_request
from armature.errors import ConfigError
from armature.grammar.compile import check_guide
from armature.grammar.tokenizer import load_grammar_tokenizer
from armature.kv.block_pool import BlockPool, make_block_pool
from armature.kv.event_log import KvEventLog
from armature.kv.eviction import EvictionObserver
from armature.kv.hashing import DEFAULT_HASH_SEED
from armature.model.arch import ModelArch, read_arch
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    StepRecord,
)
from armature.protocols.kv_events import KvDump, KvEvent
from armature.protocols.kv_transfer import KvHandle
from armature.protocols.lora import LoraNotFoundError
from armature.tiers.api import KvTiers
from armature.transfer.blocks import KvBlocks, KvBlockStore
from armature.transfer.pins import PinTable

if TYPE_CHECKING:
    from armature.engines.native.grammar import GrammarMasks

__all__ = [
    "EngineCore",
    "InvalidRequestError",
    "TierBuilder",
    "resolve_max_model_len",
]

log = logging.getLogger(__name__)

ONBOARD_WAIT_S = 0.005  # an engine with only loads in flight waits this long for one

# builds the lower KV tiers of an engine: its event log (shared with the block pool) and
# its KV cache in, a tier manager out
TierBuilder = Callable[[KvEventLog, KvBlockStore], KvTiers]


def resolve_max_model_len(config: NativeEngineConfig, arch: ModelArch) -> int:
    limit = arch.max_position_embeddings
    if arch.sliding_window:
        limit = min(limit, arch.sliding_window)  # no sliding-window attention yet
    if config.max_model_len is not None:
        if config.max_model_len > limit:
            raise ConfigError(f"max_model_len {config.max_model_len} exceeds the model's {limit}")
        limit = config.max_model_len
    return limit


class EngineCore:
    def __init__(
        self,
        config: NativeEngineConfig,
        runner: ModelRunner | None = None,
        *,
        num_blocks: int | None = None,
        eviction_observer: EvictionObserver | None = None,
        tiers: TierBuilder | None = None,
        time_s: Callable[[], float] = time.perf_counter,
        grammar: GrammarMasks | None = None,
        name: str = "native",
        loras: LoraSet | None = None,
    ):
        """`eviction_observer` is told about each cached block before the block pool reuses
        it (see `armature.kv.eviction`). `tiers` builds the lower KV tiers (G2-G4): they are
        the pool's eviction observer, and prompts onboard blocks from them. `time_s` times
        the steps (the mocker passes its clock, on which a step takes its modeled time).
        `grammar` masks the logits of guided requests (structured output); a core that builds
        its own model runner builds it from the model's tokenizer, and one without it refuses
        guided requests, naming itself by `name`. `loras`: the LoRA adapters requests may
        name (shared with the engine's owner, which adds and removes them)."""
        if tiers is not None and eviction_observer is not None:
            raise ValueError("lower KV tiers are the pool's eviction observer: pass one")
        self.config = config
        self._time_s = time_s
        arch = runner.arch if runner is not None else read_arch(config.model_dir)
        self.max_model_len = resolve_max_model_len(config, arch)
        if runner is None:
            # the model and its grammar masks need torch: loaded only here, never by the mocker
            from armature.engines.native.grammar import GrammarMasks
            from armature.engines.native.model_runner import TorchModelRunner

            torch_runner = TorchModelRunner(config, self.max_model_len)
            num_blocks = torch_runner.num_blocks
            runner = torch_runner
            if grammar is None:
                grammar = GrammarMasks(
                    lambda: load_grammar_tokenizer(
                        config.model_dir, arch.vocab_size, arch.eos_token_ids
                    ),
                    arch.vocab_size,
                )
        assert num_blocks is not None, "a custom runner must say how many blocks it has"
        self.runner: ModelRunner = runner
        self.arch = arch
        self.name = name
        self.grammar = grammar
        event_log = KvEventLog()
        self.tiers = tiers(event_log, runner.kv_store) if tiers is not None else None
        self.pool: BlockPool = make_block_pool(
            num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            eviction_observer=self.tiers if self.tiers is not None else eviction_observer,
            event_log=event_log,
        )
        on_written = self.tiers.on_written if self.tiers is not None else None
        self.kv = KvCacheManager(self.pool, on_written)
        self.loras = loras if loras is not None else LoraSet()
        self.onboarding = Onboarding(self.pool, self.tiers) if self.tiers is not None else None
        self.scheduler = Scheduler(
            self.kv, config.max_num_seqs, config.max_num_batched_tokens, self.onboarding
        )
        self.eos_token_ids = arch.eos_token_ids
        self._requests: dict[str, RequestState] = {}
        self._seed_source = random.Random(config.seed)
        self._arrivals = 0
        self._num_steps = 0
        self.step_stats = StepStats(config.block_size)
        # disaggregation: prompt blocks pinned for decode workers, and where they pull them
        self.kv_store = runner.kv_store
        self.pins = PinTable()
        self.worker_id = ""
        self.kv_endpoints: dict[str, str] = {}

    # ---- requests ----------------------------------------------------------------------
    def validate(self, request: EngineRequest) -> None:
        """Raise InvalidRequestError if `request` can never be served. Reads config only."""
        validate_request(
            request,
            vocab_size=self.arch.vocab_size,
            max_model_len=self.max_model_len,
            block_size=self.config.block_size,
            num_kv_blocks=self.pool.num_blocks,
        )
        if request.lora_name is not None and self.loras.get(request.lora_name) is None:
            raise LoraNotFoundError(
                f"the model {request.lora_name!r} does not exist: this {self.name} engine "
                "serves no LoRA adapter of that name",
                param="model",
            )
        check_structured_output(request, engine=self.name, supported=self.grammar is not None)
        if request.sampling.guide is not None:
            check_guide(request.sampling.guide)

    def add_request(
        self,
        request: EngineRequest,
        held_block_ids: list[int] | None = None,
        *,
        take_prompt: bool = False,
        block_hashes: list[tuple[int, int]] | None = None,
    ) -> None:
        """Queue `request`. `held_block_ids` are imported KV blocks (see `import_kv`) whose
        references the request takes over; they are dropped once it is admitted. With
        `take_prompt` (a request with no output yet) its prompt list becomes the engine's
        token list, appended to as tokens are made: a caller that gives the list up (the
        simulator) saves copying and freeing a long prompt. `block_hashes`: the prompt's full
        blocks' hashes as `compute_block_hashes` makes them with the request's seed, from a
        caller that has them (the simulator, which hashed the prompt to route it); the
        engine extends the list and does not hash those blocks again."""
        self.validate(request)
        if request.request_id in self._requests:
            raise InvalidRequestError(f"duplicate request id {request.request_id!r}")
        if block_hashes is not None:
            num_full = len(request.prompt_token_ids) // self.config.block_size
            if request.output_token_ids or len(block_hashes) != num_full:
                raise ValueError(
                    f"block_hashes must be the hashes of the prompt's {num_full} full blocks "
                    f"of a request with no output yet, got {len(block_hashes)}"
                )
        seed = request.sampling.seed
        sampling_seed = None
        if request.sampling.temperature > 0:
            sampling_seed = seed if seed is not None else self._seed_source.getrandbits(63)
        guide = request.sampling.guide
        grammar = None
        if guide is not None:
            assert self.grammar is not None, "validate refuses guides without a grammar"
            grammar = self.grammar.build(guide, request.output_token_ids)
        lora = None if request.lora_name is None else self.loras.get(request.lora_name)
        if request.lora_name is not None and lora is None:  # unloaded since validated
            raise LoraNotFoundError(f"LoRA adapter {request.lora_name!r} was unloaded")
        state = RequestState(
            request_id=request.request_id,
            token_ids=(
                request.prompt_token_ids
                if take_prompt and not request.output_token_ids
                else [*request.prompt_token_ids, *request.output_token_ids]
            ),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=request.sampling,
            sampling_seed=sampling_seed,
            arrival_index=self._arrivals,
            num_output_at_start=len(request.output_token_ids),
            remote_prefill=request.remote_prefill,
            held_block_ids=list(held_block_ids or []),
            grammar=grammar,
            lora=lora,
            hash_seed=DEFAULT_HASH_SEED if lora is None else lora.hash_seed,
        )
        if block_hashes is not None:
            state.block_hashes = block_hashes
        if request.computes_whole_prompt:
            state.prompt_logprobs = []  # a resumed request gave them with its first output
        self._arrivals += 1
        self._requests[request.request_id] = state
        self.scheduler.add_request(state)

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request and free its blocks; False if it is unknown or already done. A
        remote prefill that finished just before its caller left has its pin released."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return self.pins.release_request(request_id)
        self.scheduler.finish(state, FinishReason.ABORT)
        return True

    def has_work(self) -> bool:
        """Requests queued, running or onboarding."""
        return self.scheduler.has_work() or bool(self.onboarding)

    def close(self) -> None:
        """Stop the lower tiers' threads (after their loads and writes finish) and release
        what finished loads hold, and the grammar's mask thread. The core serves nothing after
        this."""
        if self.grammar is not None:
            self.grammar.close()
        if self.tiers is None or self.onboarding is None:
            return
        # the finished loads settle first: a block a load refused is dropped from its tier
        # by the writers, which close() stops
        self.tiers.finish_loads()
        for request in self.onboarding.take_ready():
            self.kv.release_held(request)
        self.tiers.close()

    # ---- the step ----------------------------------------------------------------------
    def step(self) -> list[EngineOutput]:
        """Schedule a batch, run it, sample, finish requests. A batch that ran without error
        leaves one StepRecord (see `take_step_records`)."""
        started_s = self._time_s()
        if self.onboarding is not None:
            self.scheduler.requeue_onboarded(self.onboarding.take_ready())
        scheduled = self.scheduler.schedule()
        self._num_steps += 1
        if not scheduled.chunks:
            if self.tiers is not None and self.onboarding:
                self.tiers.wait_for_loads(ONBOARD_WAIT_S)  # nothing to run until one lands
            return []
        num_kv_tokens_used = self.pool.get_num_active_blocks() * self.config.block_size
        completing = [c for c in scheduled.chunks if c.completes_sequence]
        # the guided rows' masks are computed on the grammar's thread while the model runs
        masks = None
        if self.grammar is not None:
            masks = self.grammar.start([c.request.grammar for c in completing])
        try:
            logits = self.runner.execute(scheduled.chunks)
        except Exception as exc:  # the model failed: fail this batch, keep serving
            log.exception("engine step failed; failing %d requests", len(scheduled.chunks))
            if masks is not None:
                masks.wait()  # the matchers are the mask thread's until it is done
            return fail_batch(scheduled, exc, self._finish)
        self.scheduler.update_after_step(scheduled)
        outputs = sample_and_finish(
            completing,
            logits,
            masks,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            finish=self._finish,
            pin_prompt=self._pin_prompt,
        )
        wall_s = self._time_s() - started_s
        self.step_stats.record(
            scheduled,
            num_kv_tokens_used=num_kv_tokens_used,
            num_queued_prefill_requests=self.scheduler.get_num_prefill_requests_queued(),
            num_queued_prefill_tokens=self.scheduler.get_num_prefill_tokens_queued(),
            wall_s=wall_s,
        )
        return outputs

    def run_decodes(
        self, runner: DecodeRunner, now_ms: float, horizon_ms: float
    ) -> DecodeRun | None:
        """The decode fast path (`engines.native.decode_run`): when the next step is a batch
        of decodes only, run it and the steps after it that the same batch would run, until
        one finishes a request, would preempt, or would start at or after `horizon_ms` (step
        times from `runner`, which must be this core's, on the clock that times its steps).
        Same effects as that many `step` calls; None (nothing run) when the next step is not
        such a batch."""
        if self.tiers is not None or not can_run_decodes(self.scheduler, self.eos_token_ids):
            return None
        run = run_decodes(
            self.scheduler,
            self.step_stats,
            runner,
            max_model_len=self.max_model_len,
            now_ms=now_ms,
            horizon_ms=horizon_ms,
            finish=self._finish,
        )
        if run is not None:
            self._num_steps += run.num_steps
        return run

    def extend_decodes(self, run: DecodeRun, horizon_ms: float) -> None:
        """Go on with suspended `run` (this core's, `run.can_extend()`) from its last step's
        end until the same conditions as `run_decodes`, `horizon_ms` the new horizon. Same
        effects as the steps it runs; when its first step would preempt, the run ends at its
        last step (no step is run)."""
        num_steps = run.num_steps
        run.extend(horizon_ms)
        self._num_steps += run.num_steps - num_steps

    def _finish(self, req: RequestState, reason: FinishReason) -> None:
        self.scheduler.finish(req, reason)
        self._requests.pop(req.request_id, None)

    # ---- disaggregation (kv_handoff) ---------------------------------------------------
    def _pin_prompt(self, req: RequestState) -> KvHandle:
        """Keep the prompt's full blocks after `req` finishes, for a decode worker to pull."""
        return pin_prompt(
            req,
            self.pool,
            self.pins,
            self.config,
            self.kv_store,
            worker_id=self.worker_id,
            endpoints=self.kv_endpoints,
        )

    def free_unpinned(self, now_s: float | None = None) -> int:
        """Free the blocks of released and expired handles; returns how many."""
        return free_unpinned(self.pool, self.pins, now_s)

    def plan_import(self, request: EngineRequest) -> tuple[Sequence[tuple[int, int]], int]:
        """(hashes of the prompt blocks `request.kv_handle` offers, how many of them this
        engine already caches as a prefix). Refuses (TransferError) a handle whose hashes are
        not this prompt's. Safe from another thread: the cached count is a hint, checked
        again by `import_kv`."""
        return plan_import(request, self.pool, self.config, self.loras)

    def import_kv(
        self, hashes: Sequence[tuple[int, int]], start: int, blocks: KvBlocks
    ) -> list[int]:
        """Cache `blocks` as the prompt blocks `start..` (under `hashes[start:]`) on top of the
        cached prefix `hashes[:start]`. Returns the ids of the whole prefix with one reference
        each, for `add_request(held_block_ids=...)`; [] (nothing changed) when the prefix was
        evicted meanwhile or the pool is too full."""
        return import_kv(self.pool, self.kv_store, self.config, hashes, start, blocks)

    # ---- observation -------------------------------------------------------------------
    def get_load(self) -> EngineLoad:
        """The load, with the costs tier-aware routing weighs: seconds per prefill block over
        the prefill-only steps so far, per lower tier the seconds to load a block back, and
        the lower tiers' capacities."""
        tiers = self.tiers
        # requests waiting for their blocks to load from lower tiers wait too
        onboarding = self.scheduler.onboarding
        num_onboarding, onboarding_tokens = (
            (onboarding.get_num_waiting(), onboarding.get_num_tokens_to_compute())
            if onboarding is not None
            else (0, 0)
        )
        return EngineLoad(
            num_active_blocks=self.pool.get_num_active_blocks(),
            num_total_blocks=self.pool.num_blocks,
            num_waiting=len(self.scheduler.waiting) + num_onboarding,
            num_running=len(self.scheduler.running),
            num_prefill_tokens_queued=self.scheduler.get_num_prefill_tokens_queued()
            + onboarding_tokens,
            num_steps=self._num_steps,
            prefill_s_per_block=self.step_stats.get_prefill_s_per_block(),
            onboard_s_per_block=tiers.counters.get_onboard_s_per_block()
            if tiers is not None
            else {},
            num_tier_total_blocks={
                t: tiers.policy.get_capacity_blocks(t) for t in tiers.policy.get_tiers()
            }
            if tiers is not None
            else {},
        )

    def take_kv_events(self) -> list[KvEvent]:
        return self.pool.take_events()

    def take_step_records(self) -> list[StepRecord]:
        """Drain the records of the steps run since the last call (see `StepStats`)."""
        return self.step_stats.take_records()

    def dump_kv_blocks(self) -> KvDump:
        """Every cached block, in G1 and each lower tier, as of the newest event emitted
        (take the events first)."""
        tiers = {}
        if self.tiers is not None:
            policy = self.tiers.policy
            tiers = {t: [k.seq_hash for k in policy.get_keys(t)] for t in policy.get_tiers()}
        return KvDump(self.pool.get_cached_hashes(), self.pool.get_last_event_id(), tiers)
