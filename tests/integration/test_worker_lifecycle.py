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
from fleet import SERVED_MODEL_NAME, Fleet, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# speedup 1: a decode step takes ~6 ms of simulated GPU time, so 300 tokens stream for ~2 s
MOCKER = ["--engine", "mocker", "--speedup-ratio", "1", "--num-kv-blocks", "1024"]
HUNG_MAX_TOKENS = 600  # ~4 s of streaming: the test acts on a stream well inside it


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
    """SIGSTOP one of two workers while it streams two requests (each has streamed a token):
    its streams stall, fail over after the stall timeout and finish on the other worker with
    their full length (two migrations); the frontend takes it out of routing, and it receives
    no new request."""
    fleet = Fleet(
        default_model_dir, tmp_path, engine_args=[*MOCKER, "--served-model-name", SERVED_MODEL_NAME]
    )
    hung = fleet.start_worker("worker-a")
    fleet.start_worker("worker-b")
    try:
        # the stall timeout alone finds it: a liveness timeout as short raced it (whichever
        # fired first failed the streams over, with its own log line)
        health = ["--worker-liveness-timeout-s", "60", "--worker-stall-timeout-s", "2"]
        url = fleet.start_frontend(extra=["--router", "round-robin", *health])

        def routed_to_both() -> bool:
            complete(url, 1)
            return len(decisions_of(url)) == 2

        wait_until(routed_to_both, "routed to both workers")
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": "keep going",
            "max_tokens": HUNG_MAX_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        results: list[int] = []
        first_tokens = threading.Semaphore(0)

        def request() -> None:
            chunks = []
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
                        if len(chunks) == 1:
                            first_tokens.release()
            results.append(chunks[-1]["usage"]["completion_tokens"])

        threads = [threading.Thread(target=request) for _ in range(4)]
        for t in threads:
            t.start()
        for _ in threads:  # every stream has a token: a stream that breaks now migrates
            assert first_tokens.acquire(timeout=60)
        assert fleet.num_running("worker-a") == 2  # round robin: two of the four are its
        hung.send_signal(signal.SIGSTOP)
        for t in threads:
            t.join(60)
        assert results == [HUNG_MAX_TOKENS] * 4  # none truncated: the hung worker's moved
        # the frontend marked it as stalled when its streams failed over
        assert f"{fleet.worker_id('worker-a')} sent nothing for 2 s" in fleet.log_text("frontend")
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
