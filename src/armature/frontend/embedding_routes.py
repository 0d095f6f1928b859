"""The /v1/embeddings route: one JSON answer, counted like the generation routes (in flight,
then by status under endpoint "embeddings"). The work is EmbeddingService's."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.frontend.compose import FrontendParts
from armature.frontend.embedding_protocol import EmbeddingRequest
from armature.frontend.errors import ApiError, error_body, error_responses
from armature.frontend.service import ClientDisconnectedError, unless_disconnected

__all__ = ["EMBEDDINGS_PATH", "add_embedding_routes"]

EMBEDDINGS_PATH = "/v1/embeddings"


def add_embedding_routes(app: FastAPI, parts: FrontendParts) -> None:
    responses: dict[int | str, dict[str, Any]] = {
        200: {"description": "the vectors, with usage"},
        **error_responses(400, 401, 404, 413, 500, 503),
    }

    @app.post(EMBEDDINGS_PATH, responses=responses)
    async def embeddings(body: EmbeddingRequest, http_request: Request) -> Response:
        metrics = parts.metrics
        metrics.in_flight.inc()
        status = "500"
        try:
            # a client that leaves cancels its legs on the workers
            answer = await unless_disconnected(
                parts.embeddings.create(body), http_request, parts.service.closing
            )
            status = "200"
            return JSONResponse(answer)
        except ClientDisconnectedError:
            status = "499"
            return Response(status_code=499)  # the client is gone; nobody reads this
        except ApiError as exc:
            status = str(exc.status_code)
            raise
        except InvalidRequestError as exc:  # a worker refused it
            status = "400"
            return JSONResponse(error_body(str(exc), "invalid_request_error", "input"), 400)
        except EngineDeadError as exc:
            status = "503"
            message = f"no embedding worker could serve it: {exc}"
            return JSONResponse(error_body(message, "service_unavailable"), status_code=503)
        except asyncio.CancelledError:
            status = "499"
            raise
        finally:
            metrics.in_flight.dec()
            metrics.requests.labels("embeddings", status).inc()
