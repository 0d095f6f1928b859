"""`armature serve --engine mocker`: real HTTP traffic through the real scheduler and KV cache,
with simulated step times and seeded tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_process import running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def mocker_url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = [
        "--engine",
        "mocker",
        "--speedup-ratio",
        "100",
        "--num-kv-blocks",
        "256",
        "--served-model-name",
        "mock",
        "--seed",
        "7",
    ]
    with running_server(default_model_dir, tmp_path_factory.mktemp("mocker"), args) as url:
        yield url


def test_mocker_serves_chat_with_exact_lengths_and_prefix_hits(mocker_url: str) -> None:
    body = {
        "model": "mock",
        "messages": [{"role": "user", "content": "tell me a long story " * 8}],
        "max_tokens": 7,
    }
    first = httpx.post(f"{mocker_url}/v1/chat/completions", json=body, timeout=30).json()
    second = httpx.post(f"{mocker_url}/v1/chat/completions", json=body, timeout=30).json()
    assert first["usage"]["completion_tokens"] == 7
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        (prompt_tokens - 1) // 16 * 16
    )


def test_mocker_streams_and_reports_kv_usage(mocker_url: str) -> None:
    body = {"model": "mock", "prompt": "hello there", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{mocker_url}/v1/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert len(lines) >= 2
    metrics = httpx.get(f"{mocker_url}/metrics", timeout=10).text
    assert "armature_kv_cache_usage_ratio 0.0" in metrics


def test_in_process_disaggregated_mocker_fleet(default_model_dir: Path, tmp_path: Path) -> None:
    """`serve --prefill-workers 1 --decode-workers 2 --in-process-workers`: prompts are prefilled
    on the prefill worker and continued on a decode worker, with exact lengths, streamed."""
    args = ["--engine", "mocker", "--speedup-ratio", "100", "--num-kv-blocks", "256"]
    args += ["--served-model-name", "mock", "--prefill-workers", "1", "--decode-workers", "2"]
    args += ["--in-process-workers", "--max-local-prefill-tokens", "0"]
    body = {"model": "mock", "prompt": "tell me a long story " * 8, "max_tokens": 9}
    with running_server(default_model_dir, tmp_path, args) as url:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30
        ) as stream:
            events = [line for line in stream.iter_lines() if line.startswith("data: {")]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert response["usage"]["completion_tokens"] == 9
    assert response["choices"][0]["finish_reason"] == "length"
    assert len(events) >= 2  # the prefill's first token, then the decode worker's
    assert 'armature_router_prefills_total{where="remote"} 2.0' in metrics


def test_mocker_with_lower_tiers_onboards_what_its_small_cache_evicted(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """`serve --engine mocker` with a host and a disk tier (a size alone: the mocker's disk
    holds no files): a prompt evicted from the 32-block G1 (12 other prompts of its size, 5
    blocks each, went through it since) comes back from G2, reported as cached."""
    args = ["--engine", "mocker", "--speedup-ratio", "100", "--num-kv-blocks", "32"]
    args += ["--served-model-name", "mock", "--kv-host-blocks", "256", "--kv-disk-blocks", "64"]

    def ask(url: str, text: str) -> dict[str, Any]:
        body = {"model": "mock", "prompt": text, "max_tokens": 2}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        usage: dict[str, Any] = response.json()["usage"]
        return usage

    first = "tell me a long story about a dragon " * 8
    with running_server(default_model_dir, tmp_path, args) as url:
        assert ask(url, first)["prompt_tokens_details"]["cached_tokens"] == 0
        for i in range(12):
            ask(url, f"{i} tell me a long story about a knight " * 8)
        again = ask(url, first)
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached == (again["prompt_tokens"] - 1) // 16 * 16
    assert not any(tmp_path.rglob("*.kvb"))  # no block files anywhere
