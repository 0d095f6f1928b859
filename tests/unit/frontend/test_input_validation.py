"""Every input model is strict and bounded: no bool for a number, no string for an integer, no
NaN, every number between documented bounds, no lone surrogate anywhere in a body; each
refusal is a 400 in OpenAI's error format naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from armature.frontend.errors import install_error_handlers
from armature.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OverloadUpdate,
)
from armature.frontend.text_check import find_lone_surrogate

INPUT_MODELS: list[type[BaseModel]] = [ChatCompletionRequest, CompletionRequest, OverloadUpdate]


def numeric_schemas(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) of every integer or number schema in a JSON schema."""
    if isinstance(schema, dict):
        if schema.get("type") in ("integer", "number"):
            yield path, schema
        for key, value in schema.items():
            yield from numeric_schemas(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from numeric_schemas(value, f"{path}/{i}")


@pytest.mark.parametrize("model", INPUT_MODELS, ids=lambda m: m.__name__)
def test_every_number_in_the_schema_has_both_bounds(model: type[BaseModel]) -> None:
    found = list(numeric_schemas(model.model_json_schema()))
    assert found
    for path, schema in found:
        assert {"minimum", "exclusiveMinimum"} & schema.keys(), path
        assert {"maximum", "exclusiveMaximum"} & schema.keys(), path


def app() -> FastAPI:
    """The edge's error handlers over routes that only validate (no engine, no tokenizer)."""
    api = FastAPI()
    install_error_handlers(api)

    @api.post("/completions")
    async def completions(body: CompletionRequest) -> dict[str, str]:
        return {"ok": "yes"}

    @api.post("/chat")
    async def chat(body: ChatCompletionRequest) -> dict[str, str]:
        return {"ok": "yes"}

    @api.post("/overload")
    async def overload(body: OverloadUpdate) -> dict[str, str]:
        return {"ok": "yes"}

    return api


async def post(path: str, content: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        return await c.post(path, content=content, headers={"content-type": "application/json"})


COMPLETION = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def message(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/overload", {"busy_kv_usage": True}, "busy_kv_usage"),
        ("/overload", {"queue_timeout_s": 1.4e307}, "queue_timeout_s"),
        ("/overload", {"queue_timeout_s": 3600.5}, "queue_timeout_s"),
        ("/overload", {"max_queued_requests": 1_000_001}, "max_queued_requests"),
        ("/overload", {"max_queued_requests": 4.0}, "max_queued_requests"),
        ("/overload", {"busy_prefill_tokens": 2**31}, "busy_prefill_tokens"),
        ("/completions", {**COMPLETION, "temperature": True}, "temperature"),
        ("/completions", {**COMPLETION, "temperature": "0.5"}, "temperature"),
        ("/completions", {**COMPLETION, "max_tokens": True}, "max_tokens"),
        ("/completions", {**COMPLETION, "max_tokens": -1}, "max_tokens"),  # 0: echo alone
        ("/completions", {**COMPLETION, "max_tokens": 2**31}, "max_tokens"),
        ("/completions", {**COMPLETION, "n": False}, "n"),
        ("/completions", {**COMPLETION, "logprobs": 21}, "logprobs"),
        ("/completions", {**COMPLETION, "presence_penalty": 2.5}, "presence_penalty"),
        ("/completions", {**COMPLETION, "frequency_penalty": -3}, "frequency_penalty"),
        ("/completions", {**COMPLETION, "logit_bias": {"5": 101}}, "logit_bias.5"),
        ("/completions", {**COMPLETION, "logit_bias": {"5": "1"}}, "logit_bias.5"),
        ("/completions", {**COMPLETION, "logit_bias": {"hello": 1}}, "logit_bias"),
        ("/completions", {**COMPLETION, "logit_bias": {"-5": 1}}, "logit_bias"),
        ("/completions", {**COMPLETION, "logit_bias": {"1.5": 1}}, "logit_bias"),
        ("/completions", {**COMPLETION, "logit_bias": {str(2**31): 1}}, "logit_bias"),
        ("/chat", {**CHAT, "logit_bias": {"٥": 1}}, "logit_bias"),  # an Arabic-Indic 5
        ("/completions", {**COMPLETION, "repetition_penalty": 0}, "repetition_penalty"),
        ("/completions", {**COMPLETION, "min_p": 1.5}, "min_p"),
        ("/chat", {**CHAT, "min_p": -0.1}, "min_p"),
        ("/completions", {**COMPLETION, "repetition_penalty": 10.5}, "repetition_penalty"),
        ("/chat", {**CHAT, "repetition_penalty": True}, "repetition_penalty"),
        ("/completions", {**COMPLETION, "n": 129}, "n"),
        ("/completions", {**COMPLETION, "seed": 2**63}, "seed"),
        ("/completions", {**COMPLETION, "top_k": 2**31}, "top_k"),
        ("/completions", {**COMPLETION, "min_tokens": 2**31}, "min_tokens"),
        ("/completions", {**COMPLETION, "best_of": 0}, "best_of"),
        ("/completions", {**COMPLETION, "stop_token_ids": [-1]}, "stop_token_ids.0"),
        ("/completions", {**COMPLETION, "stream": 1}, "stream"),
        ("/completions", {"model": "m", "prompt": [1, True]}, "prompt"),
        ("/chat", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        ("/chat", {**CHAT, "top_logprobs": 21}, "top_logprobs"),
        ("/chat", {**CHAT, "logprobs": 1}, "logprobs"),
        ("/chat", {**CHAT, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ],
)
async def test_out_of_type_or_range_is_a_400_naming_the_field(
    path: str, body: dict[str, Any], param: str
) -> None:
    response = await post(path, json.dumps(body))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(param)


async def test_nan_is_refused() -> None:
    response = await post("/completions", '{"model": "m", "prompt": "x", "temperature": NaN}')
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "temperature"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/overload", {"busy_kv_usage": 1, "queue_timeout_s": 3600, "max_queued_requests": 0}),
        ("/overload", {"busy_kv_usage": None, "busy_prefill_tokens": 2**31 - 1}),
        ("/completions", {**COMPLETION, "temperature": 2, "top_p": 1, "max_tokens": 2**31 - 1}),
        ("/completions", {**COMPLETION, "seed": -(2**63), "presence_penalty": -2}),
        ("/completions", {"model": "m", "prompt": [[0, 2**31 - 1]], "logit_bias": {"1": -100}}),
        ("/completions", {**COMPLETION, "logit_bias": {"0": 100, str(2**31 - 1): -100.0}}),
        ("/completions", {**COMPLETION, "repetition_penalty": 10, "n": 128, "best_of": 128}),
        ("/chat", {**CHAT, "repetition_penalty": 0.01, "frequency_penalty": 2}),
        ("/chat", {**CHAT, "logprobs": True, "top_logprobs": 20, "max_completion_tokens": 1}),
    ],
)
async def test_values_on_the_bounds_are_accepted(path: str, body: dict[str, Any]) -> None:
    response = await post(path, json.dumps(body))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", {"model": "m", "prompt": "a\ud800b"}, "prompt"),
        ("/completions", {"model": "m", "prompt": ["\udfff"]}, "prompt.0"),
        ("/completions", {**COMPLETION, "stop": ["ok", "\udc00"]}, "stop.1"),
        ("/completions", {**COMPLETION, "model": "\ud800"}, "model"),
        ("/completions", {**COMPLETION, "unknown\ud800": 1}, "body"),
        ("/chat", {**CHAT, "messages": [message("\ud83d")]}, "messages.0.content"),
        (
            "/chat",
            {**CHAT, "messages": [message([{"type": "text", "text": "\ud800"}])]},
            "messages.0.content.0.text",
        ),
    ],
)
async def test_a_lone_surrogate_is_a_400_naming_where(
    path: str, body: dict[str, Any], param: str
) -> None:
    response = await post(path, json.dumps(body))  # ensure_ascii: "\ud800" stays escaped
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert "lone UTF-16 surrogate" in error["message"]


async def test_a_surrogate_pair_is_one_valid_character() -> None:
    response = await post("/completions", json.dumps({"model": "m", "prompt": "\U0001f600"}))
    assert response.status_code == 200


def test_find_lone_surrogate_names_the_path() -> None:
    assert find_lone_surrogate({"a": [1, "ok", {"b": "x\udbff"}]}) == "a.2.b"
    assert find_lone_surrogate({"a": ["ok", "\U0001f600"], "b": None}) is None
    assert find_lone_surrogate("\ud800") == ""
    assert find_lone_surrogate({"a": {"k\ud800": 1}}) == "a"
    deep: Any = "\ud800"
    for _ in range(10_000):  # deeper than the recursion limit
        deep = [deep]
    assert find_lone_surrogate(deep) == ".".join(["0"] * 10_000)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat", {**CHAT, "messages": [message(5)]}, "messages.0.content"),
        ("/chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ("/chat", {**CHAT, "messages": [{"role": "user"}]}, "messages.0.content"),
        (  # only an assistant's content may be null (its tool calls say what it did)
            "/chat",
            {**CHAT, "messages": [{"role": "assistant"}, {"role": "tool", "content": None}]},
            "messages.1.content",
        ),
        ("/chat", {**CHAT, "stop": 5}, "stop"),
        ("/completions", {"model": "m", "prompt": 5}, "prompt"),
        ("/chat", {**CHAT, "guided_json": 5}, "guided_json"),
        (
            "/chat",
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            "/chat",
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ("/chat", {**CHAT, "logit_bias": {"5": "1"}}, "logit_bias.5"),
    ],
)
async def test_the_param_is_the_field_as_the_client_wrote_it(
    path: str, body: dict[str, Any], param: str
) -> None:
    """Without what pydantic adds inside a union: a member's type (`content.str`), a tagged
    member's tag before its field of the same name (`json_schema.json_schema`)."""
    response = await post(path, json.dumps(body))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("content_type", ["text/plain", None])
async def test_a_body_not_sent_as_json_says_so(content_type: str | None) -> None:
    """The body's bytes were echoed as Python's b'...' repr."""
    headers = {} if content_type is None else {"content-type": content_type}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app()), base_url="http://t"
    ) as c:
        response = await c.post("/completions", content=json.dumps(COMPLETION), headers=headers)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "the request body must be a JSON object sent as content-type application/json",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (
            b'{"model": "m", "prompt": "\xff"}',
            "the request body is not UTF-8 text (invalid byte at offset 26)",
        ),
        (b"[" * 5000 + b"]" * 5000, "malformed JSON body: nested too deeply"),
        (
            b'{"model": "m", "n": ' + b"9" * 5000 + b"}",
            "malformed JSON body: a number with more than 4300 digits",
        ),
    ],
    ids=["not-utf8", "deep", "long-number"],
)
async def test_a_body_the_decoder_gives_up_on_is_named(content: bytes, text: str) -> None:
    """JSON the decoder raised on without a decode error was "There was an error parsing the
    body", whatever was wrong."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app()), base_url="http://t"
    ) as c:
        headers = {"content-type": "application/json"}
        response = await c.post("/completions", content=content, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": text,
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
