"""A Responses request as the chat request it runs as: the conversation (what
`previous_response_id` names, then this request's `input` items) becomes chat messages, and
tools and tool_choice their chat shapes. Pure: request in, ChatCompletionRequest or ApiError
(a 400 naming the field, `input.2.call_id`) out.

    instructions                  ─▶ a system message first (not carried to later turns)
    message: user, assistant,     ─▶ a message of that role (a developer message renders as
             system, developer       chat's: a system message unless the template knows it)
    function_call                 ─▶ a tool call of the assistant message just before it
                                     (or of a new, empty one)
    function_call_output          ─▶ a tool message answering that call_id
    reasoning                     ─▶ nothing (templates drop the reasoning of earlier turns)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from armature.frontend.errors import ApiError
from armature.frontend.format_protocol import JsonObjectFormat
from armature.frontend.protocol import ChatCompletionRequest
from armature.frontend.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    JsonSchemaTextFormat,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)

__all__ = ["chat_request", "read_items", "responses_error"]

ITEM_MODELS: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def read_items(raw: str | list[dict[str, Any]], param: str = "input") -> list[InputItem]:
    """`input` as typed items: a string is one user message; an item without `type` is a
    message. ApiError names the first bad field (`input.1.type`, `input.0.content.0.text`)."""
    if isinstance(raw, str):
        return [MessageItem(role="user", content=[{"type": "input_text", "text": raw}])]  # type: ignore[list-item]
    items: list[InputItem] = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message")
        model = ITEM_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise ApiError(
                f"{param}.{i}.type: unknown item type {kind!r}; this server takes "
                + ", ".join(ITEM_MODELS),
                param=f"{param}.{i}.type",
                code="unsupported_item_type",
            )
        try:
            items.append(model.model_validate(item))  # type: ignore[arg-type]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join([param, str(i), *(str(p) for p in first["loc"])])
            raise ApiError(f"{where}: {first['msg']}", param=where) from None
    return items


def chat_request(
    body: ResponsesRequest, history: Sequence[InputItem], items: Sequence[InputItem]
) -> ChatCompletionRequest:
    """The chat request that runs `body` after the stored `history` (whose items were
    checked when they were stored)."""
    messages = _messages(history, items)
    if not messages:
        raise ApiError("input must hold at least one message", param="input")
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "stream": body.stream,
        "priority": body.priority,
    }
    optional = {
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "parallel_tool_calls": body.parallel_tool_calls,
        "user": body.user,
        "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None,
    }
    chat.update({k: v for k, v in optional.items() if v is not None})
    if body.tools is not None:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
            for t in body.tools
        ]
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    choice = body.tool_choice
    if choice is not None:
        chat["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:  # a bound of chat's (messages, calls per message)
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiError(f"input: as chat, {where}: {first['msg']}", param="input") from None


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None: free text)."""
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, JsonSchemaTextFormat):
        spec = fmt.model_dump(by_alias=True, exclude_none=True, exclude={"type"})
        return {"type": "json_schema", "json_schema": spec}
    if isinstance(fmt, JsonObjectFormat):
        return {"type": "json_object"}
    return None


def _messages(history: Sequence[InputItem], items: Sequence[InputItem]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for at, item in enumerate([*history, *items]):
        param = f"input.{at - len(history)}.call_id"  # history was checked when stored
        if isinstance(item, MessageItem):
            # developer as chat's: a system message unless the template knows the role
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            if item.call_id in call_ids:
                raise ApiError(f"{param}: call_id {item.call_id!r} appears twice", param=param)
            call_ids.add(item.call_id)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                raise ApiError(
                    f"{param}: no function_call with call_id {item.call_id!r} comes before "
                    "this output",
                    param=param,
                )
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:
            assert isinstance(item, ReasoningItem)
    return messages


# chat's fields -> the Responses request's, in error messages
RENAMED_WORDS = (
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
)


def responses_error(exc: ApiError) -> ApiError:
    """A chat request's error in the Responses request's terms: `messages...` is `input`,
    `max_tokens` (or `max_completion_tokens`) is `max_output_tokens`, `response_format` is
    `text.format` (flat: its `json_schema.schema` is `schema`), a tool's
    `function.parameters` its `parameters` (flat too)."""
    param = exc.param or ""
    if param.startswith("messages"):
        renamed: str | None = "input"
    elif param in ("max_tokens", "max_completion_tokens"):
        renamed = "max_output_tokens"
    elif param.startswith("response_format"):
        renamed = "text.format" + param.removeprefix("response_format").replace(
            ".json_schema", "", 1
        )
    elif param.startswith("tools.") and ".function." in param:
        renamed = param.replace(".function.", ".", 1)
    else:
        return exc
    message = exc.message
    for chat_word, responses_word in RENAMED_WORDS:
        message = message.replace(chat_word, responses_word)
    return ApiError(
        message,
        status_code=exc.status_code,
        type=exc.type,
        param=renamed,
        code=exc.code,
        headers=exc.headers,
    )
