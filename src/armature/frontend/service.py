"""OpenAIService: turns validated OpenAI requests into engine jobs and runs them, as one JSON
body or as SSE events. The HTTP routes live in app.py; this module holds no FastAPI app."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request

from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.errors import ArmatureError
from armature.frontend.chat_output import ChatOutput, ChatPiece, chat_message
from armature.frontend.chat_request import ToolUse, plan_tools, template_messages
from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.errors import ApiError, error_body
from armature.frontend.generation import Delta, GenerationError, Usage, stream_deltas
from armature.frontend.metrics import FrontendMetrics
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import NoChatTemplateError, Preprocessor
from armature.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
)
from armature.frontend.responses import (
    chat_chunk,
    chat_logprobs,
    completion_chunk,
    completion_logprobs,
    sse,
)
from armature.protocols.engine import EngineRequest, SamplingParams, TokenLogprob
from armature.router.service import EngineRouter

__all__ = ["ClientDisconnectedError", "Job", "OpenAIService", "ServedModel"]

log = logging.getLogger(__name__)

Kind = Literal["chat", "completion"]


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int
    created: int


class ClientDisconnectedError(ArmatureError):
    """The client went away before its non-streaming response was ready."""


@dataclass
class Job:
    """One accepted request, ready to run."""

    kind: Kind
    request_id: str
    engine_request: EngineRequest
    detokenizer: IncrementalDetokenizer
    stream: bool
    include_usage: bool
    want_logprobs: bool
    echo_text: str = ""
    target_worker: str | None = None  # from the x-worker-id header (direct routing)
    priority: int = 0  # overload queue order: lower first
    chat_output: ChatOutput | None = None  # chat: reads reasoning and tool calls


class OpenAIService:
    def __init__(
        self,
        engine: EngineRouter,
        preprocessor: Preprocessor,
        metrics: FrontendMetrics,
        model: ServedModel,
        parsers: OutputParsers | None = None,
    ):
        self.engine = engine
        self.preprocessor = preprocessor
        self.metrics = metrics
        self.model = model
        self.parsers = parsers or OutputParsers()  # None: output read as plain text

    # ---- request -> job ----------------------------------------------------------------
    def _check_common(self, body: GenerationFields, endpoint: str) -> None:
        if body.model_extra:
            log.info("%s: ignoring unknown fields %s", endpoint, sorted(body.model_extra))
        if body.model != self.model.name:
            raise ApiError(
                f"the model {body.model!r} does not exist; this server serves {self.model.name!r}",
                status_code=404,
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        for param, reason in body.unsupported_fields():
            raise ApiError(reason, param=param, code="unsupported_parameter")

    def _sampling(
        self, body: GenerationFields, max_tokens: int | None, num_prompt: int, logprobs: int | None
    ) -> SamplingParams:
        limit = self.model.max_model_len
        if num_prompt >= limit:
            raise ApiError(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{num_prompt} tokens",
                param="messages" if isinstance(body, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        if max_tokens is None:
            max_tokens = limit - num_prompt
        elif num_prompt + max_tokens > limit:
            raise ApiError(
                f"this model's maximum context length is {limit} tokens; you requested "
                f"{num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} "
                "for the completion); reduce the prompt or max_tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if body.min_tokens > max_tokens:
            raise ApiError("min_tokens must not exceed max_tokens", param="min_tokens")
        temperature = 1.0 if body.temperature is None else body.temperature
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=max(0, body.top_k or 0),
            seed=body.seed,
            min_tokens=body.min_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            logprobs=logprobs,
        )

    async def chat_job(self, body: ChatCompletionRequest) -> Job:
        self._check_common(body, "chat")
        features = self.preprocessor.template_features
        messages = template_messages(body.messages, features)
        tool_use = plan_tools(body, features, self.parsers.tool_call is not None)
        try:
            prompt_ids = await asyncio.to_thread(
                self.preprocessor.encode_chat, messages, tool_use.tools
            )
        except NoChatTemplateError as exc:
            raise ApiError(str(exc), param="messages") from None
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        sampling = self._sampling(body, body.get_max_tokens(), len(prompt_ids), logprobs)
        output = self._chat_output(tool_use)
        return self._job("chat", "chatcmpl", body, prompt_ids, sampling, output)

    def _chat_output(self, tool_use: ToolUse) -> ChatOutput:
        tool_call, reasoning = self.parsers.tool_call, self.parsers.reasoning
        return ChatOutput(
            reasoning=None if reasoning is None else reasoning.stream(),
            tools=tool_call.stream() if tool_call is not None and tool_use.parse_calls else None,
            new_call_id=lambda: f"call_{uuid.uuid4().hex[:24]}",
            max_calls=tool_use.max_calls,
        )

    async def completion_job(self, body: CompletionRequest) -> Job:
        self._check_common(body, "completions")
        try:
            prompt = body.single_prompt()
        except InvalidRequestError as exc:
            raise ApiError(str(exc), param="prompt") from None
        if isinstance(prompt, str):
            if not prompt:
                raise ApiError("prompt must not be empty", param="prompt")
            prompt_ids = await asyncio.to_thread(self.preprocessor.encode, prompt)
        else:
            prompt_ids = prompt
        if not prompt_ids:
            raise ApiError("prompt must not be empty", param="prompt")
        sampling = self._sampling(body, body.max_tokens, len(prompt_ids), body.logprobs)
        job = self._job("completion", "cmpl", body, prompt_ids, sampling)
        if body.echo:
            job.echo_text = (
                prompt if isinstance(prompt, str) else self.preprocessor.decode(prompt_ids)
            )
        return job

    def _job(
        self,
        kind: Kind,
        prefix: str,
        body: GenerationFields,
        prompt_ids: list[int],
        sampling: SamplingParams,
        chat_output: ChatOutput | None = None,
    ) -> Job:
        if not self.engine.is_alive:
            raise ApiError(
                "the engine is not serving",
                status_code=503,
                type="service_unavailable",
                code="engine_unavailable",
            )
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        engine_request = EngineRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, sampling=sampling
        )
        try:
            self.engine.validate(engine_request)
        except InvalidRequestError as exc:
            raise ApiError(str(exc), code="invalid_request") from None
        detokenizer = IncrementalDetokenizer(
            self.preprocessor.decoder,
            prompt_ids,
            stop=body.stop_list(),
            min_tokens=sampling.min_tokens,
        )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Job(
            kind,
            request_id,
            engine_request,
            detokenizer,
            body.stream,
            include_usage,
            sampling.logprobs is not None,
            priority=body.priority,
            chat_output=chat_output,
        )

    # ---- running a job -----------------------------------------------------------------
    def _deltas(self, job: Job, usage: Usage) -> AsyncIterator[Delta]:
        stream = self.engine.generate(job.engine_request, job.target_worker)
        return stream_deltas(
            stream, len(job.engine_request.prompt_token_ids), job.detokenizer, usage, self.metrics
        )

    def _logprobs(self, job: Job, items: list[TokenLogprob], offset: int) -> Any:
        if not job.want_logprobs:
            return None
        token_text = self.preprocessor.token_text
        if job.kind == "chat":
            return chat_logprobs(items, token_text)
        return completion_logprobs(items, token_text, offset)

    async def complete(self, job: Job, http_request: Request) -> dict[str, Any]:
        """Run `job` to the end; a client that disconnects cancels it (and raises
        ClientDisconnectedError)."""
        usage = Usage()
        texts: list[str] = [job.echo_text]
        pieces: list[ChatPiece] = []
        items: list[TokenLogprob] = []
        finish: str | None = None

        async def collect() -> None:
            nonlocal finish
            async for delta in self._deltas(job, usage):
                texts.append(delta.text)
                if job.chat_output is not None:
                    pieces.append(_feed(job.chat_output, delta))
                items.extend(delta.logprobs)
                finish = delta.finish_reason or finish

        await _unless_disconnected(collect(), http_request)
        text = "".join(texts)
        created = int(time.time())
        logprobs = self._logprobs(job, items, len(job.echo_text))
        if job.chat_output is not None:
            usage.reasoning_tokens = job.chat_output.num_reasoning_tokens
            choice: dict[str, Any] = {
                "index": 0,
                "message": chat_message(pieces),
                "logprobs": logprobs,
                "finish_reason": job.chat_output.finish_reason(finish),
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
            obj = "text_completion"
        return {
            "id": job.request_id,
            "object": obj,
            "created": created,
            "model": self.model.name,
            "choices": [choice],
            "usage": usage.as_dict(),
        }

    async def stream(self, job: Job) -> AsyncGenerator[str, None]:
        """SSE events for `job`, ending with `data: [DONE]`. Closing this generator (client
        gone) closes the engine stream, which aborts the request."""
        usage = Usage()
        created = int(time.time())
        name = self.model.name
        offset = 0
        usage_field = {"usage": None} if job.include_usage else {}
        if job.kind == "chat":
            yield sse(
                {
                    **chat_chunk(
                        job.request_id, created, name, {"role": "assistant", "content": ""}
                    ),
                    **usage_field,
                }
            )
        elif job.echo_text:
            yield sse(
                {**completion_chunk(job.request_id, created, name, job.echo_text), **usage_field}
            )
            offset = len(job.echo_text)
        try:
            async for delta in self._deltas(job, usage):
                if job.chat_output is not None:
                    chunk = self._chat_chunk(job, job.chat_output, delta, usage, created)
                else:
                    chunk = self._completion_chunk(job, delta, created, offset)
                    offset += len(delta.text)
                if chunk is not None:
                    yield sse({**chunk, **usage_field})
        except (GenerationError, EngineDeadError) as exc:
            yield sse(error_body(str(exc), "internal_error"))
        if job.include_usage:
            yield sse(
                {
                    "id": job.request_id,
                    "object": _chunk_object(job.kind),
                    "created": created,
                    "model": name,
                    "choices": [],
                    "usage": usage.as_dict(),
                }
            )
        yield "data: [DONE]\n\n"

    def _chat_chunk(
        self, job: Job, output: ChatOutput, delta: Delta, usage: Usage, created: int
    ) -> dict[str, Any] | None:
        """The chunk for one delta of a chat stream (None: nothing to send yet); counts the
        reasoning tokens into `usage`."""
        fields = _feed(output, delta).delta()
        finish = output.finish_reason(delta.finish_reason)
        usage.reasoning_tokens = output.num_reasoning_tokens
        if not fields and not finish and not job.want_logprobs:
            return None
        logprobs = self._logprobs(job, delta.logprobs, 0)
        return chat_chunk(job.request_id, created, self.model.name, fields, finish, logprobs)

    def _completion_chunk(
        self, job: Job, delta: Delta, created: int, offset: int
    ) -> dict[str, Any] | None:
        """The chunk for one delta of a completion stream whose text so far has `offset`
        characters (None: nothing to send)."""
        if not delta.text and not delta.finish_reason and not job.want_logprobs:
            return None
        logprobs = self._logprobs(job, delta.logprobs, offset)
        name = self.model.name
        return completion_chunk(
            job.request_id, created, name, delta.text, delta.finish_reason, logprobs
        )


def _feed(output: ChatOutput, delta: Delta) -> ChatPiece:
    return output.feed(delta.text, len(delta.token_ids), last=delta.finish_reason is not None)


def _chunk_object(kind: Kind) -> str:
    return "chat.completion.chunk" if kind == "chat" else "text_completion"


async def _unless_disconnected(work: Awaitable[None], http_request: Request) -> None:
    """Run `work`; if the client disconnects first, cancel it (which aborts the request) and
    raise ClientDisconnectedError."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(http_request))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
            log.info("client disconnected; request cancelled")
            # Not CancelledError: out of the ASGI app, uvicorn logs that as a crash.
            raise ClientDisconnectedError
    work_task.result()


async def _wait_for_disconnect(http_request: Request) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            return
