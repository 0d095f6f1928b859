"""Lone UTF-16 surrogates in a decoded JSON body.

JSON may escape any code unit (`"\\ud800"`), and Python's decoder keeps an unpaired one as a
surrogate code point: a `str` that cannot be encoded as UTF-8, so the tokenizer, the log and
the response encoder all fail on it. A body holding one is refused at the edge with a 400.
"""

from __future__ import annotations

import re

__all__ = ["LONE_SURROGATE", "find_lone_surrogate"]

LONE_SURROGATE = "lone_surrogate"  # the validation error type; its ctx names the `param`

# A valid pair in the JSON text decodes to one code point above U+FFFF; any surrogate code
# point left in a decoded str is a lone one.
_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(value: object) -> str | None:
    """The dotted path (`messages.0.content.1.text`) of a string in a decoded JSON value that
    holds a lone surrogate (of the object, for a key that does; "" for the value itself); None
    if none does. Walks with its own stack: a deeply nested body cannot exhaust the recursion
    limit."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and _SURROGATE.search(key):
                    return path
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), c) for i, c in enumerate(item))
    return None
