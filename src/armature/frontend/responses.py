"""OpenAI response bodies: stream chunks (typed, encoded once per event) and logprobs formats."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from armature.protocols.engine import TokenLogprob

__all__ = [
    "ChatChoiceChunk",
    "CompletionChoiceChunk",
    "StreamChunk",
    "StreamEvents",
    "chat_logprobs",
    "completion_logprobs",
    "sse_event",
]

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]

# the logprob reported for a token that could not be drawn (a guide or min_tokens masked it:
# -inf, which JSON cannot carry), as OpenAI reports a token of no probability
MIN_REPORTED_LOGPROB = -9999.0


def _reported(logprob: float) -> float:
    return logprob if logprob > MIN_REPORTED_LOGPROB else MIN_REPORTED_LOGPROB


def chat_logprobs(
    items: list[TokenLogprob], token_text: TokenText, token_bytes: TokenBytes
) -> dict[str, Any]:
    """A chat choice's `logprobs` of `items`: each token's text and its own bytes (a token
    holding part of a character: its text is U+FFFD, its bytes join with the next ones')."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": token_text(token_id),
            "logprob": _reported(logprob),
            "bytes": list(token_bytes(token_id)),
        }

    return {
        "content": [
            {
                **entry(item.token_id, item.logprob),
                "top_logprobs": [entry(t, lp) for t, lp in item.top],
            }
            for item in items
        ]
    }


def completion_logprobs(
    items: list[TokenLogprob],
    token_text: TokenText,
    offsets: Sequence[int],
    prompt: tuple[Sequence[int], list[TokenLogprob], Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The completion's `logprobs` of `items`, each at its offset into the text returned
    (`offsets`, text_offsets.py); with `prompt` (echo: its token ids, the logprobs of all but
    the first, and their offsets), the prompt's tokens come first, the first with null
    logprobs, as OpenAI gives them."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offsets: list[int] = []

    def add(token_id: int, item: TokenLogprob | None) -> None:
        text = token_text(token_id)
        tokens.append(text)
        token_logprobs.append(None if item is None else _reported(item.logprob))
        top = None
        if item is not None:  # the sampled token's too, as OpenAI's (up to logprobs + 1)
            top = {token_text(t): _reported(lp) for t, lp in item.top}
            top.setdefault(text, _reported(item.logprob))
        top_logprobs.append(top)

    if prompt is not None:
        prompt_ids, prompt_items, prompt_offsets = prompt
        add(prompt_ids[0], None)
        for item in prompt_items:
            add(item.token_id, item)
        text_offsets += prompt_offsets[: 1 + len(prompt_items)]
    for item in items:
        add(item.token_id, item)
    assert len(offsets) == len(items)
    text_offsets += offsets
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offsets,
    }


class CompletionChoiceChunk(msgspec.Struct):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatChoiceChunk(msgspec.Struct):
    index: int
    delta: dict[str, Any]
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class StreamChunk(msgspec.Struct):
    """One `data:` event of a chat or completion stream; `usage` is left out unless the
    client asked for it (then it is null on every chunk but the last)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoiceChunk] | list[ChatChoiceChunk]
    usage: dict[str, Any] | msgspec.UnsetType | None = msgspec.UNSET


_json = msgspec.json.Encoder()


def sse_event(chunk: StreamChunk | dict[str, Any]) -> bytes:
    """`chunk` as one SSE event, JSON encoded once (UTF-8, not ASCII-escaped)."""
    return b"data: " + _json.encode(chunk) + b"\n\n"


class StreamEvents:
    """The SSE events of one stream's chunks. Every chunk repeats the stream's id, object,
    created, model (and `usage`); they are encoded here once, and an event encodes only its
    choice: the bytes of `sse_event(StreamChunk(id, object, created, model, [choice], usage))`
    at a third of the cost."""

    def __init__(
        self,
        id: str,
        object: str,
        created: int,
        model: str,
        usage: dict[str, Any] | msgspec.UnsetType | None = msgspec.UNSET,
    ):
        empty = _json.encode(StreamChunk(id, object, created, model, [], usage))
        # the field's name in quotes cannot occur inside the strings before it (their quotes
        # are escaped): this is where the choices go
        cut = empty.index(b'"choices":[]') + len(b'"choices":[')
        self._before = b"data: " + empty[:cut]
        self._after = empty[cut:] + b"\n\n"

    def event(self, choice: CompletionChoiceChunk | ChatChoiceChunk) -> bytes:
        return b"".join((self._before, _json.encode(choice), self._after))
