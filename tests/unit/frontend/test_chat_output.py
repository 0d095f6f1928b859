"""ChatOutput: reasoning first, then tool calls read from the content after it; calls
numbered and named in order, each sent whole, cut at max_calls; finish_reason tool_calls
only on a stop."""

from __future__ import annotations

import itertools

from armature.frontend.chat_output import (
    CallPiece,
    ChatOutput,
    ChatPiece,
    chat_message,
)
from armature.frontend.parsing import OutputParsers

PARSERS = OutputParsers.named("hermes", "qwen3")
CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'


def output(max_calls: int | None = None, parsers: OutputParsers = PARSERS) -> ChatOutput:
    ids = (f"call_{i}" for i in itertools.count())
    assert parsers.reasoning is not None and parsers.tool_call is not None
    return ChatOutput(
        reasoning=parsers.reasoning.stream(),
        tools=parsers.tool_call.stream(),
        new_call_id=lambda: next(ids),
        max_calls=max_calls,
    )


def test_reasoning_then_calls_with_exact_pieces() -> None:
    out = output()
    pieces = [
        out.feed("<think>plan", 2),
        out.feed("</think>ok ", 2),
        out.feed(CALL, 5),
        out.feed(CALL + " end", 6, last=True),
    ]
    assert pieces == [
        ChatPiece(reasoning="plan"),
        ChatPiece(parts=("ok ",)),
        ChatPiece(parts=(CallPiece(0, '{"x": 1}', "call_0", "f"),)),
        ChatPiece(parts=(CallPiece(1, '{"x": 1}', "call_1", "f"), " end")),
    ]
    assert out.num_reasoning_tokens == 4
    assert out.finish_reason("stop") == "tool_calls"
    assert out.finish_reason("length") == "length"
    assert chat_message(pieces) == {
        "role": "assistant",
        "content": "ok  end",
        "reasoning_content": "plan",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "f", "arguments": '{"x": 1}'},
            },
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": '{"x": 1}'},
            },
        ],
    }
    assert pieces[3].delta() == {
        "content": " end",
        "tool_calls": [
            {
                "index": 1,
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": '{"x": 1}'},
            }
        ],
    }


def test_max_calls_drops_the_rest_and_blank_content_is_null() -> None:
    out = output(max_calls=1)
    pieces = [out.feed(CALL + "\n" + CALL, 9, last=True)]
    message = chat_message(pieces)
    assert message["content"] is None
    assert [c["id"] for c in message["tool_calls"]] == ["call_0"]
    assert out.num_calls == 1


def test_a_broken_call_gives_its_slot_back_under_max_calls() -> None:
    """parallel_tool_calls false: a call that broke after it began is content, and the
    valid call after it is the one call, as in the whole-output parse."""
    broken = '<tool_call>{"name": "f", "arguments": {"a": 1}} oops</tool_call>'
    good = '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    out = output(max_calls=1)
    pieces = [out.feed(c, 1, last=i == len(broken + good) - 1) for i, c in enumerate(broken + good)]
    message = chat_message(pieces)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["g"]
    assert out.finish_reason("stop") == "tool_calls"


def test_a_call_inside_reasoning_is_not_a_call() -> None:
    out = output()
    pieces = [out.feed("<think>" + CALL, 3), out.feed("</think>fine", 2, last=True)]
    assert chat_message(pieces) == {
        "role": "assistant",
        "content": "fine",
        "reasoning_content": CALL,
    }
    assert out.finish_reason("stop") == "stop"


def test_without_parsers_text_passes_through() -> None:
    out = ChatOutput(reasoning=None, tools=None, new_call_id=lambda: "unused")
    pieces = [out.feed("<think>a</think>", 3), out.feed(CALL, 5, last=True)]
    assert chat_message(pieces) == {"role": "assistant", "content": "<think>a</think>" + CALL}
    assert out.num_reasoning_tokens is None


def test_a_call_streams_whole_once_its_block_closes() -> None:
    """A call goes out in one delta once the parser has made it whole: sent in pieces, a
    call later broken could not be taken back from a streamed client."""
    out = output()
    feeds = [
        '<tool_call>{"name": "get_weather", "arguments": {"ci',
        'ty":  "Pa',
        'ris"}}</tool_call>',
    ]
    pieces = [out.feed(text, 1) for text in feeds] + [out.feed("", 0, last=True)]
    assert [p.delta() for p in pieces] == [
        {},
        {},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ]
        },
        {},
    ]
    message = chat_message(pieces)
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert out.finish_reason("stop") == "tool_calls"


def test_a_call_broken_after_it_began_is_content_and_never_streamed() -> None:
    out = output()
    text = '<tool_call>{"name": "f", "arguments": {"x": 1}} oops</tool_call>'
    pieces = [out.feed(text[:45], 1), out.feed(text[45:], 1, last=True)]
    assert [p.parts for p in pieces] == [(), (text,)]
    assert chat_message(pieces) == {"role": "assistant", "content": text}
    assert out.finish_reason("stop") == "stop"


def test_a_call_cut_by_max_tokens_streams_as_the_unstreamed_message() -> None:
    """The output ends (finish_reason length) inside a call's text: the whole message is
    that text as content and no call; the streamed deltas join to exactly it (the call's
    name and arguments went out as tool_calls, then its text as content, before)."""
    whole = CALL + ' Then: <tool_call>\n{"name": "g", "arguments": {"city": "Par'
    for cut in (1, 7, len(whole)):
        out = output()
        chunks = [whole[i : i + cut] for i in range(0, len(whole), cut)]
        pieces = [out.feed(c, 1, last=i == len(chunks) - 1) for i, c in enumerate(chunks)]
        deltas = [p.delta() for p in pieces]
        assert [d["tool_calls"] for d in deltas if "tool_calls" in d] == [
            [
                {
                    "index": 0,
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                }
            ]
        ]
        streamed = "".join(d.get("content", "") for d in deltas)
        assert streamed == ' Then: <tool_call>\n{"name": "g", "arguments": {"city": "Par'
        assert chat_message(pieces) == {
            "role": "assistant",
            "content": streamed,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                }
            ],
        }
        assert out.finish_reason("length") == "length"


def test_blank_content_around_calls_is_not_streamed_when_the_message_has_none() -> None:
    """A stream sends what the whole message holds: whitespace around and between calls is
    null content there, so it is held until text follows (then sent before it) or the output
    ends with no call (then it is the content). It streamed as content before."""
    cases = {
        "\n\n" + CALL + "\n\n" + CALL + "\n": None,
        CALL + "\n\n" + CALL: None,
        "\n" + CALL + "\nDone.": "\n\nDone.",
        "Checking.\n" + CALL + "\n\n" + CALL + "\n": "Checking.\n\n\n\n",
        "  \n": "  \n",
        "\n\nHello": "\n\nHello",
    }
    for text, content in cases.items():
        for cut in (1, 3, len(text)):
            out = output()
            chunks = [text[i : i + cut] for i in range(0, len(text), cut)]
            pieces = [out.feed(c, 1, last=i == len(chunks) - 1) for i, c in enumerate(chunks)]
            streamed = "".join(p.delta().get("content", "") for p in pieces)
            assert chat_message(pieces)["content"] == content, text
            assert streamed == (content or ""), (text, cut)
