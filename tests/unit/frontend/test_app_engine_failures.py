"""The app over a fake engine (the Engine seam): a dead engine gives 503s, not tracebacks;
rejected bodies are counted in the request metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from frontend_fakes import IdleEngine

from armature.config import RouterConfig
from armature.engines.api import EngineDeadError
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import compose_frontend
from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineOutput, EngineRequest

pytestmark = pytest.mark.slow  # loads the default model's tokenizer


class DeadEngine(IdleEngine):
    """An engine whose thread has died."""

    is_alive = False

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        raise EngineDeadError("engine died: simulated")
        yield  # pragma: no cover


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def client(preprocessor: Preprocessor) -> httpx.AsyncClient:
    parts = compose_frontend(
        engines={"w0": DeadEngine()},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
    )
    app = build_app(parts)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_dead_engine_answers_503(preprocessor: Preprocessor) -> None:
    async with client(preprocessor) as c:
        health = await c.get("/health")
        assert health.status_code == 503
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
        assert r.json()["error"]["code"] == "engine_unavailable"


async def test_schema_rejections_are_counted(preprocessor: Preprocessor) -> None:
    async with client(preprocessor) as c:
        r = await c.post("/v1/chat/completions", content=b"{bad json")
        assert r.status_code == 400
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "x", "top_p": 0})
        assert r.status_code == 400
        metrics = (await c.get("/metrics")).text
    assert 'armature_requests_total{endpoint="chat",status="400"} 1.0' in metrics
    assert 'armature_requests_total{endpoint="completions",status="400"} 1.0' in metrics


async def test_text_part_without_text_is_a_clear_400(preprocessor: Preprocessor) -> None:
    async with client(preprocessor) as c:
        body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}
        r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "a content part of type 'text' needs a 'text' string"
