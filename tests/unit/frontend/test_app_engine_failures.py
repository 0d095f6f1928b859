"""The app over a fake engine (the Engine seam): a dead engine gives 503s, not tracebacks;
rejected bodies are counted in the request metrics; a background task that fails (following
the workers) stops the serving, with the failure kept for the exit code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from frontend_fakes import IdleEngine

from armature.config import OverloadConfig, RouterConfig
from armature.engines.api import EngineDeadError
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import FrontendParts, compose_frontend
from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineLoad, EngineOutput, EngineRequest, FinishReason
from polling import wait_until

pytestmark = pytest.mark.slow  # loads the default model's tokenizer


class DeadEngine(IdleEngine):
    """An engine whose thread has died."""

    is_alive = False

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        raise EngineDeadError("engine died: simulated")
        yield  # pragma: no cover


class FailingEngine(IdleEngine):
    """An engine that sends one token, then fails the request: for its guide's field (the
    request's fault) when `param` is set, else on its own."""

    def __init__(self, param: str | None) -> None:
        self.param = param

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        rid = request.request_id
        yield EngineOutput(request_id=rid, new_token_ids=[72], num_prompt_tokens=3)
        yield EngineOutput(
            request_id=rid,
            new_token_ids=[],
            finish_reason=FinishReason.ERROR,
            error="structured output failed: lexer error: too many expressions constructed",
            error_param=self.param,
        )


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def client(preprocessor: Preprocessor, engine: IdleEngine | None = None) -> httpx.AsyncClient:
    parts = compose_frontend(
        engines={"w0": engine or DeadEngine()},  # type: ignore[dict-item]
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
        assert r.headers["Retry-After"] == "1"  # as an overloaded fleet's 503 says when


class VanishingEngine(IdleEngine):
    """A worker that looks alive and dies as a request reaches it."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        raise EngineDeadError("worker gone: simulated")
        yield  # pragma: no cover


async def test_a_worker_lost_under_a_request_is_a_503_to_retry(preprocessor: Preprocessor) -> None:
    """Unstreamed, a 503; streamed, the same error in its event (typed internal_error
    before)."""
    parts = compose_frontend(
        engines={"w0": VanishingEngine()},  # type: ignore[dict-item]
        router_config=RouterConfig(failover_wait_s=0.0),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
    )
    transport = httpx.ASGITransport(app=build_app(parts))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        body = {"model": "m", "prompt": "hi", "stream": True}
        streamed = await c.post("/v1/completions", json=body)
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "service_unavailable"
    assert r.headers["Retry-After"] == "1"
    events = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.text.splitlines()
        if line.startswith("data: {")
    ]
    assert [e["error"] for e in events if "error" in e] == [r.json()["error"]]


class OneTokenEngine(IdleEngine):
    """A healthy worker: one token, then the end."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        yield EngineOutput(
            request_id=request.request_id,
            new_token_ids=[72],
            num_prompt_tokens=len(request.prompt_token_ids),
            finish_reason=FinishReason.LENGTH,
        )


async def test_a_request_fails_over_to_the_replacement_of_the_worker_that_died(
    preprocessor: Preprocessor,
) -> None:
    """serve restarts a dead worker under its name (worker-0 again): the request waiting for
    a live worker takes the replacement, another engine under the same name (it waited the
    whole failover and answered 503, the replacement excluded by name)."""
    dead = VanishingEngine()
    parts = compose_frontend(
        engines={"w0": dead},  # type: ignore[dict-item]
        router_config=RouterConfig(failover_wait_s=60.0),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
    )
    generate = dead.generate
    called = asyncio.Event()

    def vanish(request: EngineRequest) -> AsyncIterator[EngineOutput]:
        called.set()
        return generate(request)

    dead.generate = vanish  # type: ignore[method-assign]
    transport = httpx.ASGITransport(app=build_app(parts))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        request = asyncio.create_task(c.post("/v1/completions", json=body))
        await asyncio.wait_for(called.wait(), 30)
        await parts.router.remove_engine("w0")  # its lease ends; serve starts it again
        parts.router.add_engine("w0", OneTokenEngine())  # type: ignore[arg-type]
        response = await asyncio.wait_for(request, 30)  # well within the failover's 60 s
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 1


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


async def test_a_guide_the_engine_could_not_follow_is_a_400_naming_it(
    preprocessor: Preprocessor,
) -> None:
    body = {"model": "m", "prompt": "hi", "guided_regex": "((a{100}){100}){100}"}
    async with client(preprocessor, FailingEngine("guided_regex")) as c:
        r = await c.post("/v1/completions", json=body)
        streamed = await c.post("/v1/completions", json={**body, "stream": True})
        metrics = (await c.get("/metrics")).text
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "structured output failed: lexer error: too many expressions constructed",
        "type": "invalid_request_error",
        "param": "guided_regex",
        "code": "invalid_value",
    }
    # streamed too: counted with the error's status, as unstreamed
    assert 'armature_requests_total{endpoint="completions",status="400"} 2.0' in metrics
    assert 'status="200"' not in metrics
    # streamed: the first token went out with the 200; the error event names the field
    assert streamed.status_code == 200
    events = [e for e in streamed.text.split("\n\n") if e.startswith("data: {")]
    error = json.loads(events[-1].removeprefix("data: "))["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "guided_regex",
        "invalid_value",
    )
    assert streamed.text.rstrip().endswith("data: [DONE]")


async def test_an_engine_failure_of_its_own_is_a_500(preprocessor: Preprocessor) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with client(preprocessor, FailingEngine(None)) as c:
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        streams = [
            await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "stream": True}),
            await c.post("/v1/chat/completions", json=chat),
            await c.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True}),
        ]
        metrics = (await c.get("/metrics")).text
    assert r.status_code == 500
    assert (r.json()["error"]["type"], r.json()["error"]["param"]) == ("internal_error", None)
    # each stream went out with a 200 and ended in an error event: counted as its error
    assert [s.status_code for s in streams] == [200, 200, 200]
    assert ["error" in s.text for s in streams] == [True, True, True]
    assert 'armature_requests_total{endpoint="completions",status="500"} 2.0' in metrics
    assert 'armature_requests_total{endpoint="chat",status="500"} 1.0' in metrics
    assert 'armature_requests_total{endpoint="responses",status="500"} 1.0' in metrics
    assert 'status="200"' not in metrics


async def test_health_and_live_answer_head(preprocessor: Preprocessor) -> None:
    """Load balancers' and probes' checks often send HEAD (405 before)."""
    async with client(preprocessor, FailingEngine(None)) as c:
        for path in ("/health", "/live"):
            head = await c.head(path)
            assert (head.status_code, head.content) == (200, b""), path
    async with client(preprocessor) as c:  # a dead engine
        assert (await c.head("/health")).status_code == 503


async def test_a_failed_background_task_stops_the_serving(preprocessor: Preprocessor) -> None:
    """Following the workers ran in a background task whose failure nobody saw: the frontend
    served on with a fleet it no longer followed (every request a 503 once its first worker
    left). Now it is logged and the server is told to stop; a task that ends cleanly, or is
    cancelled at shutdown, stops nothing."""
    parts = compose_frontend(
        engines={"w0": IdleEngine()},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
    )
    failed = asyncio.Event()

    async def follow() -> None:
        raise OSError("cannot bind the load publisher")

    async def done_early() -> None:
        return None

    async def forever() -> None:
        await asyncio.Event().wait()

    app = build_app(parts, background=[done_early, forever, follow])
    app.state.stop_serving = failed.set
    async with app.router.lifespan_context(app):
        await asyncio.wait_for(failed.wait(), 30)
        assert isinstance(app.state.background_failure, OSError)


def overloaded_frontend(
    engine: IdleEngine, preprocessor: Preprocessor, busy_prefill_tokens: int
) -> FrontendParts:
    """The frontend over `engine` alone, busy past `busy_prefill_tokens` queued prompt
    tokens, its queue waiting 600 s."""
    return compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
        overload=OverloadConfig(busy_prefill_tokens=busy_prefill_tokens, queue_timeout_s=600),
    )


class BusyEngine(IdleEngine):
    """An engine with more prompt tokens queued than any overload threshold lets by."""

    def get_load(self) -> EngineLoad:
        return EngineLoad(
            num_active_blocks=0,
            num_total_blocks=1 << 20,
            num_waiting=1,
            num_running=1,
            num_prefill_tokens_queued=10_000,
        )


async def test_requests_waiting_for_a_busy_fleet_are_answered_when_the_grace_ends(
    preprocessor: Preprocessor,
) -> None:
    """A shutdown's grace ends with requests in the overload queue: they were cut with the
    connection, no answer; now a 503 in OpenAI's format that says to retry."""
    parts = overloaded_frontend(BusyEngine(), preprocessor, busy_prefill_tokens=100)
    app = build_app(parts)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        waiting = [
            asyncio.ensure_future(c.post("/v1/completions", json={**body, "stream": stream}))
            for stream in (False, True)
        ]
        await wait_until(lambda: parts.gate.num_queued == 2, "both requests queued")
        app.state.begin_closing()
        for answer in await asyncio.wait_for(asyncio.gather(*waiting), 10):
            assert answer.status_code == 503
            assert answer.json()["error"]["code"] == "shutting_down"
            assert "shutting down" in answer.json()["error"]["message"]
            assert answer.headers["Retry-After"] == "1"
            assert answer.headers["x-request-id"].startswith("cmpl-")
        assert parts.gate.num_queued == 0
        late = await c.post("/v1/completions", json=body)  # one more: no wait, a 503
        assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"


async def test_an_error_after_the_request_has_its_id_carries_it(
    preprocessor: Preprocessor,
) -> None:
    """A request refused once it has its id (here: the direct router, a worker named that
    does not exist): the 400 carried no x-request-id, though the logs name the request by
    it."""
    parts = compose_frontend(
        engines={"w0": IdleEngine()},  # type: ignore[dict-item]
        router_config=RouterConfig(policy="direct"),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
    )
    transport = httpx.ASGITransport(app=build_app(parts))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        r = await c.post("/v1/completions", json=body, headers={"x-worker-id": "nope"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-worker-id"
        assert r.headers["x-request-id"].startswith("cmpl-")


class HangingEngine(IdleEngine):
    """Takes every request and never answers (its prompt stays routed, not prefilled)."""

    def __init__(self) -> None:
        self.num_requests = 0

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.num_requests += 1
        await asyncio.Event().wait()
        yield  # type: ignore[misc]


async def test_a_burst_is_weighed_one_request_at_a_time(preprocessor: Preprocessor) -> None:
    """Five requests at once to a worker with room for one prompt: one is routed, the others
    wait in the queue (weighed together, all saw the room the first took, and all went
    through to the engine)."""
    engine = HangingEngine()
    parts = overloaded_frontend(engine, preprocessor, busy_prefill_tokens=1)
    app = build_app(parts)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        body = {"model": "m", "prompt": "a prompt of a few tokens", "max_tokens": 2}
        burst = [asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(5)]
        await wait_until(lambda: parts.gate.num_queued == 4, "four requests queued")
        assert engine.num_requests == 1
        for request in burst:
            request.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
