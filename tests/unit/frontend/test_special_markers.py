"""Tool-call markers that are special tokens (Mistral's `[TOOL_CALLS]` and `[ARGS]`), on a
copy of the default model's tokenizer that holds them as special tokens, as Mistral's own
vocabularies do: decoding drops special tokens, so the frontend keeps exactly these ids, and
the mistral parser reads the calls whole and streamed through the real frontend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from frontend_fakes import ScriptedEngine
from transformers import AutoTokenizer

from armature.config import RouterConfig
from armature.frontend.app import ServedModel, build_app
from armature.frontend.chat_setup import (
    chatml_tools_template,
    special_token_ids,
    with_kept_markers,
)
from armature.frontend.compose import compose_frontend
from armature.frontend.detokenizer import IncrementalDetokenizer
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import Preprocessor

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

MARKERS = ["[TOOL_CALLS]", "[ARGS]"]
V11_OUTPUT = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
V3_OUTPUT = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


@pytest.fixture(scope="module")
def mistral_like_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": MARKERS})
    out = tmp_path_factory.mktemp("mistral_like")
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def preprocessor(mistral_like_dir: Path) -> Preprocessor:
    return Preprocessor(mistral_like_dir, chatml_tools_template())


def test_the_markers_are_found_where_they_are_special(
    preprocessor: Preprocessor, default_model_dir: Path
) -> None:
    tokenizer = preprocessor.tokenizer
    ids = [tokenizer.convert_tokens_to_ids(m) for m in MARKERS]
    assert special_token_ids(tokenizer, MARKERS) == dict(zip(ids, MARKERS, strict=True))
    parsers = with_kept_markers(OutputParsers.named("mistral", None), preprocessor)
    assert parsers.kept_tokens == dict(zip(ids, MARKERS, strict=True))
    # the default vocabulary has no such tokens, nor are hermes' markers special there
    plain = Preprocessor(default_model_dir)
    assert special_token_ids(plain.tokenizer, MARKERS) == {}
    assert with_kept_markers(OutputParsers.named("hermes", None), plain).kept_tokens == {}


def test_the_detokenizer_keeps_exactly_the_kept_ids(preprocessor: Preprocessor) -> None:
    ids = preprocessor.encode(V11_OUTPUT, add_special_tokens=False)
    kept = special_token_ids(preprocessor.tokenizer, MARKERS)
    assert set(kept) <= set(ids)  # the markers are single special tokens

    def stream(kept_tokens: dict[int, str] | None) -> str:
        detok = IncrementalDetokenizer(preprocessor.decoder, [1, 2], kept_tokens=kept_tokens)
        text = "".join(detok.update([token]).text_delta for token in ids)
        return text + detok.flush()

    assert stream(kept) == V11_OUTPUT
    assert stream(None) == 'Sure.get_weather{"city": "Paris"}'  # special tokens skipped


async def test_mistral_calls_whole_and_streamed(preprocessor: Preprocessor) -> None:
    engine = ScriptedEngine(preprocessor)
    parts = compose_frontend(
        engines={"w0": engine},  # type: ignore[dict-item]
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel("m", 2048, 0),
        parsers=with_kept_markers(OutputParsers.named("mistral", None), preprocessor),
    )
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(parts)))
    client = openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0
    )
    request: Any = {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER_TOOL],
    }
    expected = [
        ("Sure.", "get_weather", '{"city": "Paris"}'),
        (None, "get_weather", '{"city": "Rome"}'),
    ]
    engine.outputs = [V11_OUTPUT, V3_OUTPUT, V11_OUTPUT, V3_OUTPUT]
    for content, name, arguments in expected:
        choice = (await client.chat.completions.create(**request)).choices[0]
        calls = choice.message.tool_calls or []
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == content
        assert [(c.function.name, c.function.arguments) for c in calls] == [(name, arguments)]  # type: ignore[union-attr]
    for content, name, arguments in expected:
        stream = await client.chat.completions.create(**request, stream=True)
        deltas = [c.choices[0].delta async for c in stream if c.choices]
        assert "".join(d.content or "" for d in deltas) == (content or "")
        calls = [t for d in deltas for t in d.tool_calls or []]
        assert [t.function.name for t in calls if t.id] == [name]  # type: ignore[union-attr]
        assert "".join(t.function.arguments or "" for t in calls) == arguments  # type: ignore[union-attr]
    # without tools the output is not read for calls, and special tokens are skipped as ever
    engine.outputs = [V11_OUTPUT]
    plain = await client.chat.completions.create(model="m", messages=request["messages"])
    assert plain.choices[0].message.content == 'Sure.get_weather{"city": "Paris"}'
