"""Chaos: requests at concurrency 32 against a frontend and 4 mocker workers while a random
worker that is running requests is killed with SIGKILL, three times, a replacement started each
time. Clients keep sending until the kills are done (at least 300 requests), so the chaos
strikes work in flight however fast the machine is; each kill is proven to have struck (the
victim's metrics showed running requests, the frontend logged the worker dying under a
request). Every request ends with its full output (migrated when its worker died mid-stream)
or a clear error, never a silent truncation; the frontend's memory stays flat; the workers that
survive pass their block-pool integrity checks."""

from __future__ import annotations

import random
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet, Load, wait_until
from serve_process import parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MOCKER = ["--engine", "mocker", "--speedup-ratio", "1", "--num-kv-blocks", "4096"]
NUM_REQUESTS, CONCURRENCY, MAX_TOKENS, NUM_KILLS = 300, 32, 160, 3


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def busy_worker(
    fleet: Fleet, live: dict[str, subprocess.Popen[bytes]], rng: random.Random
) -> tuple[str, int] | None:
    """A random ready worker of `live` and the requests it is running, if any runs some."""
    ready = [name for name in sorted(live) if "ready:" in fleet.log_text(name)]
    rng.shuffle(ready)
    for name in ready:
        num_running = fleet.num_running(name)
        if num_running:
            return name, num_running
    return None


def kill_busy_workers(
    fleet: Fleet,
    live: dict[str, subprocess.Popen[bytes]],
    rng: random.Random,
    num_kills: int,
) -> dict[str, int]:
    """`num_kills` times: wait for a live worker running requests, SIGKILL it, start a
    replacement (not waited for), and wait until the frontend logs that the victim died under
    a request (the fault struck work in flight). Returns each victim's worker id -> the
    requests it was running just before; `live` is updated."""
    victims: dict[str, int] = {}
    spawned = len(live)
    for _ in range(num_kills):
        name, num_running = wait_until(
            lambda: busy_worker(fleet, live, rng), "a live worker running requests"
        )
        worker_id = fleet.worker_id(name)
        victims[worker_id] = num_running
        proc = live.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        live[f"w{spawned}"] = fleet.start_worker(f"w{spawned}", wait=False)
        spawned += 1
        died = f"worker {worker_id} died"
        wait_until(lambda: died in fleet.log_text("frontend"), f"logged: {died!r}")  # noqa: B023
    return victims


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
            load = Load(lambda i: send(client, url, i), CONCURRENCY, NUM_REQUESTS)
            try:
                victims = kill_busy_workers(fleet, live, rng, NUM_KILLS)
            finally:
                results = load.finish()
            rss_after = rss_kib(frontend.pid)
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    finally:
        fleet.stop()
    assert len(victims) == NUM_KILLS and all(victims.values())  # each held requests
    completed = [r for r in results if r[0] == 200]
    failed = [r for r in results if r[0] != 200]
    assert len(results) >= NUM_REQUESTS
    assert all(tokens == MAX_TOKENS and finish == "length" for _, tokens, finish in completed)
    for status, _, message in failed:  # only once the migration limit was exhausted
        assert status == 503 and "migrated 3 times, the limit" in message, message
    assert len(completed) >= len(results) - NUM_KILLS, failed
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


REAL_REQUESTS, REAL_CONCURRENCY, REAL_MAX_TOKENS, REAL_KILLS = 24, 8, 24, 2


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
    """The same chaos on 4 workers of the real engine (float32), fewer requests and kills
    (the prompts are sent in turn until the kills are done): each completed request's greedy
    text equals the undisturbed single-process server's, migrated or not."""
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
            load = Load(
                lambda i: greedy(client, url, prompts[i % len(prompts)]),
                REAL_CONCURRENCY,
                REAL_REQUESTS,
            )
            try:
                victims = kill_busy_workers(fleet, live, rng, REAL_KILLS)
            finally:
                results = load.finish()
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    finally:
        fleet.stop()
    assert len(victims) == REAL_KILLS and all(victims.values())  # each held requests
    assert len(results) >= REAL_REQUESTS
    for i, got in enumerate(results):
        if got[0] != 200:  # only once the migration limit was exhausted
            assert got[0] == 503 and "migrated 3 times, the limit" in got[1], got
        else:
            assert got == expected[i % len(prompts)]
    assert sum(1 for r in results if r[0] == 200) >= len(results) - 1
    assert metrics["armature_router_migrations_total"] >= 1
    fleet.assert_no_tracebacks()
