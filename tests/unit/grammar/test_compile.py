"""Guides compiled to llguidance grammars: each kind accepts exactly its language (checked
with a matcher over the default model's tokenizer), and a bad guide is refused naming its
field and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from armature.errors import InvalidRequestError
from armature.grammar.compile import check_guide
from armature.grammar.tokenizer import load_grammar_tokenizer
from armature.protocols.guide import (
    ChoiceGuide,
    Guide,
    JsonObjectGuide,
    JsonSchemaGuide,
    LarkGuide,
    RegexGuide,
)

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}, "c": {"enum": ["a", "b"]}},
    "required": ["n", "c"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> llguidance.LLTokenizer:
    return load_grammar_tokenizer(default_model_dir, 49152, (2,))


def accepts(tokenizer: llguidance.LLTokenizer, guide: Guide, text: str) -> bool:
    """Whether the grammar takes `text` whole (and then nothing but the end)."""
    matcher = llguidance.LLMatcher(tokenizer, check_guide(guide), log_level=0)
    tokens = tokenizer.tokenize_str(text)
    return matcher.consume_tokens(tokens) and matcher.is_accepting()


def test_each_guide_accepts_its_language_only(tokenizer: llguidance.LLTokenizer) -> None:
    schema = JsonSchemaGuide(schema_json=json.dumps(SCHEMA), param="guided_json")
    assert accepts(tokenizer, schema, '{"n": 3, "c": "b"}')
    assert not accepts(tokenizer, schema, '{"n": 10, "c": "b"}')  # above the maximum
    assert not accepts(tokenizer, schema, '{"n": 3, "c": "z"}')  # not in the enum
    assert not accepts(tokenizer, schema, '{"n":3,"c":"b"}')  # json.dumps' spacing only
    any_object = JsonObjectGuide(param="response_format")
    assert accepts(tokenizer, any_object, '{"x": [1, 2], "y": {"z": null}}')
    assert not accepts(tokenizer, any_object, "[1, 2]")
    regex = RegexGuide(pattern=r"[0-9]{3}-[a-z]+", param="guided_regex")
    assert accepts(tokenizer, regex, "123-abc")
    assert not accepts(tokenizer, regex, "12-abc")
    choice = ChoiceGuide(choices=("yes", 'no "way"', "naïve\n"), param="guided_choice")
    for text in choice.choices:
        assert accepts(tokenizer, choice, text)
    assert not accepts(tokenizer, choice, "maybe")
    lark = LarkGuide(grammar='start: "a" ("," "a")*', param="guided_grammar")
    assert accepts(tokenizer, lark, "a,a,a")
    gbnf = LarkGuide(grammar='root ::= "x" | "yy"', param="guided_grammar")  # converted
    assert accepts(tokenizer, gbnf, "yy")
    assert not accepts(tokenizer, gbnf, "xy")


def _nested_schema(depth: int) -> str:
    return '{"type": "array", "items": ' * depth + "{}" + "}" * depth


@pytest.mark.parametrize(
    ("guide", "problem"),
    [
        (JsonSchemaGuide(schema_json='{"type": "foo"}', param="p"), "Invalid type: foo"),
        (JsonSchemaGuide(schema_json='{"$ref": "#/nope"}', param="p"), "'/nope' does not exist"),
        (
            JsonSchemaGuide(
                schema_json='{"type": "array", "minItems": 3, "maxItems": 1}', param="p"
            ),
            "minItems (3) is greater than maxItems (1)",
        ),
        (
            JsonSchemaGuide(schema_json='{"type": "string", "pattern": "[a-"}', param="p"),
            "unclosed character class",
        ),
        (RegexGuide(pattern="(ab", param="p"), "unclosed group"),
        (LarkGuide(grammar='start: ("a"', param="p"), ""),
        (LarkGuide(grammar="start: missing_rule", param="p"), "missing_rule"),
        (LarkGuide(grammar="root ::= undefined", param="p"), "undefined"),  # GBNF
        (LarkGuide(grammar="root ::= 8|", param="p"), "the grammar is invalid"),
        (ChoiceGuide(choices=(), param="p"), "must not be empty"),
        # llguidance's compiler raises on these (a ValueError, a 500 before)
        (JsonSchemaGuide(schema_json=_nested_schema(300), param="p"), "recursion limit"),
        (JsonSchemaGuide(schema_json='{"maximum": NaN}', param="p"), "the JSON schema is"),
        (JsonSchemaGuide(schema_json='{"maximum": 1' + "0" * 400 + "}", param="p"), "range"),
    ],
)
def test_a_bad_guide_is_refused_naming_its_field(guide: Guide, problem: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_guide(guide)
    assert caught.value.param == "p"
    assert problem in str(caught.value)
