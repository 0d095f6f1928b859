"""OpenAI types most request fields nullable, and the official client sends a None the caller
passes as null: a null where the field has a default stands for that default (chat,
completions, Responses, embeddings alike); a required field's null is still a 400."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from frontend_fakes import ScriptedEngine, one_engine_frontend, openai_client

from armature.frontend.app import build_app
from armature.frontend.preprocess import Preprocessor

ASK: list = [{"role": "user", "content": "Hi"}]  # type: ignore[type-arg]


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


async def test_nulls_stand_for_the_defaults(preprocessor: Preprocessor) -> None:
    engine = ScriptedEngine(preprocessor)
    client = openai_client(one_engine_frontend(engine))
    engine.outputs = ["Hello there."] * 3
    chat = await client.chat.completions.create(
        model="m",
        messages=ASK,
        n=None,
        stream=None,
        logprobs=None,
        presence_penalty=None,
        frequency_penalty=None,
    )
    assert [c.message.content for c in chat.choices] == ["Hello there."]
    assert chat.choices[0].logprobs is None
    completion = await client.completions.create(
        model="m", prompt="Hi", n=None, echo=None, stream=None, presence_penalty=None
    )
    assert [c.text for c in completion.choices] == ["Hello there."]  # not echoed
    response = await client.responses.create(model="m", input="Hi", store=None, stream=None)
    assert response.output_text == "Hello there."
    assert (await client.responses.retrieve(response.id)).id == response.id  # stored
    sampling = [r.sampling for r in engine.requests]
    assert [(s.presence_penalty, s.frequency_penalty) for s in sampling] == [(0.0, 0.0)] * 3
    engine.outputs = ["Hi."]
    await client.chat.completions.create(model="m", messages=ASK, extra_body={"min_p": 0.05})
    assert engine.requests[-1].sampling.min_p == 0.05  # vLLM's min_p reaches the engine


async def test_a_required_fields_null_is_still_refused(preprocessor: Preprocessor) -> None:
    app = build_app(one_engine_frontend(ScriptedEngine(preprocessor)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        response = await http.post(
            "http://test/v1/chat/completions", json={"model": "m", "messages": None}
        )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"


async def test_the_client_sends_the_nulls(preprocessor: Preprocessor) -> None:
    """The premise: the openai client puts a None it is given into the body as null."""
    bodies: list[bytes] = []

    async def record(request: httpx.Request) -> None:
        bodies.append(request.content)

    engine = ScriptedEngine(preprocessor)
    engine.outputs = ["Hello."]
    app = build_app(one_engine_frontend(engine))
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), event_hooks={"request": [record]}
    )
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http)
    await client.chat.completions.create(model="m", messages=ASK, n=None)
    assert b'"n":null' in bodies[0].replace(b" ", b"")


async def test_a_limit_past_the_context_names_the_field_the_request_set(
    preprocessor: Preprocessor,
) -> None:
    """Chat's max_completion_tokens over the context: the 400 names it (it named max_tokens,
    a field the client never sent); Responses' name for either is max_output_tokens."""
    client = openai_client(one_engine_frontend(ScriptedEngine(preprocessor)))
    errors = []
    for limits in ({"max_completion_tokens": 4000}, {"max_tokens": 4000}):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=ASK, **limits)  # type: ignore[call-overload]
        errors.append(caught.value.body)
    for error, field in zip(errors, ("max_completion_tokens", "max_tokens"), strict=True):
        assert error["param"] == field  # type: ignore[index]
        assert error["message"].endswith(f"reduce the prompt or {field}")  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="m", messages=ASK, max_completion_tokens=2, extra_body={"min_tokens": 3}
        )
    assert caught.value.body["message"] == "min_tokens must not exceed max_completion_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="m", input="Hi", max_output_tokens=4000)
    body = caught.value.body
    assert body["param"] == "max_output_tokens"  # type: ignore[index]
    assert body["message"].endswith("reduce the prompt or max_output_tokens")  # type: ignore[index]
