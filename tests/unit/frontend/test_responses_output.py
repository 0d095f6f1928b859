"""ResponseBuilder: the exact events and items for chosen pieces (no model, no HTTP):
whitespace between calls, text after a call, the incomplete and failed endings."""

from __future__ import annotations

import itertools
from typing import Any

from armature.frontend.chat_output import CallPiece, ChatPiece
from armature.frontend.generation import Usage
from armature.frontend.responses_output import ResponseBuilder


def builder() -> ResponseBuilder:
    numbers = itertools.count()
    return ResponseBuilder({"id": "resp_1", "object": "response"}, lambda p: f"{p}_{next(numbers)}")


def call(index: int, name: str) -> ChatPiece:
    return ChatPiece(parts=(CallPiece(index, "{}", f"call_{index}", name),))


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


def test_text_after_a_call_opens_a_new_message_and_blank_text_between_calls_is_dropped() -> None:
    b = builder()
    events = b.start()
    events += b.feed(ChatPiece(parts=("\n\n",)))  # held: no message yet
    events += b.feed(call(0, "f"))
    events += b.feed(ChatPiece(parts=("\n",)))  # between calls: dropped
    events += b.feed(call(1, "g"))
    events += b.feed(ChatPiece(parts=(" ",)))
    events += b.feed(ChatPiece(parts=("Done.",)))
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
    added, part_added, first = b.feed(ChatPiece(parts=("Hel",)))
    b.feed(ChatPiece(parts=("lo",)))
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
    """The response and the item the limit cut are incomplete; items closed before it are
    completed (the cut one read `completed` inside an incomplete response)."""
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
    assert [(i["type"], i["status"]) for i in response["output"]] == [("reasoning", "incomplete")]
    assert events[-2]["item"]["status"] == "incomplete"  # output_item.done says so too
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}

    b = builder()
    b.start()
    b.feed(ChatPiece(reasoning="thinking"))
    b.feed(ChatPiece(parts=("The ans",)))
    response = b.finish("length", Usage(completion_tokens=5, reasoning_tokens=3))[-1]["response"]
    assert [(i["type"], i["status"]) for i in response["output"]] == [
        ("reasoning", "completed"),
        ("message", "incomplete"),
    ]
    b = builder()
    b.start()
    b.feed(call(0, "f"))
    response = b.finish("length", Usage(completion_tokens=4), 1_800_000_000)[-1]["response"]
    assert [(i["type"], i["status"]) for i in response["output"]] == [
        ("function_call", "incomplete")
    ]
    assert response["completed_at"] is None  # only a completed response has the time
    b = builder()
    created = b.start()[0]["response"]
    assert created["completed_at"] is None
    b.feed(ChatPiece(parts=("Done.",)))
    response = b.finish("stop", Usage(completion_tokens=2), 1_800_000_000)[-1]["response"]
    assert [(i["type"], i["status"]) for i in response["output"]] == [("message", "completed")]
    assert response["completed_at"] == 1_800_000_000


def test_an_engine_failure_is_a_failed_response() -> None:
    b = builder()
    b.start()
    b.feed(ChatPiece(parts=("par",)))
    (event,) = b.fail("worker died")
    assert event["type"] == "response.failed"
    assert event["response"]["error"] == {"code": "server_error", "message": "worker died"}
    assert event["response"]["status"] == "failed"


def test_a_call_comes_whole_in_one_arguments_delta() -> None:
    b = builder()
    events = b.feed(ChatPiece(parts=(CallPiece(0, '{"city": "Paris"}', "call_0", "f"),)))
    events += b.feed(ChatPiece(parts=("Done.",)))
    events += b.finish("stop", Usage())
    assert kinds(events) == [
        *["output_item.added", "function_call_arguments.delta"],
        *["function_call_arguments.done", "output_item.done"],
        *["output_item.added", "content_part.added", "output_text.delta"],
        *["output_text.done", "content_part.done", "output_item.done"],
        "completed",
    ]
    assert events[0]["item"]["arguments"] == ""  # as it was when added
    assert [(e["output_index"], e["delta"]) for e in events[1:2]] == [(0, '{"city": "Paris"}')]
    assert (events[2]["name"], events[2]["arguments"]) == ("f", '{"city": "Paris"}')
    assert [(i["type"], i["status"]) for i in b.output] == [
        ("function_call", "completed"),
        ("message", "completed"),
    ]
