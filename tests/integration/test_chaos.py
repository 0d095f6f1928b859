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
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


def kill_while_running(
    fleet: Fleet,
    live: dict[str, subprocess.Popen[bytes]],
    futures: Sequence[Future[Any]],
    rng: random.Random,
    every_s: float,
    most: int | None = None,
) -> int:
    """Every `every_s` while requests run, SIGKILL a random live worker and start a
    replacement (at most `most` times); returns how many were killed. `live` is updated."""
    kills, spawned = 0, len(live)
    while (most is None or kills < most) and not all(f.done() for f in futures):
        time.sleep(every_s)
        if all(f.done() for f in futures):
            break
        victim = rng.choice(sorted(live))
        live.pop(victim).send_signal(signal.SIGKILL)
        kills += 1
        name = f"w{spawned}"
        spawned += 1
        live[name] = fleet.start_worker(name, wait=False)
    return kills


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
                kills = kill_while_running(fleet, live, futures, rng, every_s=1.5)
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


REAL_REQUESTS, REAL_CONCURRENCY, REAL_MAX_TOKENS = 24, 8, 24


def greedy(client: httpx.Client, url: str, prompt: str) -> tuple[int, str]:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": REAL_MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }
    response = client.post(f"{url}/v1/completions", json=body, timeout=300)
    data = response.json()
    if response.status_code != 200:
        return response.status_code, data["error"]["message"]
    assert data["usage"]["completion_tokens"] == REAL_MAX_TOKENS, data
    return 200, data["choices"][0]["text"]


def test_real_engine_worker_kills_keep_greedy_output(
    default_model_dir: Path, tmp_path: Path, base_url: str
) -> None:
    """The same chaos on 4 workers of the real engine (float32), fewer requests: each
    completed request's greedy text equals the undisturbed single-process server's, migrated
    or not."""
    fleet = Fleet(default_model_dir, tmp_path)
    prompts = [f"Question {i}: what is {i} plus {i + 1}? Explain." for i in range(REAL_REQUESTS)]
    rng = random.Random(11)
    live: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with httpx.Client(limits=httpx.Limits(max_connections=REAL_CONCURRENCY)) as client:
            expected = [greedy(client, base_url, p) for p in prompts]
            for i in range(4):
                live[f"w{i}"] = fleet.start_worker(f"w{i}")
            url = fleet.start_frontend(extra=["--router", "least-loaded"])
            with ThreadPoolExecutor(REAL_CONCURRENCY) as pool:
                futures = [pool.submit(greedy, client, url, p) for p in prompts]
                kills = kill_while_running(fleet, live, futures, rng, every_s=3.0, most=3)
                results = [f.result() for f in futures]
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    finally:
        fleet.stop()
    assert kills >= 2, "the run ended before the chaos began"
    for got, want in zip(results, expected, strict=True):
        if got[0] != 200:  # only once the migration limit was exhausted
            assert got[0] == 503 and "migrated 3 times, the limit" in got[1], got
        else:
            assert got == want
    assert sum(1 for r in results if r[0] == 200) >= REAL_REQUESTS - 1
    assert metrics["armature_router_migrations_total"] >= 1
    fleet.assert_no_tracebacks()
