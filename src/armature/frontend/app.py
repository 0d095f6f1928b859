"""The OpenAI-compatible HTTP app: routes, error handling, request accounting.

    POST /v1/chat/completions   POST /v1/completions   POST /v1/embeddings
    GET /v1/models   GET /v1/models/{id}
    POST /v1/responses   GET|DELETE /v1/responses/{id}   GET /v1/responses/{id}/input_items
                                                          (responses_service.py)
    POST /v1/load_lora_adapter   POST /v1/unload_lora_adapter   (lora_admin.py)
    GET /health   GET /live   GET /metrics   GET /openapi.json   GET|POST /admin/overload

Requests become jobs in jobs.py (JobBuilder) and run in service.py (OpenAIService); the parts
are wired in compose.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from armature.config import HttpConfig
from armature.engines.api import EngineDeadError
from armature.frontend.admission import Overloaded
from armature.frontend.auth import ApiKeyMiddleware, ApiKeys, BodyLimitMiddleware
from armature.frontend.compose import FrontendParts, serves_generation
from armature.frontend.embedding_routes import EMBEDDINGS_PATH, add_embedding_routes
from armature.frontend.errors import (
    NO_WORKER_RETRY_AFTER_S,
    ApiError,
    error_body,
    error_responses,
    install_error_handlers,
)
from armature.frontend.event_stream import EventStreamResponse
from armature.frontend.generation import GenerationError
from armature.frontend.jobs import Job, ServedModel
from armature.frontend.lora_admin import add_lora_routes
from armature.frontend.peer_admin import REPLICA_ONLY_HEADER, send_to_peers
from armature.frontend.protocol import ChatCompletionRequest, CompletionRequest, OverloadUpdate
from armature.frontend.responses_listing import MAX_PAGE_ITEMS
from armature.frontend.responses_protocol import MAX_RESPONSE_ID_CHARS, ResponsesRequest
from armature.frontend.service import (
    ClientDisconnectedError,
    OpenAIService,
    unless_disconnected,
)
from armature.frontend.tasks import wrong_task
from armature.protocols.embedding import WorkerTask
from armature.router.policies import NoWorkerError, RoutingError

__all__ = ["REQUEST_ID_HEADER", "WORKER_HEADER", "ServedModel", "build_app", "build_replica_app"]

log = logging.getLogger(__name__)

WORKER_HEADER = "x-worker-id"  # names the worker for the direct router
REQUEST_ID_HEADER = "x-request-id"  # the id that frontend and worker logs carry
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    EMBEDDINGS_PATH: "embeddings",
    "/v1/responses": "responses",
}

Background = Callable[[], Coroutine[Any, Any, None]]
PeerUrls = Callable[[], dict[str, str]]  # the other replicas' own addresses: name -> url
ResponseId = Annotated[str, Path(min_length=1, max_length=MAX_RESPONSE_ID_CHARS)]
MAX_MODEL_ID_CHARS = 512  # a served name or a LoRA adapter's, ORG/NAME included
ModelId = Annotated[str, Path(min_length=1, max_length=MAX_MODEL_ID_CHARS)]


def build_app(
    parts: FrontendParts,
    background: Sequence[Background] = (),
    api_keys: ApiKeys | None = None,
    protect_metrics: bool = False,
    max_request_bytes: int = HttpConfig().max_request_bytes,
    peer_urls: PeerUrls = dict,
) -> FastAPI:
    """The app over `parts` (a router in front of one or more worker engines). `background`
    coroutines (e.g. following discovery) run from startup until shutdown. With `api_keys`,
    the API needs one of them (see auth.py). `peer_urls`: the other frontend replicas' own
    addresses, which admin changes reach too."""
    app = FastAPI(title="Armature", version="0.1.0", lifespan=_lifespan(parts, background))
    _add_middleware(app, api_keys, protect_metrics, max_request_bytes)
    app.state.begin_closing = functools.partial(_begin_closing, parts)

    def count_rejected(request: Request, status: int) -> None:
        endpoint = ENDPOINTS.get(request.url.path)
        if endpoint is not None:
            parts.metrics.requests.labels(endpoint, str(status)).inc()

    install_error_handlers(app, count_rejected)
    _add_generation_routes(app, parts)
    add_embedding_routes(app, parts)
    _add_info_routes(app, parts)
    _add_admin_routes(app, parts, peer_urls)
    add_lora_routes(app, parts)
    return app


def build_replica_app(
    parts: FrontendParts,
    api_keys: ApiKeys | None = None,
    protect_metrics: bool = False,
    max_request_bytes: int = HttpConfig().max_request_bytes,
    peer_urls: PeerUrls = dict,
) -> FastAPI:
    """What a frontend replica serves on its own address (`--replica-host`,
    `--replica-port`) for the planner and the other replicas: /metrics, /health, /live,
    /v1/models and /admin/overload over the same `parts`, behind the same keys; no
    generation (that goes through the address clients use). Its owner serves it until the
    main app's shutdown ends: a replica's /metrics answers while it drains."""
    app = FastAPI(title="Armature (this replica)", version="0.1.0")
    _add_middleware(app, api_keys, protect_metrics, max_request_bytes)
    install_error_handlers(app, lambda request, status: None)
    _add_info_routes(app, parts)
    _add_admin_routes(app, parts, peer_urls)
    return app


def _add_middleware(
    app: FastAPI, api_keys: ApiKeys | None, protect_metrics: bool, max_request_bytes: int
) -> None:
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_keys is not None:  # added last: runs first, so unauthenticated bodies go unread
        app.add_middleware(ApiKeyMiddleware, keys=api_keys, protect_metrics=protect_metrics)


def _begin_closing(parts: FrontendParts) -> None:
    """A shutdown's grace is about to end: what is in flight, and what waits for a busy
    fleet, is answered now (503, or a stream's error ending) while it still can be."""
    parts.gate.close()
    parts.service.begin_closing()


def _lifespan(parts: FrontendParts, background: Sequence[Background]) -> Callable[[FastAPI], Any]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        parts.router.start()
        parts.embedder.start()
        tasks = [asyncio.get_running_loop().create_task(run()) for run in background]
        for task in tasks:
            task.add_done_callback(functools.partial(_background_ended, app))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await parts.gate.stop()
        await parts.router.stop()
        await parts.embedder.stop()

    return lifespan


def _background_ended(app: FastAPI, task: asyncio.Task[None]) -> None:
    """A background task (following the workers) that fails leaves the frontend serving a
    fleet it no longer follows: say so, and stop serving (`app.state.stop_serving`, set by
    whoever serves the app) with the failure in `app.state.background_failure`."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    log.error(
        "the frontend stops: a background task failed (following the workers, or serving "
        "this replica's own address)",
        exc_info=exc,
    )
    app.state.background_failure = exc
    stop_serving = getattr(app.state, "stop_serving", None)
    if stop_serving is not None:
        stop_serving()


class Run(Protocol):
    """One accepted request's job, run whole (a JSON body) or streamed (SSE events)."""

    @property
    def job(self) -> Job: ...

    async def complete(self, http_request: Request) -> dict[str, Any]: ...

    def stream(self) -> AsyncGenerator[str | bytes, None]: ...


@dataclass(frozen=True)
class _ServiceRun:
    """A chat or completion job, run by OpenAIService."""

    service: OpenAIService
    job: Job

    async def complete(self, http_request: Request) -> dict[str, Any]:
        return await self.service.complete(self.job, http_request)

    def stream(self) -> AsyncGenerator[str | bytes, None]:
        return self.service.stream(self.job)


async def _service_run(service: OpenAIService, job: Awaitable[Job]) -> Run:
    return _ServiceRun(service, await job)


async def _counted_stream(
    parts: FrontendParts, endpoint: str, run: Run
) -> AsyncGenerator[str | bytes, None]:
    """`run.stream()`, counted in flight until the last event is sent or the client
    leaves; a stream that ends in an error event is counted with the error's status. A
    stream the client leaves before its first event is never counted."""
    metrics = parts.metrics
    metrics.in_flight.inc()
    status = "500"
    try:
        async with aclosing(run.stream()) as events:
            async for event in events:
                yield event
        status = str(run.job.error_status or 200)  # an error event: the error's status
    except (asyncio.CancelledError, GeneratorExit):  # the client left mid-stream
        status = "499"
        raise
    finally:
        metrics.in_flight.dec()
        metrics.requests.labels(endpoint, status).inc()


async def _admit(parts: FrontendParts, job: Job, http_request: Request) -> None:
    """Route check and overload admission; ApiError (400, 503) when the job cannot go on."""
    job.target_worker = http_request.headers.get(WORKER_HEADER)
    try:
        parts.router.check_route(job.target_worker)
    except NoWorkerError as exc:  # no worker of a role it needs: the fleet's state
        raise ApiError(
            str(exc), status_code=503, type="service_unavailable", code="routing_error"
        ) from None
    except RoutingError as exc:
        raise ApiError(str(exc), param=WORKER_HEADER, code="routing_error") from None
    job.started_s = time.perf_counter()  # a wait in the queue counts in its latencies
    gate = parts.gate
    try:
        if gate.admits_now():
            await gate.admit(job.priority)  # at once: no wait to watch the client over
        else:
            # a client that leaves while its request waits frees its place (a 499)
            await unless_disconnected(gate.admit(job.priority), http_request)
    except Overloaded as exc:
        raise ApiError(
            str(exc),
            status_code=503,
            type="service_unavailable",
            code=exc.code,
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None


def _check_task(parts: FrontendParts, model: str) -> None:
    """ApiError (400) when the served `model`'s workers all compute embeddings."""
    if model != parts.model.name:
        return  # the job's own check answers 404
    mismatch = wrong_task(
        model,
        WorkerTask.GENERATE,
        has_generate=serves_generation(parts.router),
        has_embed=bool(parts.embedder.engines),
    )
    if mismatch is not None:
        raise mismatch


async def _respond(
    parts: FrontendParts,
    endpoint: str,
    make_run: Callable[[], Awaitable[Run]],
    http_request: Request,
    model: str,
) -> Response:
    metrics = parts.metrics
    metrics.in_flight.inc()
    status: str | None = "500"
    headers: dict[str, str] = {}  # the request's id once it has one, errors included
    try:
        _check_task(parts, model)
        run = await make_run()
        job = run.job
        headers[REQUEST_ID_HEADER] = job.request_id
        await _admit(parts, job, http_request)
        if job.stream:
            status = None  # _counted_stream counts it when it ends
            events = _counted_stream(parts, endpoint, run)
            return EventStreamResponse(events, headers=headers)
        body = await run.complete(http_request)
        status = "200"
        return JSONResponse(body, headers=headers)
    except ApiError as exc:
        status = str(exc.status_code)
        exc.headers = {**headers, **(exc.headers or {})}
        raise
    except GenerationError as exc:
        status = str(exc.status_code)
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)
    except EngineDeadError as exc:
        status = "503"
        body = error_body(f"the engine is not serving: {exc}", "service_unavailable")
        retry = {**headers, "Retry-After": str(NO_WORKER_RETRY_AFTER_S)}
        return JSONResponse(body, status_code=503, headers=retry)
    except ClientDisconnectedError:
        status = "499"
        return Response(status_code=499)  # the client is gone; nobody reads this
    except asyncio.CancelledError:
        status = "499"
        raise
    finally:
        metrics.in_flight.dec()
        if status is not None:
            metrics.requests.labels(endpoint, status).inc()


def _add_generation_routes(app: FastAPI, parts: FrontendParts) -> None:
    service, jobs = parts.service, parts.jobs
    responses: dict[int | str, dict[str, Any]] = {
        200: {"content": {"text/event-stream": {}}, "description": "a response, or SSE"},
        **error_responses(400, 401, 404, 413, 500, 503),
    }

    @app.post("/v1/chat/completions", responses=responses)
    async def chat_completions(body: ChatCompletionRequest, http_request: Request) -> Response:
        return await _respond(
            parts,
            "chat",
            lambda: _service_run(service, jobs.chat_job(body)),
            http_request,
            body.model,
        )

    @app.post("/v1/completions", responses=responses)
    async def completions(body: CompletionRequest, http_request: Request) -> Response:
        return await _respond(
            parts,
            "completions",
            lambda: _service_run(service, jobs.completion_job(body)),
            http_request,
            body.model,
        )

    @app.post("/v1/responses", responses=responses)
    async def create_response(body: ResponsesRequest, http_request: Request) -> Response:
        return await _respond(
            parts, "responses", lambda: parts.responses.start(body), http_request, body.model
        )

    stored = error_responses(400, 401, 404)

    @app.get("/v1/responses/{response_id}", responses=stored)
    async def get_response(response_id: ResponseId) -> dict[str, Any]:
        """A stored response (see --max-stored-responses, --stored-response-ttl-s)."""
        return parts.responses.get(response_id)

    @app.get("/v1/responses/{response_id}/input_items", responses=stored)
    async def list_input_items(
        response_id: ResponseId,
        after: Annotated[str | None, Query(max_length=MAX_RESPONSE_ID_CHARS)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_ITEMS)] = 20,
        order: Literal["asc", "desc"] = "desc",
        include: Annotated[list[str] | None, Query()] = None,
        # the openai client's form of it (include[]=...)
        include_list: Annotated[
            list[str] | None, Query(alias="include[]", include_in_schema=False)
        ] = None,
    ) -> dict[str, Any]:
        """The items a stored response ran on: the chain's before its own input."""
        if include or include_list:
            raise ApiError(
                "include is not supported", param="include", code="unsupported_parameter"
            )
        return parts.responses.list_input_items(response_id, after, limit, order)

    @app.delete("/v1/responses/{response_id}", responses=stored)
    async def delete_response(response_id: ResponseId) -> dict[str, Any]:
        return parts.responses.delete(response_id)


def _add_info_routes(app: FastAPI, parts: FrontendParts) -> None:
    model, router = parts.model, parts.router

    def served_models() -> list[dict[str, Any]]:
        """The base model, then the LoRA adapters its workers serve (`parent`: the base)."""
        base = {
            "id": model.name,
            "object": "model",
            "created": model.created,
            "owned_by": "armature",
            "root": model.name,
            "parent": None,
            "max_model_len": model.max_model_len,
        }
        adapters = [
            {**base, "id": name, "parent": model.name}
            for name in sorted(router.get_lora_adapters())
        ]
        return [base, *adapters]

    @app.get("/v1/models", responses=error_responses(401))
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": served_models()}

    @app.get("/v1/models/{model_id:path}", responses=error_responses(400, 401, 404))
    async def retrieve_model(model_id: ModelId) -> dict[str, Any]:
        """One of `/v1/models` by id (the openai client's models.retrieve)."""
        for served in served_models():
            if served["id"] == model_id:
                return served
        raise ApiError(
            f"the model {model_id!r} does not exist",
            status_code=404,
            type="not_found_error",
            param="model",
            code="model_not_found",
        )

    # HEAD as well: load balancers' and probes' checks often send it (out of the schema,
    # where it would repeat the GET's operation id)
    @app.get("/health", responses=error_responses(503))
    @app.head("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        if not router.is_alive and not parts.embedder.get_workers():
            return JSONResponse({"status": "unhealthy", "reason": "engine stopped"}, 503)
        return JSONResponse({"status": "ok", "model": model.name})

    @app.get("/live")
    @app.head("/live", include_in_schema=False)
    async def live() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/metrics", response_class=PlainTextResponse, responses=error_responses(401))
    async def metrics_endpoint() -> Response:
        return Response(parts.metrics.render(), media_type="text/plain; version=0.0.4")


def _add_admin_routes(app: FastAPI, parts: FrontendParts, peer_urls: PeerUrls) -> None:
    thresholds, gate = parts.thresholds, parts.gate

    def state() -> dict[str, Any]:
        return {**dataclasses.asdict(thresholds.config), "queued": gate.num_queued}

    @app.get("/admin/overload", responses=error_responses(401))
    async def get_overload() -> dict[str, Any]:
        return state()

    @app.post("/admin/overload", responses=error_responses(400, 401, 413))
    async def set_overload(update: OverloadUpdate, request: Request) -> dict[str, Any]:
        """Change the busy thresholds and queue bounds at runtime (fields left out stay), on
        this replica and every other of the namespace (`peers`: each one's outcome), or on
        this one alone with the x-armature-replica-only header."""
        changes = update.model_dump(exclude_unset=True)
        thresholds.config = dataclasses.replace(thresholds.config, **changes)
        log.info("overload control now %s", thresholds.config)
        peers: dict[str, str] = {}
        if REPLICA_ONLY_HEADER not in request.headers:
            authorization = request.headers.get("authorization")
            peers = await send_to_peers(peer_urls(), "/admin/overload", changes, authorization)
            for name, outcome in peers.items():
                if outcome != "changed":
                    log.warning("overload control not changed on %s: %s", name, outcome)
        return {**state(), "peers": peers}
