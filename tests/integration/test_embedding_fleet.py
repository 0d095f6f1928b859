"""Embedding workers as processes: `armature serve --task embed --workers 2` starts two
`armature worker --task embed` processes that register with their task on their cards; the
frontend routes /v1/embeddings to them (a request of many inputs is cut into legs that run
on both) and refuses chat for this model, naming the task. Checked with the openai client
against transformers' sentence embeddings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_process import running_server

from armature.protocols.embedding import Pooling
from hf_embeddings import MIN_COSINE, HfEmbeddings, cosine, embed_many_in_order

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "smol-embed-fleet"


@pytest.fixture(scope="module")
def client(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    args = [
        *("--served-model-name", MODEL, "--task", "embed", "--pooling", "cls"),
        *("--workers", "2", "--device", "cpu", "--dtype", "float32", "--max-model-len", "256"),
    ]
    log_dir = tmp_path_factory.mktemp("embed-fleet")
    with (
        running_server(default_model_dir, log_dir, args) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=120) as c,
    ):
        yield c


def test_a_fleet_of_embed_workers_serves_many_inputs_in_order(
    client: openai.OpenAI, default_model_dir: Path
) -> None:
    vectors, ids = embed_many_in_order(client, MODEL, default_model_dir)
    hf = HfEmbeddings(default_model_dir)
    for i in (0, 64, 129):  # one from each leg
        assert cosine(vectors[i], hf.embed(ids[i], Pooling.CLS)) >= MIN_COSINE


def test_generation_is_refused_naming_the_model_and_task(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    body: Any = caught.value.body
    assert (body["param"], body["code"]) == ("model", "wrong_task")
    assert f"model '{MODEL}' is served for task embed only" in body["message"]
