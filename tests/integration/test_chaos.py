"""Chaos: 300 requests at concurrency 32 against a frontend and 4 mocker workers while a random
worker is killed with SIGKILL every few seconds and a replacement started. Every request ends
with its full output (migrated when its worker died mid-stream) or a clear error, never a
silent truncation; the frontend's memory stays flat; the workers that survive pass their
block-pool integrity checks."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet

from conftest import parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MOCKER = ["--engine", "mocker", "--speedup-ratio", "1", "--num-kv-blocks", "4096"]
NUM_REQUESTS, CONCURRENCY, MAX_TOKENS = 300, 32, 160


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send(client: httpx.Client, url: str, i: int) -> tuple[int, int, str]:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": f"request {i}: " + "tell me more about it " * (i % 7 + 1),
        "max_tokens": MAX_TOKENS,
    }
    response = client.post(f"{url}/v1/completions", json=body, timeout=120)
    data = response.json()
    if response.status_code != 200:
        return response.status_code, 0, data["error"]["message"]
    return 200, data["usage"]["completion_tokens"], data["choices"][0]["finish_reason"]


def test_random_worker_kills_lose_no_request(default_model_dir: Path, tmp_path: Path) -> None:
    fleet = Fleet(
        default_model_dir, tmp_path, engine_args=[*MOCKER, "--served-model-name", SERVED_MODEL_NAME]
    )
    rng = random.Random(7)
    live: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for i in range(4):
            live[f"w{i}"] = fleet.start_worker(f"w{i}")
        url = fleet.start_frontend(extra=["--worker-stall-timeout-s", "10"])
        frontend = fleet.procs[-1]
        with httpx.Client(limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
            for i in range(CONCURRENCY):  # warm up, then take the memory baseline
                send(client, url, i)
            rss_before = rss_kib(frontend.pid)
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                futures: list[Future[tuple[int, int, str]]] = [
                    pool.submit(send, client, url, i) for i in range(NUM_REQUESTS)
                ]
                kills, spawned = 0, len(live)
                while not all(f.done() for f in futures):
                    time.sleep(1.5)
                    if all(f.done() for f in futures):
                        break
                    victim = rng.choice(sorted(live))
                    live.pop(victim).send_signal(signal.SIGKILL)
                    kills += 1
                    name = f"w{spawned}"
                    spawned += 1
                    live[name] = fleet.start_worker(name, wait=False)
                results = [f.result() for f in futures]
            rss_after = rss_kib(frontend.pid)
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    finally:
        fleet.stop()
    completed = [r for r in results if r[0] == 200]
    failed = [r for r in results if r[0] != 200]
    assert kills >= 3, "the run ended before the chaos began"
    assert all(tokens == MAX_TOKENS and finish == "length" for _, tokens, finish in completed)
    for status, _, message in failed:  # only once the migration limit was exhausted
        assert status == 503 and "migrated 3 times, the limit" in message, message
    assert len(completed) >= NUM_REQUESTS - 3, failed
    assert metrics["armature_router_migrations_total"] >= 1
    assert rss_after < rss_before * 1.10 + 8 * 1024, (rss_before, rss_after)
    for name, proc in live.items():  # the survivors stopped cleanly, their pools intact
        log = (tmp_path / f"{name}.log").read_text()
        if "ready:" not in log:
            continue  # a replacement still starting when the run ended
        assert proc.returncode == 0, log[-2000:]
        assert "KV block pool integrity ok" in log, log[-2000:]
        assert "integrity check FAILED" not in log
    fleet.assert_no_tracebacks()
