"""Forced tool calls' grammars, one per tool-call parser: each accepts its parser's canonical
output, and whatever a model writes under it (random logits masked by the grammar, over the
default model's vocabulary) the parser reads as calls to the offered functions with
arguments valid against their schemas. Mistral's markers as special tokens are checked with
the default tokenizer extended by `[TOOL_CALLS]` and `[ARGS]` (as Mistral's own v11 has)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest
import torch
from tokenizers import Tokenizer

from armature.errors import InvalidRequestError
from armature.frontend.parsing import TOOL_CALL_PARSERS
from armature.frontend.parsing.tool_call import ToolCall
from armature.frontend.tool_grammar import FORCED_CALL_FORMATS, tool_call_guide
from armature.frontend.tool_protocol import ToolSpec
from armature.grammar.compile import check_guide

pytestmark = pytest.mark.slow  # reads the default model's tokenizer

VOCAB = 49152
EOS = 2
MARKERS = {"[TOOL_CALLS]": VOCAB, "[ARGS]": VOCAB + 1}  # ids in the extended tokenizer
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"},
                "hours": {"type": "array", "items": {"enum": [6, 12, 18]}, "maxItems": 2},
                "note": {"type": ["string", "null"], "maxLength": 6},
                "where": {
                    "type": "object",
                    "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}},
                    "required": ["lat"],
                    "additionalProperties": False,
                },
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
TIME: Any = {"type": "function", "function": {"name": "get_time", "parameters": NO_PARAMETERS}}
TOOLS = [ToolSpec.model_validate(WEATHER), ToolSpec.model_validate(TIME)]
SCHEMAS = {t.function.name: t.function.parameters or {} for t in TOOLS}
PARIS = ToolCall("get_weather", '{"city": "Paris", "days": 3}')
NOW = ToolCall("get_time", "{}")
# (parser, special markers, canonical output of the two calls above)
CANONICAL: list[tuple[str, bool, str]] = [
    (
        "hermes",
        False,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    ),
    (
        "llama3_json",
        False,
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
        '{"name": "get_time", "parameters": {}}',
    ),
    (
        "mistral",
        False,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "get_time", "arguments": {}}]',
    ),
    (
        "mistral",
        True,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]{}',
    ),
    ("pythonic", False, '[get_weather(city="Paris", days=3), get_time()]'),
]


@pytest.fixture(scope="module")
def tokenizers(default_model_dir: Path) -> dict[bool, tuple[Tokenizer, llguidance.LLTokenizer]]:
    """The default tokenizer as is (False) and with Mistral's markers as special tokens
    (True): (HF tokenizer, llguidance's view)."""
    text = (default_model_dir / "tokenizer.json").read_text()
    spec = json.loads(text)
    for content, token in MARKERS.items():
        spec["added_tokens"].append(
            {
                "id": token,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    extended = json.dumps(spec)
    return {
        False: (
            Tokenizer.from_str(text),
            llguidance.LLTokenizer(text, n_vocab=VOCAB, eos_token=[EOS]),
        ),
        True: (
            Tokenizer.from_str(extended),
            llguidance.LLTokenizer(extended, n_vocab=VOCAB + 2, eos_token=[EOS]),
        ),
    }


def matcher(
    tokenizer: llguidance.LLTokenizer,
    parser: str,
    special: bool,
    max_calls: int | None = None,
    named: str | None = None,
) -> llguidance.LLMatcher:
    guide = tool_call_guide(parser, TOOLS, max_calls, MARKERS if special else {}, named)
    return llguidance.LLMatcher(tokenizer, check_guide(guide), log_level=0)


def test_every_parser_has_a_forced_call_grammar() -> None:
    assert set(FORCED_CALL_FORMATS) == set(TOOL_CALL_PARSERS)


@pytest.mark.parametrize(("parser", "special", "text"), CANONICAL)
def test_the_grammar_accepts_the_parsers_canonical_output(
    tokenizers: Any, parser: str, special: bool, text: str
) -> None:
    hf, ll = tokenizers[special]
    assert TOOL_CALL_PARSERS[parser].parse(text).calls == (PARIS, NOW)
    ids = hf.encode(text, add_special_tokens=False).ids
    assert (set(ids) & set(MARKERS.values())) == (set(MARKERS.values()) if special else set())
    m = matcher(ll, parser, special)
    assert all(m.consume_token(t) for t in ids), m.get_error()
    assert m.is_accepting()
    # one call only: the first is whole, a second is refused
    one = matcher(ll, parser, special, max_calls=1)
    consumed = [one.consume_token(t) for t in ids]
    assert False in consumed and one.is_error()


def sample(tokenizer: Any, m: llguidance.LLMatcher, num_vocab: int, seed: int) -> list[int]:
    """A random walk under the grammar (the model's logits replaced by seeded noise) to its
    end, as the engine writes a guided output."""
    generator = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    words = (num_vocab + 31) // 32
    bits = torch.arange(32, dtype=torch.int32)
    while not m.is_stopped():
        assert len(ids) < 600, tokenizer.decode(ids)
        mask = torch.empty(words, dtype=torch.int32)
        m.unsafe_compute_mask_ptr(mask.data_ptr(), words * 4)
        allowed = ((mask.unsqueeze(-1) >> bits) & 1).view(-1)[:num_vocab].bool()
        logits = torch.randn(num_vocab, generator=generator) * 3
        token = int(torch.argmax(logits.masked_fill(~allowed, float("-inf"))))
        if token == EOS:
            break
        assert m.consume_token(token), m.get_error()
        ids.append(token)
    return ids


def decode(tokenizer: Tokenizer, ids: list[int]) -> str:
    """The text of `ids` as the frontend decodes output it reads for calls: special tokens
    dropped, except the parser's markers (chat_setup.py's kept tokens)."""
    names = {token: text for text, token in MARKERS.items()}
    text, run = "", []
    for token in [*ids, -1]:
        if token in names or token == -1:
            text += tokenizer.decode(run) + names.get(token, "")
            run = []
        else:
            run.append(token)
    return text


@pytest.mark.parametrize(("parser", "special"), sorted({(p, s) for p, s, _ in CANONICAL}))
@pytest.mark.parametrize("named", [None, "get_weather"])
def test_outputs_written_under_the_grammar_parse_into_valid_calls(
    tokenizers: Any, parser: str, special: bool, named: str | None
) -> None:
    hf, ll = tokenizers[special]
    num_vocab = VOCAB + (2 if special else 0)
    num_calls = []
    for seed in range(4):
        m = matcher(ll, parser, special, named=named)
        ids = sample(hf, m, num_vocab, seed)
        text = decode(hf, ids)
        parsed = TOOL_CALL_PARSERS[parser].parse(text)
        assert not parsed.content.strip() and parsed.calls, text
        for call in parsed.calls:
            assert call.name in ((named,) if named else SCHEMAS), text
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        num_calls.append(len(parsed.calls))
    if named:
        assert num_calls == [1] * 4


def test_pythonic_refuses_what_python_keyword_arguments_cannot_carry() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "get-time"}, "tools.0.function.name"),
        (
            {"name": "f", "parameters": {"type": "object", "properties": {"class": {}}}},
            "tools.0.function.parameters.properties",
        ),
        (
            {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
                },
            },
            "tools.0.function.parameters.properties.x",
        ),
    ]
    for function, param in cases:
        tool = ToolSpec.model_validate({"type": "function", "function": function})
        with pytest.raises(InvalidRequestError) as caught:
            tool_call_guide("pythonic", [tool], None, {})
        assert caught.value.param == param


@pytest.mark.parametrize(
    ("parser", "special"), [("hermes", False), ("llama3_json", False), ("mistral", True)]
)
@pytest.mark.parametrize("parameters", [None, {}])
def test_a_function_without_parameters_is_forced_to_take_none(
    tokenizers: Any, parser: str, special: bool, parameters: Any
) -> None:
    """OpenAI reads a function without `parameters` (or `{}`) as taking none: its forced
    calls carry `{}` (an open object let the model invent arguments)."""
    hf, ll = tokenizers[special]
    spec: Any = {"type": "function", "function": {"name": "get_time"}}
    if parameters is not None:
        spec["function"]["parameters"] = parameters
    guide = tool_call_guide(parser, [ToolSpec.model_validate(spec)], 1, MARKERS if special else {})
    for seed in range(4):
        m = llguidance.LLMatcher(ll, check_guide(guide), log_level=0)
        text = decode(hf, sample(hf, m, VOCAB + (2 if special else 0), seed))
        [call] = TOOL_CALL_PARSERS[parser].parse(text).calls
        assert (call.name, json.loads(call.arguments)) == ("get_time", {}), text


# a nested model as the openai client writes it (`pydantic_function_tool`): `$defs` and
# `$ref`, and a self-reference (`#`); properties named as keywords keep their references
NESTED: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "$defs": {
                "Loc": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 8}},
                    "required": ["city"],
                    "additionalProperties": False,
                }
            },
            "definitions": {"Days": {"type": "integer", "minimum": 1, "maximum": 3}},
            "type": "object",
            "properties": {
                "loc": {"$ref": "#/$defs/Loc"},
                "const": {"$ref": "#/definitions/Days"},
                "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
            },
            "required": ["loc", "const", "next"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize(
    ("parser", "special"), [("hermes", False), ("llama3_json", False), ("mistral", False)]
)
def test_forced_calls_follow_parameters_that_refer_to_their_own_definitions(
    tokenizers: Any, parser: str, special: bool
) -> None:
    hf, ll = tokenizers[special]
    tool = ToolSpec.model_validate(NESTED)
    schema = tool.function.parameters
    guide = tool_call_guide(parser, [tool], 1, {})
    for seed in range(4):
        m = llguidance.LLMatcher(ll, check_guide(guide), log_level=0)
        text = decode(hf, sample(hf, m, VOCAB, seed))
        [call] = TOOL_CALL_PARSERS[parser].parse(text).calls
        arguments = json.loads(call.arguments)
        # the function's own schema, references resolved within it
        jsonschema.validate(arguments, schema)
        nested = arguments["next"]
        assert nested is None or set(nested) == {"loc", "const", "next"}, text


@pytest.mark.parametrize("arguments", ["[1]", "1", '"x"'])
def test_parameters_without_a_type_are_an_objects(tokenizers: Any, arguments: str) -> None:
    """`parameters` without `type` reads as an object's schema (tool_protocol.py), but the
    grammar took it as written: JSON Schema without `type` lets arrays and scalars through,
    so a forced call's arguments could be `[1]`, which no parser reads as a call."""
    hf, ll = tokenizers[False]
    spec: Any = {
        "type": "function",
        "function": {"name": "a", "parameters": {"properties": {"x": {"type": "integer"}}}},
    }
    guide = tool_call_guide("hermes", [ToolSpec.model_validate(spec)], 1, {})
    for text, accepted in (
        ('<tool_call>\n{"name": "a", "arguments": ' + arguments, False),
        ('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>', True),
    ):
        m = llguidance.LLMatcher(ll, check_guide(guide), log_level=0)
        ids = hf.encode(text, add_special_tokens=False).ids
        assert all(m.consume_token(t) for t in ids) is accepted, text
