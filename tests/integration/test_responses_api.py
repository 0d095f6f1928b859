"""/v1/responses on the real default model, with the official openai client: greedy plain
text equals chat's for the same conversation, whole and streamed, with chat's token counts;
a response hitting max_output_tokens is incomplete; a stored one is continued; text.format
(json_schema, json_object) and forced tool calls (required, named) hold, whole and
streamed."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INSTRUCTIONS = "You are a terse assistant."
QUESTION = "Name three colors of the rainbow."
MAX_TOKENS = 10


def test_text_equals_chat_whole_and_streamed(openai_client: openai.OpenAI, model_name: str) -> None:
    chat = openai_client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    request: Any = {
        "model": model_name,
        "instructions": INSTRUCTIONS,
        "input": QUESTION,
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    whole = openai_client.responses.create(**request)
    text = chat.choices[0].message.content
    assert text and whole.output_text == text
    assert (whole.status, whole.incomplete_details and whole.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert [(item.type, item.status) for item in whole.output] == [("message", "incomplete")]
    assert whole.usage is not None and chat.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (
        chat.usage.prompt_tokens,
        MAX_TOKENS,
    )

    events = list(openai_client.responses.create(**request, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text  # type: ignore[union-attr]
    assert events[-1].type == "response.incomplete"
    assert openai_client.responses.retrieve(whole.id).output_text == text

    follow = openai_client.responses.create(
        model=model_name,
        previous_response_id=whole.id,
        input="And two more?",
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.usage is not None
    # the prompt holds the first turn and its answer, so it is longer than that turn's prompt
    assert follow.usage.input_tokens > whole.usage.input_tokens + MAX_TOKENS


POINT: Any = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": -100, "maximum": 100},
        "label": {"enum": ["origin", "other"]},
    },
    "required": ["x", "label"],
    "additionalProperties": False,
}
TIME_TOOL: Any = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string", "maxLength": 20}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def respond(client: openai.OpenAI, stream: bool, **fields: Any) -> Any:
    """The finished response object, whole or from the stream's last event."""
    request: Any = {"temperature": 0, "max_output_tokens": 120, **fields}
    if not stream:
        return client.responses.create(**request)
    events = list(client.responses.create(**request, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == final.output_text
    return final


@pytest.mark.parametrize("stream", [False, True])
def test_text_format_is_enforced(
    openai_client: openai.OpenAI, model_name: str, stream: bool
) -> None:
    fmt: Any = {"type": "json_schema", "name": "point", "schema": POINT, "strict": True}
    reply = respond(
        openai_client,
        stream,
        model=model_name,
        input="Give a point as JSON.",
        text={"format": fmt},
    )
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), POINT)
    reply = respond(
        openai_client,
        stream,
        model=model_name,
        input="Describe a cat as JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=200,
    )
    if reply.status == "completed":
        assert isinstance(json.loads(reply.output_text), dict)
    else:  # the object can outgrow max_output_tokens; what was written is still its start
        assert reply.output_text.startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_are_valid_calls(
    openai_client: openai.OpenAI, model_name: str, stream: bool
) -> None:
    named: Any = {"type": "function", "name": "get_time"}
    for choice, names in (("required", {"get_weather", "get_time"}), (named, {"get_time"})):
        reply = respond(
            openai_client,
            stream,
            model=model_name,
            input="What is the weather in Paris?",
            tools=[WEATHER_TOOL, TIME_TOOL],
            tool_choice=choice,
            max_output_tokens=150,
        )
        calls = [item for item in reply.output if item.type == "function_call"]
        assert calls and reply.status == "completed", reply.output
        for call in calls:
            assert call.name in names
            tool = WEATHER_TOOL if call.name == "get_weather" else TIME_TOOL
            jsonschema.validate(json.loads(call.arguments), tool["parameters"])
        if choice is named:
            assert len(calls) == 1
