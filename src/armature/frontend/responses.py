"""OpenAI response bodies: chat and completion objects, stream chunks, logprobs formats."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from armature.protocols.engine import TokenLogprob

__all__ = [
    "chat_chunk",
    "chat_logprobs",
    "completion_chunk",
    "completion_logprobs",
    "sse",
]

TokenText = Callable[[int], str]


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _entry(token_text: TokenText, token_id: int, logprob: float) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(items: list[TokenLogprob], token_text: TokenText) -> dict[str, Any]:
    return {
        "content": [
            {
                **_entry(token_text, item.token_id, item.logprob),
                "top_logprobs": [_entry(token_text, t, lp) for t, lp in item.top],
            }
            for item in items
        ]
    }


def completion_logprobs(
    items: list[TokenLogprob], token_text: TokenText, text_offset_start: int
) -> dict[str, Any]:
    tokens = [token_text(item.token_id) for item in items]
    offsets = []
    offset = text_offset_start
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [item.logprob for item in items],
        "top_logprobs": [{token_text(t): lp for t, lp in item.top} for item in items],
        "text_offset": offsets,
    }


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }


def completion_chunk(
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }
