"""Streamed completions through the whole frontend: an engine output that carries several tokens
(steps merged on the way) still gives one SSE event per token, and the events of one output
reach the client in one body chunk (the last output's with [DONE]); `stream_options.per_step`
gives one event per output."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from frontend_fakes import ScriptedEngine

from armature.config import RouterConfig
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import compose_frontend
from armature.frontend.preprocess import Preprocessor

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

MODEL = "m"
OUTPUT = "Hello world! How are you today, my friend?"


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


async def _stream(preprocessor: Preprocessor, options: dict[str, Any]) -> list[bytes]:
    """The body messages (one per socket write) of one streamed completion of OUTPUT, the
    app called as a server calls it (ScriptedEngine: 1, 2, 3, 1... tokens per output)."""
    engine = ScriptedEngine(preprocessor)
    engine.outputs = [OUTPUT]
    parts = compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel(MODEL, 2048, 0),
    )
    app = build_app(parts)
    body = {"model": MODEL, "prompt": "Say hi", "max_tokens": 64, "stream": True}
    request = json.dumps({**body, "stream_options": options}).encode()
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": request, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        await app(scope, receive, send)
    assert sent[0]["status"] == 200
    return [m["body"] for m in sent if m["type"] == "http.response.body" and m.get("body")]


def _step_sizes(num_tokens: int) -> list[int]:
    """Tokens per engine output as ScriptedEngine sends them: 1, 2, 3, 1, ... (the last one
    what is left)."""
    sizes: list[int] = []
    while sum(sizes) < num_tokens:
        sizes.append(min(1 + len(sizes) % 3, num_tokens - sum(sizes)))
    return sizes


def _texts(chunk: bytes) -> list[str]:
    events = [e for e in chunk.decode().split("\n\n") if e and e != "data: [DONE]"]
    return [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events]


async def test_one_event_per_token_one_write_per_output(preprocessor: Preprocessor) -> None:
    ids = preprocessor.encode(OUTPUT, add_special_tokens=False)
    token_texts = [preprocessor.decode([i]) for i in ids]
    chunks = await _stream(preprocessor, {})
    per_chunk = [texts for texts in map(_texts, chunks) if texts]
    assert [t for texts in per_chunk for t in texts] == token_texts
    # the engine's outputs carry 1, 2, 3, 1, 2, ... tokens: so many events per body chunk,
    # and the last output's events end with [DONE], in the same chunk
    assert [len(texts) for texts in per_chunk] == _step_sizes(len(ids))
    assert len(chunks) == len(per_chunk)
    assert chunks[-1].endswith(b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


async def test_per_step_gives_one_event_per_output(preprocessor: Preprocessor) -> None:
    ids = preprocessor.encode(OUTPUT, add_special_tokens=False)
    chunks = await _stream(preprocessor, {"per_step": True})
    texts = [t for c in chunks for t in _texts(c)]
    assert "".join(texts) == OUTPUT
    assert len(texts) == len(_step_sizes(len(ids)))
    assert texts[0] == preprocessor.decode(ids[:1])
    assert texts[1] == preprocessor.decode(ids[1:3])
