"""A chat request's tools and history, checked against what this server can do with them
and turned into the values the chat template takes. Pure: request in, values or ApiError
(a 400 naming the field) out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from armature.errors import InvalidRequestError
from armature.frontend.errors import ApiError
from armature.frontend.parsing.json_canon import loads_bounded
from armature.frontend.protocol import ChatCompletionRequest, ChatMessage
from armature.frontend.template_features import TemplateFeatures
from armature.frontend.tool_grammar import tool_call_guide
from armature.frontend.tool_protocol import NamedToolChoice
from armature.protocols.guide import LarkGuide

__all__ = ["ToolUse", "plan_tools", "template_messages"]


@dataclass(frozen=True)
class ToolUse:
    """How one chat request uses tools."""

    tools: list[dict[str, Any]] | None = None  # what the template renders
    parse_calls: bool = False  # read tool calls out of the output
    names: frozenset[str] = frozenset()  # the functions offered: a call to another is text
    max_calls: int | None = None  # 1 when parallel_tool_calls is false or a function is named
    guide: LarkGuide | None = None  # forced calls (required, named): the calls' grammar


def plan_tools(
    body: ChatCompletionRequest,
    features: TemplateFeatures,
    parser_name: str | None,
    special_tokens: Mapping[str, int],
) -> ToolUse:
    """The request's tool use (`parser_name`: the --tool-call-parser, None when there is
    none; `special_tokens`: text -> id of its markers that are special tokens here); ApiError
    for a choice that names no tool, duplicate names, or what this server cannot honour (no
    parser, a template without tools, forced calls with a schema the format's grammar
    cannot hold)."""
    tools = body.tools or []
    choice = body.tool_choice or ("auto" if tools else "none")
    names = [tool.function.name for tool in tools]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise ApiError(f"tools: the function name {duplicate!r} appears twice", param="tools")
    if choice != "none" and not tools:
        raise ApiError("tool_choice needs tools to choose from", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise ApiError(
            f"tool_choice names the function {choice.function.name!r}, which is not in tools",
            param="tool_choice",
        )
    if not tools:
        return ToolUse()
    if not features.takes_tools:
        raise ApiError(
            "this model's chat template does not render tools; start the server with "
            "--chat-template naming a template that does",
            param="tools",
            code="unsupported_parameter",
        )
    rendered = [tool.model_dump(exclude_none=True) for tool in tools]
    if choice == "none":
        return ToolUse(tools=rendered)
    if parser_name is None:
        raise ApiError(
            "this server reads no tool calls from model output; start it with "
            "--tool-call-parser, or send tool_choice 'none'",
            param="tools",
            code="unsupported_parameter",
        )
    max_calls = 1 if body.parallel_tool_calls is False else None
    if choice == "auto":
        offered = frozenset(names)
        return ToolUse(tools=rendered, parse_calls=True, names=offered, max_calls=max_calls)
    return _forced(body, rendered, parser_name, max_calls, special_tokens)


def _forced(
    body: ChatCompletionRequest,
    rendered: list[dict[str, Any]],
    parser_name: str,
    max_calls: int | None,
    special_tokens: Mapping[str, int],
) -> ToolUse:
    """tool_choice 'required' or a named function, enforced by a grammar of the calls in
    the parser's format."""
    named = None
    if isinstance(body.tool_choice, NamedToolChoice):
        named, max_calls = body.tool_choice.function.name, 1
    try:
        guide = tool_call_guide(parser_name, body.tools or [], max_calls, special_tokens, named)
    except InvalidRequestError as exc:
        raise ApiError(str(exc), param=exc.param, code="unsupported_parameter") from None
    names = frozenset(tool.function.name for tool in body.tools or [])
    return ToolUse(tools=rendered, parse_calls=True, names=names, max_calls=max_calls, guide=guide)


def template_messages(
    messages: list[ChatMessage], features: TemplateFeatures
) -> list[dict[str, Any]]:
    """The history as the chat template takes it: text content, and for assistant calls the
    arguments as objects (templates write them with `tojson`)."""
    out = []
    for i, message in enumerate(messages):
        try:
            item: dict[str, Any] = {"role": message.role, "content": message.text()}
        except InvalidRequestError as exc:
            raise ApiError(str(exc), param=f"messages.{i}.content") from None
        if message.name is not None:
            item["name"] = message.name
        if message.role == "tool":
            if message.tool_call_id is None:
                raise ApiError(
                    "a tool message needs the tool_call_id it answers",
                    param=f"messages.{i}.tool_call_id",
                )
            item["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            item["tool_calls"] = _template_calls(i, message, features)
        out.append(item)
    return out


def _template_calls(
    i: int, message: ChatMessage, features: TemplateFeatures
) -> list[dict[str, Any]]:
    param = f"messages.{i}.tool_calls"
    if message.role != "assistant":
        raise ApiError("only assistant messages carry tool_calls", param=param)
    if not features.renders_tool_calls:
        raise ApiError(
            "this model's chat template does not render tool_calls; start the server with "
            "--chat-template naming a template that does",
            param=param,
            code="unsupported_parameter",
        )
    calls = []
    for j, call in enumerate(message.tool_calls or []):
        where = f"{param}.{j}.function.arguments"
        try:
            arguments = loads_bounded(call.function.arguments)
        except ValueError as exc:
            raise ApiError(f"arguments must be a JSON object in text: {exc}", param=where) from None
        if not isinstance(arguments, dict):
            raise ApiError("arguments must be a JSON object in text", param=where)
        function = {"name": call.function.name, "arguments": arguments}
        calls.append({"id": call.id, "type": "function", "function": function})
    return calls
