"""Routing over HTTP: 4 in-process mocker workers behind the kv router, and direct routing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve_process import parse_metrics, running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFIX = "You are a meticulous assistant for the routing test suite. " * 12


def decisions(url: str) -> dict[str, float]:
    metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    return {
        key.split('worker="')[1].rstrip('"}'): value
        for key, value in metrics.items()
        if key.startswith("armature_router_decisions_total{")
    }


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {w: after[w] - before.get(w, 0.0) for w in after if after[w] != before.get(w, 0.0)}


@pytest.fixture(scope="module")
def kv_url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = [
        "--engine",
        "mocker",
        "--workers",
        "4",
        "--router",
        "kv",
        "--num-kv-blocks",
        "512",
        "--served-model-name",
        "mock",
    ]
    with running_server(default_model_dir, tmp_path_factory.mktemp("kv"), args) as url:
        yield url


def complete(url: str, prompt: str, max_tokens: int = 2) -> None:
    body = {"model": "mock", "prompt": prompt, "max_tokens": max_tokens}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_prompts_sharing_a_prefix_follow_it(kv_url: str) -> None:
    complete(kv_url, PREFIX + "first question")
    before = decisions(kv_url)
    for i in range(6):
        complete(kv_url, PREFIX + f"follow-up number {i}")
    moved = delta(before, decisions(kv_url))
    assert len(moved) == 1 and next(iter(moved.values())) == 6


def test_one_shared_prefix_under_load_still_spreads(kv_url: str) -> None:
    before = decisions(kv_url)

    async def burst() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            bodies = [
                {
                    "model": "mock",
                    "prompt": PREFIX + f"load {i}",
                    "max_tokens": 60,
                    "ignore_eos": True,
                }
                for i in range(16)
            ]
            responses = await asyncio.gather(
                *(client.post(f"{kv_url}/v1/completions", json=b) for b in bodies)
            )
            assert all(r.status_code == 200 for r in responses)

    asyncio.run(burst())
    moved = delta(before, decisions(kv_url))
    assert sum(moved.values()) == 16
    assert len(moved) >= 3, moved
    assert max(moved.values()) <= 10, moved


@pytest.fixture(scope="module")
def bounded_url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The kv router with bounded shares over a short window: 1.5 x the fair share of the
    last 2 x 4 decisions."""
    args = ["--engine", "mocker", "--workers", "4", "--router", "kv", "--num-kv-blocks", "512"]
    args += ["--served-model-name", "mock", "--kv-share-bound", "1.5", "--kv-share-window", "2"]
    with running_server(default_model_dir, tmp_path_factory.mktemp("bounded"), args) as url:
        yield url


def test_bounded_shares_keep_a_lone_clients_prefix_and_spread_a_burst(bounded_url: str) -> None:
    """One client's prompts, each answered before the next, all go where their prefix is:
    the holder is past its share of the window from the second on, but idle. A burst on the
    same prefix finds it busy, and it is left out while over its share."""
    complete(bounded_url, PREFIX + "first question")
    before = decisions(bounded_url)
    for i in range(6):
        complete(bounded_url, PREFIX + f"follow-up number {i}")
    moved = delta(before, decisions(bounded_url))
    assert len(moved) == 1 and next(iter(moved.values())) == 6, moved
    holder = next(iter(moved))
    before = decisions(bounded_url)

    async def burst() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            bodies = [
                {"model": "mock", "prompt": PREFIX + f"load {i}", "max_tokens": 60,
                 "ignore_eos": True}
                for i in range(16)
            ]  # fmt: skip
            responses = await asyncio.gather(
                *(client.post(f"{bounded_url}/v1/completions", json=b) for b in bodies)
            )
            assert all(r.status_code == 200 for r in responses)

    asyncio.run(burst())
    moved = delta(before, decisions(bounded_url))
    assert sum(moved.values()) == 16
    # busy, the holder takes at most its share (4 of any 8 decisions in a row), once idle
    assert moved.get(holder, 0) <= 9, moved
    assert len(moved) >= 3, moved


@pytest.fixture(scope="module")
def direct_url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = [
        "--engine",
        "mocker",
        "--workers",
        "2",
        "--router",
        "direct",
        "--num-kv-blocks",
        "256",
        "--served-model-name",
        "mock",
        "--speedup-ratio",
        "100",
    ]
    with running_server(default_model_dir, tmp_path_factory.mktemp("direct"), args) as url:
        yield url


def test_direct_routing_by_header(direct_url: str) -> None:
    body = {"model": "mock", "prompt": "hello", "max_tokens": 2}
    before = decisions(direct_url)
    r = httpx.post(
        f"{direct_url}/v1/completions", json=body, headers={"x-worker-id": "worker-1"}, timeout=30
    )
    assert r.status_code == 200
    assert delta(before, decisions(direct_url)) == {"worker-1": 1.0}
    missing = httpx.post(f"{direct_url}/v1/completions", json=body, timeout=30)
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "x-worker-id"
    unknown = httpx.post(
        f"{direct_url}/v1/completions", json=body, headers={"x-worker-id": "worker-7"}, timeout=30
    )
    assert unknown.status_code == 400
    assert "unknown worker 'worker-7'" in unknown.json()["error"]["message"]
