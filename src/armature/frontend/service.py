"""OpenAIService: runs the engine jobs that jobs.py makes from validated OpenAI requests, to one
JSON body or to SSE events: the candidates' deltas, best_of's choice, logprobs, and a client
that leaves. The HTTP routes live in app.py; this module holds no FastAPI app."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

import msgspec
from fastapi import Request

from armature.engines.api import EngineDeadError
from armature.errors import ArmatureError
from armature.frontend.admission import SHUTTING_DOWN
from armature.frontend.chat_output import ChatOutput, ChatPiece, chat_message
from armature.frontend.choices import fork_streams, merge_streams, top_by_score
from armature.frontend.errors import error_body
from armature.frontend.generation import (
    Delta,
    GenerationError,
    Usage,
    delta_batches,
    total_usage,
)
from armature.frontend.jobs import Job, Kind
from armature.frontend.metrics import FrontendMetrics
from armature.frontend.preprocess import Preprocessor
from armature.frontend.responses import (
    ChatChoiceChunk,
    CompletionChoiceChunk,
    StreamChunk,
    StreamEvents,
    chat_logprobs,
    completion_logprobs,
    sse_event,
)
from armature.protocols.engine import TokenLogprob
from armature.router.service import EngineRouter, RouteGroup

__all__ = ["ClientDisconnectedError", "OpenAIService", "unless_disconnected"]

_T = TypeVar("_T")

log = logging.getLogger(__name__)


class ClientDisconnectedError(ArmatureError):
    """The client went away before its non-streaming response was ready."""


class OpenAIService:
    """Runs jobs on the router, their tokens and latencies counted in `metrics`; keeps nothing
    between jobs."""

    def __init__(self, engine: EngineRouter, preprocessor: Preprocessor, metrics: FrontendMetrics):
        self.engine = engine
        self.preprocessor = preprocessor
        self.metrics = metrics
        # set when a shutdown's grace is about to end (`begin_closing`): requests still in
        # flight end now with a 503 (whole) or an error event and [DONE] (streamed), while
        # they can still be sent
        self.closing = asyncio.Event()
        self._streaming: set[asyncio.Task[Any]] = set()  # the tasks sending streams

    def begin_closing(self) -> None:
        """End every request in flight now (see `closing`): a stream waiting for its next
        output (queued, or in a long prefill) is woken to send its error ending."""
        self.closing.set()
        for task in list(self._streaming):
            task.cancel(SHUTTING_DOWN)

    def _deltas(
        self, job: Job, index: int, usage: Usage, group: RouteGroup | None
    ) -> AsyncGenerator[list[Delta], None]:
        candidate = job.candidates[index]
        request = candidate.engine_request
        stream = self.engine.generate(request, job.target_worker, group)
        num_prompt = len(request.prompt_token_ids)
        return delta_batches(
            stream,
            num_prompt,
            candidate.detokenizer,
            usage,
            self.metrics,
            not job.per_step,
            job.started_s,
        )

    def _choice_deltas(
        self, job: Job, usages: list[Usage]
    ) -> AsyncGenerator[tuple[int, list[Delta]], None]:
        """(candidate index, deltas of one engine output) of every candidate: one streams
        alone, several of a prompt share its KV (prefill once, then fork; see choices.py),
        the prompts of a batch run at once."""
        per = job.candidates_per_prompt
        if job.num_prompts == 1:
            return self._prompt_deltas(job, usages, 0, per)
        prompts = [self._prompt_deltas(job, usages, p * per, per) for p in range(job.num_prompts)]
        return _flattened(merge_streams(prompts))

    def _prompt_deltas(
        self, job: Job, usages: list[Usage], first: int, count: int
    ) -> AsyncGenerator[tuple[int, list[Delta]], None]:
        """The deltas of candidates first .. first + count - 1 (one prompt's)."""
        if count == 1:
            return _indexed(self._deltas(job, first, usages[first], None), first)
        group = RouteGroup()
        starts = [
            functools.partial(self._deltas, job, i, usages[i], group)
            for i in range(first, first + count)
        ]
        return _shifted(fork_streams(starts), first)

    async def chat_pieces(
        self, job: Job, usage: Usage
    ) -> AsyncGenerator[tuple[ChatPiece, str | None], None]:
        """A one-choice chat job's output as it comes: each piece with the choice's finish
        reason once known (`tool_calls` after calls). Fills `usage`, reasoning tokens
        included. Closing this generator aborts the request."""
        assert job.kind == "chat" and len(job.candidates) == 1
        output = job.candidates[0].chat_output
        assert output is not None
        async with aclosing(self._deltas(job, 0, usage, None)) as batches:
            async for batch in batches:
                for delta in batch:
                    piece = _feed(output, delta)
                    usage.reasoning_tokens = output.num_reasoning_tokens
                    yield piece, output.finish_reason(delta.finish_reason)

    def _logprobs(
        self,
        job: Job,
        items: list[TokenLogprob],
        offsets: Sequence[int] = (),
        prompt_items: list[TokenLogprob] | None = None,
        candidate: int = 0,
    ) -> Any:
        """The choice's `logprobs` (None unless asked for); a completion's at `offsets` into
        its text, its echoed prompt's tokens first where the engine scored them
        (`prompt_items`, of `candidate`'s prompt)."""
        if not job.want_logprobs:
            return None
        token_text = self.preprocessor.token_text
        if job.kind == "chat":
            return chat_logprobs(items, token_text, self.preprocessor.token_bytes)
        prompt = None
        if prompt_items is not None:
            c = job.candidates[candidate]
            prompt = (c.engine_request.prompt_token_ids, prompt_items, c.echo_offsets)
        return completion_logprobs(items, token_text, offsets, prompt)

    async def complete(self, job: Job, http_request: Request) -> dict[str, Any]:
        """Run `job` to the end; a client that disconnects cancels it (and raises
        ClientDisconnectedError)."""
        num = len(job.candidates)
        usages = [Usage() for _ in range(num)]
        texts: list[list[str]] = [[c.echo_text] for c in job.candidates]
        items: list[list[TokenLogprob]] = [[] for _ in range(num)]
        # each item's offset into its choice's text: where the text before its delta ends
        offsets: list[list[int]] = [[] for _ in range(num)]
        lengths = [len(c.echo_text) for c in job.candidates]
        prompts: list[list[TokenLogprob] | None] = [None] * num  # echo: the prompt scored
        finishes: list[str | None] = [None] * num
        pieces: list[list[ChatPiece]] = [[] for _ in range(num)]

        async def collect() -> None:
            async with aclosing(self._choice_deltas(job, usages)) as batches:
                async for index, batch in batches:
                    output = job.candidates[index].chat_output
                    for delta in batch:
                        if delta.prompt_logprobs is not None:
                            prompts[index] = delta.prompt_logprobs
                        texts[index].append(delta.text)
                        items[index].extend(delta.logprobs)
                        offsets[index] += [lengths[index]] * len(delta.logprobs)
                        lengths[index] += len(delta.text)
                        finishes[index] = delta.finish_reason or finishes[index]
                        if output is not None:
                            pieces[index].append(_feed(output, delta))

        await unless_disconnected(collect(), http_request, self.closing)
        if job.echo_only:  # the engine's one token is not returned
            texts = [[c.echo_text] for c in job.candidates]
            items, offsets = [[] for _ in range(num)], [[] for _ in range(num)]
            finishes = ["length"] * num
            for usage in usages:
                usage.completion_tokens = 0
        for sequence, usage in zip(job.candidates, usages, strict=True):
            if sequence.chat_output is not None:
                usage.reasoning_tokens = sequence.chat_output.num_reasoning_tokens
        per = job.candidates_per_prompt
        chosen: list[int] = []  # each prompt's in turn
        for first in range(0, num, per):
            if per > job.num_choices:  # best_of: the n with the highest cumulative logprob
                scores = [sum(i.logprob for i in its) for its in items[first : first + per]]
                chosen += [first + k for k in top_by_score(scores, job.num_choices)]
            else:
                chosen += range(first, first + per)
        choices = []
        for index, candidate in enumerate(chosen):
            logprobs = self._logprobs(
                job, items[candidate], offsets[candidate], prompts[candidate], candidate
            )
            choice: dict[str, Any] = {"index": index}
            finish = finishes[candidate]
            output = job.candidates[candidate].chat_output
            if output is not None:
                choice["message"] = chat_message(pieces[candidate])
                finish = output.finish_reason(finish)
            else:
                choice["text"] = "".join(texts[candidate])
            choice.update(logprobs=logprobs, finish_reason=finish)
            choices.append(choice)
        return {
            "id": job.request_id,
            "object": "chat.completion" if job.kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": job.model_name,
            "choices": choices,
            "usage": _usage_of(job, usages).as_dict(),
        }

    async def stream(self, job: Job) -> AsyncGenerator[bytes, None]:
        """SSE events for `job`, ending with `data: [DONE]`; the chunks of several choices
        interleave as their tokens come, each naming its choice's index. One event per token
        (per delta that has text); the events of the tokens that arrived together go out as
        one body chunk (one write), the last ones with [DONE]. Closing this generator (client
        gone) closes the engine streams, which aborts the requests."""
        assert job.candidates_per_prompt == job.num_choices, "best_of > n is never streamed"
        usages = [Usage() for _ in job.candidates]
        # with include_usage every chunk carries "usage": null but the last
        usage_field: msgspec.UnsetType | None = None if job.include_usage else msgspec.UNSET
        head = (job.request_id, _chunk_object(job.kind), int(time.time()), job.model_name)
        events = StreamEvents(*head, usage_field)
        offsets = [0] * len(job.candidates)
        # the echoed prompt goes first, at once; with logprobs (its tokens scored) or alone
        # (max_tokens 0), with the choice's first output, which brings them or the end
        waits = job.echo and (job.want_logprobs or job.echo_only)
        echo_waits = [waits] * len(job.candidates)
        for index, candidate in enumerate(job.candidates):
            if job.kind == "chat":
                role = {"role": "assistant", "content": ""}
                yield events.event(ChatChoiceChunk(index, role))
            elif candidate.echo_text and not waits:
                yield events.event(CompletionChoiceChunk(index, candidate.echo_text))
                offsets[index] = len(candidate.echo_text)
        pending: list[bytes] = []
        task = asyncio.current_task()
        assert task is not None
        self._streaming.add(task)
        try:
            async with aclosing(self._choice_deltas(job, usages)) as batches:
                async for index, batch in batches:
                    output = job.candidates[index].chat_output
                    sent: ChatChoiceChunk | CompletionChoiceChunk | None
                    for delta in batch:
                        if echo_waits[index]:
                            echo_waits[index] = False
                            pending.append(events.event(self._echo_choice(job, delta, index)))
                            offsets[index] = len(job.candidates[index].echo_text)
                        if job.echo_only:
                            usages[index].completion_tokens = 0  # its token is not returned
                            continue
                        if output is not None:
                            sent = self._chat_choice(job, output, delta, usages[index], index)
                        else:
                            sent = self._completion_choice(job, delta, offsets[index], index)
                            offsets[index] += len(delta.text)
                        if sent is not None:
                            pending.append(events.event(sent))
                    if len(usages) == 1 and batch[-1].finish_reason is not None:
                        # the only choice's last events go out with [DONE], in one write,
                        # before the engine stream is closed (after the client has them)
                        self._streaming.discard(task)
                        yield _ending(job, usages, head, pending)
                        return
                    if self.closing.is_set():  # checked per output: a flag read
                        raise asyncio.CancelledError(SHUTTING_DOWN)
                    if pending:
                        self._streaming.discard(task)  # not while the client reads
                        yield b"".join(pending)
                        self._streaming.add(task)
                        pending.clear()
        except (GenerationError, EngineDeadError) as exc:
            if isinstance(exc, GenerationError):  # the request's field, or the engine's fault
                job.error_status = exc.status_code
                pending.append(sse_event(exc.body()))
            else:
                job.error_status = 503  # as unstreamed: the fleet, not the request
                body = error_body(f"the engine is not serving: {exc}", "service_unavailable")
                pending.append(sse_event(body))
        except asyncio.CancelledError:
            if not self.closing.is_set():
                raise  # the client left: nothing to send
            if task.cancelling():
                task.uncancel()  # ours (`begin_closing`): the ending still goes out
            job.error_status = 503
            pending.append(sse_event(error_body(SHUTTING_DOWN, "service_unavailable")))
        finally:
            self._streaming.discard(task)
        yield _ending(job, usages, head, pending)

    def _chat_choice(
        self, job: Job, output: ChatOutput, delta: Delta, usage: Usage, index: int
    ) -> ChatChoiceChunk | None:
        """The choice chunk for one delta of choice `index` of a chat stream (None: nothing
        to send yet); counts the choice's reasoning tokens into its `usage`."""
        fields = _feed(output, delta).delta()
        finish = output.finish_reason(delta.finish_reason)
        usage.reasoning_tokens = output.num_reasoning_tokens
        if not fields and not finish and not job.want_logprobs:
            return None
        return ChatChoiceChunk(index, fields, self._logprobs(job, delta.logprobs), finish)

    def _echo_choice(self, job: Job, first: Delta, index: int) -> CompletionChoiceChunk:
        """The echoed prompt's chunk of choice `index`, from its first delta: its tokens'
        logprobs where asked for, the end where it is all (max_tokens 0)."""
        logprobs = self._logprobs(job, [], (), first.prompt_logprobs, index)
        finish = "length" if job.echo_only else None
        return CompletionChoiceChunk(index, job.candidates[index].echo_text, logprobs, finish)

    def _completion_choice(
        self, job: Job, delta: Delta, offset: int, index: int
    ) -> CompletionChoiceChunk | None:
        """The choice chunk for one delta of choice `index` of a completion stream whose text
        so far has `offset` characters (None: nothing to send)."""
        if not delta.text and not delta.finish_reason and not job.want_logprobs:
            return None
        logprobs = self._logprobs(job, delta.logprobs, [offset] * len(delta.logprobs))
        return CompletionChoiceChunk(index, delta.text, logprobs, delta.finish_reason)


def _ending(
    job: Job, usages: list[Usage], head: tuple[str, str, int, str], pending: list[bytes]
) -> bytes:
    """A stream's last body chunk: the events still pending, the usage chunk if asked for,
    and `data: [DONE]`."""
    if job.include_usage:
        usage = _usage_of(job, usages).as_dict()
        pending = [*pending, sse_event(StreamChunk(*head, [], usage))]
    return b"".join(pending) + b"data: [DONE]\n\n"


def _feed(output: ChatOutput, delta: Delta) -> ChatPiece:
    return output.feed(delta.text, len(delta.token_ids), last=delta.finish_reason is not None)


async def _indexed(
    batches: AsyncGenerator[list[Delta], None], index: int
) -> AsyncGenerator[tuple[int, list[Delta]], None]:
    """The deltas of one sequence, as candidate `index`'s."""
    try:
        async for batch in batches:
            yield index, batch
    finally:
        await batches.aclose()


async def _shifted(
    indexed: AsyncGenerator[tuple[int, list[Delta]], None], first: int
) -> AsyncGenerator[tuple[int, list[Delta]], None]:
    """A prompt's candidates' deltas, their indices counted from `first`."""
    try:
        async for index, batch in indexed:
            yield first + index, batch
    finally:
        await indexed.aclose()


async def _flattened(
    merged: AsyncGenerator[tuple[int, tuple[int, list[Delta]]], None],
) -> AsyncGenerator[tuple[int, list[Delta]], None]:
    """The prompts' (candidate index, deltas), their prompt's index dropped."""
    try:
        async for _, item in merged:
            yield item
    finally:
        await merged.aclose()


def _usage_of(job: Job, usages: list[Usage]) -> Usage:
    """A job's usage: each prompt's (its prompt once, all its sequences' output), summed."""
    per = job.candidates_per_prompt
    totals = [total_usage(usages[p * per : (p + 1) * per]) for p in range(job.num_prompts)]
    if len(totals) == 1:
        return totals[0]
    reasoning = [u.reasoning_tokens for u in totals if u.reasoning_tokens is not None]
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in totals),
        completion_tokens=sum(u.completion_tokens for u in totals),
        cached_tokens=sum(u.cached_tokens for u in totals),
        reasoning_tokens=sum(reasoning) if reasoning else None,
    )


def _chunk_object(kind: Kind) -> str:
    return "chat.completion.chunk" if kind == "chat" else "text_completion"


async def unless_disconnected(
    work: Awaitable[_T], http_request: Request, closing: asyncio.Event | None = None
) -> _T:
    """`work`'s result; if the client disconnects first, cancel it (which aborts the request)
    and raise ClientDisconnectedError; if `closing` is set first (a shutdown's grace ends),
    cancel it and raise EngineDeadError (a 503)."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(http_request))
    waits: set[asyncio.Future[Any]] = {work_task, watch_task}
    closing_task = None if closing is None else asyncio.ensure_future(closing.wait())
    if closing_task is not None:
        waits.add(closing_task)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if closing_task is not None:
            closing_task.cancel()
        if not work_task.done():
            work_task.cancel()
            if closing is not None and closing.is_set():
                raise EngineDeadError(SHUTTING_DOWN)
            log.info("client disconnected; request cancelled")
            # Not CancelledError: out of the ASGI app, uvicorn logs that as a crash.
            raise ClientDisconnectedError
    return work_task.result()


async def _wait_for_disconnect(http_request: Request) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            return
