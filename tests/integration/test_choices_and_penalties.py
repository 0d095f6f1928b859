"""n > 1, best_of, penalties and logit_bias through the official openai client against the
native engine: choices forked from one prefill, streamed interleaved by index, usage summed,
best_of ranked by cumulative logprob, penalties and logit_bias acting alike whole and streamed,
and each bad input a 400 naming its field."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest
from openai_replies import reply

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MESSAGES: list[Any] = [{"role": "user", "content": "Write one sentence about the sea."}]
MAX_TOKENS = 8
BLOCK_SIZE = 16
SAMPLED: dict[str, Any] = {"temperature": 1.0, "seed": 1234, "max_tokens": MAX_TOKENS}
NO_EOS: dict[str, Any] = {"ignore_eos": True}  # every sequence runs to max_tokens


def chat_texts(response: Any) -> list[str]:
    return [c.message.content for c in sorted(response.choices, key=lambda c: c.index)]


def test_chat_n_returns_n_seeded_choices_and_sums_usage(
    openai_client: openai.OpenAI, model_name: str
) -> None:
    request: dict[str, Any] = {"model": model_name, "messages": MESSAGES, **SAMPLED}
    response = openai_client.chat.completions.create(**request, n=3, extra_body=NO_EOS)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in response.choices)
    texts = chat_texts(response)
    assert len(set(texts)) == 3  # sequence i samples with seed + i
    assert response.usage is not None
    assert response.usage.completion_tokens == 3 * MAX_TOKENS
    assert response.usage.total_tokens == response.usage.prompt_tokens + 3 * MAX_TOKENS
    # choice i is what a single request seeded with seed + i gives
    for i, text in enumerate(texts):
        single = openai_client.chat.completions.create(
            **{**request, "seed": SAMPLED["seed"] + i}, extra_body=NO_EOS
        )
        assert single.choices[0].message.content == text


def test_chat_n_streams_choices_interleaved_by_index(
    openai_client: openai.OpenAI, model_name: str
) -> None:
    request: dict[str, Any] = {"model": model_name, "messages": MESSAGES, **SAMPLED, "n": 3}
    whole = chat_texts(openai_client.chat.completions.create(**request, extra_body=NO_EOS))
    stream = openai_client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}, extra_body=NO_EOS
    )
    chunks = list(stream)
    choice_chunks = [c for c in chunks if c.choices]
    assert all(len(c.choices) == 1 for c in choice_chunks)
    indices = [c.choices[0].index for c in choice_chunks]
    assert indices[:3] == [0, 1, 2]  # each choice opens with its role
    assert [choice_chunks[i].choices[0].delta.role for i in range(3)] == ["assistant"] * 3
    content = indices[3:]
    # after choice 0's first token the others decode beside it: the chunks interleave
    assert any(later < earlier for earlier, later in itertools.pairwise(content))
    texts = [
        "".join(c.choices[0].delta.content or "" for c in choice_chunks if c.choices[0].index == i)
        for i in range(3)
    ]
    assert texts == whole
    finishes = [c.choices[0].finish_reason for c in choice_chunks if c.choices[0].finish_reason]
    assert sorted(finishes) == ["length"] * 3
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 3 * MAX_TOKENS


def test_n_choices_fork_from_one_prefill(
    openai_client: openai.OpenAI,
    model_name: str,
    tokenizer: Any,
    read_metrics: Callable[[], dict[str, float]],
) -> None:
    # a prompt no other request shares, several blocks long
    prompt = f"[{uuid.uuid4().hex}] " + "The lighthouse keeper counted the waves. " * 8
    num_prompt = len(tokenizer.encode(prompt))
    assert num_prompt > 4 * BLOCK_SIZE
    before = read_metrics()
    response = openai_client.completions.create(
        model=model_name, prompt=prompt, n=4, **SAMPLED, extra_body=NO_EOS
    )
    after = read_metrics()
    assert response.usage is not None
    assert response.usage.prompt_tokens == num_prompt  # the prompt counts once
    assert response.usage.completion_tokens == 4 * MAX_TOKENS
    details = response.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == 0  # the first computed it
    # the engine computed the prompt once: the other three found every full block of it
    # but the one holding the last token in the prefix cache
    num_shared = (num_prompt - 1) // BLOCK_SIZE * BLOCK_SIZE

    def delta(name: str) -> float:
        return after[name] - before[name]

    assert delta("armature_prompt_tokens_total") == 4 * num_prompt
    assert delta("armature_prefix_cache_hit_tokens_total") == 3 * num_shared


def completion_candidates(
    client: openai.OpenAI, model_name: str, prompt: str, **fields: Any
) -> list[tuple[str, float]]:
    response = client.completions.create(
        model=model_name, prompt=prompt, logprobs=0, **SAMPLED, **fields, extra_body=NO_EOS
    )
    out = []
    for choice in sorted(response.choices, key=lambda c: c.index):
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        out.append((choice.text, sum(choice.logprobs.token_logprobs)))
    return out


def test_best_of_returns_the_n_most_likely_of_its_candidates(
    openai_client: openai.OpenAI, model_name: str
) -> None:
    prompt = "My favourite fruit is"
    candidates = completion_candidates(openai_client, model_name, prompt, n=4)
    best = sorted(candidates, key=lambda c: -c[1])[:2]
    response = openai_client.completions.create(
        model=model_name, prompt=prompt, n=2, best_of=4, **SAMPLED, extra_body=NO_EOS
    )
    assert [c.index for c in response.choices] == [0, 1]
    assert [c.text for c in response.choices] == [text for text, _ in best]
    assert all(c.logprobs is None for c in response.choices)  # none asked for
    assert response.usage is not None
    assert response.usage.completion_tokens == 4 * MAX_TOKENS  # all candidates were generated
    with_logprobs = completion_candidates(openai_client, model_name, prompt, n=2, best_of=4)
    assert [text for text, _ in with_logprobs] == [text for text, _ in best]
    assert [lp for _, lp in with_logprobs] == pytest.approx([lp for _, lp in best])


def test_logit_bias_forces_a_token(
    openai_client: openai.OpenAI, model_name: str, tokenizer: Any
) -> None:
    [token_id] = tokenizer.encode(" ocean")
    response = openai_client.completions.create(
        model=model_name,
        prompt="Once upon a time",
        max_tokens=5,
        temperature=0,
        logit_bias={str(token_id): 100},
    )
    assert response.choices[0].text == " ocean" * 5


def greedy_text(client: openai.OpenAI, stream: bool, **request: Any) -> str:
    """One greedy request's text, whole or its streamed deltas joined."""
    return reply(client, {**request, "temperature": 0}, stream)[0]


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_steers_the_first_chat_token(
    openai_client: openai.OpenAI, model_name: str, tokenizer: Any, stream: bool
) -> None:
    """-100 on the token greedy decoding starts with replaces it; +100 on another makes it
    the first token."""
    request: dict[str, Any] = {"model": model_name, "messages": MESSAGES, "max_tokens": 1}
    first = greedy_text(openai_client, stream, **request)
    [first_id] = tokenizer.encode(first)
    banned = greedy_text(openai_client, stream, **request, logit_bias={str(first_id): -100})
    assert banned != first
    [ocean_id] = tokenizer.encode(" ocean")
    forced = greedy_text(openai_client, stream, **request, logit_bias={str(ocean_id): 100})
    assert forced == " ocean"


def test_penalties_change_greedy_output_and_stay_deterministic(
    openai_client: openai.OpenAI, model_name: str
) -> None:
    prompt = "one two one two one two one two one two"
    request: dict[str, Any] = {"model": model_name, "prompt": prompt, "max_tokens": 12}
    plain = openai_client.completions.create(**request, temperature=0).choices[0].text
    penalties: list[dict[str, Any]] = [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ]
    for penalty in penalties:
        first = openai_client.completions.create(**request, temperature=0, **penalty)
        second = openai_client.completions.create(**request, temperature=0, **penalty)
        streamed = greedy_text(openai_client, True, **request, **penalty)
        assert first.choices[0].text == second.choices[0].text == streamed, penalty
        assert first.choices[0].text != plain, penalty


def test_chat_frequency_penalty_breaks_a_greedy_repetition(
    openai_client: openai.OpenAI, model_name: str
) -> None:
    """Unpenalized, greedy decoding echoes "two"; a frequency penalty of 2 ends the echo,
    streamed exactly as whole."""
    content = "Repeat after me: one two one two one two one two"
    request: dict[str, Any] = {
        "model": model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
    }
    assert greedy_text(openai_client, False, **request).endswith("two two two two")
    whole = greedy_text(openai_client, False, **request, frequency_penalty=2.0)
    streamed = greedy_text(openai_client, True, **request, frequency_penalty=2.0)
    assert streamed == whole == "One two one two one two."


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"n": 1, "best_of": 2, "stream": True}, "best_of"),
        ({"logit_bias": {"49152": 1}}, "logit_bias"),
        ({"logit_bias": {"token": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 150}}, "logit_bias.5"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"n": 0}, "n"),
    ],
)
def test_bad_sampling_inputs_are_400s_naming_the_field(
    openai_client: openai.OpenAI, model_name: str, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.completions.create(model=model_name, prompt="Hi", max_tokens=2, **fields)
    assert bad.value.status_code == 400
    assert bad.value.param == param
    body = bad.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
