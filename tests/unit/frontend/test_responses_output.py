"""ResponseBuilder: the exact events and items for chosen pieces (no model, no HTTP):
whitespace between calls, text after a call, the incomplete and failed endings."""

from __future__ import annotations

import itertools
from typing import Any

from armature.frontend.chat_output import ChatPiece, IssuedCall
from armature.frontend.generation import Usage
from armature.frontend.parsing.tool_call import ToolCall
from armature.frontend.responses_output import ResponseBuilder


def builder() -> ResponseBuilder:
    numbers = itertools.count()
    return ResponseBuilder({"id": "resp_1", "object": "response"}, lambda p: f"{p}_{next(numbers)}")


def call(index: int, name: str) -> IssuedCall:
    return IssuedCall(index, f"call_{index}", ToolCall(name, "{}"))


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


def test_text_after_a_call_opens_a_new_message_and_blank_text_between_calls_is_dropped() -> None:
    b = builder()
    events = b.start()
    events += b.feed(ChatPiece(content="\n\n"))  # held: no message yet
    events += b.feed(ChatPiece(calls=(call(0, "f"),)))
    events += b.feed(ChatPiece(content="\n"))  # between calls: dropped
    events += b.feed(ChatPiece(calls=(call(1, "g"),)))
    events += b.feed(ChatPiece(content=" "))
    events += b.feed(ChatPiece(content="Done."))
    events += b.finish("stop", Usage(prompt_tokens=5, completion_tokens=7))
    assert kinds(events) == [
        "created",
        "in_progress",
        *["output_item.added", "function_call_arguments.delta"],
        *["function_call_arguments.done", "output_item.done"],
        *["output_item.added", "function_call_arguments.delta"],
        *["function_call_arguments.done", "output_item.done"],
        *["output_item.added", "content_part.added", "output_text.delta"],
        *["output_text.done", "content_part.done", "output_item.done"],
        "completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [(i["type"], i["id"]) for i in b.output] == [
        ("function_call", "fc_0"),
        ("function_call", "fc_1"),
        ("message", "msg_2"),
    ]
    assert b.output[2]["content"][0]["text"] == " Done."  # held space leads the text it precedes
    assert b.response is not None
    assert (b.response["status"], b.response["usage"]["total_tokens"]) == ("completed", 12)
    assert b.response["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}


def test_events_keep_the_item_as_it_was() -> None:
    b = builder()
    b.start()
    added, part_added, first = b.feed(ChatPiece(content="Hel"))
    b.feed(ChatPiece(content="lo"))
    assert added["item"]["content"] == [] and added["item"]["status"] == "in_progress"
    assert part_added["part"]["text"] == ""
    assert first["delta"] == "Hel"
    done = b.finish("stop", Usage())
    assert [e["item"]["content"][0]["text"] for e in done if "item" in e] == ["Hello"]
    assert done[0] == {
        "type": "response.output_text.done",
        "sequence_number": 6,
        "item_id": "msg_0",
        "output_index": 0,
        "content_index": 0,
        "text": "Hello",
        "logprobs": [],
    }


def test_hitting_the_token_limit_is_incomplete() -> None:
    b = builder()
    b.start()
    b.feed(ChatPiece(reasoning="thinking"))
    events = b.finish("length", Usage(completion_tokens=3, reasoning_tokens=3))
    assert kinds(events)[-1] == "incomplete"
    response = events[-1]["response"]
    assert (response["status"], response["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert [(i["type"], i["status"]) for i in response["output"]] == [("reasoning", "completed")]
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}


def test_an_engine_failure_is_a_failed_response() -> None:
    b = builder()
    b.start()
    b.feed(ChatPiece(content="par"))
    (event,) = b.fail("worker died")
    assert event["type"] == "response.failed"
    assert event["response"]["error"] == {"code": "server_error", "message": "worker died"}
    assert event["response"]["status"] == "failed"
