"""/v1/responses on the real default model, with the official openai client: greedy plain
text equals chat's for the same conversation, whole and streamed, with chat's token counts;
a response hitting max_output_tokens is incomplete; a stored one is continued."""

from __future__ import annotations

from typing import Any

import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INSTRUCTIONS = "You are a terse assistant."
QUESTION = "Name three colors of the rainbow."
MAX_TOKENS = 10


def test_text_equals_chat_whole_and_streamed(openai_client: openai.OpenAI, model_name: str) -> None:
    chat = openai_client.chat.completions.create(
        model=model_name,
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    request: Any = {
        "model": model_name,
        "instructions": INSTRUCTIONS,
        "input": QUESTION,
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    whole = openai_client.responses.create(**request)
    text = chat.choices[0].message.content
    assert text and whole.output_text == text
    assert (whole.status, whole.incomplete_details and whole.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert whole.usage is not None and chat.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (
        chat.usage.prompt_tokens,
        MAX_TOKENS,
    )

    events = list(openai_client.responses.create(**request, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text  # type: ignore[union-attr]
    assert events[-1].type == "response.incomplete"
    assert openai_client.responses.retrieve(whole.id).output_text == text

    follow = openai_client.responses.create(
        model=model_name,
        previous_response_id=whole.id,
        input="And two more?",
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.usage is not None
    # the prompt holds the first turn and its answer, so it is longer than that turn's prompt
    assert follow.usage.input_tokens > whole.usage.input_tokens + MAX_TOKENS
