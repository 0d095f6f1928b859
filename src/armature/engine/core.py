"""EngineCore: one synchronous engine step = schedule, run the model, sample, finish.

Not thread-safe: one thread (the AsyncEngine's, or a test) owns it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque

import torch

from armature.engine.config import EngineConfig
from armature.engine.interface import InvalidRequestError
from armature.engine.kv_manager import KvCacheManager
from armature.engine.model_runner import ModelRunner, RunnerOutput, TorchModelRunner
from armature.engine.request import RequestState
from armature.engine.sampler import SampleInput, sample
from armature.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from armature.engine.validation import validate_request
from armature.kv.block_pool import BlockPool
from armature.kv.hashing import DEFAULT_HASH_SEED
from armature.model.arch import ModelArch, read_arch
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    FinishReason,
    StepRecord,
    TokenLogprob,
)
from armature.protocols.kv_events import KvDump, KvEvent

__all__ = ["EngineCore", "InvalidRequestError", "resolve_max_model_len"]

log = logging.getLogger(__name__)


def resolve_max_model_len(config: EngineConfig, arch: ModelArch) -> int:
    limit = arch.max_position_embeddings
    if arch.sliding_window:
        limit = min(limit, arch.sliding_window)  # no sliding-window attention yet
    if config.max_model_len is not None:
        if config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {limit}")
        limit = config.max_model_len
    return limit


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner | None = None,
        *,
        num_blocks: int | None = None,
    ):
        self.config = config
        arch = runner.arch if runner is not None else read_arch(config.model_dir)
        self.max_model_len = resolve_max_model_len(config, arch)
        if runner is None:
            torch_runner = TorchModelRunner(config, self.max_model_len)
            num_blocks = torch_runner.num_blocks
            runner = torch_runner
        assert num_blocks is not None, "a custom runner must say how many blocks it has"
        self.runner: ModelRunner = runner
        self.arch = arch
        self.pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
        self.kv = KvCacheManager(self.pool, DEFAULT_HASH_SEED)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.eos_token_ids = arch.eos_token_ids
        self._requests: dict[str, RequestState] = {}
        self._seed_source = random.Random(config.seed)
        self._arrivals = 0
        self.step_records: deque[StepRecord] = deque(maxlen=1024)

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

    def add_request(self, request: EngineRequest) -> None:
        self.validate(request)
        if request.request_id in self._requests:
            raise InvalidRequestError(f"duplicate request id {request.request_id!r}")
        seed = request.sampling.seed
        if request.sampling.temperature > 0:
            generator = torch.Generator()
            generator.manual_seed(seed if seed is not None else self._seed_source.getrandbits(63))
        else:
            generator = None
        state = RequestState(
            request_id=request.request_id,
            token_ids=list(request.prompt_token_ids) + list(request.output_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=request.sampling,
            generator=generator,
            arrival_index=self._arrivals,
            num_output_at_start=len(request.output_token_ids),
        )
        self._arrivals += 1
        self._requests[request.request_id] = state
        self.scheduler.add_request(state)

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request and free its blocks; False if it is unknown or already done."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return False
        self.scheduler.finish(state, FinishReason.ABORT)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- the step ----------------------------------------------------------------------
    def step(self) -> list[EngineOutput]:
        started_s = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled.chunks:
            return []
        completing = [c for c in scheduled.chunks if c.completes_sequence]
        try:
            logits = self.runner.execute(scheduled.chunks)
        except Exception as exc:  # the model failed: fail this batch, keep serving
            log.exception("engine step failed; failing %d requests", len(scheduled.chunks))
            return self._fail(scheduled, exc)
        self.scheduler.update_after_step(scheduled)
        outputs = self._sample_and_finish(completing, logits)
        self._record(scheduled, time.perf_counter() - started_s)
        return outputs

    def _sample_and_finish(
        self, completing: list[ScheduledChunk], result: RunnerOutput
    ) -> list[EngineOutput]:
        tokens: list[int]
        logprobs: list[TokenLogprob | None]
        if isinstance(result, list):  # the runner chose the tokens (the mocker)
            tokens, logprobs = result, [None] * len(result)
        else:
            inputs = [self._sample_input(c.request) for c in completing]
            tokens, logprobs = sample(result, inputs)
        outputs: list[EngineOutput] = []
        for chunk, token, logprob in zip(completing, tokens, logprobs, strict=True):
            req: RequestState = chunk.request
            first = req.num_output_tokens == req.num_output_at_start
            req.token_ids.append(token)
            reason = self._finish_reason(req, token)
            if reason is not None:
                self.scheduler.finish(req, reason)
                self._requests.pop(req.request_id, None)
            outputs.append(
                EngineOutput(
                    request_id=req.request_id,
                    new_token_ids=[token],
                    logprobs=[logprob] if logprob is not None else None,
                    finish_reason=reason,
                    num_prompt_tokens=req.num_prompt_tokens if first else 0,
                    num_cached_tokens=req.num_cached_tokens if first else 0,
                )
            )
        return outputs

    def _sample_input(self, req: RequestState) -> SampleInput:
        p = req.sampling
        blocked: tuple[int, ...] = ()
        if req.num_output_tokens < p.min_tokens:
            blocked = p.stop_token_ids + (() if p.ignore_eos else self.eos_token_ids)
        return SampleInput(p, req.generator, req.num_output_tokens, blocked)

    def _finish_reason(self, req: RequestState, token: int) -> FinishReason | None:
        p = req.sampling
        if not p.ignore_eos and token in self.eos_token_ids:
            return FinishReason.STOP
        if token in p.stop_token_ids:
            return FinishReason.STOP
        if req.num_output_tokens >= p.max_tokens + req.num_output_at_start:
            return FinishReason.LENGTH
        if req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _fail(self, scheduled: SchedulerOutput, exc: Exception) -> list[EngineOutput]:
        outputs = []
        for chunk in scheduled.chunks:
            req = chunk.request
            self.scheduler.finish(req, FinishReason.ERROR)
            self._requests.pop(req.request_id, None)
            outputs.append(
                EngineOutput(
                    request_id=req.request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ERROR,
                    error=str(exc),
                )
            )
        return outputs

    def _record(self, scheduled: SchedulerOutput, wall_s: float) -> None:
        prefill_tokens = sum(c.num_tokens for c in scheduled.chunks if not c.is_decode)
        self.step_records.append(
            StepRecord(
                num_scheduled_prefill_tokens=prefill_tokens,
                num_queued_prefill_tokens=self.scheduler.get_num_prefill_tokens_queued(),
                num_decode_requests=sum(1 for c in scheduled.chunks if c.is_decode),
                num_kv_tokens_used=self.pool.get_num_active_blocks() * self.config.block_size,
                step_wall_s=wall_s,
            )
        )

    # ---- observation -------------------------------------------------------------------
    def get_load(self) -> EngineLoad:
        return EngineLoad(
            num_active_blocks=self.pool.get_num_active_blocks(),
            num_total_blocks=self.pool.num_blocks,
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            num_prefill_tokens_queued=self.scheduler.get_num_prefill_tokens_queued(),
        )

    def take_kv_events(self) -> list[KvEvent]:
        return self.pool.take_events()

    def dump_kv_blocks(self) -> KvDump:
        """Every cached block, as of the newest event emitted (take the events first)."""
        return KvDump(self.pool.get_cached_hashes(), self.pool.get_last_event_id())
