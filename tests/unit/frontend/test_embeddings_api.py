"""/v1/embeddings through the whole frontend with the official openai client (float and
base64), on the native embedding engine with the default model in float32: vectors equal
transformers' sentence embeddings (cosine >= 0.999), usage counts the tokens, token-id
inputs embed like their text. Every bad input is a 400 (404 for the model) in OpenAI's error
format naming the field; a request for the task the workers do not serve names it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from frontend_fakes import IdleEngine

from armature.config import RouterConfig
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.embed_queue import EmbedQueue
from armature.engines.native.embedding_engine import NativeEmbeddingEngine
from armature.engines.native.embedding_runner import EmbeddingRunner
from armature.frontend.app import ServedModel, build_app
from armature.frontend.compose import FrontendParts, compose_frontend
from armature.frontend.preprocess import Preprocessor
from armature.protocols.embedding import Pooling
from hf_embeddings import MIN_COSINE, HfEmbeddings, cosine

pytestmark = pytest.mark.slow  # loads the default model

MODEL = "smol-embed"
MAX_MODEL_LEN = 64
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France."]


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


@pytest.fixture(scope="module")
def hf(default_model_dir: Path) -> HfEmbeddings:
    return HfEmbeddings(default_model_dir)


def load_runner(model_dir: Path) -> EmbeddingRunner:
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN)
    return EmbeddingRunner(config, Pooling.MEAN)


@pytest.fixture(scope="module")
def runner(default_model_dir: Path) -> EmbeddingRunner:
    return load_runner(default_model_dir)


@pytest.fixture(scope="module")
def matryoshka_runner(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> EmbeddingRunner:
    """The default model, its config.json declaring Matryoshka dimensions 64 and 576."""
    directory = tmp_path_factory.mktemp("matryoshka")
    for path in default_model_dir.iterdir():
        if path.name != "config.json":
            (directory / path.name).symlink_to(path)
    config = json.loads((default_model_dir / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps({**config, "matryoshka_dimensions": [64, 576]})
    )
    return load_runner(directory)


async def serve(
    preprocessor: Preprocessor, runner: EmbeddingRunner | None, generate: bool = False
) -> tuple[FrontendParts, httpx.AsyncClient, openai.AsyncOpenAI]:
    embed_engines = {}
    if runner is not None:
        embed_engines["e0"] = NativeEmbeddingEngine(runner, EmbedQueue(256, 8))
    return await serve_engines(preprocessor, embed_engines, generate)


async def serve_engines(
    preprocessor: Preprocessor,
    embed_engines: dict[str, NativeEmbeddingEngine],
    generate: bool = False,
) -> tuple[FrontendParts, httpx.AsyncClient, openai.AsyncOpenAI]:
    parts = compose_frontend(
        engines={"g0": IdleEngine()} if generate else {},  # type: ignore[dict-item]
        embed_engines=embed_engines,
        router_config=RouterConfig(),
        preprocessor=preprocessor,
        model=ServedModel(MODEL, MAX_MODEL_LEN, 0),
    )
    parts.embedder.start()  # the ASGI transport runs no lifespan
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(parts)), base_url="http://t"
    )
    client = openai.AsyncOpenAI(
        base_url="http://t/v1", api_key="-", http_client=http, max_retries=0
    )
    return parts, http, client


@pytest.fixture
async def app(
    preprocessor: Preprocessor, runner: EmbeddingRunner
) -> AsyncIterator[tuple[httpx.AsyncClient, openai.AsyncOpenAI]]:
    parts, http, client = await serve(preprocessor, runner)
    try:
        yield http, client
    finally:
        await parts.embedder.stop()


async def test_openai_client_float_and_base64_match_transformers(
    app: tuple[httpx.AsyncClient, openai.AsyncOpenAI], hf: HfEmbeddings, preprocessor: Preprocessor
) -> None:
    _, client = app
    whole = await client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    packed = await client.embeddings.create(model=MODEL, input=TEXTS)  # base64 by default
    prompts = [preprocessor.encode(text) for text in TEXTS]
    assert whole.model == MODEL and whole.object == "list"
    assert [d.index for d in whole.data] == [0, 1]
    assert whole.usage.prompt_tokens == whole.usage.total_tokens == sum(len(p) for p in prompts)
    assert packed.usage == whole.usage
    for prompt, one, two in zip(prompts, whole.data, packed.data, strict=True):
        assert one.embedding == two.embedding  # base64 carries the same float32 values
        vector = np.array(one.embedding, dtype=np.float32)
        assert vector.shape == (576,)
        assert cosine(vector, hf.embed(prompt, Pooling.MEAN)) >= MIN_COSINE


async def test_token_ids_embed_like_their_text(
    app: tuple[httpx.AsyncClient, openai.AsyncOpenAI], preprocessor: Preprocessor
) -> None:
    _, client = app
    ids = [preprocessor.encode(text) for text in TEXTS]
    text = await client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    one = await client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    many = await client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert one.data[0].embedding == text.data[0].embedding
    assert len(many.data) == 2 and many.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    assert cosine(np.array(many.data[0].embedding), np.array(text.data[0].embedding)) > 0.99999


BAD_INPUTS: list[tuple[dict[str, Any], str, str]] = [
    ({"input": ""}, "input", "input must not be empty"),
    ({"input": []}, "input", "input must not be empty"),
    ({"input": ["a", ""]}, "input", "input[1] must not be empty"),
    ({"input": [[1], []]}, "input", "input[1] must not be empty"),
    ({"input": [1, "a"]}, "input", "input must be a string, a list of strings"),
    ({"input": 5}, "input", "input must be a string"),
    ({"input": True}, "input", "input must be a string"),
    ({"input": [[-1]]}, "input", "token ids (integers 0..2**31-1)"),
    ({"input": [1.5]}, "input", "input must be a string"),
    ({"input": ["x"] * 2049}, "input", "at most 2048 items, got 2049"),
    # the value shown is cut, and says so (it read as a whole list missing its end)
    ({"input": ["x"] * 2049}, "input", '"x",... (10,145 more characters))'),
    # a flat list of token ids is one input: the context bounds it, not the count of inputs
    ({"input": [7] * 3000}, "input", "input[0] has 3000 tokens; this model's maximum"),
    ({"input": [49152]}, "input", "token ids must be in [0, 49152)"),
    ({"input": [7] * (MAX_MODEL_LEN + 1)}, "input", "input[0] has 65 tokens; this model's maximum"),
    ({"input": ["ok", "word " * 80]}, "input", "input[1] has 81 tokens"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "x", "dimensions": "8"}, "dimensions", "valid integer"),
    ({"input": "x", "dimensions": 64}, "dimensions", "does not support `dimensions`"),
    ({}, "input", "Field required"),
]


@pytest.mark.parametrize(("fields", "param", "fragment"), BAD_INPUTS)
async def test_every_bad_input_is_a_400_naming_its_field(
    app: tuple[httpx.AsyncClient, openai.AsyncOpenAI],
    fields: dict[str, Any],
    param: str,
    fragment: str,
) -> None:
    http, _ = app
    response = await http.post("/v1/embeddings", json={"model": MODEL, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]


async def test_an_unknown_model_is_a_404_and_a_non_object_body_a_400(
    app: tuple[httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    http, client = app
    with pytest.raises(openai.NotFoundError) as caught:
        await client.embeddings.create(model="other", input="x")
    assert caught.value.body["param"] == "model"  # type: ignore[index]
    response = await http.post("/v1/embeddings", json=["x"])
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_dimensions_cut_and_renormalise_on_a_matryoshka_model(
    preprocessor: Preprocessor, matryoshka_runner: EmbeddingRunner
) -> None:
    parts, http, client = await serve(preprocessor, matryoshka_runner)
    try:
        full = await client.embeddings.create(model=MODEL, input="x", encoding_format="float")
        cut = await client.embeddings.create(model=MODEL, input="x", dimensions=64)
        refused = await http.post(
            "/v1/embeddings", json={"model": MODEL, "input": "x", "dimensions": 65}
        )
    finally:
        await parts.embedder.stop()
    vector = np.array(cut.data[0].embedding, dtype=np.float64)
    assert vector.shape == (64,)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-6
    head = np.array(full.data[0].embedding[:64], dtype=np.float64)
    assert np.allclose(vector, head / np.linalg.norm(head), atol=1e-6)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "dimensions"
    assert "can be cut to 64, 576 dimensions, not 65" in refused.json()["error"]["message"]


async def test_each_task_refuses_the_other_naming_model_and_task(
    preprocessor: Preprocessor, runner: EmbeddingRunner
) -> None:
    parts, _, client = await serve(preprocessor, runner)
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        await parts.embedder.stop()
    body: Any = caught.value.body
    assert (body["param"], body["code"]) == ("model", "wrong_task")
    assert f"model '{MODEL}' is served for task embed only" in body["message"]

    _, _, client = await serve(preprocessor, None, generate=True)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=MODEL, input="x")
    body = caught.value.body
    assert (body["param"], body["code"]) == ("model", "wrong_task")
    assert (
        "served for task generate only; /v1/embeddings needs workers of task embed"
        in body["message"]
    )
    assert "with any engine" in body["message"]
    assert "no embeddings" not in body["message"]


class HeldRunner:
    """The runner, held on its first batch until `release` is set."""

    def __init__(self, runner: EmbeddingRunner) -> None:
        self.shape = runner.shape
        self.arch = runner.arch
        self.max_model_len = runner.max_model_len
        self._runner = runner
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, prompts: list[list[int]]) -> list[bytes]:
        self.entered.set()
        self.release.wait(60)
        return self._runner.embed(prompts)


def asgi_post(path: str, body: dict[str, Any], leave_when: threading.Event) -> Any:
    """An ASGI call of POST `path` whose client disconnects once `leave_when` is set."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode()}
        await asyncio.to_thread(leave_when.wait, 60)
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"t")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }
    return scope, receive


async def test_a_client_that_leaves_cancels_its_embeddings(
    preprocessor: Preprocessor, runner: EmbeddingRunner
) -> None:
    """The route awaited the vectors however long they took, counted the request 200 and
    held its place in flight; the queued legs ran for nobody."""
    held = HeldRunner(runner)
    engine = NativeEmbeddingEngine(held, EmbedQueue(256, 1))  # type: ignore[arg-type]
    parts, _, _ = await serve_engines(preprocessor, {"e0": engine})
    body = {"model": MODEL, "input": ["one", "two", "three"]}  # three legs, one a batch
    scope, receive = asgi_post("/v1/embeddings", body, held.entered)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        # the client leaves while the first leg computes: the route answers without it
        await asyncio.wait_for(build_app(parts)(scope, receive, send), 30)
        assert not held.release.is_set()
        assert sent[0]["status"] == 499
        load = engine.get_load()
        assert (load.num_waiting, load.num_running) == (0, 1)  # the other two left the queue
        metrics = parts.metrics.render().decode()
        assert 'armature_requests_total{endpoint="embeddings",status="499"} 1.0' in metrics
        assert "armature_requests_in_flight 0.0" in metrics
    finally:
        held.release.set()
        await parts.embedder.stop()
