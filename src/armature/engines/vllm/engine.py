"""VllmEngine: our Engine contract (DESIGN §3) over vLLM's AsyncLLM.

    generate(EngineRequest) --TokensPrompt + SamplingParams(DELTA, no detokenize)--> AsyncLLM
    EngineOutput <--to_engine_output-- RequestOutput delta (one per vLLM step)
    get_load()  <-- LoadTracker <-- vLLM's per-step SchedulerStats (a stat logger)
    take_kv_events() / dump_kv_blocks() <-- KvEventSubscriber <-- vLLM's zmq KV events

Closing the stream early (client gone, stop string, task cancelled) closes vLLM's stream,
which aborts the request in vLLM and frees its blocks. vLLM is reached only through the
`AsyncLlm` protocol and a `make_sampling` callable, so this module imports no vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from armature.engine.interface import EngineDeadError, InvalidRequestError
from armature.engine.validation import validate_request
from armature.engines.vllm.load import LoadTracker, SchedulerSnapshot
from armature.engines.vllm.outputs import RequestOutputLike, to_engine_output
from armature.engines.vllm.sampling import VllmSampling, to_vllm_prompt, to_vllm_sampling
from armature.engines.vllm.subscriber import KvEventSubscriber
from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest
from armature.protocols.kv_events import KvDump, KvEvent

__all__ = ["AsyncLlm", "VllmEngine", "VllmEngineInfo"]

log = logging.getLogger(__name__)


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


class VllmEngine:
    """One vLLM engine (its core runs in vLLM's own processes) behind our Engine contract.

    Owns the AsyncLLM and the KV event subscriber: `stop` shuts both down. `record_step` is
    the stat logger's hook, called by vLLM on the event loop after every engine step.
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
    ):
        self.llm = llm
        self.info = info
        self._make_sampling = make_sampling
        self._make_prompt = make_prompt
        self._subscriber = subscriber
        self._load = load
        self._client_errors = client_errors  # vLLM's "bad request" exceptions
        self._active: set[str] = set()
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
        to_vllm_sampling(request, self.info.max_logprobs)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream outputs until one carries a finish_reason. Raises InvalidRequestError before
        anything reaches vLLM if the request cannot be served."""
        if not self.is_alive:
            raise EngineDeadError("the vllm engine is not running")
        self.validate(request)
        request_id = request.request_id
        if request_id in self._active:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        prompt = to_vllm_prompt(request)
        sampling = self._make_sampling(to_vllm_sampling(request, self.info.max_logprobs))
        self._active.add(request_id)
        self._load.add_request(request_id, len(prompt.token_ids))
        stream = self.llm.generate(self._make_prompt(prompt.token_ids), sampling, request_id)
        first = True
        try:
            async for delta in stream:
                output = to_engine_output(
                    request_id,
                    delta,
                    num_logprobs=request.sampling.logprobs,
                    num_prompt_tokens=prompt.num_prompt_tokens,
                    first=first,
                )
                if first:
                    self._load.prefill_done(request_id)
                    first = False
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

    # ---- observation -------------------------------------------------------------------
    def record_step(self, snapshot: SchedulerSnapshot) -> None:
        self._load.record_step(snapshot)

    def get_scheduler_snapshot(self) -> SchedulerSnapshot:
        """vLLM's scheduler counts as of its last step."""
        return self._load.get_snapshot()

    def get_load(self) -> EngineLoad:
        return self._load.get_load()

    def take_kv_events(self) -> list[KvEvent]:
        return self._subscriber.take_events() if self._subscriber is not None else []

    async def dump_kv_blocks(self) -> KvDump:
        if not self.is_alive:
            raise EngineDeadError("the vllm engine is not running")
        if self._subscriber is None:
            return KvDump(seq_hashes=[], last_event_id=-1)
        return self._subscriber.dump()
