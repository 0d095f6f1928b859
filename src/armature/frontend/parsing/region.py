"""The stream shared by formats whose calls fill the rest of the output (Llama 3 JSON,
pythonic lists, Mistral): content until the region of calls begins, then the region held
whole and parsed at the end, because only the whole region says whether it is calls.

Where the region may begin:
- `at_start`: only at the output's start, leading whitespace aside, opened by one of
  `openers` (a format whose output either is calls or is not);
- otherwise: at the first `openers[0]` anywhere (content before it stays content).

`parse_region(region)` gets the text from the opener to the end and returns the calls, or
None when the region is not calls; then the whole output is content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from armature.frontend.parsing.tool_call import ParsedToolCalls, ToolCall, held_prefix_chars

__all__ = ["RegionFormat", "RegionStream"]

RegionParse = Callable[[str], tuple[ToolCall, ...] | None]


@dataclass(frozen=True)
class RegionFormat:
    openers: tuple[str, ...]
    at_start: bool
    parse_region: RegionParse
    markers: tuple[str, ...] = ()  # see ToolCallParser

    def parse(self, text: str) -> ParsedToolCalls:
        """The whole output at once."""
        if self.at_start:
            body = text.lstrip()
            if not body.startswith(self.openers):
                return ParsedToolCalls(text)
            begin = len(text) - len(body)
        else:
            begin = text.find(self.openers[0])
            if begin < 0:
                return ParsedToolCalls(text)
        calls = self.parse_region(text[begin:])
        if not calls:
            return ParsedToolCalls(text)
        return ParsedToolCalls("" if self.at_start else text[:begin], calls)

    def stream(self) -> RegionStream:
        return RegionStream(self)


class RegionStream:
    def __init__(self, fmt: RegionFormat) -> None:
        self._format = fmt
        self._pending = ""  # held text: undecided start, partial opener, or the region
        self._in_region = False
        self._decided = not fmt.at_start  # at_start: whether the output opens a region

    def feed(self, text: str) -> ParsedToolCalls:
        self._pending += text
        if self._in_region:
            return ParsedToolCalls("")
        if self._format.at_start:
            return ParsedToolCalls(self._decide_start())
        opener = self._format.openers[0]
        begin = self._pending.find(opener)
        if begin >= 0:
            shown, self._pending = self._pending[:begin], self._pending[begin:]
            self._in_region = True
            return ParsedToolCalls(shown)
        keep = held_prefix_chars(self._pending, opener)
        cut = len(self._pending) - keep
        shown, self._pending = self._pending[:cut], self._pending[cut:]
        return ParsedToolCalls(shown)

    def finish(self) -> ParsedToolCalls:
        """The region parsed, or (not calls) all held text as content: the content shown
        before plus this is then the whole output."""
        region, self._pending = self._pending, ""
        if not self._in_region:
            return ParsedToolCalls(region)
        calls = self._format.parse_region(region.lstrip())
        if not calls:
            return ParsedToolCalls(region)
        return ParsedToolCalls("", calls)

    def _decide_start(self) -> str:
        """At the start: hold while the text may still open a region; returns what to show."""
        if self._decided:
            shown, self._pending = self._pending, ""
            return shown
        body = self._pending.lstrip()
        if body.startswith(self._format.openers):
            self._in_region = self._decided = True
            return ""
        if not body or any(o.startswith(body) for o in self._format.openers):
            return ""
        self._decided = True
        shown, self._pending = self._pending, ""
        return shown
