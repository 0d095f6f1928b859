"""Worker lifecycle faults. Graceful shutdown: SIGTERM on a worker takes it out of discovery at
once, lets the request it is streaming finish in full, then exits cleanly. A hung worker
(SIGSTOP): its streams fail over, and it gets no new request."""

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


def test_a_hung_worker_is_taken_out_of_routing(default_model_dir: Path, tmp_path: Path) -> None:
    """SIGSTOP one of two workers mid-stream: its streams stall, fail over after the stall
    timeout and finish on the other worker with their full length; once its heartbeats stop
    it receives no new request."""
    fleet = Fleet(
        default_model_dir, tmp_path, engine_args=[*MOCKER, "--served-model-name", SERVED_MODEL_NAME]
    )
    hung = fleet.start_worker("worker-a")
    fleet.start_worker("worker-b")
    try:
        health = ["--worker-liveness-timeout-s", "2", "--worker-stall-timeout-s", "2"]
        url = fleet.start_frontend(extra=["--router", "round-robin", *health])
        deadline = time.monotonic() + 30
        while len(decisions_of(url)) < 2 and time.monotonic() < deadline:
            complete(url, 1)  # until both workers have been routed to
        body = {"model": SERVED_MODEL_NAME, "prompt": "keep going", "max_tokens": 300}
        results: list[int] = []

        def request() -> None:
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            results.append(response.json()["usage"]["completion_tokens"])

        threads = [threading.Thread(target=request) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        hung.send_signal(signal.SIGSTOP)
        for t in threads:
            t.join(60)
        assert results == [300] * 4  # none truncated: the hung worker's moved to the other
        time.sleep(2.5)  # its heartbeats have stopped for longer than the liveness timeout
        before = decisions_of(url)
        for _ in range(4):
            complete(url, 2)
        after = decisions_of(url)
        grew = {w: after[w] - before[w] for w in before}
        assert sorted(grew.values()) == [0, 4]  # all four went to the live worker
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert "armature_router_migrations_total 2.0" in metrics
    finally:
        hung.send_signal(signal.SIGCONT)
        fleet.stop()


def decisions_of(url: str) -> dict[str, float]:
    prefix = 'armature_router_decisions_total{worker="'
    return {
        line.split('"')[1]: float(line.split()[-1])
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
        if line.startswith(prefix)
    }


def complete(url: str, max_tokens: int) -> None:
    body = {"model": SERVED_MODEL_NAME, "prompt": "hi", "max_tokens": max_tokens}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
