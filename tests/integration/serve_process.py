"""What the integration tests share outside fixtures: the session server's settings, starting
an `armature serve` process and waiting for it to be healthy, and reading /metrics. (A module of
its own, imported by name: `conftest` is a different module in every test directory.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servers import free_port as _free_port

__all__ = [
    "MAX_MODEL_LEN",
    "NUM_KV_BLOCKS",
    "SERVED_MODEL_NAME",
    "Metrics",
    "_free_port",
    "_wait_healthy",
    "parse_metrics",
    "running_server",
]

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
    started: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[str]:
    """Start `armature serve` on a free loopback port (with `env` added to this process's
    environment; `preexec_fn` run in the child before exec; the process appended to
    `started`); yield its URL; stop it by PID and assert its stderr holds no traceback. Its
    $XDG_RUNTIME_DIR is `log_dir / "run"`: a `--workers` fleet's private directory lies
    there, not in a directory others share."""
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
    if started is not None:
        started.append(proc)
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


def parse_metrics(text: str) -> Metrics:
    """Prometheus text -> {'name{k="v",...}': value}, labels sorted by name."""
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
