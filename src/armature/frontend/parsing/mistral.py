"""Mistral tool calls: content, then `[TOOL_CALLS]` and the calls to the end, either as a
JSON list (tokenizer v3-v7) or, per call, `name[ARGS]{arguments}` (v11 and later):

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

`[TOOL_CALLS]` and `[ARGS]` are special tokens in Mistral's own vocabularies, which decoding
drops: where the tokenizer holds them so, the frontend keeps exactly these token ids in the
text it decodes (chat_setup.py, the detokenizer's `kept_tokens`), so the parser sees them.
"""

from __future__ import annotations

import json

from armature.frontend.parsing.region import RegionFormat
from armature.frontend.parsing.tool_call import ToolCall, call_from_object

__all__ = ["MISTRAL", "TOOL_CALLS", "parse_mistral_calls"]

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
            items = json.loads(segment)
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
        obj = json.loads(arguments)
    except ValueError:
        return None
    call = call_from_object({"name": name, "arguments": obj})
    return None if call is None else [call]


MISTRAL = RegionFormat(
    openers=(TOOL_CALLS,),
    at_start=False,
    parse_region=parse_mistral_calls,
    markers=(TOOL_CALLS, ARGS),
)
