"""Refusals that come after a request was admitted, and the fleet's own state at admission,
in OpenAI's error format: a worker that refuses what the frontend's checks passed (an adapter
unloaded meanwhile) is a 400, whole or streamed (it was a 500, or a stream cut after its 200
without an error event); a request no worker can take any more is a 503 (a 500 or a cut
stream); no live worker at admission is a 503 (a 400 naming x-worker-id)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontend_fakes import IdleEngine

from armature.config import DisaggConfig, RouterConfig
from armature.errors import InvalidRequestError
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import compose_frontend
from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineOutput, EngineRequest
from armature.router.policies import RoutingError

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 4}


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


class RefusingEngine(IdleEngine):
    """Refuses every request when asked to run it, with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        raise self.error
        yield  # type: ignore[unreachable]


def client(preprocessor: Preprocessor, engine: IdleEngine) -> httpx.AsyncClient:
    parts = compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(parts)), base_url="http://t"
    )


def streamed_error(text: str) -> dict[str, Any]:
    """The error event of a stream that ends with [DONE]."""
    events = [
        line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    [error] = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    return error


@pytest.mark.parametrize(
    ("error", "status", "body"),
    [
        (
            InvalidRequestError("the LoRA adapter 'a1' is not loaded"),
            400,
            {
                "message": "the LoRA adapter 'a1' is not loaded",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request",
            },
        ),
        (
            InvalidRequestError("prompt token id 99999 is outside the vocabulary", "prompt"),
            400,
            {
                "message": "prompt token id 99999 is outside the vocabulary",
                "type": "invalid_request_error",
                "param": "prompt",
                "code": "invalid_value",
            },
        ),
        (
            RoutingError("unknown worker 'w0'; workers: w1"),
            503,
            {
                "message": "the engine is not serving: no worker can serve it now: unknown "
                "worker 'w0'; workers: w1",
                "type": "service_unavailable",
                "param": None,
                "code": None,
            },
        ),
    ],
    ids=["refused", "refused-naming-a-field", "no-worker-left"],
)
async def test_a_refusal_after_admission(
    preprocessor: Preprocessor, error: Exception, status: int, body: dict[str, Any]
) -> None:
    async with client(preprocessor, RefusingEngine(error)) as http:
        whole = await http.post("/v1/completions", json=BODY)
        streamed = await http.post("/v1/completions", json={**BODY, "stream": True})
    assert (whole.status_code, whole.json()["error"]) == (status, body)
    assert streamed.status_code == 200  # the headers went out before the engine was asked
    event = streamed_error(streamed.text)
    assert event["message"].endswith(str(error))
    assert event["type"] == body["type"]  # a lost fleet streams the 503's type, as unstreamed


async def test_no_prefill_worker_under_enforced_disaggregation_is_a_503(
    preprocessor: Preprocessor,
) -> None:
    """The fleet's state, not the request's: it was a 400 naming the x-worker-id header."""
    parts = compose_frontend(
        engines={"d0": RefusingEngine(AssertionError("never asked"))},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
        disagg=DisaggConfig(enforce_disagg=True),
    )
    transport = httpx.ASGITransport(app=build_app(parts))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.post("/v1/completions", json=BODY)
    assert response.status_code == 503
    assert response.json()["error"] == {
        "message": "no prefill worker is available and disaggregation is enforced",
        "type": "service_unavailable",
        "param": None,
        "code": "routing_error",
    }
