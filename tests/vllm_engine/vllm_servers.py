"""Shared by the vLLM tests: skip without vLLM, the engine flags every test uses (the same in
the server and in vLLM's offline run), `armature serve` processes stopped by PID, and vLLM's
offline LLM.generate in a subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from servers import free_port

HAS_VLLM = importlib.util.find_spec("vllm") is not None
STARTUP_TIMEOUT_S = 400.0
HERE = Path(__file__).resolve().parent

# eager (no torch.compile): each engine starts in ~45 s instead of ~2 min on 2 cores
MAX_MODEL_LEN = 2048
ARMATURE_ENGINE_ARGS = [
    "--engine",
    "vllm",
    "--enforce-eager",
    "--dtype",
    "float32",
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--kv-cache-bytes",
    "512MiB",
]
OFFLINE_ENGINE_KWARGS = {  # the same engine as ARMATURE_ENGINE_ARGS plus Armature's defaults
    "enforce_eager": True,
    "dtype": "float32",
    "max_model_len": MAX_MODEL_LEN,
    "kv_cache_memory_bytes": 512 << 20,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 1024,
    "seed": 0,
}


def skip_without_vllm() -> None:
    if not HAS_VLLM:
        pytest.skip(
            "vLLM is not installed (scripts/check-vllm runs these)", allow_module_level=True
        )


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline_s = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"server not healthy after {STARTUP_TIMEOUT_S} s")


@contextmanager
def armature_serve(model_dir: Path, log_path: Path, args: list[str]) -> Iterator[str]:
    """`armature serve --model model_dir *args` on a free loopback port; yields its URL; stops
    it by PID and asserts its log holds no traceback. Its $XDG_RUNTIME_DIR (where a fleet's
    private directory lies) is `run/` beside the log."""
    port = free_port()
    runtime_dir = log_path.parent / "run"
    runtime_dir.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "armature.cli", "serve", "--model", str(model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(runtime_dir)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, log_path)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log_path.read_text(errors="replace")
    assert "Traceback" not in text, f"server logged a traceback:\n{text[-5000:]}"


def offline_greedy(
    model_dir: Path, prompts: list[list[int]], max_tokens: int
) -> tuple[list[str], list[list[int]]]:
    """vLLM's offline LLM.generate (greedy, one prompt at a time): (texts, token ids)."""
    job = {
        "model": str(model_dir),
        "engine": OFFLINE_ENGINE_KWARGS,
        "prompts": prompts,
        "max_tokens": max_tokens,
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "offline_generate.py")],
        input=json.dumps(job).encode(),
        capture_output=True,
        timeout=STARTUP_TIMEOUT_S,
        check=False,
    )
    for line in done.stdout.decode().splitlines():
        if line.startswith("OFFLINE-RESULT "):
            result = json.loads(line.removeprefix("OFFLINE-RESULT "))
            return result["texts"], result["token_ids"]
    pytest.fail(f"offline vLLM failed ({done.returncode}):\n{done.stderr.decode()[-5000:]}")
