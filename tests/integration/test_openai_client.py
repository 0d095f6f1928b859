"""The official openai client against a real server: both endpoints streaming and not, greedy
determinism, usage accounting, include_usage, prefix-cache reporting."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three colors of the rainbow."},
]
PROMPT = "The three primary colors are"
MAX_TOKENS = 10
BLOCK_SIZE = 16


def chat_prompt_len(tokenizer: Any, messages: list[Any]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_chat_greedy_is_deterministic_and_streams_the_same_text(
    openai_client: openai.OpenAI, model_name: str, tokenizer: Any
) -> None:
    request: dict[str, Any] = {
        "model": model_name,
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    first = openai_client.chat.completions.create(**request)
    second = openai_client.chat.completions.create(**request)
    text = first.choices[0].message.content
    assert text
    assert second.choices[0].message.content == text
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None
    assert first.usage.prompt_tokens == chat_prompt_len(tokenizer, MESSAGES)
    assert first.usage.completion_tokens == MAX_TOKENS
    assert first.usage.total_tokens == first.usage.prompt_tokens + MAX_TOKENS

    stream = openai_client.chat.completions.create(**request, stream=True)
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_completion_greedy_is_deterministic_and_streams_the_same_text(
    openai_client: openai.OpenAI, model_name: str, tokenizer: Any
) -> None:
    request: dict[str, Any] = {
        "model": model_name,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    first = openai_client.completions.create(**request)
    second = openai_client.completions.create(**request)
    text = first.choices[0].text
    assert text
    assert second.choices[0].text == text
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None
    assert first.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert first.usage.completion_tokens == MAX_TOKENS

    chunks = list(openai_client.completions.create(**request, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_include_usage_ends_with_a_usage_only_chunk(
    openai_client: openai.OpenAI, model_name: str, endpoint: str
) -> None:
    common: dict[str, Any] = {"model": model_name, "max_tokens": 6, "temperature": 0}
    if endpoint == "chat":
        create: Any = openai_client.chat.completions.create
        common["messages"] = MESSAGES
    else:
        create = openai_client.completions.create
        common["prompt"] = PROMPT
    whole = create(**common)
    chunks = list(create(**common, stream=True, stream_options={"include_usage": True}))
    *content_chunks, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert whole.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == whole.usage.completion_tokens == 6
    assert last.usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None and len(c.choices) == 1 for c in content_chunks)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_second_identical_long_prompt_hits_the_prefix_cache(
    openai_client: openai.OpenAI, model_name: str, endpoint: str
) -> None:
    # A unique head, so no earlier request shares any block of this prompt.
    long_text = f"Ticket {uuid.uuid4().hex}. " + "Summarize the weather report for today. " * 12
    common: dict[str, Any] = {"model": model_name, "max_tokens": 2, "temperature": 0}

    def send() -> Any:
        if endpoint == "chat":
            messages = [{"role": "user", "content": long_text}]
            return openai_client.chat.completions.create(**common, messages=messages).usage
        return openai_client.completions.create(**common, prompt=long_text).usage

    first, second = send(), send()
    num_prompt = first.prompt_tokens
    assert num_prompt > 64
    assert second.prompt_tokens == num_prompt
    num_cached = second.prompt_tokens_details.cached_tokens
    if endpoint == "completions":
        assert first.prompt_tokens_details.cached_tokens == 0
    else:  # the chat template's head (default system prompt) may be cached by earlier chats
        assert first.prompt_tokens_details.cached_tokens < num_cached
    assert num_cached > 0
    assert num_cached % BLOCK_SIZE == 0
    # every full block except one holding the last token, whose logits must be computed
    assert num_cached == (num_prompt - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_errors_surface_as_openai_exceptions(openai_client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        openai_client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert not_found.value.status_code == 404
    assert not_found.value.code == "model_not_found"
    assert not_found.value.param == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.chat.completions.create(
            model=model_name, messages=MESSAGES, logit_bias={"49152": 5}
        )
    assert bad.value.status_code == 400
    assert bad.value.code == "invalid_request"
    assert bad.value.param == "logit_bias"


def test_echo_scores_the_prompt_as_transformers_does(
    openai_client: openai.OpenAI, model_name: str, tokenizer: Any, default_model_dir: Any
) -> None:
    """How evaluation harnesses score text (echo, logprobs, max_tokens 0 or more): each
    prompt token's logprob after the first equals transformers' in float32, whole and
    streamed; with a completion its tokens follow the prompt's. The prompt was cached by an
    earlier request: scoring computes it whole all the same."""
    import torch
    from transformers import AutoModelForCausalLM

    text = f"Note {uuid.uuid4().hex[:8]}: the three primary colors are red, yellow and blue."
    ids = tokenizer.encode(text, add_special_tokens=False)
    openai_client.completions.create(model=model_name, prompt=ids, max_tokens=1)  # cached
    ask: dict[str, Any] = {"model": model_name, "prompt": ids, "echo": True, "logprobs": 2}
    whole = openai_client.completions.create(**ask, max_tokens=0)
    [streamed] = [c for c in openai_client.completions.create(**ask, max_tokens=0, stream=True)]
    longer = openai_client.completions.create(**ask, max_tokens=3, temperature=0)

    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir), dtype=torch.float32)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    reference = [float(expected[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    choice = whole.choices[0]
    assert (choice.text, choice.finish_reason) == (tokenizer.decode(ids), "length")
    assert whole.usage is not None and whole.usage.completion_tokens == 0
    assert whole.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == pytest.approx(reference, abs=1e-3)
    assert logprobs.top_logprobs is not None
    # the 2 most likely, and the prompt's own token where it is not among them (OpenAI's)
    tops = zip(logprobs.tokens[1:], logprobs.top_logprobs[1:], strict=True)  # type: ignore[arg-type]
    assert all(len(top) <= 3 and token in top for token, top in tops)
    assert streamed.choices[0].text == choice.text
    assert streamed.choices[0].logprobs.tokens == logprobs.tokens  # type: ignore[union-attr]
    assert streamed.choices[0].logprobs.token_logprobs[1:] == pytest.approx(  # type: ignore[union-attr]
        reference, abs=1e-3
    )
    both = longer.choices[0].logprobs
    assert both is not None and both.tokens is not None and both.text_offset is not None
    assert len(both.tokens) == len(ids) + 3
    assert both.token_logprobs[1 : len(ids)] == pytest.approx(reference, abs=1e-3)  # type: ignore[index]
    assert both.text_offset[len(ids)] == len(choice.text)  # the completion follows the echo
    assert longer.choices[0].text.startswith(choice.text)


def test_a_model_is_retrieved_by_its_id(openai_client: openai.OpenAI, model_name: str) -> None:
    """models.retrieve: the entry /v1/models lists (it was a 404); an unknown id is a 404 in
    OpenAI's format."""
    listed = {m.id: m for m in openai_client.models.list().data}
    retrieved = openai_client.models.retrieve(model_name)
    assert retrieved == listed[model_name]
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.models.retrieve("no-such-model")
    body = missing.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"
