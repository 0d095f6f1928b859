"""Tool calls streamed as OpenAI's deltas: a call's name goes out first, then its arguments
in pieces that join to exactly the whole-output arguments (canonical JSON text), for every
chunking; a call whose text turns out malformed after it began is broken and its text is
content, so the content always equals the whole-output content."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from parser_streams import chunked, run_stream

from armature.frontend.parsing import TOOL_CALL_PARSERS
from armature.frontend.parsing.json_canon import CanonicalJson
from armature.frontend.parsing.tool_call import ParsedToolCalls

LONG_ARGUMENTS: dict[str, Any] = {
    "query": "weather in Paris, Lyon and Zürich " * 4,
    "days": [1, 2, 3, 4, 5],
    "units": {"temperature": "celsius", "wind": "km/h"},
    "escaped": 'a "quoted" \\ line\nbreak \u0001 😀',
    "ratio": 0.25,
    "strict": True,
    "none": None,
}
RAW = json.dumps(LONG_ARGUMENTS, indent=1)  # the model's spacing and escapes
CANONICAL = json.dumps(LONG_ARGUMENTS, ensure_ascii=False)

# one output per streaming format, each a long-arguments call between two others
LONG_OUTPUTS = {
    "hermes": (
        'Checking.<tool_call>\n{"name": "search", "arguments": '
        + RAW
        + '}\n</tool_call>\n<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "search", "parameters": ' + RAW + '};{"name": "noop", '
        '"parameters": {}}'
    ),
    "mistral": (
        'Sure. [TOOL_CALLS][{"name": "search", "arguments": '
        + RAW
        + '}][TOOL_CALLS]noop[ARGS]{"a": 1E1}'
    ),
}


@seed(0)
@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(LONG_OUTPUTS)).flatmap(
        lambda name: st.tuples(st.just(name), chunked(LONG_OUTPUTS[name]))
    )
)
def test_a_long_call_streams_its_arguments_in_pieces(sample: tuple[str, list[str]]) -> None:
    name, chunks = sample
    parser = TOOL_CALL_PARSERS[name]
    out = run_stream(parser, chunks)
    whole = parser.parse(LONG_OUTPUTS[name])
    assert whole.calls[0].arguments == CANONICAL
    assert ParsedToolCalls(out.content, out.calls()) == whole
    assert not out.broken
    # the name first, then the arguments as they arrive: in two pieces at least when a
    # chunk ends inside their text (after its `{`, before its `}`)
    first = out.deltas[0]
    assert (first.number, first.name) == (0, "search")
    assert all(d.name is None for d in out.deltas[1:] if d.number == 0)
    begin = LONG_OUTPUTS[name].index(RAW)
    cuts = itertools.accumulate(map(len, chunks))
    if any(begin < cut < begin + len(RAW) for cut in cuts):
        assert len(out.argument_deltas(0)) >= 2
    assert "".join(out.argument_deltas(0)) == CANONICAL


@pytest.mark.parametrize("name", sorted(LONG_OUTPUTS))
def test_per_character_the_arguments_go_out_before_the_call_ends(name: str) -> None:
    text = LONG_OUTPUTS[name]
    out = run_stream(TOOL_CALL_PARSERS[name], list(text))
    pieces = out.argument_deltas(0)
    assert len(pieces) > 50
    assert "".join(pieces) == CANONICAL
    assert pieces[0] == "{"


BROKEN = {  # (output, the content: all of it) for calls that began, then broke
    "hermes": '<tool_call>{"name": "f", "arguments": {"x": 1}} trailing</tool_call>',
    "llama3_json": '{"name": "f", "parameters": {"x": 1}}; and then prose',
    "mistral": '[TOOL_CALLS]f[ARGS]{"x": 1, "x": 2}',
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_call_malformed_after_it_began_is_broken_and_its_text_is_content(name: str) -> None:
    text = BROKEN[name]
    parser = TOOL_CALL_PARSERS[name]
    assert parser.parse(text) == ParsedToolCalls(text)
    out = run_stream(parser, list(text))
    assert out.deltas[0].name == "f"  # it had begun
    assert out.broken == {0}
    assert (out.content, out.calls()) == (text, ())


def test_a_truncated_block_breaks_at_the_end() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"city": "Par'
    out = run_stream(TOOL_CALL_PARSERS["hermes"], [text[:30], text[30:]])
    assert [(d.name, d.arguments) for d in out.deltas] == [("f", '{"city": "Par')]
    assert (out.broken, out.content) == ({0}, text)


def test_arguments_before_the_name_go_out_with_it() -> None:
    text = '<tool_call>{"arguments": {"a": [1, 2]}, "type": "function", "name": "g"}</tool_call>'
    out = run_stream(TOOL_CALL_PARSERS["hermes"], list(text))
    assert [(d.name, d.arguments) for d in out.deltas] == [("g", '{"a": [1, 2]}')]


def test_pythonic_sends_each_call_whole_at_the_end() -> None:
    out = run_stream(TOOL_CALL_PARSERS["pythonic"], list('[f(a=1), g(b="x")]'))
    assert [(d.number, d.name, d.arguments) for d in out.deltas] == [
        (0, "f", '{"a": 1}'),
        (1, "g", '{"b": "x"}'),
    ]


# ---- the canonical JSON writer against json.dumps(json.loads(...)) --------------------------
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@seed(0)
@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4),
    st.sampled_from([None, 0, 2]),
    st.booleans(),
    st.data(),
)
def test_canonical_json_equals_dumps_of_loads(
    value: dict[str, Any], indent: int | None, ascii_only: bool, data: st.DataObject
) -> None:
    raw = json.dumps(value, indent=indent, ensure_ascii=ascii_only) + " tail"
    reader = CanonicalJson()
    written = "".join(reader.feed(chunk) for chunk in data.draw(chunked(raw)))
    assert (reader.done, reader.failed, reader.rest) == (True, False, " tail")
    assert written == json.dumps(json.loads(raw[: -len(" tail")]), ensure_ascii=False)


@pytest.mark.parametrize(
    "raw",
    ['{"x": NaN}', '{"x": 1e999}', '{"a": 1, "a": 2}', '{"x": "\u0001"}', "[1,]", "{'a': 1}"],
)
def test_canonical_json_fails_where_the_whole_parse_refuses(raw: str) -> None:
    reader = CanonicalJson()
    for char in raw:
        reader.feed(char)
    assert reader.failed and not reader.done


NEST = 300  # containers: past MAX_JSON_DEPTH, short of json.loads' recursion limit
DEEP = {
    # a value too deep where the name or type should be: malformed output, never an error
    "name": '<tool_call>{"name":' + "[" * 1200 + "]" * 1200 + ',"arguments":{}}</tool_call>',
    "type": '<tool_call>{"type":' + "[" * 1200 + "]" * 1200 + ',"name":"f"}</tool_call>',
    # arguments deeper than the limit: not a call, streamed or whole
    "arguments": '<tool_call>{"name":"f","arguments":{"a":'
    + "[" * NEST
    + "1"
    + "]" * NEST
    + "}}</tool_call>",
}


@pytest.mark.parametrize("where", sorted(DEEP))
def test_json_nested_too_deep_is_content_streamed_and_whole(where: str) -> None:
    text = DEEP[where]
    parser = TOOL_CALL_PARSERS["hermes"]
    assert parser.parse(text) == ParsedToolCalls(text)
    for chunks in ([text], list(text)):
        out = run_stream(parser, chunks)
        assert (out.content, out.calls()) == (text, ())


def test_a_long_name_form_without_args_is_content_and_a_short_one_a_call() -> None:
    """`[TOOL_CALLS]` then a long text without `[ARGS]`: content, as whole. The stream reads
    each piece once (it rescanned and copied the whole text per piece: seconds at this size,
    minutes at twice it)."""
    text = "[TOOL_CALLS]" + "x" * 400_000
    parser = TOOL_CALL_PARSERS["mistral"]
    assert parser.parse(text) == ParsedToolCalls(text)
    out = run_stream(parser, [text[at : at + 4] for at in range(0, len(text), 4)])
    assert (out.content, out.calls()) == (text, ())
    name_form = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    out = run_stream(parser, list(name_form))
    assert [(c.name, c.arguments) for c in out.calls()] == [("get_weather", '{"city": "Paris"}')]


def test_a_lone_surrogate_escape_stays_an_escape_streamed_and_whole() -> None:
    """`"\\ud800"` reads as a lone surrogate, which UTF-8 cannot carry: the arguments keep it
    as its escape (written raw, encoding the reply failed: a 500, a stream cut mid-body). A
    pair of escapes is one character, written as it is."""
    arguments = '{"s": "a\\ud800b", "k\\udc00": 1, "pair": "\\ud83d\\ude00", "x": "\\ud800"}'
    canonical = '{"s": "a\\ud800b", "k\\udc00": 1, "pair": "😀", "x": "\\ud800"}'
    text = '<tool_call>{"name": "f", "arguments": ' + arguments + "}</tool_call>"
    parser = TOOL_CALL_PARSERS["hermes"]
    [whole] = parser.parse(text).calls
    assert whole.arguments == canonical
    assert json.loads(canonical) == json.loads(arguments)
    canonical.encode("utf-8")  # no lone surrogate left in it
    assert run_stream(parser, list(text)).calls() == (whole,)
    assert run_stream(parser, [text]).calls() == (whole,)
    python = TOOL_CALL_PARSERS["pythonic"].parse("[f(s='a\\ud800')]")
    assert [c.arguments for c in python.calls] == ['{"s": "a\\ud800"}']
