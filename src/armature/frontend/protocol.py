"""OpenAI API request and response models (pydantic, the HTTP edge only).

Unknown request fields are kept (extra="allow") so the app can log and ignore them: clients
send new fields before servers know them. Known fields this server does not implement are
rejected by `unsupported_fields` with a clear 400, never silently ignored.

Every input model is strict (no `true` for a number, no `"1"` for an integer, no NaN or
infinity) and every number has bounds, written into the OpenAPI schema as minimum/maximum.
A body holding a lone UTF-16 surrogate anywhere is refused (see text_check.py).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from armature.config.edge import MAX_QUEUE_TIMEOUT_S, MAX_QUEUED_REQUESTS, OverloadConfig
from armature.errors import InvalidRequestError
from armature.frontend.format_protocol import MAX_GUIDE_CHARS, MAX_GUIDED_CHOICES, ResponseFormat
from armature.frontend.text_check import LONE_SURROGATE, find_lone_surrogate
from armature.frontend.tool_protocol import (
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    MessageToolCall,
    ToolChoice,
    ToolSpec,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "GenerationFields",
    "StreamOptions",
]


# Bounds on what one request may carry (each refused with a 400 naming the field).
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 512
MAX_STOP_TOKEN_IDS = 64
MAX_MESSAGES = 4096
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_N = 128
# a completions request's prompts, and sequences in all (prompts x n, or best_of)
MAX_BATCH_PROMPTS = 128
MAX_BATCH_SEQUENCES = 128
MAX_LOGPROBS = 20
MAX_PENALTY = 2.0  # presence and frequency penalties lie in -2..2 (OpenAI)
MAX_REPETITION_PENALTY = 10.0  # above 1 discourages repeats; past 10 every seen token is gone
MAX_TEMPLATE_KWARGS = 64

# OpenAI's reasoning efforts; the chat template reads the request's as `reasoning_effort`
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
# what `apply_chat_template` and its renderer take themselves: a template variable of these
# names would reach the renderer, not the template (a test checks them against transformers)
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "conversation",
        "conversations",
        "documents",
        "max_length",
        "messages",
        "padding",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "sanitize_control_tokens",
        "tokenize",
        "tokenizer_kwargs",
        "tools",
        "truncation",
    }
)
MAX_LOGIT_BIAS = 100.0  # a logit bias lies in -100..100 (OpenAI)
INT32_END = 2**31  # token counts, ids and priorities are 32-bit in the engine
INT64_END = 2**63  # torch generators take 64-bit seeds

TokenCount = Annotated[int, Field(ge=1, lt=INT32_END)]
TokenId = Annotated[int, Field(ge=0, lt=INT32_END)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class _Request(_Strict):
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        path = find_lone_surrogate(data)
        if path is not None:
            raise PydanticCustomError(
                LONE_SURROGATE,
                "{param}: text must be valid Unicode; it holds a lone UTF-16 surrogate",
                {"param": path or "body"},
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """A null where the field has a default that is not null stands for that default
        (OpenAI types these fields nullable: the openai client sends `n=None` as null); a
        required field's null is still refused."""
        if not isinstance(data, dict) or None not in data.values():
            return data
        defaulted = _defaulted_not_null(cls)
        return {k: v for k, v in data.items() if v is not None or k not in defaulted}


@functools.cache
def _defaulted_not_null(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` with a default whose type does not take None."""
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if not field.is_required() and type(None) not in get_args(field.annotation)
    )


class StreamOptions(_Strict):
    include_usage: bool = False
    # an extension: one event per engine step (the tokens a worker sent together) instead of
    # one per token; fewer, larger events for clients that do not need each token apart
    per_step: bool = False


class ChatMessage(_Strict):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # checked when left out too: only an assistant's (its tool calls') may be
    content: str | list[dict[str, Any]] | None = Field(default=None, validate_default=True)
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(default=None, max_length=MAX_TOOL_CALLS)
    tool_call_id: str | None = None
    refusal: str | None = None  # an assistant's, as OpenAI returned it: what it said

    @field_validator("refusal")
    @classmethod
    def _refusal_is_the_assistants(cls, refusal: Any, info: ValidationInfo) -> Any:
        if refusal is not None and info.data.get("role") != "assistant":
            raise ValueError("only an assistant message holds a refusal")
        return refusal

    @field_validator("content")
    @classmethod
    def _content_unless_assistant(cls, content: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if content is None and role is not None and role != "assistant":
            raise PydanticCustomError(
                "missing", "a {role} message needs content (a string or parts)", {"role": role}
            )
        return content

    def text(self) -> str:
        """The message's text; list content must be text parts only (an assistant's may
        also hold refusal parts, and a refusal, each rendered as what it said)."""
        return self._content_text() + (self.refusal or "")

    def _content_text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            kind = part.get("type")
            key = "refusal" if kind == "refusal" and self.role == "assistant" else "text"
            if kind != key:
                raise InvalidRequestError(f"content part type {kind!r} is not supported")
            text = part.get(key)
            if not isinstance(text, str):
                raise InvalidRequestError(f"a content part of type {kind!r} needs a {key!r} string")
            texts.append(text)
        return "".join(texts)


class GenerationFields(_Request):
    """Sampling fields shared by chat and completions (OpenAI plus vLLM's extensions)."""

    model: str
    max_tokens: TokenCount | None = Field(default=None, description="Tokens to generate at most.")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(
        default=None, ge=-1, lt=INT32_END, description="0 or -1 disables (vLLM)."
    )
    min_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="0 disables (vLLM): the least share of the best."
    )
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # a larger seed would fail on the engine thread
    seed: int | None = Field(default=None, ge=-INT64_END, lt=INT64_END)
    presence_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    logit_bias: dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = (
        Field(default=None, max_length=MAX_LOGIT_BIAS_ENTRIES)
    )
    repetition_penalty: float = Field(
        default=1.0, gt=0.0, le=MAX_REPETITION_PENALTY, description="1 disables (vLLM)."
    )
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, lt=INT32_END)
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    priority: int = Field(
        default=0,
        ge=-INT32_END,
        lt=INT32_END,
        description="Queue order under overload: lower first.",
    )
    # OpenAI's structured output (chat's; on completions too, as vLLM takes it)
    response_format: ResponseFormat | None = None
    # vLLM's guided decoding (structured.py): at most one, and not with response_format
    guided_json: str | dict[str, Any] | None = Field(
        default=None, description="A JSON schema the output must match (vLLM)."
    )
    guided_regex: str | None = Field(
        default=None, max_length=MAX_GUIDE_CHARS, description="A regex the output must match."
    )
    guided_choice: list[str] | None = Field(
        default=None, min_length=1, max_length=MAX_GUIDED_CHOICES, description="One of these."
    )
    guided_grammar: str | None = Field(
        default=None, max_length=MAX_GUIDE_CHARS, description="A Lark or GBNF grammar (vLLM)."
    )

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
            raise ValueError(f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not (key.isascii() and key.isdigit()) or int(key) >= INT32_END:
                raise ValueError(f"keys must be token ids (decimal integers), got {key!r}")
        return value

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs sorted by token id (zero biases dropped)."""
        items = {int(k): v for k, v in (self.logit_bias or {}).items() if v}
        return tuple(sorted(items.items()))

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported_fields(self) -> list[tuple[str, str]]:
        """(param, reason) for each known parameter this server does not implement, or
        cannot honour as given."""
        if self.stream_options is not None and not self.stream:
            # as OpenAI: the options of a stream that is not there would do nothing
            return [("stream_options", "stream_options is only allowed when stream is true")]
        return []


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[ToolSpec] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    functions: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None
    # the template's `reasoning_effort` (templates that take one; others ignore it)
    reasoning_effort: ReasoningEffort | None = None
    # variables for the chat template, e.g. {"enable_thinking": false} (vLLM's extension)
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, max_length=MAX_TEMPLATE_KWARGS
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs_names(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in value or {}:
            if not key.isidentifier():
                raise ValueError(f"keys must be template variable names, got {key!r}")
            if key in RESERVED_TEMPLATE_KWARGS:
                raise ValueError(f"{key!r} is the renderer's own argument, not a variable")
        return value

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's extra variables: `chat_template_kwargs`, with the request's
        `reasoning_effort` (where given) as `reasoning_effort`."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return kwargs

    def get_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unsupported_fields(self) -> list[tuple[str, str]]:
        out = super().unsupported_fields()
        if self.functions:
            out.append(("functions", "functions is deprecated and not supported; use tools"))
        if self.top_logprobs and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs requires logprobs to be true"))
        return out


class CompletionRequest(GenerationFields):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    # 0 with echo: the prompt alone (with logprobs: its tokens scored)
    max_tokens: Annotated[int, Field(ge=0, lt=INT32_END)] | None = Field(
        default=16, description="Tokens to generate at most."
    )
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)

    def get_prompts(self) -> list[str | list[int]]:
        """The request's prompts: one (text, or token ids), or a batch of several (a list of
        texts or of token id lists), each giving its own choices."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequestError("prompt must not be empty")
        if all(isinstance(t, int) for t in p):
            return [list(p)]  # type: ignore[arg-type]
        if len(p) > MAX_BATCH_PROMPTS:
            raise InvalidRequestError(
                f"a batch of {len(p)} prompts; at most {MAX_BATCH_PROMPTS} in one request"
            )
        prompts: list[str | list[int]] = []
        for item in p:
            if isinstance(item, int):  # ints beside texts or lists (the schema allows none)
                raise InvalidRequestError("a batch is a list of texts or of token id lists")
            prompts.append(item if isinstance(item, str) else list(item))
        return prompts

    def unsupported_fields(self) -> list[tuple[str, str]]:
        out = super().unsupported_fields()
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        return out


class OverloadUpdate(_Strict):
    """POST /admin/overload: new busy thresholds and queue bounds (null clears a threshold).
    The bounds are the command line's (config/edge.py); a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid")

    busy_kv_usage: float | None = Field(default=None, ge=0.0, le=1.0)
    busy_prefill_tokens: TokenCount | None = None
    max_queued_requests: int = Field(
        default=OverloadConfig().max_queued_requests, ge=0, le=MAX_QUEUED_REQUESTS
    )
    queue_timeout_s: float = Field(
        default=OverloadConfig().queue_timeout_s, gt=0.0, le=MAX_QUEUE_TIMEOUT_S
    )
