"""One JSON value read from text that arrives in pieces, written out as it is read in the
one canonical form the whole-output parsers give a call's arguments (`dumps_canonical`):
`json.dumps(json.loads(text), ensure_ascii=False, allow_nan=False)`, a lone surrogate
(`"\\ud800"`: no character, UTF-8 cannot carry it) kept as its escape. The pieces written so
far are always a prefix of that text, so streamed argument deltas join to exactly the
arguments a non-streamed response carries.

    raw:        {"city" :"Par\\u00eds",   "days":1E1}
    canonical:  {"city": "París", "days": 10.0}

What json.loads reads and json.dumps then refuses (NaN, Infinity, an integer too long for
int()) fails, as does an object with a repeated key (the whole-output parsers refuse those
too: see tool_call.loads_json), and so does nesting deeper than MAX_JSON_DEPTH containers
(the whole-output parsers' limit too). Pure, no recursion (nesting is an explicit stack).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "JSON_SPACE",
    "MAX_JSON_DEPTH",
    "CanonicalJson",
    "dumps_canonical",
    "json_depth",
    "loads_bounded",
    "within_depth",
]

MAX_JSON_DEPTH = 256  # nested containers a call may carry, streamed or whole (far below
# the recursion limit that json.loads would otherwise hit at ~1,000 levels)

JSON_SPACE = " \t\n\r"  # the whitespace json.loads skips (str.isspace is wider)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")
_SURROGATE = re.compile("[\ud800-\udfff]")  # left in a str by json.loads: a lone one


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dumps_canonical(value: Any) -> str:
    """The canonical JSON text of `value` (ValueError for NaN and infinities): non-ASCII
    characters as they are, lone surrogates escaped (a surrogate in a str is always lone
    once json.loads has read it: it joins a pair into one character)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return _SURROGATE.sub(_escaped, text) if _SURROGATE.search(text) else text


def json_depth(value: object) -> int:
    """The deepest nesting of containers (dicts and lists) in a decoded JSON value; 0 for a
    scalar. Iterative: any depth json.loads returned is measured."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in children)
    return deepest


def loads_bounded(text: str, decoder: json.JSONDecoder | None = None) -> Any:
    """`json.loads(text)` (or `decoder.decode`), refusing (ValueError) nesting deeper than
    MAX_JSON_DEPTH containers: past ~1,000 levels json.loads raises RecursionError, and a
    value nested nearly as deep breaks code that recurses into it (a chat template)."""
    try:
        value = (decoder or _PLAIN).decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    return within_depth(value)


def within_depth(value: Any) -> Any:
    """`value` (decoded JSON), or ValueError when it nests deeper than MAX_JSON_DEPTH."""
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError("JSON nested too deep")
    return value


_PLAIN = json.JSONDecoder()


class _Failed(Exception):
    """The text is not one JSON value that the canonical form can carry."""


class CanonicalJson:
    """Feed the text from the value's first character on; each `feed` returns the
    canonical text now certain. Once `done`, `rest` holds the text fed after the value's
    end; once `failed`, nothing more is read. A top-level value must be an object, an
    array or a string (the only ones the call formats stream, and ones whose end is seen)."""

    def __init__(self) -> None:
        self.done = False
        self.failed = False
        self.rest = ""
        self.value_text = ""  # the canonical text written so far
        # open containers: "{" or "[" with the keys seen in each object
        self._stack: list[tuple[str, set[str]]] = []
        self._expect = "value"  # value | key | colon | comma | first_key | first_item
        self._token = ""  # a number or literal being read
        self._string: list[str] | None = None  # a string being read (decoded chars)
        self._escape: str | None = None  # after a backslash: "" or the \\u digits so far
        self._high: int | None = None  # a \\u high surrogate waiting for its pair
        self._is_key = False
        self._started = False

    def feed(self, text: str) -> str:
        if self.done:
            self.rest += text
            return ""
        if self.failed:
            return ""
        out: list[str] = []
        try:
            for at, char in enumerate(text):
                self._char(char, out)
                if self.done:
                    self.rest = text[at + 1 :]
                    break
        except _Failed:
            self.failed = True
        written = "".join(out)
        self.value_text += written
        return written

    # ---- one character -------------------------------------------------------------------
    def _char(self, char: str, out: list[str]) -> None:
        if self._string is not None:
            self._string_char(char, out)
        elif self._token:
            if char in _NUMBER_CHARS or char.isalpha():
                self._token += char
                return
            self._end_token(out)
            self._structural(char, out)
        else:
            self._structural(char, out)

    def _structural(self, char: str, out: list[str]) -> None:
        if char in JSON_SPACE:
            return
        expect = self._expect
        if expect in ("key", "first_key"):
            if char == '"':
                self._open_string(out, is_key=True)
            elif char == "}" and expect == "first_key":
                self._close(out)
            else:
                raise _Failed
        elif expect == "colon":
            if char != ":":
                raise _Failed
            out.append(": ")
            self._expect = "value"
        elif expect == "comma":
            kind = self._stack[-1][0]
            if char == ",":
                out.append(", ")
                self._expect = "key" if kind == "{" else "value"
            elif char == ("}" if kind == "{" else "]"):
                self._close(out)
            else:
                raise _Failed
        elif char == "]" and expect == "first_item":
            self._close(out)
        else:
            self._value_start(char, out)

    def _value_start(self, char: str, out: list[str]) -> None:
        top = not self._started
        self._started = True
        if char in "{[":
            if len(self._stack) >= MAX_JSON_DEPTH:
                raise _Failed
            self._stack.append((char, set()))
            out.append(char)
            self._expect = "first_key" if char == "{" else "first_item"
        elif char == '"':
            self._open_string(out, is_key=False)
        elif not top and (char == "-" or char.isdigit() or char.isalpha()):
            self._token = char
        else:
            raise _Failed

    def _end_token(self, out: list[str]) -> None:
        token, self._token = self._token, ""
        if token in _LITERALS:
            out.append(token)
        elif _NUMBER.fullmatch(token):
            try:  # the float or int json reads, as json writes it (1E1 -> 10.0, -0 -> 0)
                out.append(json.dumps(json.loads(token), allow_nan=False))
            except ValueError:  # 1e999 is inf; an int past int()'s digit limit
                raise _Failed from None
        else:  # NaN, Infinity, or not JSON
            raise _Failed
        self._value_end()

    def _close(self, out: list[str]) -> None:
        kind, _ = self._stack.pop()
        out.append("}" if kind == "{" else "]")
        self._value_end()

    def _value_end(self) -> None:
        if self._stack:
            self._expect = "comma"
        else:
            self.done = True

    # ---- strings ----------------------------------------------------------------------
    def _open_string(self, out: list[str], *, is_key: bool) -> None:
        if not self._started:
            self._started = True
        self._string, self._is_key = [], is_key
        if not is_key:
            out.append('"')

    def _string_char(self, char: str, out: list[str]) -> None:
        if self._escape is not None:
            self._escape_char(char, out)
        elif char == "\\":
            self._escape = ""
        elif char == '"':
            self._flush_high(out)
            self._close_string(out)
        elif char < " ":  # json.loads (strict) refuses raw control characters
            raise _Failed
        else:
            self._flush_high(out)
            self._decoded(char, out)

    def _escape_char(self, char: str, out: list[str]) -> None:
        assert self._escape is not None
        if self._escape == "":
            if char == "u":
                self._escape = "u"
                return
            if char not in _ESCAPES:
                raise _Failed
            self._escape = None
            self._flush_high(out)
            self._decoded(_ESCAPES[char], out)
            return
        if char not in _HEX:
            raise _Failed
        self._escape += char
        if len(self._escape) < 5:
            return
        code, self._escape = int(self._escape[1:], 16), None
        # json joins a high surrogate and a low one that follows it at once; any other
        # surrogate stays a lone one
        if self._high is not None and 0xDC00 <= code <= 0xDFFF:
            high, self._high = self._high, None
            self._decoded(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)), out)
            return
        self._flush_high(out)
        if 0xD800 <= code <= 0xDBFF:
            self._high = code
        else:
            self._decoded(chr(code), out)

    def _flush_high(self, out: list[str]) -> None:
        if self._high is not None:
            high, self._high = self._high, None
            self._decoded(chr(high), out)

    def _decoded(self, char: str, out: list[str]) -> None:
        assert self._string is not None
        self._string.append(char)
        if not self._is_key:  # a key is written whole, once known not to repeat
            out.append(dumps_canonical(char)[1:-1])

    def _close_string(self, out: list[str]) -> None:
        assert self._string is not None
        text, self._string = "".join(self._string), None
        if not self._is_key:
            out.append('"')
            self._value_end()
            return
        keys = self._stack[-1][1]
        if text in keys:
            raise _Failed
        keys.add(text)
        out.append(dumps_canonical(text))
        self._expect = "colon"
