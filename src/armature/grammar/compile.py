"""A `Guide` as llguidance's grammar text, and the check that refuses a bad one with the
request field at fault. Pure: the check needs no tokenizer, so a frontend runs the same one
as the engine."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from armature.errors import InvalidRequestError
from armature.protocols.guide import (
    ChoiceGuide,
    Guide,
    JsonObjectGuide,
    JsonSchemaGuide,
    LarkGuide,
    RegexGuide,
)

if TYPE_CHECKING:  # a TypedDict of llguidance's stubs only
    from llguidance._lib import JsonCompileOptions

__all__ = ["JSON_OPTIONS", "check_guide", "to_grammar"]

# JSON as `json.dumps` writes it: one space after ',' and ':', no other whitespace. Free
# whitespace would let a small model pad forever (vLLM offers the same switch).
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_ANY_OBJECT = '{"type": "object"}'


def to_grammar(guide: Guide) -> str:
    """llguidance's grammar text for `guide` (not yet checked: see `check_guide`)."""
    match guide:
        case JsonSchemaGuide(schema_json=schema):
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        case JsonObjectGuide():
            return llguidance.LLMatcher.grammar_from_json_schema(_ANY_OBJECT, defaults=JSON_OPTIONS)
        case RegexGuide(pattern=pattern):
            return llguidance.LLMatcher.grammar_from_regex(pattern)
        case ChoiceGuide(choices=choices):
            # JSON string literals are Lark string literals (same escapes)
            lark = "start: " + " | ".join(json.dumps(c) for c in choices)
            return llguidance.LLMatcher.grammar_from_lark(lark)
        case LarkGuide(grammar=text):
            return llguidance.LLMatcher.grammar_from_lark(_as_lark(text, guide.param))
    raise AssertionError(f"unknown guide {guide!r}")


def check_guide(guide: Guide) -> str:
    """The grammar of `guide`; InvalidRequestError naming `guide.param` and llguidance's
    reason when it is invalid (a malformed schema or regex, an unsatisfiable schema)."""
    if isinstance(guide, ChoiceGuide) and not guide.choices:
        raise InvalidRequestError("the list of choices must not be empty", param=guide.param)
    try:
        grammar = to_grammar(guide)
    # llguidance's compilers only read the guide: an error is the guide's (a schema nested
    # past its recursion limit, NaN or a number beyond a double in a schema), a 400
    except ValueError as exc:
        raise InvalidRequestError(f"{_what(guide)} is invalid: {exc}", guide.param) from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise InvalidRequestError(f"{_what(guide)} is invalid: {problem.strip()}", guide.param)
    return grammar


def _as_lark(text: str, param: str) -> str:
    """`text` in Lark syntax: Lark as it is, GBNF (llama.cpp's, which vLLM's guided_grammar
    also takes) converted."""
    try:
        return any_to_lark(text)
    # llguidance's GBNF converter (pure Python) reports bad input with GbnfToLarkError, but
    # also with a bare Exception (an undefined rule) or IndexError (a truncated rule); it only
    # reads `text`, so any error it raises means the grammar is bad: a 400, never a 500.
    except Exception as exc:
        what = "" if isinstance(exc, GbnfToLarkError) else f"{type(exc).__name__}: "
        raise InvalidRequestError(f"the grammar is invalid: {what}{exc}", param) from None


def _what(guide: Guide) -> str:
    match guide:
        case JsonSchemaGuide():
            return "the JSON schema"
        case RegexGuide():
            return "the regex"
        case LarkGuide():
            return "the grammar"
    return "the guide"
