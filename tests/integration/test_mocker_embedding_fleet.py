"""A fleet of mocker embedding workers (`armature serve --engine mocker --task embed
--workers 2`): no weights, routed and served like real embedding workers, with the mocker's
documented pseudo-embeddings (sim/mock_embedding.py) of the model's dimension, whole legs on
both workers, in order; chat is refused naming the task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from serve_process import running_server

from armature.protocols.embedding import Pooling
from armature.sim.mock_embedding import pseudo_embedding
from hf_embeddings import embed_many_in_order

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "mock-embed"
HIDDEN_SIZE = 576  # SmolLM2-135M


@pytest.fixture(scope="module")
def client(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    args = [
        *("--served-model-name", MODEL, "--engine", "mocker", "--task", "embed"),
        *("--pooling", "mean", "--workers", "2", "--speedup-ratio", "100"),
    ]
    log_dir = tmp_path_factory.mktemp("mock-embed")
    with (
        running_server(default_model_dir, log_dir, args) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=60) as c,
    ):
        yield c


def test_pseudo_embeddings_of_many_inputs_in_order(
    client: openai.OpenAI, default_model_dir: Path
) -> None:
    vectors, ids = embed_many_in_order(client, MODEL, default_model_dir)
    for prompt, vector in zip(ids, vectors, strict=True):
        assert np.array_equal(vector, pseudo_embedding(prompt, HIDDEN_SIZE, Pooling.MEAN))


def test_chat_is_refused_naming_the_task(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    body: Any = caught.value.body
    assert (body["param"], body["code"]) == ("model", "wrong_task")
