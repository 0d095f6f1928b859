"""ResponsesService: POST /v1/responses as a chat job (the same preprocessing, routing,
detokenizing and parsers as /v1/chat/completions), its output as Responses items and events,
and the store that `previous_response_id` and GET /v1/responses/{id} read. The HTTP routes
live in app.py; the translations in responses_input.py and responses_output.py.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request

from armature.config import ResponsesConfig
from armature.engines.api import EngineDeadError
from armature.frontend.errors import ApiError
from armature.frontend.generation import GenerationError, Usage
from armature.frontend.jobs import Job, JobBuilder
from armature.frontend.response_store import Missing, ResponseStore
from armature.frontend.responses_input import chat_request, read_items, responses_error
from armature.frontend.responses_listing import get_page, listed_items
from armature.frontend.responses_output import ResponseBuilder, response_fields
from armature.frontend.responses_protocol import InputItem, ResponsesRequest
from armature.frontend.service import OpenAIService, unless_disconnected

__all__ = ["ResponseRun", "ResponsesService", "StoredResponse"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # monotonic seconds


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, as GET returns it
    conversation: tuple[InputItem, ...]  # what a response that follows it continues
    input_items: tuple[dict[str, Any], ...]  # what it ran on, as input_items lists them


class ResponsesService:
    """Owns the store of responses (bounded, with a TTL; see response_store.py)."""

    def __init__(
        self,
        jobs: JobBuilder,
        chat: OpenAIService,
        config: ResponsesConfig,
        clock: Clock = time.monotonic,
    ) -> None:
        self.jobs = jobs
        self.chat = chat
        self.clock = clock
        self.store: ResponseStore[StoredResponse] = ResponseStore(
            config.max_stored_responses, config.stored_response_ttl_s
        )

    async def start(self, body: ResponsesRequest) -> ResponseRun:
        """The run of `body`, checked and translated; ApiError (4xx naming the field) for
        what cannot run."""
        if body.model_extra:
            log.info("responses: ignoring unknown fields %s", sorted(body.model_extra))
        if body.reasoning is not None and body.reasoning.model_extra:
            log.info(
                "responses: ignoring unknown reasoning fields %s",
                sorted(body.reasoning.model_extra),
            )
        for param, reason in body.unsupported_fields():
            raise ApiError(reason, param=param, code="unsupported_parameter")
        history, history_listed = self._history(body.previous_response_id)
        items = read_items(body.input)
        try:
            job = await self.jobs.chat_job(chat_request(body, history, items))
        except ApiError as exc:
            raise responses_error(exc) from None
        fields = response_fields(body, f"resp_{uuid.uuid4().hex}", int(time.time()), job.model_name)
        new_id = _new_id
        builder = ResponseBuilder(fields, new_id)
        listed = (*history_listed, *listed_items(items, body.input, new_id))
        return ResponseRun(self, job, builder, (*history, *items), listed, body.store)

    def get(self, response_id: str) -> dict[str, Any]:
        found = self.store.get(response_id, self.clock())
        if isinstance(found, Missing):
            raise _missing(response_id, found, "response_id")
        return found.response

    def list_input_items(
        self, response_id: str, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> dict[str, Any]:
        """A page of the items a stored response ran on (see responses_listing.py)."""
        found = self.store.get(response_id, self.clock())
        if isinstance(found, Missing):
            raise _missing(response_id, found, "response_id")
        return get_page(found.input_items, after, limit, order)

    def delete(self, response_id: str) -> dict[str, Any]:
        self.get(response_id)  # ApiError when there is none
        self.store.delete(response_id, self.clock())
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def keep(self, run: ResponseRun) -> None:
        """Store a finished run (or, with store: false, its tombstone)."""
        response = run.builder.response
        assert response is not None, "a run is kept once it has finished"
        now_s = self.clock()
        if not run.store:
            self.store.put_tombstone(response["id"], now_s)
            return
        output = read_items(run.builder.output, "output")
        stored = StoredResponse(response, (*run.conversation, *output), run.input_items)
        self.store.put(response["id"], stored, now_s)

    def _history(
        self, previous_id: str | None
    ) -> tuple[tuple[InputItem, ...], tuple[dict[str, Any], ...]]:
        """The conversation a response after `previous_id` continues, and its items as
        input_items lists them (the previous response's input items, then its output)."""
        if previous_id is None:
            return (), ()
        found = self.store.get(previous_id, self.clock())
        if isinstance(found, Missing):
            raise _missing(previous_id, found, "previous_response_id")
        return found.conversation, (*found.input_items, *found.response["output"])


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _missing(response_id: str, why: Missing, param: str) -> ApiError:
    if why is Missing.NOT_STORED:
        return ApiError(
            f"response {response_id!r} was created with store: false, so it was not kept; "
            "send its items in input instead",
            param=param,
            code="response_not_stored",
        )
    reason = (
        "has expired" if why is Missing.EXPIRED else "was not found (unknown, deleted or expired)"
    )
    return ApiError(
        f"response {response_id!r} {reason}",
        status_code=404,
        type="not_found_error",
        param=param,
        code="response_not_found",
    )


@dataclass
class ResponseRun:
    """One admitted /v1/responses request: its chat job, run whole or streamed."""

    service: ResponsesService
    job: Job
    builder: ResponseBuilder
    conversation: tuple[InputItem, ...]  # the history and this request's input items
    input_items: tuple[dict[str, Any], ...]  # the same, as input_items lists them
    store: bool

    async def complete(self, http_request: Request) -> dict[str, Any]:
        """The whole response; a client that disconnects cancels the job."""
        usage = Usage()
        finish: list[str | None] = [None]

        async def collect() -> None:
            async with aclosing(self.service.chat.chat_pieces(self.job, usage)) as pieces:
                async for piece, reason in pieces:
                    self.builder.feed(piece)
                    finish[0] = reason

        self.builder.start()
        await unless_disconnected(collect(), http_request, self.service.chat.closing)
        self.builder.finish(finish[0], usage, int(time.time()))
        self.service.keep(self)
        assert self.builder.response is not None
        return self.builder.response

    async def stream(self) -> AsyncGenerator[str, None]:
        """SSE events (`event: TYPE`, `data: JSON`), from response.created to
        response.completed (or .incomplete, or .failed when the engine fails). The run is
        stored before its last event goes out, so the client can follow it at once."""
        usage = Usage()
        finish: str | None = None
        for event in self.builder.start():
            yield _sse(event)
        try:
            async with aclosing(self.service.chat.chat_pieces(self.job, usage)) as pieces:
                async for piece, reason in pieces:
                    finish = reason
                    for event in self.builder.feed(piece):
                        yield _sse(event)
        except (GenerationError, EngineDeadError) as exc:
            self.job.error_status = exc.status_code if isinstance(exc, GenerationError) else 503
            for event in self.builder.fail(str(exc)):
                yield _sse(event)
            return
        events = self.builder.finish(finish, usage, int(time.time()))
        self.service.keep(self)
        for event in events:
            yield _sse(event)


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
