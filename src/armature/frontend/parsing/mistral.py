"""Mistral tool calls: content, then `[TOOL_CALLS]` and the calls to the end, either as a
JSON list (tokenizer v3-v7) or, per call, `name[ARGS]{arguments}` (v11 and later):

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

`[TOOL_CALLS]` and `[ARGS]` are special tokens in Mistral's own vocabularies, which decoding
drops: where the tokenizer holds them so, the frontend keeps exactly these token ids in the
text it decodes (chat_setup.py, the detokenizer's `kept_tokens`), so the parser sees them.
"""

from __future__ import annotations

from armature.frontend.parsing.call_reader import ArgumentsReader, CallObjectReader
from armature.frontend.parsing.json_canon import JSON_SPACE
from armature.frontend.parsing.region import RegionFormat
from armature.frontend.parsing.tool_call import (
    CallDelta,
    ToolCall,
    call_from_object,
    cut_at_marker,
    loads_json,
)

__all__ = ["MISTRAL", "TOOL_CALLS", "MistralReader", "parse_mistral_calls"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


def parse_mistral_calls(region: str) -> tuple[ToolCall, ...] | None:
    """Every `[TOOL_CALLS]` segment of the region, each a list of calls or one named call."""
    calls: list[ToolCall] = []
    for segment in region.split(TOOL_CALLS)[1:]:
        found = _segment_calls(segment.strip())
        if found is None:
            return None
        calls.extend(found)
    return tuple(calls) or None


def _segment_calls(segment: str) -> list[ToolCall] | None:
    if segment.startswith("["):
        try:
            items = loads_json(segment)
        except ValueError:
            return None
        if not isinstance(items, list):
            return None
        calls = [call_from_object(item) for item in items]
        return None if None in calls else [c for c in calls if c is not None]
    name, sep, arguments = segment.partition(ARGS)
    if not sep or not name or name != name.strip():
        return None
    try:
        obj = loads_json(arguments)
    except ValueError:
        return None
    call = call_from_object({"name": name, "arguments": obj})
    return None if call is None else [call]


class MistralReader:
    """`parse_mistral_calls`'s region as it streams (a RegionReader): cut at each
    `[TOOL_CALLS]` as the whole-output parse cuts it, each segment read by a _Segment."""

    def __init__(self) -> None:
        self.failed = False
        self.num_begun = 0
        self._held = ""  # a partial [TOOL_CALLS] at the end
        self._segment: _Segment | None = None
        self._num_calls = 0  # in the segments complete

    def feed(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        self._held += text
        while not self.failed:
            ready, self._held, found = cut_at_marker(self._held, TOOL_CALLS)
            self._take(ready, out)
            if not found:
                break
            self._end_segment()
            self._segment = _Segment(self.num_begun)
        return out

    def finish(self) -> bool:
        self._take(self._held, [])
        self._end_segment()
        return not self.failed and self._num_calls > 0

    def _take(self, text: str, out: list[CallDelta]) -> None:
        if not text or self.failed:
            return
        assert self._segment is not None, "the region opens with [TOOL_CALLS]"
        out += self._segment.feed(text)
        self.num_begun = self._segment.first_number + self._segment.num_begun
        self.failed = self._segment.failed

    def _end_segment(self) -> None:
        if self._segment is not None and not self.failed:
            self.failed = self._segment.state != "after"
            self._num_calls += self._segment.num_begun


class _Segment:
    """One segment's text after its `[TOOL_CALLS]`: a JSON list of call objects, or
    `name[ARGS]arguments`; complete when `state` is "after"."""

    def __init__(self, first_number: int) -> None:
        self.first_number = first_number
        self.num_begun = 0
        self.failed = False
        # start | list (just opened) | item | comma | call | name | arguments | after
        self.state = "start"
        self._call = CallObjectReader(first_number)
        self._name = ""
        self._name_pieces: list[str] = []  # the name's text so far, until [ARGS]
        self._name_chars = 0  # their length
        self._name_tail = ""  # their last len(ARGS) - 1 characters
        self._arguments = ArgumentsReader()

    def feed(self, text: str) -> list[CallDelta]:
        out: list[CallDelta] = []
        while text and not self.failed:
            state = self.state
            if state == "call":
                out += self._call.feed(text)
                self.num_begun = self._call.number - self.first_number + self._call.header_sent
                self.failed = self._call.failed
                if not self._call.done:
                    break
                text, self.state = self._call.rest, "comma"
            elif state == "name":
                text = self._read_name(text)
            elif state == "arguments":
                text = self._read_arguments(text, out)
            elif state == "start" and not text[0].isspace():
                self.state = "list" if text[0] == "[" else "name"
                text = text[1:] if text[0] == "[" else text
            elif _is_space(state, text[0]):
                text = text[1:]
            elif state in ("list", "item") and text[0] == "{":
                self._call, self.state = (
                    CallObjectReader(self.first_number + self.num_begun),
                    "call",
                )
            elif state in ("list", "comma") and text[0] == "]":
                text, self.state = text[1:], "after"
            elif state == "comma" and text[0] == ",":
                text, self.state = text[1:], "item"
            else:
                self.failed = True
        return out

    def _read_name(self, text: str) -> str:
        """The text after `[ARGS]` once the name is whole. Only the new text and the end of
        the old (which may begin `[ARGS]`) is searched: linear in a long name-form output."""
        window = self._name_tail + text
        at = window.find(ARGS)
        if at < 0:
            self._name_pieces.append(text)
            self._name_chars += len(text)
            self._name_tail = window[-(len(ARGS) - 1) :]
            return ""
        position = self._name_chars - len(self._name_tail) + at  # in the whole name text
        whole = "".join(self._name_pieces) + text
        name, rest = whole[:position], whole[position + len(ARGS) :]
        if not name or name != name.strip():
            self.failed = True
        self._name, self.state = name, "arguments"
        return rest

    def _read_arguments(self, text: str, out: list[CallDelta]) -> str:
        """The text after the arguments once they are whole."""
        begun = self._arguments.started
        arguments = self._arguments.feed(text)
        self.failed = self._arguments.failed
        if not begun and self._arguments.started and not self.failed:
            self.num_begun = 1
            out.append(CallDelta(self.first_number, self._name, arguments))
        elif arguments:
            out.append(CallDelta(self.first_number, None, arguments))
        if not self._arguments.done:
            return ""
        self.state = "after"
        return self._arguments.rest


def _is_space(state: str, char: str) -> bool:
    """Whitespace the segment skips: str.strip's around it, JSON's inside its list."""
    if state in ("start", "after"):
        return char.isspace()
    return state in ("list", "item", "comma") and char in JSON_SPACE


MISTRAL = RegionFormat(
    openers=(TOOL_CALLS,),
    at_start=False,
    parse_region=parse_mistral_calls,
    markers=(TOOL_CALLS, ARGS),
    reader=MistralReader,
)
