"""Each tool-call parser over a corpus of model-shaped outputs (well-formed, truncated and
malformed): the whole-output parse gives the exact content and calls; the stream, fed the
same output in random chunkings, gives the same."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from parser_streams import chunked, stream_tools

from armature.frontend.parsing import TOOL_CALL_PARSERS
from armature.frontend.parsing.tool_call import ParsedToolCalls, ToolCall

W = ToolCall("get_weather", '{"city": "Paris"}')
T = ToolCall("get_time", '{"zone": "CET", "utc": true}')
E = ToolCall("noop", "{}")

Case = tuple[str, ParsedToolCalls]

HERMES: list[Case] = [
    ("Plain answer.", ParsedToolCalls("Plain answer.")),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        ParsedToolCalls("", (W,)),
    ),
    (  # content around two parallel calls
        'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": '
        '{"zone": "CET", "utc": true}}</tool_call> done',
        ParsedToolCalls("Checking.\n done", (W, T)),
    ),
    (  # arguments as JSON text
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        ParsedToolCalls("", (W,)),
    ),
    (  # a bad block stays content; the good one is still a call
        '<tool_call>{"name": get_weather}</tool_call><tool_call>{"name": "noop", '
        '"arguments": {}}</tool_call>',
        ParsedToolCalls('<tool_call>{"name": get_weather}</tool_call>', (E,)),
    ),
    (  # truncated: never closed
        '<tool_call>{"name": "get_weather", "arguments": {"ci',
        ParsedToolCalls('<tool_call>{"name": "get_weather", "arguments": {"ci'),
    ),
    (  # not a call: no arguments, or extra keys, or a list
        '<tool_call>{"name": "f"}</tool_call><tool_call>[1]</tool_call>',
        ParsedToolCalls('<tool_call>{"name": "f"}</tool_call><tool_call>[1]</tool_call>'),
    ),
    (  # NaN is not JSON text
        '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>',
        ParsedToolCalls('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>'),
    ),
    ("a < b and <tool_ca", ParsedToolCalls("a < b and <tool_ca")),
    ("</tool_call> stray end", ParsedToolCalls("</tool_call> stray end")),
]

LLAMA3: list[Case] = [
    ("The weather is fine.", ParsedToolCalls("The weather is fine.")),
    (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        ParsedToolCalls("", (W,)),
    ),
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"type": "function", "name": "get_time", "parameters": {"zone": "CET", "utc": true}}',
        ParsedToolCalls("", (W, T)),
    ),
    ('  \n{"name": "noop", "arguments": {}}  ', ParsedToolCalls("", (E,))),
    (  # JSON that is not a call
        '{"city": "Paris"}',
        ParsedToolCalls('{"city": "Paris"}'),
    ),
    (  # truncated
        '{"name": "get_weather", "parameters": {"city": "Par',
        ParsedToolCalls('{"name": "get_weather", "parameters": {"city": "Par'),
    ),
    (  # trailing prose after the call
        '{"name": "noop", "parameters": {}} and more',
        ParsedToolCalls('{"name": "noop", "parameters": {}} and more'),
    ),
    ("<|python_tag|>", ParsedToolCalls("<|python_tag|>")),
    (  # a call in the middle of prose is not a call
        'Use {"name": "noop", "parameters": {}}',
        ParsedToolCalls('Use {"name": "noop", "parameters": {}}'),
    ),
]

MISTRAL: list[Case] = [
    ("No tools needed.", ParsedToolCalls("No tools needed.")),
    (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET", "utc": true}}]',
        ParsedToolCalls("", (W, T)),
    ),
    (  # v11 form, two calls, content before
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]noop[ARGS]{}',
        ParsedToolCalls("Sure. ", (W, E)),
    ),
    (  # truncated list: everything is content
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city"',
        ParsedToolCalls('Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city"'),
    ),
    ("[TOOL_CALLS]", ParsedToolCalls("[TOOL_CALLS]")),
    ("[TOOL_CALLS][]", ParsedToolCalls("[TOOL_CALLS][]")),
    ("[TOOL_CALLS]noop[ARGS][1]", ParsedToolCalls("[TOOL_CALLS]noop[ARGS][1]")),
    ("[TOOL_CALL", ParsedToolCalls("[TOOL_CALL")),
]

PYTHONIC: list[Case] = [
    ("It is sunny.", ParsedToolCalls("It is sunny.")),
    ('[get_weather(city="Paris")]', ParsedToolCalls("", (W,))),
    (
        '[get_weather(city="Paris"), get_time(zone="CET", utc=True)]',
        ParsedToolCalls("", (W, T)),
    ),
    ("<|python_start|>[noop()]<|python_end|>", ParsedToolCalls("", (E,))),
    (
        "[f(a=[1, 2.5, None], b={'k': (1, 2)})]",
        ParsedToolCalls("", (ToolCall("f", '{"a": [1, 2.5, null], "b": {"k": [1, 2]}}'),)),
    ),
    ("[1] is a footnote", ParsedToolCalls("[1] is a footnote")),
    ('[get_weather("Paris")]', ParsedToolCalls('[get_weather("Paris")]')),  # positional
    ("[f(x=open('/etc/passwd'))]", ParsedToolCalls("[f(x=open('/etc/passwd'))]")),  # not literal
    ("[f(x={1, 2})]", ParsedToolCalls("[f(x={1, 2})]")),  # a set is not JSON
    ("[f(**kw)]", ParsedToolCalls("[f(**kw)]")),
    ("[os.system(c='ls')]", ParsedToolCalls("[os.system(c='ls')]")),
    ('[get_weather(city="Par', ParsedToolCalls('[get_weather(city="Par')),
    ("[]", ParsedToolCalls("[]")),
]

CORPUS: dict[str, list[Case]] = {
    "hermes": HERMES,
    "llama3_json": LLAMA3,
    "mistral": MISTRAL,
    "pythonic": PYTHONIC,
}
CASES = [(name, text, want) for name, cases in CORPUS.items() for text, want in cases]


def test_every_parser_has_a_corpus() -> None:
    assert set(CORPUS) == set(TOOL_CALL_PARSERS)


@pytest.mark.parametrize(("name", "text", "want"), CASES)
def test_whole_output(name: str, text: str, want: ParsedToolCalls) -> None:
    assert TOOL_CALL_PARSERS[name].parse(text) == want


@pytest.mark.parametrize(("name", "text", "want"), CASES)
def test_stream_in_one_piece_and_per_character(name: str, text: str, want: ParsedToolCalls) -> None:
    parser = TOOL_CALL_PARSERS[name]
    assert stream_tools(parser, [text]) == want
    assert stream_tools(parser, list(text)) == want


@seed(0)
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CASES).flatmap(lambda c: st.tuples(st.just(c), chunked(c[1]))))
def test_stream_in_random_chunks_equals_whole(case: tuple[tuple[str, str, Any], list[str]]) -> None:
    (name, text, want), chunks = case
    assert "".join(chunks) == text
    assert stream_tools(TOOL_CALL_PARSERS[name], chunks) == want


# Outputs stitched from format fragments: markers, calls, broken JSON, prose.
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_start|>",
    "<|python_end|>",
    '{"name": "noop", "arguments": {}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '[{"name": "noop", "arguments": {}}]',
    '[get_weather(city="Paris")]',
    "noop(",
    ")",
    "; ",
    "{",
    "}",
    "[",
    "]",
    '"',
    " ",
    "\n",
    "text",
    "<",
    "é🎉",
]


@seed(0)
@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(TOOL_CALL_PARSERS)),
    st.lists(st.sampled_from(FRAGMENTS), max_size=8)
    .map("".join)
    .flatmap(lambda text: st.tuples(st.just(text), chunked(text))),
)
def test_stream_equals_whole_on_stitched_outputs(name: str, sample: tuple[str, list[str]]) -> None:
    text, chunks = sample
    parser = TOOL_CALL_PARSERS[name]
    whole = parser.parse(text)
    assert stream_tools(parser, chunks) == whole
    for call in whole.calls:  # every call carries a JSON object
        assert isinstance(json.loads(call.arguments), dict)


OFFERED = ("get_weather", "get_time")
NOT_OFFERED: list[tuple[str, str, ParsedToolCalls]] = [  # noop is not offered
    (
        "hermes",
        'Sure.<tool_call>{"name": "noop", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        ParsedToolCalls('Sure.<tool_call>{"name": "noop", "arguments": {}}</tool_call>\n', (W,)),
    ),
    (  # the name after the arguments
        "hermes",
        '<tool_call>{"arguments": {}, "name": "noop"}</tool_call>',
        ParsedToolCalls('<tool_call>{"arguments": {}, "name": "noop"}</tool_call>'),
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "noop", '
        '"parameters": {}}',
        ParsedToolCalls(
            '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "noop", '
            '"parameters": {}}'
        ),
    ),
    (
        "mistral",
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]noop[ARGS]{}',
        ParsedToolCalls(
            'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]noop[ARGS]{}'
        ),
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "noop", "arguments": {}}]',
        ParsedToolCalls('[TOOL_CALLS][{"name": "noop", "arguments": {}}]'),
    ),
    (
        "pythonic",
        '[get_weather(city="Paris"), noop()]',
        ParsedToolCalls('[get_weather(city="Paris"), noop()]'),
    ),
]


@pytest.mark.parametrize(("name", "text", "want"), NOT_OFFERED)
def test_a_call_to_a_function_not_offered_is_content(
    name: str, text: str, want: ParsedToolCalls
) -> None:
    """As a malformed call: its block (hermes) or the whole region of calls is content."""
    parser = TOOL_CALL_PARSERS[name]
    assert parser.parse(text, OFFERED) == want
    assert stream_tools(parser, [text], OFFERED) == want
    assert stream_tools(parser, list(text), OFFERED) == want
    assert parser.parse(text, (*OFFERED, "noop")).calls  # offered, it is a call


@seed(0)
@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(TOOL_CALL_PARSERS)),
    st.lists(st.sampled_from(FRAGMENTS), max_size=8)
    .map("".join)
    .flatmap(lambda text: st.tuples(st.just(text), chunked(text))),
)
def test_stream_equals_whole_with_only_some_functions_offered(
    name: str, sample: tuple[str, list[str]]
) -> None:
    text, chunks = sample
    parser = TOOL_CALL_PARSERS[name]
    whole = parser.parse(text, ["get_weather"])
    assert stream_tools(parser, chunks, ["get_weather"]) == whole
    assert all(call.name == "get_weather" for call in whole.calls)


def test_the_flag_choices_are_the_registered_parsers() -> None:
    from armature.config import chat
    from armature.frontend.parsing import REASONING_PARSERS

    assert tuple(TOOL_CALL_PARSERS) == chat.TOOL_CALL_PARSERS
    assert tuple(REASONING_PARSERS) == chat.REASONING_PARSERS
