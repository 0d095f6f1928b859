"""VllmEngine: our Engine contract (DESIGN §3) over vLLM's AsyncLLM.

    generate(EngineRequest) --TokensPrompt + SamplingParams(DELTA, no detokenize)--> AsyncLLM
    EngineOutput <--to_engine_output-- RequestOutput delta (one per vLLM step)
    get_load()  <-- LoadTracker <-- vLLM's per-step SchedulerStats (a stat logger)
    take_step_records() <-- to_step_record <-- the same stats and the step's IterationStats
    take_kv_events() / dump_kv_blocks() <-- KvEventSubscriber <-- vLLM's zmq KV events

Closing the stream early (client gone, stop string, task cancelled) closes vLLM's stream,
which aborts the request in vLLM and frees its blocks. vLLM is reached only through the
`AsyncLlm` protocol and a `make_sampling` callable, so this module imports no vLLM.

Disaggregation (an engine started with vLLM's NIXL connector, `VllmTransfer`): a remote
prefill runs one token with `do_remote_decode` and finishes with FinishReason.TRANSFER and
a handle that carries vLLM's transfer params; a request with such a handle has vLLM pull the
prompt's blocks from the prefill engine (engines/vllm/disagg.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import msgspec

from armature.engines.api import EngineDeadError, InvalidRequestError, poll_for_update
from armature.engines.validation import validate_request
from armature.engines.vllm.disagg import (
    NIXL_BACKEND,
    PREFILL_PARAMS,
    ConnectorParamsError,
    decode_transfer_params,
    to_kv_handle,
)
from armature.engines.vllm.load import LoadTracker, SchedulerSnapshot
from armature.engines.vllm.outputs import PromptLogprobs, RequestOutputLike, to_engine_output
from armature.engines.vllm.sampling import VllmSampling, to_vllm_prompt, to_vllm_sampling
from armature.engines.vllm.steps import IterationSnapshot, to_step_record
from armature.engines.vllm.subscriber import KvEventSubscriber
from armature.protocols.engine import (
    EngineLoad,
    EngineOutput,
    EngineRequest,
    EngineStats,
    FinishReason,
    StepRecord,
)
from armature.protocols.kv_events import KvDump, KvEvent
from armature.protocols.kv_transfer import KvHandle, KvLayout
from armature.protocols.lora import LoraAdapter, LoraNotFoundError, lora_unsupported

__all__ = ["AsyncLlm", "VllmEngine", "VllmEngineInfo", "VllmTransfer"]

log = logging.getLogger(__name__)

MAX_BUFFERED_STEP_RECORDS = 4096  # kept until taken; beyond this the oldest are dropped


class AsyncLlm(Protocol):
    """The part of vLLM's AsyncLLM this adapter uses."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str
    ) -> AsyncGenerator[RequestOutputLike, None]: ...

    def shutdown(self) -> None: ...

    @property
    def errored(self) -> bool: ...


@dataclass(frozen=True)
class VllmEngineInfo:
    """The shape of the running vLLM engine, read back from its config after it started."""

    block_size: int
    num_kv_blocks: int
    max_model_len: int
    vocab_size: int
    max_logprobs: int


@dataclass(frozen=True)
class VllmTransfer:
    """The engine runs vLLM's NIXL connector: it can prefill for, and decode from, its peers."""

    worker_id: str  # ours, named in the handles it returns
    layout: KvLayout
    lease_s: float  # vLLM frees unread prefilled blocks this long after the prefill


class VllmEngine:
    """One vLLM engine (its core runs in vLLM's own processes) behind our Engine contract.

    Owns the AsyncLLM and the KV event subscriber: `stop` shuts both down. `record_step` is
    the stat logger's hook, called by vLLM on the event loop after every engine step; step
    records are kept (bounded) until `take_step_records`, also on the event loop.
    """

    def __init__(
        self,
        llm: AsyncLlm,
        info: VllmEngineInfo,
        *,
        make_sampling: Callable[[VllmSampling], Any],
        make_prompt: Callable[[list[int]], Any],
        subscriber: KvEventSubscriber | None,
        load: LoadTracker,
        client_errors: tuple[type[Exception], ...] = (),
        transfer: VllmTransfer | None = None,
    ):
        self.llm = llm
        self.info = info
        self._make_sampling = make_sampling
        self._make_prompt = make_prompt
        self._subscriber = subscriber
        self._load = load
        self._client_errors = client_errors  # vLLM's "bad request" exceptions
        self.transfer = transfer
        self.num_kv_pulls = 0  # decode legs that had vLLM pull the prompt's blocks
        self.num_kv_bytes_pulled = 0  # what vLLM's connector reports it read
        self.num_kv_pull_failures = 0
        self._active: set[str] = set()
        self._step_records: deque[StepRecord] = deque(maxlen=MAX_BUFFERED_STEP_RECORDS)
        self._started = False
        self._stopped = False

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._subscriber is not None and not self._started:
            self._subscriber.start()
        self._started = True

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.llm.shutdown()
        if self._subscriber is not None:
            self._subscriber.stop()

    @property
    def is_alive(self) -> bool:
        return self._started and not self._stopped and not self.llm.errored

    # ---- requests ----------------------------------------------------------------------
    def validate(self, request: EngineRequest) -> None:
        """The native engine's checks, with vLLM's limits, then what vLLM cannot do."""
        validate_request(
            request,
            vocab_size=self.info.vocab_size,
            max_model_len=self.info.max_model_len,
            block_size=self.info.block_size,
            num_kv_blocks=self.info.num_kv_blocks,
        )
        if request.lora_name is not None:
            raise lora_unsupported("vllm")
        if request.remote_prefill and self.transfer is None:
            raise InvalidRequestError(
                "this vllm worker prefills for no one: start it with --role prefill"
            )
        to_vllm_sampling(request, self.info.max_logprobs)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream outputs until one carries a finish_reason. Raises InvalidRequestError before
        anything reaches vLLM if the request cannot be served."""
        if not self.is_alive:
            raise EngineDeadError("the vllm engine is not running")
        self.validate(request)
        request_id = request.request_id
        if request_id in self._active:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        prompt = to_vllm_prompt(request)
        args = to_vllm_sampling(request, self.info.max_logprobs)
        prefill_leg = request.remote_prefill and request.sampling.max_tokens > 1
        pulls = False
        if prefill_leg:  # one token, then vLLM keeps the blocks for a decode engine
            extra = {"kv_transfer_params": dict(PREFILL_PARAMS)}
            args = replace(args, max_tokens=1, min_tokens=min(args.min_tokens, 1), extra_args=extra)
        elif request.kv_handle is not None and self.transfer is not None:
            params = self._decode_params(request, len(prompt.token_ids))
            if params is not None:
                args = replace(args, extra_args={"kv_transfer_params": params})
                pulls = True
        sampling = self._make_sampling(args)
        self._active.add(request_id)
        self._load.add_request(request_id, len(prompt.token_ids))
        stream = self.llm.generate(self._make_prompt(prompt.token_ids), sampling, request_id)
        first = True
        scored = None  # prompt logprobs, given with the first output
        if args.prompt_logprobs is not None:
            scored = PromptLogprobs(prompt.token_ids, args.prompt_logprobs)
        try:
            async for delta in stream:
                if scored is not None:
                    scored.add(delta.prompt_logprobs)
                    (completion,) = delta.outputs
                    if not completion.token_ids and completion.finish_reason is None:
                        continue  # a chunk of prompt logprobs alone
                output = to_engine_output(
                    request_id,
                    delta,
                    num_logprobs=request.sampling.logprobs,
                    num_prompt_tokens=prompt.num_prompt_tokens,
                    first=first,
                )
                if scored is not None:
                    output = msgspec.structs.replace(output, prompt_logprobs=scored.items)
                    scored = None
                if first:
                    self._load.prefill_done(request_id)
                    first = False
                    if pulls:
                        self.num_kv_pulls += 1
                if prefill_leg and output.finish_reason is FinishReason.LENGTH:
                    output = self._transfer_output(output, delta)
                if output.finish_reason is not None:
                    # let vLLM's stream end by itself: closing it now would send an abort
                    # for a request that is already done (a wasted round trip to its core)
                    await anext(stream, None)
                    yield output
                    return
                yield output
        except Exception as exc:
            if self.llm.errored:
                raise EngineDeadError(f"the vllm engine died: {exc}") from exc
            if first and isinstance(exc, self._client_errors):  # vLLM refused the request
                raise InvalidRequestError(str(exc)) from exc
            raise
        finally:
            self._active.discard(request_id)
            self._load.finish_request(request_id)
            await stream.aclose()  # unfinished: vLLM aborts the request and frees its blocks

    def get_num_active_requests(self) -> int:
        return len(self._active)

    # ---- disaggregation ------------------------------------------------------------------
    def _decode_params(
        self, request: EngineRequest, num_context_tokens: int
    ) -> dict[str, Any] | None:
        """vLLM's params to pull this request's prompt blocks; None to compute them here (a
        handle from a native prefill worker, or one that cannot be read)."""
        assert request.kv_handle is not None
        try:
            return decode_transfer_params(
                request.kv_handle,
                num_context_tokens=num_context_tokens,
                block_size=self.info.block_size,
            )
        except ConnectorParamsError as exc:
            log.warning("request %s: computing the prompt here: %s", request.request_id, exc)
            return None

    def _transfer_output(self, output: EngineOutput, delta: RequestOutputLike) -> EngineOutput:
        """The prefill leg's last output: TRANSFER, with a handle to the blocks vLLM kept (or
        none, when vLLM kept nothing usable: the decode worker then computes the prompt)."""
        assert self.transfer is not None
        handle = None
        try:
            handle = to_kv_handle(
                getattr(delta, "kv_transfer_params", None) or {},
                request_id=output.request_id,
                worker_id=self.transfer.worker_id,
                layout=self.transfer.layout,
                ttl_s=self.transfer.lease_s,
            )
        except ConnectorParamsError as exc:
            log.warning("request %s: no KV to hand over: %s", output.request_id, exc)
        return msgspec.structs.replace(
            output, finish_reason=FinishReason.TRANSFER, kv_handle=handle
        )

    def record_transfers(self, num_bytes: int, num_failures: int) -> None:
        """vLLM's connector stats for one engine step (called by the stat logger)."""
        self.num_kv_bytes_pulled += num_bytes
        self.num_kv_pull_failures += num_failures

    def stats(self) -> EngineStats:
        """KV transfer counters (disaggregated serving); zero without a connector."""
        if self.transfer is None:
            return EngineStats()
        return EngineStats(
            num_kv_pulls_by_backend={NIXL_BACKEND: self.num_kv_pulls},
            num_kv_blocks_pulled=self.num_kv_bytes_pulled // self.transfer.layout.bytes_per_block,
            num_kv_pull_failures=self.num_kv_pull_failures,
        )

    async def release_kv(self, handle: KvHandle) -> None:
        """Nothing to do: vLLM's connector has no early release; it frees unread prefilled
        blocks when their lease (`VllmTransfer.lease_s`) ends."""

    # ---- LoRA: not wired into this adapter (vLLM's LoRARequest needs enable_lora and
    # per-adapter ids at engine start); requests naming an adapter get a 400 ------------
    def get_lora_adapters(self) -> list[LoraAdapter]:
        return []

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        raise lora_unsupported("vllm")

    async def unload_lora(self, name: str) -> None:
        raise LoraNotFoundError(f"the vllm engine serves no LoRA adapter {name!r}")

    # ---- observation -------------------------------------------------------------------
    def record_step(
        self, snapshot: SchedulerSnapshot, iteration: IterationSnapshot | None = None
    ) -> None:
        """vLLM ran one step: update the load and keep the step's record (engines/vllm/steps
        says which fields vLLM's stats fill)."""
        self._load.record_step(snapshot)
        record = to_step_record(
            iteration or IterationSnapshot(), self._load.get_load(), self.info.block_size
        )
        self._step_records.append(record)

    def take_step_records(self) -> list[StepRecord]:
        records = list(self._step_records)
        self._step_records.clear()
        return records

    def get_scheduler_snapshot(self) -> SchedulerSnapshot:
        """vLLM's scheduler counts as of its last step."""
        return self._load.get_snapshot()

    def get_load(self) -> EngineLoad:
        return self._load.get_load()

    def take_kv_events(self) -> list[KvEvent]:
        return self._subscriber.take_events() if self._subscriber is not None else []

    async def wait_for_update(self, timeout_s: float) -> bool:
        return await poll_for_update(timeout_s)  # vLLM's stats and events arrive without a signal

    async def dump_kv_blocks(self) -> KvDump:
        if not self.is_alive:
            raise EngineDeadError("the vllm engine is not running")
        if self._subscriber is None:
            return KvDump(seq_hashes=[], last_event_id=-1)
        return self._subscriber.dump()
