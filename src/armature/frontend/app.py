"""The OpenAI-compatible HTTP app: routes, error handling, request accounting.

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models
    GET /health   GET /live   GET /metrics   GET /openapi.json

The request logic lives in service.py (OpenAIService); routing over workers in routing.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import Gauge

from armature.config import HttpConfig, OverloadConfig
from armature.engines.api import EngineDeadError
from armature.frontend.admission import AdmissionGate, Overloaded, WorkerPressure, is_busy
from armature.frontend.auth import ApiKeyMiddleware, ApiKeys, BodyLimitMiddleware
from armature.frontend.errors import ApiError, error_body, error_responses, install_error_handlers
from armature.frontend.generation import GenerationError
from armature.frontend.metrics import FrontendMetrics
from armature.frontend.preprocess import Preprocessor
from armature.frontend.protocol import ChatCompletionRequest, CompletionRequest, OverloadUpdate
from armature.frontend.service import ClientDisconnectedError, Job, OpenAIService, ServedModel
from armature.router.policies import RoutingError
from armature.router.service import EngineRouter

__all__ = ["REQUEST_ID_HEADER", "WORKER_HEADER", "ServedModel", "build_app"]

log = logging.getLogger(__name__)

WORKER_HEADER = "x-worker-id"  # names the worker for the direct router
REQUEST_ID_HEADER = "x-request-id"  # the id that frontend and worker logs carry


def build_app(
    engine: EngineRouter,
    preprocessor: Preprocessor,
    model: ServedModel,
    background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
    api_keys: ApiKeys | None = None,
    protect_metrics: bool = False,
    max_request_bytes: int = HttpConfig().max_request_bytes,
    overload: OverloadConfig | None = None,
) -> FastAPI:
    """The app over `engine`, a router in front of one or more worker engines. `background`
    coroutines (e.g. following discovery) run from startup until shutdown. With `api_keys`,
    the API needs one of them (see auth.py)."""
    metrics = FrontendMetrics(model.name, engine.get_load, engine.get_worker_loads)
    engine.observer = metrics.router_observer()
    service = OpenAIService(engine, preprocessor, metrics, model)

    def pressures_by_worker() -> dict[str, WorkerPressure]:
        return {
            worker: WorkerPressure(
                kv_usage=load.num_active_blocks / max(1, load.num_total_blocks),
                prefill_tokens=max(load.num_prefill_tokens_queued, routed_prefill_tokens),
            )
            for worker, (load, routed_prefill_tokens) in engine.get_pool_loads().items()
        }

    def busy_workers() -> set[str]:
        config = gate.config
        if not config.enabled:
            return set()
        return {w for w, p in pressures_by_worker().items() if is_busy(config, p)}

    gate = AdmissionGate(overload or OverloadConfig(), lambda: pressures_by_worker().values())
    engine.get_busy_workers = busy_workers  # admitted requests go to a worker with room
    Gauge(
        "armature_requests_queued",
        "Requests waiting for a free worker (overload control)",
        registry=metrics.registry,
    ).set_function(lambda: gate.num_queued)
    Gauge(
        "armature_router_index_blocks",
        "(worker, block) entries in the router's prefix index",
        registry=metrics.registry,
    ).set_function(lambda: engine.get_index_blocks()[0])
    Gauge(
        "armature_router_index_capacity_blocks",
        "The prefix index's bound: the routed workers' KV capacity in blocks",
        registry=metrics.registry,
    ).set_function(lambda: engine.get_index_blocks()[1])

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        tasks = [asyncio.get_running_loop().create_task(run()) for run in background]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await gate.stop()
        await engine.stop()

    app = FastAPI(title="Armature", version="0.1.0", lifespan=lifespan)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if api_keys is not None:  # added last: runs first, so unauthenticated bodies go unread
        app.add_middleware(ApiKeyMiddleware, keys=api_keys, protect_metrics=protect_metrics)
    app.state.service = service
    endpoints = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}

    def count_rejected(request: Request, status: int) -> None:
        endpoint = endpoints.get(request.url.path)
        if endpoint is not None:
            metrics.requests.labels(endpoint, str(status)).inc()

    install_error_handlers(app, count_rejected)

    async def counted_stream(endpoint: str, job: Job) -> AsyncIterator[str]:
        """`service.stream(job)`, counted in flight until the last event is sent or the client
        leaves. A stream the client leaves before its first event is never counted."""
        metrics.in_flight.inc()
        status = "500"
        try:
            async with aclosing(service.stream(job)) as events:
                async for event in events:
                    yield event
            status = "200"
        except (asyncio.CancelledError, GeneratorExit):  # the client left mid-stream
            status = "499"
            raise
        finally:
            metrics.in_flight.dec()
            metrics.requests.labels(endpoint, status).inc()

    async def respond(
        endpoint: str, make_job: Callable[[], Awaitable[Job]], http_request: Request
    ) -> Response:
        metrics.in_flight.inc()
        status: str | None = "500"
        try:
            job = await make_job()
            job.target_worker = http_request.headers.get(WORKER_HEADER)
            try:
                service.engine.check_route(job.target_worker)
            except RoutingError as exc:
                raise ApiError(str(exc), param=WORKER_HEADER, code="routing_error") from None
            try:
                await gate.admit(job.priority)
            except Overloaded as exc:
                raise ApiError(
                    str(exc),
                    status_code=503,
                    type="service_unavailable",
                    code=exc.code,
                    headers={"Retry-After": str(exc.retry_after_s)},
                ) from None
            headers = {REQUEST_ID_HEADER: job.request_id}
            if job.stream:
                status = None  # counted_stream counts it when it ends
                events = counted_stream(endpoint, job)
                return StreamingResponse(events, media_type="text/event-stream", headers=headers)
            body = await service.complete(job, http_request)
            status = "200"
            return JSONResponse(body, headers=headers)
        except ApiError as exc:
            status = str(exc.status_code)
            raise
        except GenerationError as exc:
            return JSONResponse(error_body(str(exc), "internal_error"), status_code=500)
        except EngineDeadError as exc:
            status = "503"
            body = error_body(f"the engine is not serving: {exc}", "service_unavailable")
            return JSONResponse(body, status_code=503)
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

    generation_errors: dict[int | str, dict[str, Any]] = {
        200: {"content": {"text/event-stream": {}}, "description": "a response, or SSE"},
        **error_responses(400, 401, 404, 413, 500, 503),
    }

    @app.post("/v1/chat/completions", responses=generation_errors)
    async def chat_completions(body: ChatCompletionRequest, http_request: Request) -> Response:
        return await respond("chat", lambda: service.chat_job(body), http_request)

    @app.post("/v1/completions", responses=generation_errors)
    async def completions(body: CompletionRequest, http_request: Request) -> Response:
        return await respond("completions", lambda: service.completion_job(body), http_request)

    @app.get("/v1/models", responses=error_responses(401))
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model.name,
                    "object": "model",
                    "created": model.created,
                    "owned_by": "armature",
                    "max_model_len": model.max_model_len,
                }
            ],
        }

    @app.get("/health", responses=error_responses(503))
    async def health() -> JSONResponse:
        if not engine.is_alive:
            return JSONResponse({"status": "unhealthy", "reason": "engine stopped"}, 503)
        return JSONResponse({"status": "ok", "model": model.name})

    @app.get("/live")
    async def live() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/admin/overload", responses=error_responses(401))
    async def get_overload() -> dict[str, Any]:
        return {**dataclasses.asdict(gate.config), "queued": gate.num_queued}

    @app.post("/admin/overload", responses=error_responses(400, 401, 413))
    async def set_overload(update: OverloadUpdate) -> dict[str, Any]:
        """Change the busy thresholds and queue bounds at runtime (fields left out stay)."""
        changes = update.model_dump(exclude_unset=True)
        gate.config = dataclasses.replace(gate.config, **changes)
        log.info("overload control now %s", gate.config)
        return {**dataclasses.asdict(gate.config), "queued": gate.num_queued}

    @app.get("/metrics", response_class=PlainTextResponse, responses=error_responses(401))
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app
