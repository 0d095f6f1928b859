"""Structured output on the default model (native engine, float32) through the official
openai client: every output parses and validates against its schema (nested objects, enums,
arrays, bounded numbers), whole and streamed, in batches mixed with free requests; vLLM's
guided fields (guided_grammar's Lark among them) and json_object, streamed as they return
whole; bad schemas, regexes and grammars are 400s naming the field. Forced tool calls:
test_default_model_tools.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai_replies import reply
from serve_process import running_server

from bench.structured_output import PROMPTS, SCHEMAS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "structured"


@pytest.fixture(scope="module")
def client(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    args = ["--served-model-name", MODEL, "--device", "cpu", "--dtype", "float32"]
    args += ["--num-kv-blocks", "512", "--max-model-len", "2048", "--max-num-seqs", "8"]
    log_dir = tmp_path_factory.mktemp("structured")
    with running_server(default_model_dir, log_dir, args) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def response_format(name: str) -> Any:
    spec = {"name": name, "schema": SCHEMAS[name], "strict": True}
    return {"type": "json_schema", "json_schema": spec}


def ask(client: openai.OpenAI, name: str, seed: int, stream: bool) -> tuple[str, str | None]:
    """(text, finish_reason) of one guided chat request, whole or streamed."""
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[name]}],
        "max_tokens": 200,
        "temperature": 0.0 if seed == 0 else 0.8,
        "seed": seed,
        "response_format": response_format(name),
    }
    return reply(client, request, stream)


def free(client: openai.OpenAI, seed: int) -> tuple[str, str | None]:
    choice = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=24,
        temperature=0.8,
        seed=seed,
        extra_body={"ignore_eos": True},
    ).choices[0]
    return choice.message.content or "", choice.finish_reason


def test_every_output_validates_against_its_schema(client: openai.OpenAI) -> None:
    """4 schemas x (greedy, 2 seeds) x (whole, streamed) = 24 guided requests, 8 at a time,
    with 4 free requests in the same batches."""
    jobs = [(name, seed, stream) for name in SCHEMAS for seed in (0, 1, 2) for stream in (0, 1)]
    with ThreadPoolExecutor(8) as pool:
        frees = [pool.submit(free, client, seed) for seed in range(4)]
        guided = [pool.submit(ask, client, n, s, bool(st)) for n, s, st in jobs]
        results = [f.result() for f in guided]
        free_results = [f.result() for f in frees]
    for (name, seed, stream), (text, finish) in zip(jobs, results, strict=True):
        assert finish == "stop", (name, seed, stream, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    for text, finish in free_results:  # free requests in the same batches are not masked
        assert finish == "length"
        assert text


def test_json_object_and_vllm_guided_fields(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Describe a cat as JSON."}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = reply.choices[0].message.content or ""
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # the object can outgrow max_tokens; what was written is still an object's start
        assert text.startswith("{")
    choice = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer:",
        max_tokens=10,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert (choice.choices[0].text, choice.choices[0].finish_reason) in (
        ("yes", "stop"),
        ("no", "stop"),
    )
    regex = client.completions.create(
        model=MODEL,
        prompt="A phone number:",
        max_tokens=20,
        extra_body={"guided_regex": r"[0-9]{3}-[0-9]{4}"},
    )
    assert regex.choices[0].finish_reason == "stop"
    assert len(regex.choices[0].text) == 8 and regex.choices[0].text[3] == "-"
    schema = SCHEMAS["bounds"]
    completion = client.completions.create(  # response_format on completions, as vLLM's
        model=MODEL,
        prompt=PROMPTS["bounds"] + "\n",
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": response_format("bounds")},
    )
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].text), schema)
    guided_json = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=120,
        temperature=0,
        extra_body={"guided_json": json.dumps(schema)},
    )
    jsonschema.validate(json.loads(guided_json.choices[0].message.content or ""), schema)


def whole_and_streamed(
    client: openai.OpenAI, request: dict[str, Any]
) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
    """(text, finish_reason) of one greedy request whole, then streamed."""
    request = {"model": MODEL, "temperature": 0, **request}
    return reply(client, request, stream=False), reply(client, request, stream=True)


COLOURS_GRAMMAR = 'start: colour " and " colour\ncolour: "red" | "green" | "blue"\n'


def test_guided_grammar_output_is_in_the_grammar_whole_and_streamed(
    client: openai.OpenAI,
) -> None:
    whole, streamed = whole_and_streamed(
        client,
        {
            "messages": [{"role": "user", "content": "Name two colours."}],
            "max_tokens": 10,
            "extra_body": {"guided_grammar": COLOURS_GRAMMAR},
        },
    )
    assert streamed == whole
    text, finish = whole
    assert finish == "stop"
    assert re.fullmatch(r"(red|green|blue) and (red|green|blue)", text), text


def json_object_check(text: str) -> None:
    assert isinstance(json.loads(text), dict)


def guided_json_check(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMAS["bounds"])


def guided_regex_check(text: str) -> None:
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", text), text


def guided_choice_check(text: str) -> None:
    assert text in ("yes", "no")


@pytest.mark.parametrize(
    ("request_fields", "check"),
    [
        pytest.param(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": 'Reply with a JSON object {"name": ...} naming a cat.',
                    }
                ],
                "max_tokens": 40,
                "response_format": {"type": "json_object"},
            },
            json_object_check,
            id="json_object",
        ),
        pytest.param(
            {
                "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
                "max_tokens": 120,
                "extra_body": {"guided_json": json.dumps(SCHEMAS["bounds"])},
            },
            guided_json_check,
            id="guided_json",
        ),
        pytest.param(
            {
                "prompt": "A phone number:",
                "max_tokens": 20,
                "extra_body": {"guided_regex": r"[0-9]{3}-[0-9]{4}"},
            },
            guided_regex_check,
            id="guided_regex",
        ),
        pytest.param(
            {
                "prompt": "Is the sky blue? Answer:",
                "max_tokens": 10,
                "extra_body": {"guided_choice": ["yes", "no"]},
            },
            guided_choice_check,
            id="guided_choice",
        ),
    ],
)
def test_guided_output_streams_the_text_it_returns_whole(
    client: openai.OpenAI, request_fields: dict[str, Any], check: Callable[[str], None]
) -> None:
    """Greedy, so the streamed deltas join to the whole reply, which is complete (stop, not
    length) and in its language."""
    whole, streamed = whole_and_streamed(client, request_fields)
    assert streamed == whole
    text, finish = whole
    assert finish == "stop", text
    check(text)


@pytest.mark.parametrize(
    ("fields", "param", "problem"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format.json_schema.schema",
            "Invalid type: nope",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "array", "minItems": 2, "maxItems": 1},
                    },
                }
            },
            "response_format.json_schema.schema",
            "minItems (2) is greater than maxItems (1)",
        ),
        ({"guided_regex": "(unclosed"}, "guided_regex", "unclosed group"),
        ({"guided_grammar": "start: missing"}, "guided_grammar", "missing"),
        ({"guided_json": "{not json"}, "guided_json", "not JSON"),
        ({"guided_choice": []}, "guided_choice", ""),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
        ({"response_format": {"type": "xml"}}, "response_format", ""),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", ""),
    ],
)
def test_bad_structured_output_is_a_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str, problem: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body=fields,
        )
    error: Any = caught.value.body
    assert error["param"] == param, error
    assert problem in error["message"]


def test_top_logprobs_past_what_a_guide_allows_are_reported_as_no_probability(
    client: openai.OpenAI,
) -> None:
    """Where a guide leaves fewer tokens than top_logprobs asks for, the others are masked
    (-inf): they are reported at -9999.0, as OpenAI reports a token of no probability (the
    whole reply was a 500, JSON cannot carry -inf; a stream carried null)."""
    request: Any = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Answer 1 for yes, 0 for no: is water wet?"}],
        "max_tokens": 4,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 5,
        "extra_body": {"guided_regex": "[01]"},  # two tokens allowed
    }
    whole = client.chat.completions.create(**request)
    streamed = list(client.chat.completions.create(**request, stream=True))
    entries = [e for e in whole.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert whole.choices[0].message.content in {"0", "1"}
    streamed_entries = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]  # type: ignore[union-attr]

    def shape(items: list[Any]) -> list[tuple[str, list[str]]]:
        return [(e.token, [t.token for t in e.top_logprobs]) for e in items]

    assert shape(streamed_entries) == shape(entries)  # the values within float noise
    tops = [t.logprob for e in entries for t in e.top_logprobs]
    assert len(tops) == 5 * len(entries)
    assert -9999.0 in tops and all(isinstance(v, float) and v >= -9999.0 for v in tops)
    assert all(e.logprob > -9999.0 for e in entries)  # the drawn tokens were allowed
    completion = client.completions.create(
        model=MODEL,
        prompt="Is water wet? Answer 1 for yes, 0 for no:",
        max_tokens=3,
        temperature=0.0,
        logprobs=5,
        extra_body={"guided_regex": "[01]"},
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs
    assert -9999.0 in [v for top in logprobs.top_logprobs for v in top.values()]
