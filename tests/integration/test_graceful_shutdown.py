"""Graceful shutdown: SIGTERM on a worker takes it out of discovery at once, lets the request
it is streaming finish in full, then exits cleanly; new requests no longer reach it."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# speedup 1: a decode step takes ~6 ms of simulated GPU time, so 300 tokens stream for ~2 s
MOCKER = ["--engine", "mocker", "--speedup-ratio", "1", "--num-kv-blocks", "1024"]


def test_sigterm_drains_the_worker(default_model_dir: Path, tmp_path: Path) -> None:
    fleet = Fleet(
        default_model_dir, tmp_path, engine_args=[*MOCKER, "--served-model-name", SERVED_MODEL_NAME]
    )
    try:
        victim = fleet.start_worker("worker-a")
        url = fleet.start_frontend()
        body = {"model": SERVED_MODEL_NAME, "prompt": "drain me", "max_tokens": 300}
        result: dict[str, object] = {}
        first_token = threading.Event()

        def stream() -> None:
            texts, finish = [], None
            with httpx.stream(
                "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        choice = json.loads(line[6:])["choices"][0]
                        texts.append(choice["text"])
                        finish = choice["finish_reason"] or finish
                        first_token.set()
            result.update(chunks=len(texts), finish=finish)

        thread = threading.Thread(target=stream)
        thread.start()
        assert first_token.wait(30)
        victim.send_signal(signal.SIGTERM)
        started = time.monotonic()
        thread.join(60)
        assert result["finish"] == "length"  # the whole stream, not a truncated one
        assert victim.wait(30) == 0
        assert time.monotonic() - started < 30
        log = (tmp_path / "worker-a.log").read_text()
        assert "draining 1 in-flight requests" in log
        assert "still in flight" not in log
        late = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert late.status_code == 503  # the only worker is gone
    finally:
        fleet.stop()
    fleet.assert_no_tracebacks()
