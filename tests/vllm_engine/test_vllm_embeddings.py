"""`armature serve --engine vllm --task embed`: vLLM's pooling runner behind /v1/embeddings,
through the openai client, against sentence embeddings computed with transformers on the
same model (cosine >= 0.999), in order, float and base64 alike; generation refused naming
the task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from vllm_servers import ARMATURE_ENGINE_ARGS, armature_serve, skip_without_vllm

skip_without_vllm()

from armature.protocols.embedding import Pooling  # noqa: E402
from hf_embeddings import (  # noqa: E402
    MIN_COSINE,
    HfEmbeddings,
    cosine,
    embed_many_in_order,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration]

MODEL = "smollm2-vllm-embed"


@pytest.fixture(scope="module")
def client(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("vllm-embed") / "serve.log"
    args = [*ARMATURE_ENGINE_ARGS, "--served-model-name", MODEL, "--task", "embed"]
    args += ["--pooling", "mean"]
    with (
        armature_serve(default_model_dir, log, args) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=120) as c,
    ):
        yield c


def test_vectors_match_transformers(client: openai.OpenAI, default_model_dir: Path) -> None:
    vectors, ids = embed_many_in_order(client, MODEL, default_model_dir)
    hf = HfEmbeddings(default_model_dir)
    assert len(vectors[0]) == 576
    for i in (0, 64, 129):
        assert cosine(vectors[i], hf.embed(ids[i], Pooling.MEAN)) >= MIN_COSINE


def test_generation_is_refused_naming_the_task(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    body: Any = caught.value.body
    assert (body["param"], body["code"]) == ("model", "wrong_task")
