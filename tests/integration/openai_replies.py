"""One reply through the official openai client, whole or streamed, as the same value: its
text (the streamed deltas joined) and finish reason. A module of its own, imported by name, so
that tests on different servers compare whole and streamed replies alike."""

from __future__ import annotations

from typing import Any

import openai

__all__ = ["reply"]


def reply(client: openai.OpenAI, request: dict[str, Any], stream: bool) -> tuple[str, str | None]:
    """(text, finish_reason) of the first choice of `request`: a chat completion when it has
    messages, a completion when it has a prompt."""
    chat = "messages" in request
    create: Any = client.chat.completions.create if chat else client.completions.create
    if not stream:
        choice = create(**request).choices[0]
        return (choice.message.content or "") if chat else choice.text, choice.finish_reason
    chunks = [c for c in create(**request, stream=True) if c.choices]
    if chat:
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        text = "".join(c.choices[0].text for c in chunks)
    return text, chunks[-1].choices[0].finish_reason
