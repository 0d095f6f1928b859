"""The stream shared by formats whose calls fill the rest of the output (Llama 3 JSON,
pythonic lists, Mistral): content until the region of calls begins, then the region's calls
streamed by the format's `reader` as they are read. Only the whole region says whether it is
calls: a region that turns out not to be breaks the calls it began (tool_call.py) and is
content from then on; its calls are whole at the end of the output. A format without a
reader holds the region whole and parses it at the end.

Where the region may begin:
- `at_start`: only at the output's start, leading whitespace aside, opened by one of
  `openers` (a format whose output either is calls or is not);
- otherwise: at the first `openers[0]` anywhere (content before it stays content).

`parse_region(region)` gets the text from the opener to the end and returns the calls, or
None when the region is not calls; then the whole output is content, as it is when a call
names a function not offered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from armature.frontend.parsing.tool_call import (
    BrokenCall,
    CallDelta,
    ParsedToolCalls,
    StreamedToolCalls,
    StreamPart,
    ToolCall,
    WholeCall,
    held_prefix_chars,
    offered,
)

__all__ = ["RegionFormat", "RegionStream"]

RegionParse = Callable[[str], tuple[ToolCall, ...] | None]


class RegionReader(Protocol):
    """Reads a region as it streams, accepting exactly what `parse_region` accepts: `feed`
    takes the region's text from its opener on and returns the call deltas now certain;
    `failed` once the region cannot be calls; `finish` says whether it was. `num_begun`:
    the calls whose first delta went out (numbered from 0)."""

    @property
    def failed(self) -> bool: ...

    @property
    def num_begun(self) -> int: ...

    def feed(self, text: str) -> list[CallDelta]: ...

    def finish(self) -> bool: ...


@dataclass(frozen=True)
class RegionFormat:
    openers: tuple[str, ...]
    at_start: bool
    parse_region: RegionParse
    markers: tuple[str, ...] = ()  # see ToolCallParser
    # streams the region's calls as they are read; None: the region is read whole at the end
    reader: Callable[[], RegionReader] | None = None

    def parse(self, text: str, names: Collection[str] | None = None) -> ParsedToolCalls:
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
        if not calls or not all(offered(call, names) for call in calls):
            return ParsedToolCalls(text)
        return ParsedToolCalls("" if self.at_start else text[:begin], calls)

    def stream(self, names: Collection[str] | None = None) -> RegionStream:
        return RegionStream(self, names)


class RegionStream:
    def __init__(self, fmt: RegionFormat, names: Collection[str] | None = None) -> None:
        self._format = fmt
        self._names = names
        self._pending = ""  # held text before the region: undecided start, partial opener
        # the region's text so far, in pieces: joined only at its end (a string grown by +=
        # on an attribute is copied whole on every piece: quadratic in a long region)
        self._region: list[str] = []
        self._in_region = False
        self._decided = not fmt.at_start  # at_start: whether the output opens a region
        self._reader = None if fmt.reader is None else fmt.reader()
        self._not_calls = False  # the region turned out not to be calls: all is content

    def feed(self, text: str) -> StreamedToolCalls:
        if self._not_calls:
            return StreamedToolCalls.of([text])
        parts: list[StreamPart] = []
        if not self._in_region:
            self._pending += text
            parts.append(self._before_region())
            if not self._in_region:
                return StreamedToolCalls.of(parts)
            text, self._pending = self._pending, ""
        self._region.append(text)
        if self._reader is not None:
            deltas = self._reader.feed(text)
            parts.extend(deltas)
            if self._reader.failed or not all(offered(d, self._names) for d in deltas):
                self._break(parts)
        return StreamedToolCalls.of(parts)

    def finish(self) -> StreamedToolCalls:
        """The rest: the region's last deltas, or (not calls) all held text as content: the
        content shown before plus this is then the whole output."""
        if self._not_calls:
            return StreamedToolCalls()
        if not self._in_region:
            return StreamedToolCalls.of([self._pending])
        parts: list[StreamPart] = []
        if self._reader is not None:
            if self._reader.finish():
                parts.extend(WholeCall(number) for number in range(self._reader.num_begun))
            else:
                self._break(parts)
            return StreamedToolCalls.of(parts)
        # read whole: each call in one delta, name and arguments together
        region = "".join(self._region)
        calls = self._format.parse_region(region.lstrip())
        if not calls or not all(offered(call, self._names) for call in calls):
            return StreamedToolCalls.of([region])
        for number, call in enumerate(calls):
            parts += [CallDelta(number, call.name, call.arguments), WholeCall(number)]
        return StreamedToolCalls(tuple(parts))

    def _break(self, parts: list[StreamPart]) -> None:
        """The region is not calls: its begun calls break and its text is content."""
        assert self._reader is not None
        parts.extend(BrokenCall(number) for number in range(self._reader.num_begun))
        parts.append("".join(self._region))
        self._region, self._not_calls = [], True

    def _before_region(self) -> str:
        """Before the region: what to show now; sets `_in_region` (the region's text then
        left in `_pending`) once it opens."""
        if self._format.at_start:
            return self._decide_start()
        opener = self._format.openers[0]
        begin = self._pending.find(opener)
        if begin >= 0:
            shown, self._pending = self._pending[:begin], self._pending[begin:]
            self._in_region = True
            return shown
        cut = len(self._pending) - held_prefix_chars(self._pending, opener)
        shown, self._pending = self._pending[:cut], self._pending[cut:]
        return shown

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
