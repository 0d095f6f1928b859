"""JobBuilder: turns validated OpenAI requests (chat, completions) into engine jobs: checks the
model, context length and sampling fields, templates and tokenizes the prompt, and makes one
`Candidate` (engine request and detokenizer) per sequence. Running a job is service.py's."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, ParamSpec

import msgspec

from armature.engines.api import InvalidRequestError
from armature.frontend.chat_output import ChatOutput
from armature.frontend.chat_request import ToolUse, plan_tools, template_messages
from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.errors import NO_WORKER_RETRY_AFTER_S, ApiError
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import ChatRenderError, Preprocessor
from armature.frontend.protocol import (
    MAX_BATCH_SEQUENCES,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
)
from armature.frontend.structured import check_request_guide, check_tool_schemas, request_guide
from armature.frontend.text_offsets import prompt_offsets
from armature.frontend.tool_protocol import ToolSpec
from armature.protocols.engine import EngineRequest, SamplingParams
from armature.protocols.guide import Guide
from armature.protocols.lora import LoraNotFoundError
from armature.router.service import EngineRouter

__all__ = ["Candidate", "Job", "JobBuilder", "Kind", "ServedModel"]

log = logging.getLogger(__name__)

Kind = Literal["chat", "completion"]
P = ParamSpec("P")

# A prompt up to this long (characters; a chat's messages and tools as JSON) is encoded on the
# event loop: 0.1-0.2 ms even for text the tokenizer's caches have never seen, about what the
# hop to a thread and back costs on a 2-core VM (~0.1 ms of CPU, measured). A longer one is
# encoded on a thread, where the tokenizer runs without the GIL beside the loop.
INLINE_PROMPT_CHARS = 512


@dataclass(frozen=True)
class ServedModel:
    """The model requests name (an adapter aside), its context limit, and when it was loaded."""

    name: str
    max_model_len: int
    created: int


@dataclass
class Candidate:
    """One sequence a job generates: a choice, or with best_of a candidate for one."""

    engine_request: EngineRequest
    detokenizer: IncrementalDetokenizer
    chat_output: ChatOutput | None = None  # chat: reads reasoning and tool calls
    echo_text: str = ""  # echo: its prompt's text, which goes first (empty for some prompts)
    # echo with logprobs: each prompt token's offset into echo_text (text_offsets.py)
    echo_offsets: Sequence[int] = ()


@dataclass
class Job:
    """One accepted request, ready to run. For each of its `num_prompts` prompts (a batch of
    completions: several) it generates `candidates_per_prompt` sequences (n, or best_of of
    them), in prompt order, and returns `num_choices` (n): all of them, or with best_of the n
    whose tokens have the highest cumulative logprob. Choice i * n + j is prompt i's j-th."""

    kind: Kind
    request_id: str
    candidates: list[Candidate]
    stream: bool
    include_usage: bool
    want_logprobs: bool
    echo: bool = False  # each prompt's text goes first (its candidates' `echo_text`)
    # echo with max_tokens 0: the prompt alone (the engine makes one token, not returned)
    echo_only: bool = False
    model_name: str = ""  # as the request named it: the base model or a LoRA adapter
    target_worker: str | None = None  # from the x-worker-id header (direct routing)
    priority: int = 0  # overload queue order: lower first
    num_choices: int = 1
    per_step: bool = False  # stream one event per engine output, not one per token
    # its stream ended in an error event: the HTTP status the error has unstreamed (the
    # server's shutdown grace ended: 503)
    error_status: int | None = None
    num_prompts: int = 1
    # perf_counter when its admission began: its TTFT and latency count from here, a wait
    # in the overload queue included (None: from when its engine stream starts)
    started_s: float | None = None

    @property
    def engine_request(self) -> EngineRequest:
        """The first sequence's request (the others of its prompt differ only in id and
        seed)."""
        return self.candidates[0].engine_request

    @property
    def candidates_per_prompt(self) -> int:
        return len(self.candidates) // self.num_prompts


class JobBuilder:
    """Makes the jobs of one served model. Reads the router (adapters served, liveness, a
    request's validation) and the preprocessor; mutates neither."""

    def __init__(
        self,
        engine: EngineRouter,
        preprocessor: Preprocessor,
        model: ServedModel,
        parsers: OutputParsers | None = None,
    ):
        self.engine = engine
        self.preprocessor = preprocessor
        self.model = model
        self.parsers = parsers or OutputParsers()  # None: output read as plain text

    def _check_common(self, body: GenerationFields, endpoint: str) -> str | None:
        """Check the fields every generation shares; returns the LoRA adapter `model` names
        (None: the base model). ApiError (404) for a model nobody serves."""
        if body.model_extra:
            log.info("%s: ignoring unknown fields %s", endpoint, sorted(body.model_extra))
        lora_name = None
        if body.model != self.model.name:
            adapters = self.engine.get_lora_adapters()
            if body.model not in adapters:
                served = ", ".join(repr(n) for n in [self.model.name, *sorted(adapters)])
                raise ApiError(
                    f"the model {body.model!r} does not exist; this server serves {served}",
                    status_code=404,
                    type="not_found_error",
                    param="model",
                    code="model_not_found",
                )
            lora_name = body.model
        for param, reason in body.unsupported_fields():
            raise ApiError(reason, param=param, code="unsupported_parameter")
        return lora_name

    def _sampling(
        self,
        body: GenerationFields,
        max_tokens: int | None,
        num_prompt: int,
        logprobs: int | None,
        guide: Guide | None = None,
    ) -> SamplingParams:
        limit = self.model.max_model_len
        if num_prompt >= limit:
            raise ApiError(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{num_prompt} tokens",
                param="messages" if isinstance(body, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        # the field the request set the limit with (chat's newer name where given)
        field = "max_tokens"
        if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
            field = "max_completion_tokens"
        if max_tokens is None:
            max_tokens = limit - num_prompt
        elif num_prompt + max_tokens > limit:
            raise ApiError(
                f"this model's maximum context length is {limit} tokens; you requested "
                f"{num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} "
                f"for the completion); reduce the prompt or {field}",
                param=field,
                code="context_length_exceeded",
            )
        if body.min_tokens > max_tokens:
            raise ApiError(f"min_tokens must not exceed {field}", param="min_tokens")
        temperature = 1.0 if body.temperature is None else body.temperature
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=max(0, body.top_k or 0),
            min_p=body.min_p,
            seed=body.seed,
            min_tokens=body.min_tokens,
            ignore_eos=body.ignore_eos,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            logprobs=logprobs,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            logit_bias=body.logit_bias_pairs(),
            guide=guide,
        )

    async def chat_job(self, body: ChatCompletionRequest) -> Job:
        lora_name = self._check_common(body, "chat")
        features = self.preprocessor.template_features
        messages = template_messages(body.messages, features)
        markers = {text: token for token, text in self.parsers.kept_tokens.items()}
        tool_use = plan_tools(body, features, self.parsers.tool_call_name, markers)
        guide = await _checked_guide(body, tool_use.guide, body.tools)
        template_kwargs = body.template_kwargs()
        unread = sorted(set(template_kwargs) - features.variables)
        if unread:  # as unknown fields: clients send them to every model alike
            log.info("chat: the chat template reads no %s; ignoring them", ", ".join(unread))
        try:
            size_chars = len(msgspec.json.encode([messages, tool_use.tools, template_kwargs]))
            prompt_ids = await _encoded(
                size_chars,
                self.preprocessor.encode_chat,
                messages,
                tool_use.tools,
                template_kwargs,
            )
        except ChatRenderError as exc:
            raise ApiError(str(exc), param="messages") from None
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        sampling = self._sampling(body, body.get_max_tokens(), len(prompt_ids), logprobs, guide)
        outputs = functools.partial(self._chat_output, tool_use, guide is not None)
        kept = self.parsers.kept_tokens if tool_use.parse_calls else None
        return self._job(
            "chat", "chatcmpl", body, prompt_ids, sampling, body.n, lora_name, outputs, kept
        )

    def _chat_output(self, tool_use: ToolUse, guided: bool) -> ChatOutput:
        """A fresh reader of one choice's output: reasoning, then tool calls. A `guided`
        output is its guide's format (a JSON value, forced calls) from its first token: no
        reasoning is read from it (a parser that takes text before its end marker as
        reasoning took all of it, leaving no content and no call)."""
        tool_call, reasoning = self.parsers.tool_call, self.parsers.reasoning
        return ChatOutput(
            reasoning=None if reasoning is None or guided else reasoning.stream(),
            tools=(
                tool_call.stream(tool_use.names)
                if tool_call is not None and tool_use.parse_calls
                else None
            ),
            new_call_id=lambda: f"call_{uuid.uuid4().hex[:24]}",
            max_calls=tool_use.max_calls,
        )

    async def completion_job(self, body: CompletionRequest) -> Job:
        lora_name = self._check_common(body, "completions")
        try:
            prompts = body.get_prompts()
        except InvalidRequestError as exc:
            raise ApiError(str(exc), param="prompt") from None
        num_candidates = _num_candidates(body)
        if len(prompts) * num_candidates > MAX_BATCH_SEQUENCES:
            raise ApiError(
                f"{len(prompts)} prompts with {num_candidates} sequences each are "
                f"{len(prompts) * num_candidates} sequences; at most {MAX_BATCH_SEQUENCES} "
                "in one request",
                param="prompt",
                code="invalid_value",
            )
        guide = await _checked_guide(body, None)
        echo_only = body.max_tokens == 0
        if echo_only and not body.echo:
            raise ApiError(
                "max_tokens 0 returns nothing without echo",
                param="max_tokens",
                code="invalid_value",
            )
        max_tokens = 1 if echo_only else body.max_tokens
        self._check_alive()
        request_id = f"cmpl-{uuid.uuid4().hex}"
        candidates: list[Candidate] = []
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                if not prompt:
                    raise ApiError("prompt must not be empty", param="prompt")
                prompt_ids = await _encoded(len(prompt), self.preprocessor.encode, prompt)
            else:
                prompt_ids = prompt
            if not prompt_ids:
                raise ApiError("prompt must not be empty", param="prompt")
            sampling = self._sampling(body, max_tokens, len(prompt_ids), body.logprobs, guide)
            if body.echo and body.logprobs is not None:  # the echoed prompt's tokens scored too
                _check_prompt_logprobs_size(len(prompt_ids), body.logprobs)
                sampling = msgspec.structs.replace(sampling, prompt_logprobs=body.logprobs)
            echo_text, echo_offsets = "", []
            if body.echo:
                echo_text = (
                    prompt if isinstance(prompt, str) else self.preprocessor.decode(prompt_ids)
                )
            if body.echo and body.logprobs is not None:  # a second tokenizing: off the loop too
                pre = self.preprocessor
                echo_offsets = await _encoded(
                    len(echo_text), prompt_offsets, pre.tokenizer, pre.decoder, prompt, prompt_ids
                )
            ids_from = request_id if len(prompts) == 1 else f"{request_id}-{index}"
            candidates += self._candidates(
                ids_from,
                body,
                prompt_ids,
                sampling,
                num_candidates,
                lora_name,
                (echo_text, echo_offsets),
            )
        job = self._new_job("completion", request_id, body, candidates, body.logprobs)
        job.num_prompts = len(prompts)
        job.echo = body.echo
        job.echo_only = echo_only and body.echo
        return job

    def _job(
        self,
        kind: Kind,
        prefix: str,
        body: GenerationFields,
        prompt_ids: list[int],
        sampling: SamplingParams,
        num_candidates: int,
        lora_name: str | None,
        chat_outputs: Callable[[], ChatOutput] | None = None,
        kept_tokens: Mapping[int, str] | None = None,
    ) -> Job:
        """A job of one prompt."""
        self._check_alive()
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        candidates = self._candidates(
            request_id,
            body,
            prompt_ids,
            sampling,
            num_candidates,
            lora_name,
            chat_outputs=chat_outputs,
            kept_tokens=kept_tokens,
        )
        return self._new_job(kind, request_id, body, candidates, sampling.logprobs)

    def _check_alive(self) -> None:
        if not self.engine.is_alive:
            raise ApiError(
                "the engine is not serving",
                status_code=503,
                type="service_unavailable",
                code="engine_unavailable",
                headers={"Retry-After": str(NO_WORKER_RETRY_AFTER_S)},
            )

    def _candidates(
        self,
        ids_from: str,
        body: GenerationFields,
        prompt_ids: list[int],
        sampling: SamplingParams,
        num_candidates: int,
        lora_name: str | None,
        echo: tuple[str, Sequence[int]] = ("", ()),
        chat_outputs: Callable[[], ChatOutput] | None = None,
        kept_tokens: Mapping[int, str] | None = None,
    ) -> list[Candidate]:
        """The sequences of one prompt, their requests named from `ids_from`, checked by the
        engine (ApiError for a request it refuses)."""
        if num_candidates > body.n and sampling.logprobs is None:
            sampling = msgspec.structs.replace(sampling, logprobs=0)  # best_of ranks by them
        candidates = [
            Candidate(
                EngineRequest(
                    request_id=ids_from if num_candidates == 1 else f"{ids_from}-{i}",
                    prompt_token_ids=prompt_ids,
                    sampling=_candidate_sampling(sampling, i),
                    lora_name=lora_name,
                ),
                IncrementalDetokenizer(
                    self.preprocessor.decoder,
                    prompt_ids,
                    stop=body.stop_list(),
                    min_tokens=sampling.min_tokens,
                    kept_tokens=kept_tokens,
                ),
                None if chat_outputs is None else chat_outputs(),
                *echo,
            )
            for i in range(num_candidates)
        ]
        try:
            self.engine.validate(candidates[0].engine_request)
        except InvalidRequestError as exc:
            raise _invalid(exc) from None
        return candidates

    def _new_job(
        self,
        kind: Kind,
        request_id: str,
        body: GenerationFields,
        candidates: list[Candidate],
        logprobs: int | None,
    ) -> Job:
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        return Job(
            kind,
            request_id,
            candidates,
            body.stream,
            include_usage,
            want_logprobs=logprobs is not None,
            priority=body.priority,
            num_choices=body.n,
            per_step=bool(options and options.per_step),
            model_name=body.model,
        )


def _invalid(exc: InvalidRequestError) -> ApiError:
    """An engine's refusal as the edge's 4xx: 404 for an adapter no longer served."""
    if isinstance(exc, LoraNotFoundError):
        return ApiError(
            str(exc),
            status_code=404,
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    return ApiError(str(exc), param=exc.param, code="invalid_request")


async def _encoded(
    size_chars: int, encode: Callable[P, list[int]], *args: P.args, **kwargs: P.kwargs
) -> list[int]:
    """`encode(*args)`: on the event loop for a prompt of at most `INLINE_PROMPT_CHARS`
    (`size_chars`), on a thread for a longer one, which would hold the loop up."""
    if size_chars <= INLINE_PROMPT_CHARS:
        return encode(*args, **kwargs)
    return await asyncio.to_thread(encode, *args, **kwargs)


async def _checked_guide(
    body: GenerationFields, tool_guide: Guide | None, tools: list[ToolSpec] | None = None
) -> Guide | None:
    """The request's one guide (structured output, or forced tool calls' grammar), checked
    off the event loop (compiling a large schema takes a while), after the parameters
    schemas of `tools`; ApiError naming the field."""
    guide = request_guide(body)
    if tool_guide is not None:
        if guide is not None:
            raise ApiError(
                "tool_choice 'required' or a named function fixes the output's format: it "
                "cannot be combined with response_format or guided_*",
                param=guide.param,
            )
        guide = tool_guide
    if tools:
        await asyncio.to_thread(check_tool_schemas, tools)
    if guide is not None:
        await asyncio.to_thread(check_request_guide, guide)
    return guide


# A prompt's logprobs come in one engine output, one message of the request plane: NATS's
# smallest default payload is 1 MiB. Measured msgpack sizes: 35 bytes a prompt token and 13
# an alternative (tests/unit/frontend/test_completions_echo.py holds them to it).
MAX_PROMPT_LOGPROBS_BYTES = 900_000
PROMPT_LOGPROB_TOKEN_BYTES = 36
PROMPT_LOGPROB_ALTERNATIVE_BYTES = 13


def _check_prompt_logprobs_size(num_prompt_tokens: int, num_alternatives: int) -> None:
    """ApiError (400) when the prompt's logprobs would not fit one engine output."""
    per_token = PROMPT_LOGPROB_TOKEN_BYTES + PROMPT_LOGPROB_ALTERNATIVE_BYTES * num_alternatives
    most = MAX_PROMPT_LOGPROBS_BYTES // per_token
    if num_prompt_tokens > most:
        raise ApiError(
            f"echo with logprobs {num_alternatives} scores at most {most} prompt tokens (the "
            f"logprobs of one engine output), the prompt has {num_prompt_tokens}: shorten it "
            "or ask fewer logprobs",
            param="logprobs",
            code="invalid_value",
        )


def _num_candidates(body: CompletionRequest) -> int:
    """Sequences to generate for a completion: best_of (at least n), else n."""
    if body.best_of is None:
        return body.n
    if body.best_of < body.n:
        raise ApiError(
            f"best_of ({body.best_of}) must be at least n ({body.n})",
            param="best_of",
            code="invalid_value",
        )
    if body.stream and body.best_of > body.n:
        raise ApiError(
            "best_of greater than n cannot be streamed: the best are known only at the end",
            param="best_of",
            code="invalid_value",
        )
    return body.best_of


def _candidate_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Sequence `index`'s sampling: a seeded request's sequences take seeds seed, seed+1, ...
    (as vLLM's), so they differ from each other and repeat across identical requests."""
    if index == 0 or sampling.seed is None:
        return sampling
    return msgspec.structs.replace(sampling, seed=sampling.seed + index)
