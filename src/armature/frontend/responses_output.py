"""One response's output, in the Responses API's shapes: the chat pieces of its choice
(chat_output.py) in, output items and stream events out. Pure: the caller runs the job and
sends the events; the whole response is the last event's `response`.

    piece.reasoning ─▶ a reasoning item   (reasoning_text part, response.reasoning_text.*)
    piece.content   ─▶ a message item     (output_text part, response.output_text.*)
    call pieces     ─▶ function_call items (one response.function_call_arguments.delta:
                       a call comes whole, chat_output.py)

An item stays open while text of its kind follows; text of another kind, or a call, closes
it (…done events) and opens the next. Items are only added, so every event's output_index
is its item's place in the response's `output`. Every event carries `sequence_number`,
from 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from armature.frontend.chat_output import CallPiece, ChatPiece
from armature.frontend.generation import Usage
from armature.frontend.responses_protocol import ResponsesRequest

__all__ = ["ResponseBuilder", "response_fields", "response_usage"]

NewId = Callable[[str], str]  # a fresh id with this prefix: "msg" -> "msg_..."
TextKind = Literal["reasoning", "message"]
ItemKind = Literal["reasoning", "message", "function_call"]
Event = dict[str, Any]


def response_fields(
    body: ResponsesRequest, response_id: str, created_at_s: int, model: str
) -> dict[str, Any]:
    """The response object's fields that do not change while it runs: its id and what the
    request asked for (defaults filled in, as OpenAI echoes them)."""
    choice = body.tool_choice or "auto"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at_s,
        "model": model,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": _reasoning(body),
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": _text_format(body)},
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "tools": [t.model_dump() for t in body.tools or []],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "user": body.user,
    }


def _reasoning(body: ResponsesRequest) -> dict[str, Any]:
    options = body.reasoning
    if options is None:
        return {"effort": None, "summary": None}
    return {"effort": options.effort, "summary": options.summary or options.generate_summary}


def _text_format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None else None
    return {"type": "text"} if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True)


def response_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class ResponseBuilder:
    """Call `start`, `feed` each piece in order, then `finish` (or `fail`); each returns the
    events to send. `output` holds the items made so far; `response` the final object."""

    def __init__(self, fields: dict[str, Any], new_id: NewId) -> None:
        self.fields = fields
        self.new_id = new_id
        self.items: list[dict[str, Any]] = []  # every item, at its events' output_index
        self.response: dict[str, Any] | None = None
        self._num_events = 0
        self._open: tuple[ItemKind, int] | None = None  # the item open: kind, index
        self._held_space = ""  # whitespace-only content, sent once text follows it

    @property
    def output(self) -> list[dict[str, Any]]:
        return list(self.items)

    def snapshot(
        self, status: str, usage: Usage | None = None, completed_at_s: int | None = None
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            **self.fields,
            "completed_at": completed_at_s if status == "completed" else None,
            "status": status,
            "output": self.output,
            "usage": None if usage is None else response_usage(usage),
            "error": None,
            "incomplete_details": incomplete,
        }

    def start(self) -> list[Event]:
        return [
            self._event("response.created", response=self.snapshot("in_progress")),
            self._event("response.in_progress", response=self.snapshot("in_progress")),
        ]

    def feed(self, piece: ChatPiece) -> list[Event]:
        events = []
        if piece.reasoning:
            events += self._text("reasoning", piece.reasoning)
        for part in piece.parts:
            if isinstance(part, str):
                events += self._content(part)
            else:
                events += self._call(part)
        return events

    def _content(self, content: str) -> list[Event]:
        text, self._held_space = self._held_space + content, ""
        in_message = self._open is not None and self._open[0] == "message"
        if in_message or text.strip():
            return self._text("message", text)
        self._held_space = text  # e.g. the blank line between reasoning and calls: held
        return []

    def finish(
        self, finish_reason: str | None, usage: Usage, completed_at_s: int | None = None
    ) -> list[Event]:
        """Close the open item; `response.completed` (at `completed_at_s`, Unix seconds), or
        `response.incomplete` when the output hit max_output_tokens (or the context)."""
        status = "incomplete" if finish_reason == "length" else "completed"
        events = self._close(status)  # the item the limit cut is incomplete too
        self.response = self.snapshot(status, usage, completed_at_s)
        return [*events, self._event(f"response.{status}", response=self.response)]

    def fail(self, message: str) -> list[Event]:
        """`response.failed`: the engine failed the request after it began."""
        response = self.snapshot("failed")
        response["error"] = {"code": "server_error", "message": message}
        self.response = response
        return [self._event("response.failed", response=response)]

    # ---- items -------------------------------------------------------------------------
    def _text(self, kind: TextKind, delta: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open[0] != kind:
            events += self._close()
            events += self._open_text(kind)
        assert self._open is not None
        index = self._open[1]
        item = self.items[index]
        item["content"][0]["text"] += delta
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "message":
            return [
                *events,
                self._event("response.output_text.delta", **where, delta=delta, logprobs=[]),
            ]
        return [*events, self._event("response.reasoning_text.delta", **where, delta=delta)]

    def _open_text(self, kind: TextKind) -> list[Event]:
        index = len(self.items)
        if kind == "message":
            item: dict[str, Any] = {
                "id": self.new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part: dict[str, Any] = {
                "type": "output_text",
                "text": "",
                "annotations": [],
                "logprobs": [],
            }
        else:
            item = {
                "id": self.new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "reasoning_text", "text": ""}
        added = self._event("response.output_item.added", output_index=index, item=_copy(item))
        item["content"].append(part)
        self.items.append(item)
        self._open = (kind, index)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [added, self._event("response.content_part.added", **where, part=dict(part))]

    def _close(self, status: str = "completed") -> list[Event]:
        self._held_space = ""  # whitespace before a call or the end is dropped
        if self._open is None:
            return []
        kind, index = self._open
        self._open = None
        item = self.items[index]
        if kind == "function_call":
            item["status"] = status
            where = {"item_id": item["id"], "output_index": index}
            done = self._event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
            return [
                done,
                self._event("response.output_item.done", output_index=index, item=dict(item)),
            ]
        item["status"] = status
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "message":
            done = self._event("response.output_text.done", **where, text=part["text"], logprobs=[])
        else:
            done = self._event("response.reasoning_text.done", **where, text=part["text"])
        return [
            done,
            self._event("response.content_part.done", **where, part=dict(part)),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _call(self, piece: CallPiece) -> list[Event]:
        """A whole call: its item opens with its arguments (closed by what follows)."""
        events = self._close()
        index = len(self.items)
        item = {
            "id": self.new_id("fc"),
            "type": "function_call",
            "call_id": piece.id,
            "name": piece.name,
            "arguments": "",
            "status": "in_progress",
        }
        self.items.append(item)
        self._open = ("function_call", index)
        events.append(
            self._event("response.output_item.added", output_index=index, item=dict(item))
        )
        if not piece.arguments:
            return events
        item["arguments"] = piece.arguments
        where = {"item_id": item["id"], "output_index": index}
        kind = "response.function_call_arguments.delta"
        return [*events, self._event(kind, **where, delta=piece.arguments)]

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._num_events, **fields}
        self._num_events += 1
        return event


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """The item as it is now (events must not change when the item grows later)."""
    return {**item, "content": [dict(part) for part in item["content"]]}
