"""Tool calls and reasoning through the whole frontend, with the official openai client:
a scripted engine (the Engine seam) emits the token ids of a chosen model output, so the
bytes go through the real router, detokenizer, parsers and SSE encoding, whole and
streamed. Also the 400s of tool requests the server cannot honour."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from frontend_fakes import ScriptedEngine

from armature.config import RouterConfig
from armature.frontend.app import ServedModel, build_app
from armature.frontend.chat_setup import chatml_tools_template
from armature.frontend.compose import compose_frontend
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import Preprocessor

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

TEMPLATE = chatml_tools_template()
MODEL = "m"
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: Any = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
ASK: Any = [{"role": "user", "content": "Weather in Paris and the time?"}]

CALLS_OUTPUT = (
    "<think>\nThe user wants two things.\n</think>\n\nLet me look.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def tool_preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir, TEMPLATE)


@pytest.fixture(scope="module")
def plain_preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def asgi(engine: ScriptedEngine, parsers: OutputParsers) -> httpx.ASGITransport:
    """The whole frontend over `engine` (serving `engine.preprocessor`'s model)."""
    parts = compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=engine.preprocessor,
        model=ServedModel(MODEL, 2048, 0),
        parsers=parsers,
    )
    return httpx.ASGITransport(app=build_app(parts))


def serve(preprocessor: Preprocessor, parsers: OutputParsers) -> tuple[ScriptedEngine, Any]:
    engine = ScriptedEngine(preprocessor)
    http = httpx.AsyncClient(transport=asgi(engine, parsers))
    client = openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0
    )
    return engine, client


HERMES_QWEN3 = OutputParsers.named("hermes", "qwen3")
# what the template's <think>...</think> costs: 1 + the reasoning + the closing delta


async def test_tool_calls_and_reasoning_whole_and_streamed(tool_preprocessor: Preprocessor) -> None:
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    engine.outputs = [CALLS_OUTPUT, CALLS_OUTPUT]
    request: Any = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL, TIME_TOOL]}

    whole = await client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look.\n"
    assert choice.message.reasoning_content == "\nThe user wants two things.\n"  # type: ignore[attr-defined]
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("function", "get_weather", '{"city": "Paris"}'),
        ("function", "get_time", "{}"),
    ]
    assert all(c.id.startswith("call_") for c in calls)
    assert len({c.id for c in calls}) == 2
    assert whole.usage is not None
    num_reasoning = whole.usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
    assert 0 < num_reasoning < whole.usage.completion_tokens

    stream = await client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me look.\n"
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (
        "\nThe user wants two things.\n"
    )
    streamed = [t for d in deltas for t in d.tool_calls or []]
    # each call whole in one delta, once its block closed (the engine sends 1-3 tokens a
    # step): its id, type, name and arguments, as the whole response has them
    assert [(t.index, t.type, t.function.name, t.function.arguments) for t in streamed] == [  # type: ignore[union-attr]
        (i, "function", c.function.name, c.function.arguments)  # type: ignore[union-attr]
        for i, c in enumerate(calls)
    ]
    assert all((t.id or "").startswith("call_") for t in streamed)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == num_reasoning  # type: ignore[union-attr]

    # the prompt rendered the tools through the template
    prompt = tool_preprocessor.decode(engine.prompts[0], skip_special_tokens=False)
    assert json.dumps(WEATHER_TOOL) in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


async def test_each_of_n_choices_reads_its_own_calls_and_reasoning(
    tool_preprocessor: Preprocessor,
) -> None:
    """n = 2: choice 0 answers with reasoning and two calls, choice 1 with reasoning and
    plain text. Each choice has its own parsers (no state crosses between them), whole and
    streamed (the chunks interleave by index); usage sums both choices' reasoning tokens."""
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    plain = "<think>\nNo tools needed.\n</think>\n\nIt is sunny."
    request: Any = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL, TIME_TOOL], "n": 2}

    engine.outputs = [CALLS_OUTPUT, plain]
    whole = await client.chat.completions.create(**request)
    first, second = whole.choices
    assert (first.index, first.finish_reason, second.index, second.finish_reason) == (
        0,
        "tool_calls",
        1,
        "stop",
    )
    assert [c.function.name for c in first.message.tool_calls or []] == [  # type: ignore[union-attr]
        "get_weather",
        "get_time",
    ]
    assert (second.message.content, second.message.tool_calls) == ("It is sunny.", None)
    assert second.message.reasoning_content == "\nNo tools needed.\n"  # type: ignore[attr-defined]
    assert whole.usage is not None
    whole_reasoning = whole.usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]

    engine.outputs = [CALLS_OUTPUT, plain]
    stream = await client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    by_index: dict[int, list[Any]] = {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk.choices:
            by_index[choice.index].append(choice)
    calls = [t.function.name for c in by_index[0] for t in c.delta.tool_calls or [] if t.id]  # type: ignore[union-attr]
    assert calls == ["get_weather", "get_time"]
    assert "".join(c.delta.content or "" for c in by_index[1]) == "It is sunny."
    assert not any(c.delta.tool_calls for c in by_index[1])
    assert [c.finish_reason for c in by_index[0] if c.finish_reason] == ["tool_calls"]
    assert [c.finish_reason for c in by_index[1] if c.finish_reason] == ["stop"]
    assert chunks[-1].usage is not None
    streamed_reasoning = chunks[-1].usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
    assert streamed_reasoning == whole_reasoning
    one = tool_preprocessor.encode("\nThe user wants two things.\n", add_special_tokens=False)
    assert whole_reasoning > len(one)  # both choices' reasoning, not the first one's alone


async def test_malformed_calls_fall_back_to_content(tool_preprocessor: Preprocessor) -> None:
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    broken = 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    engine.outputs = [broken, broken]
    request: Any = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL]}
    whole = await client.chat.completions.create(**request)
    assert whole.choices[0].message.content == broken
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"
    chunks = [c async for c in await client.chat.completions.create(**request, stream=True)]
    # the call had begun when its text broke: a call goes out only once whole, so the
    # streamed client gets its text as content alone, as the whole response
    assert joined_message(chunks) == {"content": broken, "tool_calls": None}
    assert chunks[-1].choices[0].finish_reason == "stop"


def joined_message(chunks: list[Any]) -> dict[str, Any]:
    """The message a streamed client joins from the chunks of choice 0, as the openai
    client's stream accumulation does: content concatenated, each call by its index (id,
    type and name from its deltas, argument pieces concatenated)."""
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls: dict[int, dict[str, Any]] = {}
    for t in (t for d in deltas for t in d.tool_calls or []):
        call = calls.setdefault(t.index, {"function": {"arguments": ""}})
        call.update({k: v for k, v in (("id", t.id), ("type", t.type)) if v is not None})
        if t.function is not None and t.function.name is not None:
            call["function"]["name"] = t.function.name
        if t.function is not None:
            call["function"]["arguments"] += t.function.arguments or ""
    content = "".join(d.content or "" for d in deltas)
    return {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)] or None}


async def test_a_call_cut_by_max_tokens_streams_as_the_whole_response(
    tool_preprocessor: Preprocessor,
) -> None:
    """max_tokens ends the output inside a call's text: the whole response has that text as
    content and no such call (as for any malformed call); the streamed deltas join to
    exactly that message (it held the cut call's name and argument pieces too, sent as
    tool_calls before its text came as content)."""
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    output = (
        'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n'
        "</tool_call>"
    )
    request: Any = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL, TIME_TOOL]}
    weather = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    cases = {  # max_tokens: (content, the calls' functions), the whole response's
        25: ('Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris', []),
        56: (
            'Let me look.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "C',
            [weather],
        ),
    }
    for max_tokens, (content, functions) in cases.items():
        engine.outputs = [output, output]
        whole = await client.chat.completions.create(**request, max_tokens=max_tokens)
        message = whole.choices[0].message
        calls = [c.model_dump() for c in message.tool_calls or []]
        assert (message.content, [c["function"] for c in calls]) == (content, functions)
        assert whole.choices[0].finish_reason == "length"
        stream = await client.chat.completions.create(**request, max_tokens=max_tokens, stream=True)
        chunks = [c async for c in stream]
        joined = joined_message(chunks)
        assert joined["content"] == content
        assert [c["function"] for c in joined["tool_calls"] or []] == functions
        ids = [c["id"] for c in [*calls, *(joined["tool_calls"] or [])]]
        assert all(i.startswith("call_") for i in ids)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_a_call_to_a_function_not_offered_is_content(
    tool_preprocessor: Preprocessor,
) -> None:
    """tool_choice auto: the model calls get_time, which the request did not offer. Its
    block is content, as a malformed call's (it was returned as a tool call no client can
    run); the offered call after it is a call. Whole and streamed alike."""
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    unoffered = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    output = (
        f"Let me look.{unoffered}"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    engine.outputs = [output, output]
    request: Any = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL]}
    whole = await client.chat.completions.create(**request)
    message = whole.choices[0].message
    calls = [c.model_dump() for c in message.tool_calls or []]
    weather = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert (message.content, [c["function"] for c in calls]) == (
        f"Let me look.{unoffered}",
        [weather],
    )
    assert whole.choices[0].finish_reason == "tool_calls"
    chunks = [c async for c in await client.chat.completions.create(**request, stream=True)]
    joined = joined_message(chunks)
    assert joined["content"] == f"Let me look.{unoffered}"
    assert [c["function"] for c in joined["tool_calls"] or []] == [weather]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_parallel_tool_calls_false_keeps_the_first(tool_preprocessor: Preprocessor) -> None:
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    engine.outputs = [CALLS_OUTPUT]
    whole = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL], parallel_tool_calls=False
    )
    calls = whole.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]


async def test_tool_choice_none_renders_tools_but_reads_no_calls(
    tool_preprocessor: Preprocessor,
) -> None:
    engine, client = serve(tool_preprocessor, OutputParsers.named("hermes", None))
    engine.outputs = [CALLS_OUTPUT]
    whole = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="none"
    )
    assert whole.choices[0].message.content == CALLS_OUTPUT
    assert whole.choices[0].message.tool_calls is None
    assert whole.usage is not None and whole.usage.completion_tokens_details is None
    assert "get_weather" in tool_preprocessor.decode(engine.prompts[0])


async def test_history_with_calls_and_results_round_trips(tool_preprocessor: Preprocessor) -> None:
    """The second turn of an agent loop: the first answer's message (as the client got it)
    and the tool's result go back; the template renders both."""
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    engine.outputs = [CALLS_OUTPUT, "It is 21 °C in Paris."]
    tools: Any = [WEATHER_TOOL, TIME_TOOL]
    first = await client.chat.completions.create(model=MODEL, messages=ASK, tools=tools)
    message = first.choices[0].message
    calls = message.tool_calls or []
    history: Any = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp_c": 21}'},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "12:00"},
    ]
    second = await client.chat.completions.create(model=MODEL, messages=history, tools=tools)
    assert second.choices[0].message.content == "It is 21 °C in Paris."
    assert second.choices[0].finish_reason == "stop"
    prompt = tool_preprocessor.decode(engine.prompts[1], skip_special_tokens=False)
    assert prompt.endswith(
        "<|im_start|>assistant\nLet me look.\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n"
        '{"temp_c": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


async def error_of(client: Any, **fields: Any) -> dict[str, Any]:
    """The `error` object of the 400 (the client unwraps it)."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ASK, **fields)
    body = caught.value.body
    assert isinstance(body, dict)
    return body


async def test_tool_requests_the_server_cannot_honour_are_400s(
    tool_preprocessor: Preprocessor, plain_preprocessor: Preprocessor
) -> None:
    _, client = serve(tool_preprocessor, HERMES_QWEN3)
    unknown = {"type": "function", "function": {"name": "launch"}}
    bad_schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
    bad_name = {"type": "function", "function": {"name": "two words"}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [WEATHER_TOOL], "tool_choice": unknown}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools"),
        ({"tools": [bad_schema]}, "tools.0.function.parameters"),
        ({"tools": [bad_name]}, "tools.0.function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ]
    for fields, param in cases:
        error = await error_of(client, **fields)
        assert (error["param"], error["type"]) == (param, "invalid_request_error"), fields
    # forced calls with a format of their own, in one request
    json_object = {"type": "json_object"}
    error = await error_of(
        client, tools=[WEATHER_TOOL], tool_choice="required", response_format=json_object
    )
    assert error["param"] == "response_format"
    assert "cannot be combined" in error["message"]

    # forced calls to a function the format's grammar cannot write (pythonic calls are
    # Python names)
    _, client = serve(tool_preprocessor, OutputParsers.named("pythonic", None))
    dashed = {"type": "function", "function": {"name": "get-time"}}
    for choice in ("required", {"type": "function", "function": {"name": "get-time"}}):
        error = await error_of(client, tools=[WEATHER_TOOL, dashed], tool_choice=choice)
        assert (error["param"], error["code"]) == ("tools.1.function.name", "unsupported_parameter")
        assert "not a Python name" in error["message"]

    # no parser: tools are refused rather than read as text
    _, client = serve(tool_preprocessor, OutputParsers())
    error = await error_of(client, tools=[WEATHER_TOOL])
    assert (error["param"], error["code"]) == ("tools", "unsupported_parameter")
    assert "--tool-call-parser" in error["message"]

    # SmolLM2's own template renders neither tools nor calls
    _, client = serve(plain_preprocessor, HERMES_QWEN3)
    error = await error_of(client, tools=[WEATHER_TOOL])
    assert (error["param"], error["code"]) == ("tools", "unsupported_parameter")
    assert "--chat-template" in error["message"]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [*ASK, {"role": "assistant", "tool_calls": [call]}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=history)
    assert caught.value.body["param"] == "messages.1.tool_calls"  # type: ignore[index]


async def test_bad_history_items_name_their_place(tool_preprocessor: Preprocessor) -> None:
    _, client = serve(tool_preprocessor, HERMES_QWEN3)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    cases: list[tuple[Any, str]] = [
        (
            [*ASK, {"role": "assistant", "tool_calls": [call]}],
            "messages.1.tool_calls.0.function.arguments",
        ),
        ([*ASK, {"role": "tool", "content": "x"}], "messages.1.tool_call_id"),
        ([{"role": "user", "content": "x", "tool_calls": [call]}], "messages.0.tool_calls"),
    ]
    for messages, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=messages)
        assert caught.value.body["param"] == param, messages  # type: ignore[index]


async def test_an_invalid_parameters_schema_is_a_400_naming_the_tool_for_every_choice(
    tool_preprocessor: Preprocessor,
) -> None:
    engine, client = serve(tool_preprocessor, HERMES_QWEN3)
    misspelt = {"type": "object", "properties": {"city": {"type": "strnig"}}}
    bad = {"type": "function", "function": {"name": "f", "parameters": misspelt}}
    named = {"type": "function", "function": {"name": "f"}}
    for choice in ("auto", "required", named, "none"):
        error = await error_of(client, tools=[WEATHER_TOOL, bad], tool_choice=choice)
        assert (error["param"], error["code"]) == ("tools.1.function.parameters", "invalid_value")
        assert error["type"] == "invalid_request_error"
        assert "JSON schema is invalid" in error["message"], choice
        assert "strnig" in error["message"], choice
    assert engine.prompts == []  # refused before anything ran


async def post_chat(engine: ScriptedEngine, body: str) -> Any:
    """`body` as it is (JSON text the openai client would not write) to chat completions."""
    async with httpx.AsyncClient(transport=asgi(engine, HERMES_QWEN3), base_url="http://test") as c:
        headers = {"content-type": "application/json"}
        return await c.post("/v1/chat/completions", content=body, headers=headers)


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


async def test_inputs_nested_past_what_the_server_reads_are_400s(
    tool_preprocessor: Preprocessor,
) -> None:
    """JSON text nested past json.loads' recursion limit, arguments nested past what the chat
    template can render, schemas past the grammar compiler's limits, a NaN in a schema: each
    a 400 naming its field (each was a 500 with a traceback), and the server serves on."""
    engine = ScriptedEngine(tool_preprocessor)
    ask = json.dumps(ASK)[1:-1]
    where = "messages.1.tool_calls.0.function.arguments"

    def history(arguments: str) -> str:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        turn = {"role": "assistant", "tool_calls": [call]}
        return f'{{"model": "{MODEL}", "messages": [{ask}, {json.dumps(turn)}]}}'

    def tool(parameters: str) -> str:
        function = f'{{"name": "f", "parameters": {parameters}}}'
        tools = f'[{{"type": "function", "function": {function}}}]'
        return f'{{"model": "{MODEL}", "messages": [{ask}], "tools": {tools}}}'

    def number(maximum: str) -> str:
        x = f'{{"type": "number", "maximum": {maximum}}}'
        return f'{{"type": "object", "properties": {{"x": {x}}}}}'

    deep_schema = '{"type": "object", "properties": {"a": ' * 300 + "{}" + "}}" * 300
    cases = [
        (history(nested(900)), where, "nested too deep"),
        (history("[" * 100_000), where, "nested too deep"),
        (
            f'{{"model": "{MODEL}", "messages": [{ask}], "guided_json": "{"[" * 100_000}"}}',
            "guided_json",
            "nested too deep",
        ),
        (tool(deep_schema), "tools.0.function.parameters", "recursion limit"),
        (tool(number("NaN")), "tools.0.function.parameters", "NaN or Infinity"),
        (tool(number("1" + "0" * 400)), "tools.0.function.parameters", "range"),
    ]
    for body, param, problem in cases:
        r = await post_chat(engine, body)
        assert r.status_code == 400, (param, r.text[:300])
        error = r.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
        assert problem in error["message"], error["message"]
    # what the server reads (arguments at MAX_JSON_DEPTH) renders and runs
    engine.outputs = ["ok"]
    r = await post_chat(engine, history(nested(255)))
    assert r.status_code == 200, r.text[:300]
    assert len(engine.prompts) == 1


async def test_messages_a_template_refuses_are_a_400(default_model_dir: Path) -> None:
    strict = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('system messages are not supported') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    engine = ScriptedEngine(Preprocessor(default_model_dir, strict))
    system = {"role": "system", "content": "be brief"}
    body = json.dumps({"model": MODEL, "messages": [system, *ASK]})
    r = await post_chat(engine, body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages")
    assert "system messages are not supported" in error["message"]
    assert engine.prompts == []


async def test_a_guided_output_is_not_read_as_reasoning(tool_preprocessor: Preprocessor) -> None:
    """Under deepseek_r1 (the output starts inside reasoning) a guided output, a forced call
    or a JSON format from its first token, never writes </think>: read as reasoning it was
    all reasoning, with no call and empty content. A guided output is its format; an
    unguided one is still split."""
    engine, client = serve(tool_preprocessor, OutputParsers.named("hermes", "deepseek_r1"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    forced: Any = {"model": MODEL, "messages": ASK, "tools": [WEATHER_TOOL]}
    forced["tool_choice"] = "required"
    json_format: Any = {"model": MODEL, "messages": ASK, "response_format": {"type": "json_object"}}
    free: Any = {"model": MODEL, "messages": ASK}
    for stream in (False, True):
        engine.outputs = [call, '{"a": 1}', "Thinking.</think>Sunny."]
        got = []
        for request in (forced, json_format, free):
            if stream:
                chunks = [
                    c async for c in await client.chat.completions.create(**request, stream=True)
                ]
                deltas = [c.choices[0].delta for c in chunks if c.choices]
                content = "".join(d.content or "" for d in deltas)
                reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
                names = [t.function.name for d in deltas for t in d.tool_calls or [] if t.id]  # type: ignore[union-attr]
            else:
                message = (await client.chat.completions.create(**request)).choices[0].message
                content = message.content or ""
                reasoning = getattr(message, "reasoning_content", None) or ""
                names = [t.function.name for t in message.tool_calls or []]  # type: ignore[union-attr]
            got.append((content, reasoning, names))
        assert got == [
            ("", "", ["get_weather"]),
            ('{"a": 1}', "", []),
            ("Sunny.", "Thinking.", []),
        ], stream
