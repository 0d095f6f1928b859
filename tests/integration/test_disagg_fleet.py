"""Disaggregated serving with worker processes: prefill workers and a decode worker behind a
frontend. Greedy float32 outputs equal the single-process aggregated server's over shared
memory and over TCP, streamed or not; pinned blocks are released; a prefill worker killed with
SIGKILL mid-burst loses no request (its requests are prefilled again elsewhere, or the decode
worker computes the prompt when the blocks cannot be pulled). Each fault strikes work shown in
flight first (a worker's metrics, a stream's tokens), never after a fixed time."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet, Load, wait_until
from serve_process import parse_metrics

TOPICS = [
    "the history of the printing press and how it changed the spread of knowledge in Europe",
    "a recipe for a simple vegetable soup with carrots, onions, celery and fresh thyme",
    "how a compiler turns source code into machine instructions, step by step",
    "the life cycle of a star from a cloud of gas to a white dwarf or a black hole",
    "why the sky is blue during the day and red at sunset, explained for a child",
    "the rules of chess, including castling, en passant and pawn promotion",
]
PROMPTS = [f"Write a detailed essay about {t}. Start with an introduction." for t in TOPICS]
MAX_TOKENS = 16
PREFILL_CHUNKS = ["--max-num-batched-tokens", "16"]
DECODE_MAX_TOKENS = 96  # far beyond the 3 chunks a decode test waits for before its fault


def complete(url: str, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    response = httpx.post(f"{url}/v1/completions", json={**body, "temperature": 0}, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == max_tokens
    return str(response.json()["choices"][0]["text"])


def stream(
    url: str,
    prompt: str,
    max_tokens: int = MAX_TOKENS,
    on_chunk: int = 0,
    reached: Callable[[], object] = lambda: None,
) -> str:
    """The streamed text; `reached()` is called once the `on_chunk`-th chunk arrived."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    text = []
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json={**body, "temperature": 0, "stream": True},
        timeout=120,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
                if len(text) == on_chunk:
                    reached()
    return "".join(text)


def num_in_flight(metrics: dict[str, float]) -> float:
    """A worker's requests running or waiting, and its blocks pinned for a decode worker."""
    names = (
        "armature_worker_requests_running",
        "armature_worker_requests_waiting",
        "armature_worker_kv_pinned_blocks",
    )
    return sum(v for k, v in metrics.items() if k.startswith(names))


def wait_for_workers(url: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        if sum(1 for k in metrics if k.startswith("armature_worker_kv_capacity_blocks{")) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"the frontend did not see {count} workers")


@pytest.mark.slow
@pytest.mark.integration
def test_disaggregated_processes_match_aggregated(fleet: Fleet, base_url: str) -> None:
    fleet.start_worker("prefill-a", ["--role", "prefill"])
    fleet.start_worker("prefill-b", ["--role", "prefill"])
    fleet.start_worker("decode-a", ["--role", "decode"])
    url = fleet.start_frontend(extra=["--max-local-prefill-tokens", "0"])
    wait_for_workers(url, 3)
    expected = [complete(base_url, p) for p in PROMPTS]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda p: complete(url, p), PROMPTS)) == expected
    assert stream(url, PROMPTS[0]) == expected[0]
    frontend = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    assert frontend['armature_router_prefills_total{where="remote"}'] == len(PROMPTS) + 1
    decode = fleet.worker_metrics("decode-a")
    assert decode['armature_worker_kv_pulls_total{backend="shm"}'] >= len(PROMPTS)
    assert decode["armature_worker_kv_pull_failures_total"] == 0
    assert decode["armature_worker_kv_blocks_pulled_total"] >= len(PROMPTS)
    for name in ("prefill-a", "prefill-b"):
        assert fleet.worker_metrics(name)["armature_worker_kv_pinned_blocks"] == 0
    # every first token came from a prefill worker; the decode legs came with theirs
    ttft_count = "armature_worker_time_to_first_token_seconds_count"
    assert decode[ttft_count] == 0
    prefills = [fleet.worker_metrics(name)[ttft_count] for name in ("prefill-a", "prefill-b")]
    assert sum(prefills) == len(PROMPTS) + 1


@pytest.mark.slow
@pytest.mark.integration
def test_tcp_transfer_and_a_prefill_worker_killed_mid_burst(fleet: Fleet, base_url: str) -> None:
    tcp = ["--kv-transfer-backends", "tcp"]
    victim = fleet.start_worker("prefill-a", ["--role", "prefill", *tcp])
    fleet.start_worker("prefill-b", ["--role", "prefill", *tcp])
    fleet.start_worker("decode-a", ["--role", "decode", *tcp])
    url = fleet.start_frontend(extra=["--max-local-prefill-tokens", "0"])
    wait_for_workers(url, 3)
    expected = [complete(base_url, p) for p in PROMPTS]
    assert complete(url, PROMPTS[0]) == expected[0]
    assert fleet.worker_metrics("decode-a")['armature_worker_kv_pulls_total{backend="tcp"}'] == 1
    burst = [f"{p} Be thorough." for p in PROMPTS]
    burst_expected = [complete(base_url, p) for p in burst]
    load = Load(lambda i: complete(url, burst[i % len(burst)]), len(burst), 2 * len(burst))
    try:  # the victim is prefilling a prompt or holds one's blocks for the decode worker
        busy = lambda: num_in_flight(fleet.worker_metrics("prefill-a")) > 0  # noqa: E731
        wait_until(busy, "prefill-a busy")
        victim.send_signal(signal.SIGKILL)
    finally:
        results = load.finish()
    assert results == [burst_expected[i % len(burst)] for i in range(len(results))]
    assert fleet.worker_metrics("prefill-b")["armature_worker_kv_pinned_blocks"] == 0


@pytest.mark.slow
@pytest.mark.integration
def test_a_decode_worker_killed_mid_stream_migrates_its_requests(
    fleet: Fleet, base_url: str
) -> None:
    fleet.start_worker("prefill-a", ["--role", "prefill"])
    victim = fleet.start_worker("decode-a", ["--role", "decode"])
    fleet.start_worker("decode-b", ["--role", "decode"])
    url = fleet.start_frontend(
        extra=["--max-local-prefill-tokens", "0", "--router", "least-loaded"]
    )
    wait_for_workers(url, 3)
    prompts = PROMPTS[:4]
    expected = [complete(base_url, p, DECODE_MAX_TOKENS) for p in prompts]
    complete(url, PROMPTS[0], 4)  # every engine pays its first-run costs before the burst
    decoding = threading.Semaphore(0)

    def stream_and_signal(prompt: str) -> str:
        # the prefill leg brings one output, so a third chunk comes from a decode leg
        return stream(url, prompt, DECODE_MAX_TOKENS, on_chunk=3, reached=decoding.release)

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(stream_and_signal, p) for p in prompts]
        for _ in prompts:  # every decode leg is streaming
            assert decoding.acquire(timeout=120)
        num_streams = fleet.num_running("decode-a")
        assert num_streams > 0  # least-loaded: some of the four decode there
        victim.send_signal(signal.SIGKILL)
        results = [f.result() for f in futures]
    assert results == expected
    frontend = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    assert frontend["armature_router_migrations_total"] == num_streams  # each one it held


def frontend_metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


def wait_idle(fleet: Fleet, names: list[str]) -> dict[str, dict[str, float]]:
    """Poll the workers until none has a running or waiting request, a block in use or a pin;
    returns their last metrics."""
    deadline = time.monotonic() + 30
    while True:
        metrics = {name: fleet.worker_metrics(name) for name in names}
        busy = [
            name
            for name, m in metrics.items()
            if any(
                value
                for key, value in m.items()
                if key.startswith(
                    (
                        "armature_worker_requests_running",
                        "armature_worker_requests_waiting",
                        "armature_worker_kv_usage_ratio",
                        "armature_worker_kv_pinned_blocks",
                    )
                )
            )
        ]
        if not busy:
            return metrics
        if time.monotonic() > deadline:
            pytest.fail(f"still busy after the clients left: {busy}: {metrics}")
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.integration
def test_a_client_leaving_cancels_both_legs_and_frees_every_block(fleet: Fleet) -> None:
    # prefill in chunks of 16 tokens: a long prompt's prefill spans many engine steps
    prefill = fleet.start_worker("prefill-a", ["--role", "prefill", *PREFILL_CHUNKS])
    fleet.start_worker("decode-a", ["--role", "decode"])
    url = fleet.start_frontend(extra=["--max-local-prefill-tokens", "0"])
    wait_for_workers(url, 2)
    body = {"model": SERVED_MODEL_NAME, "max_tokens": 600, "ignore_eos": True, "stream": True}
    # leaves during the decode leg: after a few streamed tokens
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "prompt": PROMPTS[0]}, timeout=60
    ) as response:
        chunks = response.iter_lines()
        received = sum(1 for _, line in zip(range(6), chunks, strict=False) if line)
    assert received >= 3
    idle = wait_idle(fleet, ["prefill-a", "decode-a"])
    assert idle["decode-a"]['armature_worker_requests_total{reason="cancelled"}'] == 1
    assert idle["prefill-a"]['armature_worker_requests_total{reason="transfer"}'] == 1
    # leaves during the prefill leg: a long prompt, gone before its first token. The prefill
    # worker is stopped mid-prefill (chunks still queued), the client leaves, and the worker
    # resumes once the frontend has cancelled: the cancel reaches it before its last chunk.
    long_prompt = " ".join(PROMPTS) * 5  # about 810 tokens: about 50 chunks
    before = frontend_metrics(url)
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    try:
        payload = json.dumps({**body, "prompt": long_prompt, "max_tokens": 100}).encode()
        connection.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})

        def prefilling() -> bool:  # with half the prompt, 25 chunks, still to go
            queued = "armature_worker_prefill_tokens_queued{"
            metrics = fleet.worker_metrics("prefill-a")
            return sum(v for k, v in metrics.items() if k.startswith(queued)) >= 400

        wait_until(prefilling, "prefill-a prefilling the long prompt")
        prefill.send_signal(signal.SIGSTOP)
        try:
            first_tokens = "armature_time_to_first_token_seconds_count"
            assert frontend_metrics(url)[first_tokens] == before[first_tokens]  # none came yet
            connection.close()
            in_flight = "armature_requests_in_flight"
            wait_until(lambda: frontend_metrics(url)[in_flight] == 0, "cancelled by the frontend")
        finally:
            prefill.send_signal(signal.SIGCONT)
    finally:
        connection.close()
    idle = wait_idle(fleet, ["prefill-a", "decode-a"])
    assert idle["prefill-a"]['armature_worker_requests_total{reason="cancelled"}'] == 1
    assert idle["decode-a"]['armature_worker_requests_total{reason="cancelled"}'] == 1
    # both workers still serve after the cancellations
    assert complete(url, PROMPTS[1]) == complete(url, PROMPTS[1])
