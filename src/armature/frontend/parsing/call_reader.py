"""Readers of one call's JSON as it streams, shared by the JSON formats (hermes, llama3,
mistral): `ArgumentsReader` for an arguments value, `CallObjectReader` for a whole
`{"name": ..., "arguments"|"parameters": ..., "type": "function"}` object. Each accepts
exactly what `call_from_object` accepts, and writes the arguments in the canonical text it
gives them (json_canon.py).

A reader's first delta (the call's name) goes out once the name is known and the arguments
have begun, so an object that names a function but never gives arguments, or starts with
a key no call has, fails before anything is sent.
"""

from __future__ import annotations

import json

from armature.frontend.parsing.json_canon import JSON_SPACE, CanonicalJson, dumps_canonical
from armature.frontend.parsing.tool_call import ARGUMENT_KEYS, CallDelta, loads_json

__all__ = ["ArgumentsReader", "CallObjectReader"]

_CALL_KEYS = frozenset(("name", "type", *ARGUMENT_KEYS))


class ArgumentsReader:
    """A call's arguments value from its first character (JSON whitespace before it is
    skipped): an object, written as it is read, or a string holding an object's JSON text,
    written whole when the string ends (its content is only JSON once complete). `feed`
    returns the canonical arguments text now certain; `done`, `failed` and `rest` as
    CanonicalJson's."""

    def __init__(self) -> None:
        self._json: CanonicalJson | None = None
        self._is_text = False
        self.failed = False

    @property
    def started(self) -> bool:
        return self._json is not None

    @property
    def done(self) -> bool:
        return self._json is not None and self._json.done and not self.failed

    @property
    def rest(self) -> str:
        assert self._json is not None
        return self._json.rest

    def feed(self, text: str) -> str:
        if self.failed:
            return ""
        if self._json is None:
            text = text.lstrip(JSON_SPACE)
            if not text:
                return ""
            if text[0] not in '{"':
                self.failed = True
                return ""
            self._json, self._is_text = CanonicalJson(), text[0] == '"'
        was_done = self._json.done
        written = self._json.feed(text)
        if self._json.failed:
            self.failed = True
            return ""
        if not self._is_text:
            return written
        if self._json.done and not was_done:
            return self._decoded_text(self._json.value_text)
        return ""

    def _decoded_text(self, string_json: str) -> str:
        try:
            obj = loads_json(json.loads(string_json))
            if isinstance(obj, dict):
                return dumps_canonical(obj)
        except ValueError:
            pass
        self.failed = True
        return ""


class CallObjectReader:
    """One call object from its `{` (JSON whitespace before it is skipped). `feed` returns
    the call's deltas now certain, numbered `number`; `done` once the object closed as a
    call, `failed` once it cannot be one; `rest`: the text fed after its end."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.done = False
        self.failed = False
        self.rest = ""
        self.header_sent = False
        self._opened = False
        self._expect = "first_key"  # first_key | key | colon | value | comma
        self._keys: set[str] = set()
        self._key: str | None = None  # the key whose value is being read
        self._part: CanonicalJson | None = None  # a key, or a name or type value
        self._arguments: ArgumentsReader | None = None
        self._name: str | None = None
        self._held = ""  # arguments text read before the name

    def feed(self, text: str) -> list[CallDelta]:
        if self.done:
            self.rest += text
            return []
        out: list[CallDelta] = []
        while text and not (self.done or self.failed):
            arguments = self._arguments
            if arguments is not None and self._key in ARGUMENT_KEYS:
                self._send(arguments.feed(text), out)
                self.failed = arguments.failed
                if not arguments.done:
                    return out
                text, self._key, self._expect = arguments.rest, None, "comma"
            elif self._part is not None:
                self._part.feed(text)
                self.failed = self._part.failed
                if not self._part.done:
                    return out
                text = self._part.rest
                self._part_read(out)
            elif text[0] in JSON_SPACE:
                text = text[1:]
            elif self._expect == "value" and self._opened:  # the value gets this text
                if self._key in ARGUMENT_KEYS:
                    self._arguments = ArgumentsReader()
                else:
                    self._part = CanonicalJson()
            else:
                char, text = text[0], text[1:]
                self._structural(char)
        if self.done:
            self.rest += text
        return out

    def _structural(self, char: str) -> None:
        expect = self._expect
        if not self._opened:
            self._opened = char == "{"
            self.failed = not self._opened
        elif expect in ("first_key", "key") and char == '"':
            self._part = CanonicalJson()
            self._part.feed(char)
            self._expect = "colon"
        elif expect in ("first_key", "comma") and char == "}":
            self._close()
        elif expect == "comma" and char == ",":
            self._expect = "key"
        elif expect == "colon" and char == ":" and self._key is not None:
            self._expect = "value"
        else:
            self.failed = True

    def _part_read(self, out: list[CallDelta]) -> None:
        assert self._part is not None
        try:  # the canonical text of one value: only its depth can refuse it here
            value, self._part = loads_json(self._part.value_text), None
        except ValueError:
            self.failed, self._part = True, None
            return
        if self._expect == "colon" and self._key is None:  # a key
            repeated = value in ARGUMENT_KEYS and bool(self._keys & set(ARGUMENT_KEYS))
            if value not in _CALL_KEYS or value in self._keys or repeated:
                self.failed = True
            self._keys.add(value)
            self._key = value
            return
        if self._key == "name":
            if not isinstance(value, str) or not value:
                self.failed = True
            else:
                self._name = value
                self._send("", out)
        elif value != "function":  # "type"
            self.failed = True
        self._key, self._expect = None, "comma"

    def _send(self, arguments: str, out: list[CallDelta]) -> None:
        """Arguments text now read: sent, or held until the name is known."""
        self._held += arguments
        reader = self._arguments
        started = reader is not None and reader.started and not reader.failed
        if self._name is None or not (started or self.header_sent):
            return
        if not self.header_sent:
            self.header_sent = True
            out.append(CallDelta(self.number, self._name, self._held))
        elif self._held:
            out.append(CallDelta(self.number, None, self._held))
        self._held = ""

    def _close(self) -> None:
        if self._name is None or not self._keys & set(ARGUMENT_KEYS):
            self.failed = True
        else:
            self.done = True
