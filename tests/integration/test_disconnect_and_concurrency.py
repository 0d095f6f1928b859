"""A client that leaves cancels its request (KV blocks freed, nothing left in flight), and
concurrent streams give the same greedy text as each request alone. The client leaves once
the server's metrics show its request running, not after a fixed time."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Metrics = dict[str, float]
KV_USAGE = "armature_kv_cache_usage_ratio"
IN_FLIGHT = "armature_requests_in_flight"
DRAIN_TIMEOUT_S = 20.0


def wait_for(
    read_metrics: Callable[[], Metrics], done: Callable[[Metrics], bool], what: str
) -> Metrics:
    deadline_s = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        metrics = read_metrics()
        if done(metrics):
            return metrics
        assert time.monotonic() < deadline_s, f"not {what} after {DRAIN_TIMEOUT_S} s: {metrics}"
        time.sleep(0.1)


def idle(metrics: Metrics) -> bool:
    return metrics[KV_USAGE] == 0 and metrics[IN_FLIGHT] == 0


def long_request(model_name: str, kind: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": model_name,
        "max_tokens": 1500,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }
    if kind == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "Go"}]}
    return "/v1/completions", {**body, "prompt": "Count from one to a thousand: one, two,"}


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_closing_a_stream_cancels_the_request(
    base_url: str, model_name: str, kind: str, read_metrics: Callable[[], Metrics]
) -> None:
    endpoint = "chat" if kind == "chat" else "completions"
    cancelled = f'armature_requests_total{{endpoint="{endpoint}",status="499"}}'
    before = wait_for(read_metrics, idle, "idle")
    path, body = long_request(model_name, kind, stream=True)
    with (
        httpx.Client(base_url=base_url, timeout=30.0) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        for _ in range(2):
            json.loads(next(lines).removeprefix("data: "))
        during = read_metrics()
        assert during[IN_FLIGHT] == 1
        assert during[KV_USAGE] > 0
    after = wait_for(read_metrics, idle, "drained after the client left")
    assert after.get(cancelled, 0) == before.get(cancelled, 0) + 1
    assert_nothing_runs(base_url, model_name, read_metrics, after)


def assert_nothing_runs(
    base_url: str, model_name: str, read_metrics: Callable[[], Metrics], idle_metrics: Metrics
) -> None:
    """A short request run after the cancellation adds exactly its own tokens: the cancelled
    request would add its tokens too if it still ran (it shares the engine's steps)."""
    generated = idle_metrics["armature_generation_tokens_total"]
    body = {"model": model_name, "prompt": "Hi", "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    assert read_metrics()["armature_generation_tokens_total"] == generated + 4


def test_a_client_leaving_cancels_a_non_streaming_request(
    base_url: str, model_name: str, read_metrics: Callable[[], Metrics]
) -> None:
    """The client sends the request, waits until the server runs it, and closes the
    connection without reading the answer (as a client that timed out does)."""
    cancelled = 'armature_requests_total{endpoint="completions",status="499"}'
    before = wait_for(read_metrics, idle, "idle")
    path, body = long_request(model_name, "completions")
    host_port = base_url.removeprefix("http://")
    connection = http.client.HTTPConnection(host_port, timeout=30.0)
    try:
        payload = json.dumps(body).encode()
        connection.request("POST", path, payload, {"Content-Type": "application/json"})
        during = wait_for(read_metrics, lambda m: m[KV_USAGE] > 0, "running")
        assert during[IN_FLIGHT] == 1
    finally:
        connection.close()  # gone before the answer: 1500 tokens take far longer
    after = wait_for(read_metrics, idle, "drained after the client left")
    assert after.get(cancelled, 0) == before.get(cancelled, 0) + 1
    assert_nothing_runs(base_url, model_name, read_metrics, after)


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "My favorite animal is the",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "In the beginning,",
    "Water boils at",
    "Roses are red, violets are",
]


async def stream_text(client: httpx.AsyncClient, model_name: str, prompt: str) -> str:
    body = {
        "model": model_name,
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }
    pieces: list[str] = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                return "".join(pieces)
            pieces.append(json.loads(payload)["choices"][0]["text"])
    raise AssertionError(f"stream for {prompt!r} ended without [DONE]")


async def test_concurrent_streams_match_each_request_alone(base_url: str, model_name: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0) as client:
        together = await asyncio.gather(*(stream_text(client, model_name, p) for p in PROMPTS))
        alone = [await stream_text(client, model_name, p) for p in PROMPTS]
    assert together == alone
    assert all(together)
    assert len(set(together)) == len(PROMPTS)
