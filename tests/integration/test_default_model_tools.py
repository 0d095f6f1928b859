"""Tools out of the box: `armature serve` on the default model (SmolLM2, whose own ChatML
template renders no tools) with no chat flags renders tool chats with the bundled ChatML tools
template and reads calls with the hermes parser. Through the official openai client, whole
and streamed: tool_choice auto (the model's own call), required and named (enforced by the
calls' grammar), none, and a tool-role round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from armature.config.chat import ChatConfig
from armature.frontend.chat_request import template_messages
from armature.frontend.chat_setup import ChatSetup, load_chat_setup
from armature.frontend.protocol import ChatMessage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
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
        "description": "The time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
PARIS_CALL: Any = {
    "id": "call_paris",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
}
# an earlier turn in which the assistant called a tool: the model follows it
FOLLOW_UP: Any = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [PARIS_CALL]},
    {"role": "user", "content": "And in Rome?"},
]


@pytest.fixture(scope="module")
def chat_setup(default_model_dir: Path) -> ChatSetup:
    """What the server chose, computed here to count prompt tokens."""
    return load_chat_setup(default_model_dir, ChatConfig())


def rendered(setup: ChatSetup, messages: Any, tools: Any) -> tuple[str, int]:
    """The prompt the server renders for this chat, and its number of tokens."""
    preprocessor = setup.preprocessor
    chat = [ChatMessage.model_validate(m) for m in messages]
    prompt = preprocessor.render_chat(
        template_messages(chat, preprocessor.template_features), tools
    )
    return prompt, len(preprocessor.encode(prompt, add_special_tokens=False))


def ask(
    client: openai.OpenAI, model: str, stream: bool, **fields: Any
) -> tuple[str | None, list[tuple[str, str]], str | None, Any]:
    """(content, [(name, arguments)], finish_reason, usage) of one greedy chat request."""
    request: dict[str, Any] = {"model": model, "temperature": 0, "max_tokens": 80, **fields}
    if not stream:
        reply = client.chat.completions.create(**request)
        message = reply.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]  # type: ignore[union-attr]
        return message.content, calls, reply.choices[0].finish_reason, reply.usage
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    by_index: dict[int, list[str]] = {}
    content = ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        content += chunk.choices[0].delta.content or ""
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.function is not None
            if delta.id is not None:  # a call's first delta names it; the rest add arguments
                assert delta.function.name and delta.index not in by_index
                by_index[delta.index] = [delta.function.name, ""]
            else:
                assert delta.function.name is None
            by_index[delta.index][1] += delta.function.arguments or ""
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    calls = [(name, arguments) for name, arguments in by_index.values()]
    return content or None, calls, finish, chunks[-1].usage


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_the_models_own_call(
    openai_client: openai.OpenAI, model_name: str, stream: bool
) -> None:
    content, calls, finish, _ = ask(
        openai_client, model_name, stream, messages=FOLLOW_UP, tools=[WEATHER, TIME]
    )
    assert finish == "tool_calls"
    assert content is None
    assert [(name, json.loads(arguments)["city"]) for name, arguments in calls] == [
        ("get_weather", "Rome")
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_are_valid_calls(
    openai_client: openai.OpenAI, model_name: str, stream: bool
) -> None:
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice, names in (("required", {"get_weather", "get_time"}), (named, {"get_time"})):
        _, calls, finish, _ = ask(
            openai_client,
            model_name,
            stream,
            messages=messages,
            tools=[WEATHER, TIME],
            tool_choice=choice,
            max_tokens=150,
        )
        assert finish == "tool_calls", (choice, calls)
        assert calls
        for name, arguments in calls:
            assert name in names
            tool = WEATHER if name == "get_weather" else TIME
            jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])
        if choice is named:
            assert len(calls) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_none_renders_the_tools_and_reads_no_calls(
    openai_client: openai.OpenAI, model_name: str, chat_setup: ChatSetup, stream: bool
) -> None:
    """The same chat in which `auto` calls get_weather: with `none` the output stays
    content, and the prompt still holds the tools (its tokens are the tools template's)."""
    content, calls, finish, usage = ask(
        openai_client,
        model_name,
        stream,
        messages=FOLLOW_UP,
        tools=[WEATHER, TIME],
        tool_choice="none",
    )
    assert calls == []
    assert finish in ("stop", "length")
    assert content and "<tool_call>" in content  # what auto would have read as a call
    prompt, num_tokens = rendered(chat_setup, FOLLOW_UP, [WEATHER, TIME])
    assert "<tools>" in prompt and '"name": "get_time"' in prompt
    assert usage.prompt_tokens == num_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_result_round_trips(
    openai_client: openai.OpenAI, model_name: str, chat_setup: ChatSetup, stream: bool
) -> None:
    """Turn 1: the model calls get_weather (named). Turn 2: its call and the tool's result
    go back; the model answers, and the prompt is the template's rendering of both."""
    asked: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    _, calls, finish, _ = ask(
        openai_client, model_name, stream, messages=asked, tools=[WEATHER], tool_choice=named
    )
    assert finish == "tool_calls" and len(calls) == 1
    name, arguments = calls[0]
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
    history: Any = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
    ]
    content, calls, finish, usage = ask(
        openai_client, model_name, stream, messages=history, tools=[WEATHER], tool_choice="none"
    )
    assert content and calls == [] and finish in ("stop", "length")
    prompt, num_tokens = rendered(chat_setup, history, [WEATHER])
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>' in (
        prompt
    )
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 degrees\n</tool_response>" in prompt
    assert usage.prompt_tokens == num_tokens


def test_chats_without_tools_keep_the_models_own_template(
    openai_client: openai.OpenAI, model_name: str, tokenizer: Any
) -> None:
    messages: Any = [{"role": "user", "content": "Hi."}]
    reply = openai_client.chat.completions.create(model=model_name, messages=messages, max_tokens=1)
    own = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "You are a helpful AI assistant named SmolLM" in own  # SmolLM2's default system
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tokenizer.encode(own, add_special_tokens=False))
