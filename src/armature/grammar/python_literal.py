"""Lark rules (llguidance's dialect) for Python literals valid against a JSON Schema: what a
pythonic tool call's keyword arguments are (`f(city="Paris", days=3)`, read back with
`ast.literal_eval`). Pure.

Strings and numbers are written as JSON writes them, which Python reads as the same value,
so their schemas (lengths, patterns, bounds) go to llguidance's own JSON grammar (`%json`);
the rest is built here, in Python's spelling: True, False, None, lists, dicts with string
keys. Properties come in the schema's order, each optional one may be left out. A schema
keyword this cannot honour (references, oneOf, allOf, tuples, unique items...) is refused
(InvalidRequestError naming the schema's place) rather than ignored.
"""

from __future__ import annotations

import json
import keyword
from typing import Any

from armature.errors import InvalidRequestError

__all__ = ["PythonLiteralRules", "python_literal"]

# structure this builder does not turn into grammar (keywords of string and number schemas
# go to llguidance, which refuses what it does not know)
_REFUSED = frozenset(
    {
        "$ref",
        "$defs",
        "definitions",
        "oneOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "prefixItems",
        "contains",
        "uniqueItems",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
_LEAF_TYPES = ("string", "number", "integer")
_GENERIC = """py_value: py_string | py_number | "True" | "False" | "None" | py_list | py_dict
py_list: "[" (py_value (", " py_value)*)? "]"
py_dict: "{" (py_string ": " py_value (", " py_string ": " py_value)*)? "}"
py_string: %json {"type": "string"}
py_number: %json {"type": "number"}"""
_KEY = 'py_key: %json {"type": "string"}'


def python_literal(value: Any) -> str:
    """`value` (JSON data) as Python source that `ast.literal_eval` reads back as it."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return json.dumps(value, ensure_ascii=False)  # str, int, float


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal (JSON's escapes)


class PythonLiteralRules:
    """Collects the rules of one grammar (names `py_*`). `lines()` gives them, with the
    rules of any Python value when a schema asked for one."""

    def __init__(self) -> None:
        self._rules: list[str] = []
        self._uses_generic = False
        self._uses_key = False

    def lines(self) -> list[str]:
        generic = _GENERIC.splitlines() if self._uses_generic else []
        return self._rules + generic + ([_KEY] if self._uses_key else [])

    def keyword_arguments(self, schema: dict[str, Any], where: str) -> str | None:
        """An expression of `name=value, ...` for an object schema's properties (None: the
        call takes no arguments)."""
        self._check(schema, where)
        entries = []
        required = set(schema.get("required", ()))
        for name, sub in schema.get("properties", {}).items():
            if not name.isidentifier() or keyword.iskeyword(name):
                raise InvalidRequestError(
                    f"the parameter {name!r} cannot be a Python keyword argument (the "
                    "pythonic call format); use tool_choice 'auto'",
                    param=f"{where}.properties",
                )
            value = self.value(sub, f"{where}.properties.{name}")
            entries.append((f'"{name}=" {value}', name in required))
        return self._sequence(entries)

    def value(self, schema: Any, where: str) -> str:
        """An expression of the Python literals `schema` allows."""
        if schema is True or schema == {}:
            self._uses_generic = True
            return "py_value"
        if not isinstance(schema, dict):
            raise InvalidRequestError("a schema must be an object", param=where)
        self._check(schema, where)
        if "const" in schema:
            return _lit(python_literal(schema["const"]))
        if "enum" in schema:
            return "(" + " | ".join(_lit(python_literal(v)) for v in schema["enum"]) + ")"
        if "anyOf" in schema:
            branches = schema["anyOf"]
            return "(" + " | ".join(self.value(b, f"{where}.anyOf") for b in branches) + ")"
        kind = schema.get("type")
        if isinstance(kind, list):
            options = [self.value({**schema, "type": k}, where) for k in kind]
            return "(" + " | ".join(options) + ")"
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        return self._typed(schema, kind, where)

    def _typed(self, schema: dict[str, Any], kind: str | None, where: str) -> str:
        if kind in _LEAF_TYPES:
            return self._rule(f"%json {json.dumps(schema)}")
        if kind == "boolean":
            return '("True" | "False")'
        if kind == "null":
            return '"None"'
        if kind == "object":
            return self._object(schema, where)
        if kind == "array":
            return self._array(schema, where)
        if kind is None:  # annotations only: any value
            self._uses_generic = True
            return "py_value"
        raise InvalidRequestError(f"unknown type {kind!r}", param=f"{where}.type")

    def _object(self, schema: dict[str, Any], where: str) -> str:
        properties = schema.get("properties")
        if not properties:
            extra = schema.get("additionalProperties", True)
            if extra is False:
                return '"{}"'
            value = self.value(extra, f"{where}.additionalProperties")
            entry = f"py_key {_lit(': ')} {value}"
            self._uses_key = True
            return f'"{{" ({entry} (", " {entry})*)? "}}"'
        required = set(schema.get("required", ()))
        entries = []
        for key, sub in properties.items():
            value = self.value(sub, f"{where}.properties.{key}")
            entries.append((f"{_lit(python_literal(key) + ': ')} {value}", key in required))
        inner = self._sequence(entries)
        return '"{" ' + (inner + " " if inner else "") + '"}"'

    def _array(self, schema: dict[str, Any], where: str) -> str:
        item = self.value(schema.get("items", True), f"{where}.items")
        low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
        if high is not None and int(high) == 0:
            return '"[]"'
        most = "" if high is None else str(int(high) - 1)
        body = f'{item} (", " {item}){{{max(low - 1, 0)},{most}}}'
        return f'"[" ({body})' + ("?" if low == 0 else "") + ' "]"'

    def _sequence(self, entries: list[tuple[str, bool]]) -> str | None:
        """The entries (expression, required) in order, separated by ", ", each optional one
        may be left out; None when there are none. Linear in rules: tail k is entries k.. each
        after a comma, the head the first one written, without."""
        tails: list[str | None] = [None] * (len(entries) + 1)
        for k in reversed(range(1, len(entries))):  # the first entry is never after a comma
            expr, required = entries[k]
            item = f'", " {expr}' if required else f'(", " {expr})?'
            tails[k] = self._rule(f"{item} {tails[k + 1] or ''}".strip())
        head: str | None = None  # entries k.. with at least one written
        may_be_empty = True
        for k in reversed(range(len(entries))):
            expr, required = entries[k]
            first = f"{expr} {tails[k + 1] or ''}".strip()
            if required:
                head, may_be_empty = first, False
            else:
                head = first if head is None else f"({first} | {head})"
        if head is None:
            return None
        return f"{self._rule(head)}" + ("?" if may_be_empty else "")

    def _rule(self, body: str) -> str:
        name = f"py_{len(self._rules)}"
        self._rules.append(f"{name}: {body}")
        return name

    @staticmethod
    def _check(schema: dict[str, Any], where: str) -> None:
        refused = sorted(_REFUSED & set(schema))
        if refused:
            raise InvalidRequestError(
                f"the pythonic call format's grammar does not take the JSON Schema keyword "
                f"{refused[0]!r}; use tool_choice 'auto'",
                param=where,
            )
