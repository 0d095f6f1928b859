"""Sampling options end to end: stop strings, seeds, logprobs, min_tokens, ignore_eos."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "Here is a short list of fruits: apples, bananas,"
CHAT = [{"role": "user", "content": "Describe the ocean in two sentences."}]
STOP_MAX_TOKENS = 24


def reference(http: httpx.Client, model_name: str, kind: str) -> tuple[str, list[str]]:
    """Greedy text and its tokens' texts (from logprobs), with no stop string."""
    if kind == "chat":
        path, body = "/v1/chat/completions", {"messages": CHAT, "logprobs": True}
    else:
        path, body = "/v1/completions", {"prompt": PROMPT, "logprobs": 0}
    request = {"model": model_name, "max_tokens": STOP_MAX_TOKENS, "temperature": 0, **body}
    response = http.post(path, json=request)
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    if kind == "chat":
        text = choice["message"]["content"]
        tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    else:
        text = choice["text"]
        tokens = choice["logprobs"]["tokens"]
    assert "".join(tokens) == text  # plain ASCII output: token texts tile the text
    return text, tokens


def pick_stop(text: str, tokens: list[str]) -> tuple[str, int, int]:
    """A stop string spanning the boundary between two tokens in the middle of `text`, whose
    first occurrence is there -> (stop, its start, tokens generated up to its end)."""
    ends = [sum(len(t) for t in tokens[: i + 1]) for i in range(len(tokens))]
    middle = len(tokens) // 2
    for i in sorted(range(2, len(tokens) - 2), key=lambda k: abs(k - middle)):
        boundary = ends[i]
        start = boundary - min(2, len(tokens[i]))
        stop = text[start : boundary + min(3, len(tokens[i + 1]))]
        if tokens[i] and tokens[i + 1] and stop.strip() and text.find(stop) == start:
            return stop, start, i + 2
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_stop_string_spanning_tokens_ends_the_output_before_it(
    http: httpx.Client, openai_client: openai.OpenAI, model_name: str, kind: str
) -> None:
    text, tokens = reference(http, model_name, kind)
    stop, start, num_tokens = pick_stop(text, tokens)
    expected = text[:start]
    common: dict[str, Any] = {
        "model": model_name,
        "max_tokens": STOP_MAX_TOKENS,
        "temperature": 0,
        "stop": [stop, "never-generated-stop"],
    }
    if kind == "chat":
        create: Any = openai_client.chat.completions.create
        common["messages"] = CHAT
    else:
        create = openai_client.completions.create
        common["prompt"] = PROMPT

    whole = create(**common)
    choice = whole.choices[0]
    assert (choice.message.content if kind == "chat" else choice.text) == expected
    assert choice.finish_reason == "stop"
    assert whole.usage.completion_tokens == num_tokens

    chunks = list(create(**common, stream=True, stream_options={"include_usage": True}))
    *content_chunks, usage_chunk = chunks
    if kind == "chat":
        pieces = [c.choices[0].delta.content or "" for c in content_chunks]
    else:
        pieces = [c.choices[0].text for c in content_chunks]
    assert "".join(pieces) == expected
    assert all(stop not in piece for piece in pieces)
    assert content_chunks[-1].choices[0].finish_reason == "stop"
    assert usage_chunk.usage.completion_tokens == num_tokens


def test_same_seed_same_text_other_seeds_differ(
    openai_client: openai.OpenAI, model_name: str
) -> None:
    def sample(seed: int) -> str:
        completion = openai_client.completions.create(
            model=model_name, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=seed
        )
        return completion.choices[0].text

    text = sample(1234)
    assert sample(1234) == text
    assert any(sample(seed) != text for seed in (1, 2, 3))


def test_tiny_temperature_is_greedy(openai_client: openai.OpenAI, model_name: str) -> None:
    # logits / 1e-40 overflow to inf: the engine must treat it as greedy, not die
    def complete(temperature: float) -> str:
        completion = openai_client.completions.create(
            model=model_name, prompt="Once upon a time", max_tokens=6, temperature=temperature
        )
        return completion.choices[0].text

    assert complete(1e-40) == complete(0.0)


def test_chat_logprobs_with_top_logprobs(http: httpx.Client, model_name: str) -> None:
    request = {
        "model": model_name,
        "messages": CHAT,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    body = http.post("/v1/chat/completions", json=request).json()
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert set(choice["logprobs"]) == {"content"}
    assert len(content) == body["usage"]["completion_tokens"] == 6
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0
        assert entry["bytes"] == list(entry["token"].encode("utf-8"))  # whole characters here
        top = entry["top_logprobs"]
        assert len(top) == 3
        for alternative in top:
            assert set(alternative) == {"token", "logprob", "bytes"}
            assert alternative["logprob"] <= 0
            assert alternative["bytes"] == list(alternative["token"].encode("utf-8"))
        assert [a["logprob"] for a in top] == sorted((a["logprob"] for a in top), reverse=True)
        # greedy: the chosen token is the most likely one
        assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"])


def test_completion_logprobs(http: httpx.Client, model_name: str) -> None:
    request = {
        "model": model_name,
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 2,
    }
    body = http.post("/v1/completions", json=request).json()
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    tokens = logprobs["tokens"]
    assert len(tokens) == body["usage"]["completion_tokens"] == 6
    for key in ("token_logprobs", "top_logprobs", "text_offset"):
        assert len(logprobs[key]) == len(tokens), key
    assert "".join(tokens) == choice["text"]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert logprobs["text_offset"] == offsets
    for token, logprob, top in zip(
        tokens, logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert logprob <= 0
        assert len(top) == 2
        assert all(value <= 0 for value in top.values())
        assert top[token] == logprob == max(top.values())  # greedy picks the top token


def test_ignore_eos_and_min_tokens(openai_client: openai.OpenAI, model_name: str) -> None:
    messages: Any = [{"role": "user", "content": "Reply with just the word: yes"}]

    def run(**extra: Any) -> Any:
        return openai_client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=40, temperature=0, extra_body=extra
        )

    natural = run()
    assert natural.choices[0].finish_reason == "stop"  # the model ends it with EOS
    num_natural = natural.usage.completion_tokens
    assert num_natural < 40

    forced = run(ignore_eos=True)
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage.completion_tokens == 40

    min_tokens = num_natural + 4
    at_least = run(min_tokens=min_tokens)
    assert at_least.usage.completion_tokens >= min_tokens
    assert at_least.choices[0].message.content.startswith(natural.choices[0].message.content)
