"""One real `armature serve` process for the whole integration session.

- `base_url`: the server's root URL (loopback, a free port); the process starts once, is
  stopped by its PID at the end, and its stderr must then hold no traceback.
- `model_name`: the name the server serves (`--served-model-name`).
- `http`: an httpx client on `base_url`; `openai_client`: the official client on `/v1`.
- `tokenizer`: the served model's tokenizer, to count prompt tokens independently.
- `read_metrics`: scrape /metrics into {'name{label="v",...}': value}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_process import (
    MAX_MODEL_LEN,
    NUM_KV_BLOCKS,
    SERVED_MODEL_NAME,
    Metrics,
    parse_metrics,
    running_server,
)


@pytest.fixture(scope="session")
def base_url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = [
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--device",
        "cpu",  # deterministic numerics: tests compare greedy outputs across batches
        "--dtype",
        "float32",
        "--num-kv-blocks",
        str(NUM_KV_BLOCKS),
        "--max-model-len",
        str(MAX_MODEL_LEN),
    ]
    with running_server(default_model_dir, tmp_path_factory.mktemp("server"), args) as url:
        yield url


@pytest.fixture(scope="session")
def model_name() -> str:
    return SERVED_MODEL_NAME


@pytest.fixture(scope="session")
def max_model_len() -> int:
    return MAX_MODEL_LEN


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        yield client


@pytest.fixture
def openai_client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60.0
    ) as client:
        yield client


@pytest.fixture(scope="session")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))


@pytest.fixture
def read_metrics(base_url: str) -> Callable[[], Metrics]:
    def read() -> Metrics:
        response = httpx.get(f"{base_url}/metrics", timeout=10.0)
        assert response.status_code == 200
        return parse_metrics(response.text)

    return read


@pytest.fixture
def fleet(default_model_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """A `fleet.Fleet` of worker and frontend processes in `tmp_path`, stopped after the test,
    whose logs must hold no traceback."""
    from fleet import Fleet

    f = Fleet(default_model_dir, tmp_path)
    try:
        yield f
    finally:
        f.stop()
    f.assert_no_tracebacks()
