"""Every route of a real server over raw HTTP: exact response shapes, SSE framing, metrics."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Metrics = dict[str, float]

USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
STORY = [{"role": "user", "content": "Tell me a story about a cat."}]


def sse_payloads(response: httpx.Response) -> list[str]:
    """The `data:` payloads of a complete SSE body; asserts the framing is exact."""
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.text
    assert body.endswith("\n\n")
    events = body[: -len("\n\n")].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e.removeprefix("data: ") for e in events]


def check_usage(usage: dict[str, Any]) -> None:
    assert set(usage) == USAGE_KEYS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"].keys() == {"cached_tokens"}
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]


def test_health_and_live(http: httpx.Client, model_name: str) -> None:
    health = http.get("/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "model": model_name}
    live = http.get("/live")
    assert live.status_code == 200
    assert live.json() == {"status": "alive"}


def test_models_lists_the_served_model(
    http: httpx.Client, model_name: str, max_model_len: int
) -> None:
    response = http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    created = body["data"][0]["created"]
    assert body == {
        "object": "list",
        "data": [
            {
                "id": model_name,
                "object": "model",
                "created": created,
                "owned_by": "armature",
                "root": model_name,
                "parent": None,
                "max_model_len": max_model_len,
            }
        ],
    }
    assert isinstance(created, int)
    assert time.time() - 3600 < created <= time.time()


def test_openapi_documents_both_generation_routes(http: httpx.Client) -> None:
    response = http.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "post" in paths["/v1/chat/completions"]
    assert "post" in paths["/v1/completions"]
    assert "get" in paths["/v1/models"]


def test_chat_completion_body(http: httpx.Client, model_name: str) -> None:
    request = {"model": model_name, "messages": STORY, "max_tokens": 8, "temperature": 0}
    response = http.post("/v1/chat/completions", json=request)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert abs(body["created"] - time.time()) < 60
    assert body["model"] == model_name
    [choice] = body["choices"]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": choice["message"]["content"]},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert choice["message"]["content"].strip()
    check_usage(body["usage"])
    assert body["usage"]["completion_tokens"] == 8


def test_completion_body(http: httpx.Client, model_name: str) -> None:
    request = {"model": model_name, "prompt": "The capital of France is", "max_tokens": 6}
    response = http.post("/v1/completions", json={**request, "temperature": 0})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert body["model"] == model_name
    [choice] = body["choices"]
    assert choice == {
        "index": 0,
        "text": choice["text"],
        "logprobs": None,
        "finish_reason": "length",
    }
    assert choice["text"].startswith(" Paris")
    check_usage(body["usage"])
    assert body["usage"]["completion_tokens"] == 6


def test_chat_stream_sse_framing(http: httpx.Client, model_name: str) -> None:
    request = {"model": model_name, "messages": STORY, "max_tokens": 8, "temperature": 0}
    whole = http.post("/v1/chat/completions", json=request).json()
    response = http.post("/v1/chat/completions", json={**request, "stream": True})
    assert response.status_code == 200
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    for chunk in chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["model"] == model_name
        assert len(chunk["choices"]) == 1
        assert chunk["choices"][0]["index"] == 0
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finish = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finish == [None] * (len(chunks) - 1) + ["length"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]


def test_completion_stream_with_usage(http: httpx.Client, model_name: str) -> None:
    request = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 7}
    request["temperature"] = 0
    whole = http.post("/v1/completions", json=request).json()
    stream_options = {"include_usage": True}
    response = http.post(
        "/v1/completions", json={**request, "stream": True, "stream_options": stream_options}
    )
    assert response.status_code == 200
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    *chunks, usage_chunk = (json.loads(p) for p in payloads[:-1])
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert chunk["usage"] is None
        assert len(chunk["choices"]) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert usage_chunk == {
        "id": chunks[0]["id"],
        "object": "text_completion",
        "created": usage_chunk["created"],
        "model": model_name,
        "choices": [],
        "usage": whole["usage"],  # the prompt is under one block: nothing cached either time
    }
    assert usage_chunk["usage"]["completion_tokens"] == 7


METRIC_NAMES = [
    "armature_requests_total",
    "armature_requests_in_flight",
    "armature_time_to_first_token_seconds_count",
    "armature_inter_token_latency_seconds_count",
    "armature_e2e_request_latency_seconds_count",
    "armature_prompt_tokens_total",
    "armature_generation_tokens_total",
    "armature_request_generation_tokens_count",
    "armature_request_generation_tokens_sum",
    "armature_kv_cache_usage_ratio",
    "armature_prefix_cache_hit_ratio",
]


def test_metrics_count_each_request(
    http: httpx.Client, model_name: str, read_metrics: Callable[[], Metrics]
) -> None:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    for name in METRIC_NAMES:
        assert any(line.startswith(name) for line in response.text.splitlines()), name

    ok = 'armature_requests_total{endpoint="completions",status="200"}'
    bad = 'armature_requests_total{endpoint="completions",status="400"}'
    before = read_metrics()
    # A prompt no earlier request shares, sent twice: the second reuses its cached blocks.
    prompt = f"[{uuid.uuid4().hex}] " + "Count the sheep jumping over the fence. " * 10
    request = {"model": model_name, "prompt": prompt, "max_tokens": 5, "temperature": 0}
    first = http.post("/v1/completions", json=request).json()["usage"]
    second = http.post("/v1/completions", json=request).json()["usage"]
    # Refused by the app (best_of < n); bodies that fail schema validation never reach the
    # counter.
    assert http.post("/v1/completions", json={**request, "n": 2, "best_of": 1}).status_code == 400
    after = read_metrics()

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta(ok) == 2
    assert delta(bad) == 1
    assert after["armature_requests_in_flight"] == 0
    assert delta("armature_time_to_first_token_seconds_count") == 2
    assert delta("armature_e2e_request_latency_seconds_count") == 2
    # every token after the first of each request is one inter-token gap
    assert delta("armature_inter_token_latency_seconds_count") == 2 * (5 - 1)
    assert delta("armature_prompt_tokens_total") == first["prompt_tokens"] * 2
    assert delta("armature_generation_tokens_total") == 10
    # each finished request's own output tokens: 2 requests of 5
    assert delta("armature_request_generation_tokens_count") == 2
    assert delta("armature_request_generation_tokens_sum") == 10
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    num_cached = second["prompt_tokens_details"]["cached_tokens"]
    assert num_cached > 0
    assert delta("armature_prefix_cache_hit_tokens_total") == num_cached
    hit_ratio = after["armature_prefix_cache_hit_ratio"]
    assert hit_ratio != before["armature_prefix_cache_hit_ratio"]
    assert hit_ratio == pytest.approx(
        after["armature_prefix_cache_hit_tokens_total"] / after["armature_prompt_tokens_total"]
    )
    assert after["armature_kv_cache_usage_ratio"] == 0  # idle: no request holds blocks
