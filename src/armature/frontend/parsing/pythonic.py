"""Pythonic tool calls (Llama 3.2 light models, Llama 4, ToolACE): the whole output is a
Python list of calls with keyword arguments, optionally between Llama 4's tags:

    [get_weather(city="Paris", days=3), get_time(zone="CET")]

Read with `ast` (never evaluated): each argument must be a literal (strings, numbers,
booleans, None, and lists and dicts of them) that JSON can carry.
"""

from __future__ import annotations

import ast

from armature.frontend.parsing.json_canon import dumps_canonical
from armature.frontend.parsing.region import RegionFormat
from armature.frontend.parsing.tool_call import ToolCall

__all__ = ["PYTHONIC", "parse_call_list"]

START_TAG = "<|python_start|>"
END_TAG = "<|python_end|>"


def parse_call_list(region: str) -> tuple[ToolCall, ...] | None:
    text = region.strip()
    if text.startswith(START_TAG):
        text = text.removeprefix(START_TAG).strip().removesuffix(END_TAG)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a NUL character in the source
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = [_call(node) for node in tree.body.elts]
    if any(call is None for call in calls):
        return None
    return tuple(call for call in calls if call is not None)


def _call(node: ast.expr) -> ToolCall | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **kwargs
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    try:
        text = dumps_canonical(arguments)
    except (TypeError, ValueError):  # sets, bytes, complex numbers, NaN: not JSON
        return None
    return ToolCall(node.func.id, text)


PYTHONIC = RegionFormat(
    openers=("[", START_TAG),
    at_start=True,
    parse_region=parse_call_list,
    markers=(START_TAG, END_TAG),
)
