"""One real `armature serve` process for the whole integration session.

- `base_url`: the server's root URL (loopback, a free port); the process starts once, is
  stopped by its PID at the end, and its stderr must then hold no traceback.
- `model_name`: the name the server serves (`--served-model-name`).
- `http`: an httpx client on `base_url`; `openai_client`: the official client on `/v1`.
- `tokenizer`: the served model's tokenizer, to count prompt tokens independently.
- `read_metrics`: scrape /metrics into {'name{label="v",...}': value}.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servers import free_port as _free_port

SERVED_MODEL_NAME = "smollm2-integration"
MAX_MODEL_LEN = 2048
NUM_KV_BLOCKS = 512
STARTUP_TIMEOUT_S = 180.0
SHUTDOWN_TIMEOUT_S = 20.0

Metrics = dict[str, float]


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, stderr_path: Path) -> None:
    deadline_s = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            pytest.fail(
                f"server exited with {proc.returncode} during startup:\n{stderr_path.read_text()}"
            )
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.kill()
    pytest.fail(f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{stderr_path.read_text()}")


@contextmanager
def running_server(
    model_dir: Path,
    log_dir: Path,
    extra_args: list[str],
    *,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[str]:
    """Start `armature serve` on a free loopback port (with `env` added to this process's
    environment; `preexec_fn` run in the child before exec); yield its URL; stop it by PID
    and assert its stderr holds no traceback. Its $XDG_RUNTIME_DIR is `log_dir / "run"`:
    a `--workers` fleet's private directory lies there, not in a directory others share."""
    port = _free_port()
    runtime_dir = log_dir / "run"
    runtime_dir.mkdir(exist_ok=True)
    stderr_path = log_dir / "stderr.log"
    command = [
        sys.executable,
        "-m",
        "armature.cli",
        "serve",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    with (
        open(stderr_path, "wb") as stderr,
        open(log_dir / "stdout.log", "wb") as stdout,
    ):
        proc = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=stderr,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "XDG_RUNTIME_DIR": str(runtime_dir),
                **(env or {}),
            },
            preexec_fn=preexec_fn,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, stderr_path)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM to this PID only: uvicorn shuts down gracefully
            try:
                proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    log_text = stderr_path.read_text(errors="replace")
    assert "Traceback" not in log_text, f"server logged a traceback:\n{log_text}"


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


def parse_metrics(text: str) -> Metrics:
    """Prometheus text -> {'name{k="v",...}': value}, labels sorted by name."""
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


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
    from fleet import Fleet  # fleet.py imports this module

    f = Fleet(default_model_dir, tmp_path)
    try:
        yield f
    finally:
        f.stop()
    f.assert_no_tracebacks()
