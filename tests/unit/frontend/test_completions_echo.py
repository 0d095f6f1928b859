"""`echo` on /v1/completions: the prompt's text before the completion, whole and streamed,
for a text prompt and a token-id prompt; with `logprobs` the prompt's tokens come first in
them (the first with null logprobs), asked of the engine as prompt logprobs; `max_tokens` 0
with echo returns the prompt alone. Also: stream_options without a stream is refused, as
OpenAI refuses it."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from frontend_fakes import SCRIPTED_LOGPROB, SCRIPTED_PROMPT_LOGPROB, ScriptedEngine

from armature.config import RouterConfig
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import compose_frontend
from armature.frontend.jobs import (
    MAX_PROMPT_LOGPROBS_BYTES,
    PROMPT_LOGPROB_ALTERNATIVE_BYTES,
    PROMPT_LOGPROB_TOKEN_BYTES,
)
from armature.frontend.preprocess import Preprocessor
from armature.protocols.engine import EngineOutput, TokenLogprob

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

PROMPT = "The capital of France is"
OUTPUT = " Paris, a city of light."


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def serve(
    preprocessor: Preprocessor, max_model_len: int = 2048
) -> tuple[ScriptedEngine, openai.AsyncOpenAI]:
    engine = ScriptedEngine(preprocessor)
    parts = compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", max_model_len, 0),
    )
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(parts)))
    client = openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0
    )
    return engine, client


async def test_echo_puts_the_prompt_before_the_completion(preprocessor: Preprocessor) -> None:
    engine, client = serve(preprocessor)
    engine.outputs = [OUTPUT, OUTPUT, OUTPUT]
    whole = await client.completions.create(model="m", prompt=PROMPT, echo=True, max_tokens=32)
    assert whole.choices[0].text == PROMPT + OUTPUT
    chunks = await client.completions.create(
        model="m", prompt=PROMPT, echo=True, max_tokens=32, stream=True
    )
    texts = [chunk.choices[0].text async for chunk in chunks if chunk.choices]
    assert texts[0] == PROMPT  # the prompt first, on its own
    assert "".join(texts) == PROMPT + OUTPUT
    # a prompt of token ids is echoed as its text
    ids = preprocessor.encode(PROMPT, add_special_tokens=False)
    by_ids = await client.completions.create(model="m", prompt=ids, echo=True, max_tokens=32)
    assert by_ids.choices[0].text == preprocessor.decode(ids) + OUTPUT
    assert engine.prompts == [ids, ids, ids]


async def test_echo_with_logprobs_scores_the_prompt_first(preprocessor: Preprocessor) -> None:
    """OpenAI's shape: the prompt's tokens, then the completion's, text offsets into the
    returned text; the first prompt token has no logprob. Whole and streamed alike."""
    engine, client = serve(preprocessor)
    engine.outputs = [OUTPUT, OUTPUT]
    ids = preprocessor.encode(PROMPT)
    out_ids = preprocessor.encode(OUTPUT, add_special_tokens=False)
    ask = {"model": "m", "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 32}
    whole = await client.completions.create(**ask)  # type: ignore[arg-type]
    chunks = [c async for c in await client.completions.create(**ask, stream=True)]  # type: ignore[arg-type]
    [request, _] = engine.requests
    assert (request.sampling.prompt_logprobs, request.sampling.logprobs) == (1, 1)
    choice = whole.choices[0]
    assert choice.text == PROMPT + OUTPUT
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    texts = [preprocessor.token_text(t) for t in [*ids, *out_ids]]
    assert logprobs.tokens == texts
    assert "".join(texts) == PROMPT + OUTPUT
    num_prompt = len(ids)
    assert logprobs.token_logprobs == [None] + [SCRIPTED_PROMPT_LOGPROB] * (num_prompt - 1) + [
        SCRIPTED_LOGPROB
    ] * len(out_ids)
    assert logprobs.top_logprobs is not None and logprobs.top_logprobs[0] is None
    assert logprobs.top_logprobs[1] == {texts[1]: SCRIPTED_PROMPT_LOGPROB}
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert logprobs.text_offset == offsets
    # streamed: the prompt's chunk first, with its tokens' logprobs, then the completion's
    parts = [c.choices[0] for c in chunks if c.choices]
    assert parts[0].text == PROMPT
    assert parts[0].logprobs is not None and parts[0].logprobs.tokens == texts[:num_prompt]
    joined: dict[str, list[object]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for part in parts:
        assert part.logprobs is not None
        for key, values in joined.items():
            values.extend(getattr(part.logprobs, key))
    assert joined == {
        "tokens": logprobs.tokens,
        "token_logprobs": logprobs.token_logprobs,
        "text_offset": logprobs.text_offset,
    }


async def test_max_tokens_0_with_echo_returns_the_prompt_scored(
    preprocessor: Preprocessor,
) -> None:
    """How evaluation harnesses score a text: the prompt alone, its tokens' logprobs, no
    completion token returned or counted. Without echo, max_tokens 0 is refused."""
    engine, client = serve(preprocessor)
    engine.outputs = [OUTPUT, OUTPUT]
    ids = preprocessor.encode(PROMPT)
    ask = {"model": "m", "prompt": PROMPT, "echo": True, "logprobs": 0, "max_tokens": 0}
    whole = await client.completions.create(**ask)  # type: ignore[arg-type]
    chunks = [
        c
        async for c in await client.completions.create(
            **ask, stream=True, stream_options={"include_usage": True}
        )
    ]  # type: ignore[arg-type]
    assert engine.requests[0].sampling.max_tokens == 1  # one step; its token is dropped
    choice = whole.choices[0]
    assert (choice.text, choice.finish_reason) == (PROMPT, "length")
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert len(choice.logprobs.tokens) == len(ids)
    # logprobs 0: no alternatives, the sampled (here: the prompt's) token alone
    assert choice.logprobs.top_logprobs == [None] + [
        {preprocessor.token_text(t): SCRIPTED_PROMPT_LOGPROB} for t in ids[1:]
    ]
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), 0)
    parts = [c.choices[0] for c in chunks if c.choices]
    assert [(p.text, p.finish_reason) for p in parts] == [(PROMPT, "length")]
    assert parts[0].logprobs is not None
    assert parts[0].logprobs.token_logprobs == choice.logprobs.token_logprobs
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="m", prompt=PROMPT, max_tokens=0)
    body = caught.value.body
    assert isinstance(body, dict)
    assert (body["param"], body["message"]) == (
        "max_tokens",
        "max_tokens 0 returns nothing without echo",
    )


async def test_stream_options_without_a_stream_is_refused(preprocessor: Preprocessor) -> None:
    """The options of a stream that is not there did nothing, without a word."""
    engine, client = serve(preprocessor)
    for create in (client.completions.create, client.chat.completions.create):
        body: dict[str, object] = {"model": "m", "max_tokens": 4}
        if create == client.completions.create:
            body["prompt"] = PROMPT
        else:
            body["messages"] = [{"role": "user", "content": PROMPT}]
        with pytest.raises(openai.BadRequestError) as caught:
            await create(**body, stream_options={"include_usage": True})  # type: ignore[call-overload]
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["param"] == "stream_options"
        assert error["message"] == "stream_options is only allowed when stream is true"
    assert engine.prompts == []


async def test_an_echo_whose_text_is_empty_still_ends_its_stream(
    preprocessor: Preprocessor,
) -> None:
    """A prompt of special tokens alone echoes as "": with max_tokens 0 its stream still
    has its choice's chunk and finish_reason (it had none)."""
    engine, client = serve(preprocessor)
    engine.outputs = [OUTPUT]
    [eos] = preprocessor.encode("<|endoftext|>", add_special_tokens=False)
    chunks = await client.completions.create(
        model="m", prompt=[eos], echo=True, max_tokens=0, logprobs=0, stream=True
    )
    parts = [c.choices[0] async for c in chunks if c.choices]
    assert [(p.text, p.finish_reason) for p in parts] == [("", "length")]


async def test_a_prompt_too_long_to_score_in_one_output_is_refused(
    preprocessor: Preprocessor,
) -> None:
    """A prompt's logprobs travel in one engine output, one request-plane message (NATS: 1
    MiB by default): a prompt whose logprobs would not fit is a 400 naming the bound (it
    failed on the worker, read as a dead worker, and was recomputed on every other). The
    bound's per-token sizes are msgpack's own."""
    for n in (0, 1, 20):  # the most it lets through fits NATS's default 1 MiB message
        per_token = PROMPT_LOGPROB_TOKEN_BYTES + PROMPT_LOGPROB_ALTERNATIVE_BYTES * n
        items = [TokenLogprob(49151, -1.25, [(49150, -2.5)] * n)] * (
            MAX_PROMPT_LOGPROBS_BYTES // per_token
        )
        output = EngineOutput(
            request_id="cmpl-" + "0" * 32, new_token_ids=[1], prompt_logprobs=items
        )
        assert len(msgspec.msgpack.encode(output)) < 1 << 20
    engine, client = serve(preprocessor, max_model_len=8192)
    most = MAX_PROMPT_LOGPROBS_BYTES // (PROMPT_LOGPROB_TOKEN_BYTES + 20 * 13)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(
            model="m", prompt=[42] * (most + 1), echo=True, logprobs=20, max_tokens=0
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "logprobs"
    assert f"scores at most {most} prompt tokens" in body["message"]
    assert engine.prompts == []


async def test_a_special_token_in_the_prompt_adds_nothing_to_the_offsets(
    preprocessor: Preprocessor,
) -> None:
    """The echo leaves a special token out (a BOS): its offset width is 0, so every offset
    indexes the returned text and they never run backwards (the BOS's own text was counted:
    the completion's offsets then went back)."""
    engine, client = serve(preprocessor)
    engine.outputs = [OUTPUT]
    [eos] = preprocessor.encode("<|endoftext|>", add_special_tokens=False)
    ids = [eos, *preprocessor.encode(PROMPT, add_special_tokens=False)]
    whole = await client.completions.create(
        model="m", prompt=ids, echo=True, logprobs=0, max_tokens=32
    )
    choice = whole.choices[0]
    assert choice.text == PROMPT + OUTPUT
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.text_offset
    assert logprobs.tokens[0] == "<|endoftext|>" and logprobs.text_offset[:2] == [0, 0]
    offsets = logprobs.text_offset
    assert offsets == sorted(offsets)
    for token, offset in zip(logprobs.tokens[1:], offsets[1:], strict=True):
        assert choice.text[offset : offset + len(token)] == token
