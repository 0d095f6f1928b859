"""Forced tool calls in the formats whose grammars the default model was not trained on:
`armature serve` on the default model with `--tool-call-parser mistral` or `pythonic` (and
the bundled ChatML tools template, which renders the tools). tool_choice required and a
named function make the model write calls in that parser's format, which the server reads
back: finish_reason tool_calls and arguments valid against the tool's parameters, whole and
streamed, through the official openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from serve_process import SERVED_MODEL_NAME, running_server

import armature.frontend

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEMPLATE = Path(armature.frontend.__file__).parent / "templates" / "chatml_tools.jinja"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=["mistral", "pythonic"])
def client(
    request: pytest.FixtureRequest,
    default_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[openai.OpenAI]:
    args = ["--served-model-name", SERVED_MODEL_NAME, "--device", "cpu", "--dtype", "float32"]
    args += ["--tool-call-parser", request.param, "--chat-template", str(TEMPLATE)]
    log_dir = tmp_path_factory.mktemp(f"forced-{request.param}")
    with (
        running_server(default_model_dir, log_dir, args) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c,
    ):
        yield c


def calls_of(client: openai.OpenAI, stream: bool, choice: Any) -> tuple[list[Any], str | None]:
    """([(name, arguments)], finish_reason) of one greedy forced-call request."""
    request: Any = {
        "model": SERVED_MODEL_NAME,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": 120,
    }
    if not stream:
        reply = client.chat.completions.create(**request)
        calls = reply.choices[0].message.tool_calls or []
        named = [(c.function.name, c.function.arguments) for c in calls]  # type: ignore[union-attr]
        return named, reply.choices[0].finish_reason
    found: dict[int, tuple[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            assert delta.function is not None
            if delta.id is not None:  # a call's first delta names it; the rest add arguments
                assert delta.function.name
                found[delta.index] = (delta.function.name, "")
            name, arguments = found[delta.index]
            found[delta.index] = (name, arguments + (delta.function.arguments or ""))
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    return list(found.values()), finish


@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_in_the_parsers_format_are_valid_calls(
    client: openai.OpenAI, stream: bool
) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice, names in (("required", set(SCHEMAS)), (named, {"get_time"})):
        calls, finish = calls_of(client, stream, choice)
        assert finish == "tool_calls", (choice, calls)
        assert calls, choice
        for name, arguments in calls:
            assert name in names
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        if choice is named:
            assert len(calls) == 1
