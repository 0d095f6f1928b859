"""Bad requests: each gets a 4xx with OpenAI's error object, and the server keeps serving."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "<served>"  # replaced by the served model name
MAX_MODEL_LEN = 2048  # --max-model-len of the integration server
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]


@dataclass(frozen=True)
class Case:
    id: str
    path: str
    body: Any  # a JSON value, or bytes sent as they are
    param: str | None = None
    code: str | None = None
    status: int = 400


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HI, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hi", **fields}


TOO_LONG = "hello " * (MAX_MODEL_LEN + 10)  # one token per "hello "
CASES = [
    Case("malformed-json", CHAT, b'{"model": "x", "messages": ['),
    Case("body-is-array", CHAT, b'[{"model": "x"}]'),
    Case("body-is-empty", CHAT, b""),
    Case("missing-model", CHAT, {"messages": HI}, param="model"),
    Case("missing-messages", CHAT, {"model": MODEL}, param="messages"),
    Case("missing-prompt", COMPLETIONS, {"model": MODEL}, param="prompt"),
    Case("messages-is-string", CHAT, chat(messages="Hi"), param="messages"),
    Case("max-tokens-is-string", CHAT, chat(max_tokens="ten"), param="max_tokens"),
    Case("empty-messages", CHAT, chat(messages=[]), param="messages"),
    Case(
        "unknown-role",
        CHAT,
        chat(messages=[{"role": "wizard", "content": "Hi"}]),
        param="messages.0.role",
    ),
    Case(
        "best-of-below-n",
        COMPLETIONS,
        completion(n=2, best_of=1),
        param="best_of",
        code="invalid_value",
    ),
    Case(
        "streamed-best-of",
        COMPLETIONS,
        completion(best_of=2, stream=True),
        param="best_of",
        code="invalid_value",
    ),
    Case(
        "logit-bias-past-vocab",
        CHAT,
        chat(logit_bias={"49152": 1}),
        param="logit_bias",
        code="invalid_request",
    ),
    Case(
        "tool-choice-names-no-tool",
        CHAT,
        chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        param="tool_choice",
    ),
    Case(
        "tools-duplicate-names",
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "f"}}] * 2),
        param="tools",
    ),
    Case(
        "chat-prompt-past-context",
        CHAT,
        chat(messages=[{"role": "user", "content": TOO_LONG}]),
        param="messages",
        code="context_length_exceeded",
    ),
    Case(
        "prompt-past-context",
        COMPLETIONS,
        completion(prompt=TOO_LONG),
        param="prompt",
        code="context_length_exceeded",
    ),
    Case(
        "token-prompt-at-context",
        COMPLETIONS,
        completion(prompt=[1] * MAX_MODEL_LEN),
        param="prompt",
        code="context_length_exceeded",
    ),
    Case("max-tokens-0", CHAT, chat(max_tokens=0), param="max_tokens"),
    Case("max-tokens-negative", CHAT, chat(max_tokens=-1), param="max_tokens"),
    Case(
        "max-tokens-past-context",
        CHAT,
        chat(max_tokens=MAX_MODEL_LEN),
        param="max_tokens",
        code="context_length_exceeded",
    ),
    Case(
        "completion-max-tokens-past-context",
        COMPLETIONS,
        completion(max_tokens=MAX_MODEL_LEN),
        param="max_tokens",
        code="context_length_exceeded",
    ),
    Case(
        "max-completion-tokens-0",
        CHAT,
        chat(max_completion_tokens=0),
        param="max_completion_tokens",
    ),
    Case("temperature-negative", CHAT, chat(temperature=-0.5), param="temperature"),
    Case("top-p-0", CHAT, chat(top_p=0), param="top_p"),
    Case("top-p-above-1", CHAT, chat(top_p=1.5), param="top_p"),
    Case(
        "unknown-model",
        CHAT,
        {"model": "gpt-4o", "messages": HI},
        param="model",
        code="model_not_found",
        status=404,
    ),
    Case(
        "image-content",
        CHAT,
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
                    ],
                }
            ]
        ),
        param="messages.0.content",
    ),
    Case("too-many-prompts", COMPLETIONS, completion(prompt=["Hi"] * 129), param="prompt"),
    Case("an-empty-prompt-of-a-batch", COMPLETIONS, completion(prompt=["Hi", ""]), param="prompt"),
    Case("empty-prompt", COMPLETIONS, completion(prompt=""), param="prompt"),
    Case("empty-stop-string", COMPLETIONS, completion(stop=[""]), param="stop"),
    Case(
        "min-tokens-above-max",
        COMPLETIONS,
        completion(max_tokens=2, min_tokens=5),
        param="min_tokens",
    ),
    Case(
        "top-logprobs-without-logprobs",
        CHAT,
        chat(top_logprobs=2),
        param="top_logprobs",
        code="unsupported_parameter",
    ),
    Case(  # max_tokens 0 returns the prompt alone: nothing without echo
        "max-tokens-0-without-echo",
        COMPLETIONS,
        completion(max_tokens=0),
        param="max_tokens",
        code="invalid_value",
    ),
    Case(
        "suffix", COMPLETIONS, completion(suffix="x"), param="suffix", code="unsupported_parameter"
    ),
    # The first two used to kill the engine thread (500, then every request failed):
    Case("seed-past-64-bits", CHAT, chat(seed=2**64, max_tokens=2), param="seed"),
    Case(
        "stop-token-id-outside-vocab",
        COMPLETIONS,
        completion(stop_token_ids=[10**9], min_tokens=1, max_tokens=2),
        param="stop_token_ids",
        code="invalid_request",
    ),
    Case(
        "prompt-token-id-outside-vocab",
        COMPLETIONS,
        completion(prompt=[10**9]),
        code="invalid_request",
    ),
    # limits: what one request may carry
    Case("too-many-stop-strings", COMPLETIONS, completion(stop=["x"] * 17), param="stop"),
    Case("stop-string-too-long", COMPLETIONS, completion(stop=["x" * 513]), param="stop"),
    Case(
        "too-many-stop-token-ids",
        COMPLETIONS,
        completion(stop_token_ids=[1] * 65),
        param="stop_token_ids",
    ),
    Case("n-too-large", CHAT, chat(n=129), param="n"),
    Case(
        "too-many-messages",
        CHAT,
        chat(messages=[{"role": "user", "content": "a"}] * 4097),
        param="messages",
    ),
    Case(
        "logit-bias-too-large",
        CHAT,
        chat(logit_bias={str(i): 1.0 for i in range(301)}),
        param="logit_bias",
    ),
    Case(
        "body-too-large",
        COMPLETIONS,
        completion(prompt="x" * (8 << 20)),
        code="request_too_large",
        status=413,
    ),
]


def substitute_model(body: Any, model_name: str) -> Any:
    if isinstance(body, dict) and body.get("model") == MODEL:
        return {**body, "model": model_name}
    return body


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_request_gets_an_openai_error_and_the_server_keeps_serving(
    http: httpx.Client, model_name: str, case: Case
) -> None:
    body = substitute_model(case.body, model_name)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(case.path, content=content, headers={"content-type": "application/json"})

    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"].strip()
    assert "Traceback" not in error["message"]
    expected_type = "not_found_error" if case.status == 404 else "invalid_request_error"
    assert error["type"] == expected_type
    assert error["param"] == case.param
    assert error["code"] == case.code

    good = http.post(COMPLETIONS, json={"model": model_name, "prompt": "Hi", "max_tokens": 1})
    assert good.status_code == 200
    assert good.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_unknown_fields_are_ignored(http: httpx.Client, model_name: str, path: str) -> None:
    body = chat() if path == CHAT else completion()
    body = substitute_model(
        {**body, "max_tokens": 2, "foo_bar": 1, "nested": {"x": [1]}}, model_name
    )
    response = http.post(path, json=body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 2


def test_unknown_route_and_wrong_method(http: httpx.Client) -> None:
    missing = http.get("/v1/nothing-here")
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    wrong_method = http.get(CHAT)
    assert wrong_method.status_code == 405
    assert set(wrong_method.json()["error"]) == {"message", "type", "param", "code"}


def test_a_chunked_body_over_the_limit_is_refused(http: httpx.Client, model_name: str) -> None:
    """No Content-Length: the server reads at most the limit, then answers 413."""

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"model": "' + model_name.encode() + b'", "prompt": "'
        for _ in range(9):
            yield b"x" * (1 << 20)
        yield b'"}'

    response = http.post(
        COMPLETIONS, content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    body = json.dumps(substitute_model(completion(max_tokens=1), model_name)).encode()
    small = http.post(
        COMPLETIONS, content=iter([body]), headers={"content-type": "application/json"}
    )
    assert small.status_code == 200, small.text
