"""`echo` on /v1/completions: the prompt's text before the completion, whole and streamed,
for a text prompt and a token-id prompt; with `logprobs` it is refused (no logprobs of the
prompt's tokens are computed, so the tokens would not join the text). Also: stream_options
without a stream is refused, as OpenAI refuses it."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from frontend_fakes import ScriptedEngine

from armature.config import RouterConfig
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import compose_frontend
from armature.frontend.preprocess import Preprocessor

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

PROMPT = "The capital of France is"
OUTPUT = " Paris, a city of light."


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def serve(preprocessor: Preprocessor) -> tuple[ScriptedEngine, openai.AsyncOpenAI]:
    engine = ScriptedEngine(preprocessor)
    parts = compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
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


async def test_echo_with_logprobs_is_refused_before_the_engine(
    preprocessor: Preprocessor,
) -> None:
    engine, client = serve(preprocessor)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(
            model="m", prompt=PROMPT, echo=True, logprobs=0, max_tokens=4
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert (body["param"], body["code"]) == ("echo", "unsupported_parameter")
    assert body["message"] == "echo with logprobs is not supported (no logprobs of prompt tokens)"
    assert engine.prompts == []


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
