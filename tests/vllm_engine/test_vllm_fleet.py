"""A KV-routed frontend in front of two `armature worker --engine vllm` processes (`serve
--workers 2 --router kv`): a repeated prefix goes back to the worker that cached it, learned
from that worker's translated vLLM KV events."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_servers import ARMATURE_ENGINE_ARGS, armature_serve, skip_without_vllm

skip_without_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration]

MODEL = "smollm2-vllm-fleet"
PREFIX = "You are a meticulous assistant for the vLLM routing test. " * 30  # > 2 blocks of 128


@pytest.fixture(scope="module")
def url(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vllm-fleet") / "serve.log"
    args = [*ARMATURE_ENGINE_ARGS, "--workers", "2", "--router", "kv"]
    args += ["--served-model-name", MODEL, "--kv-cache-bytes", "256MiB"]
    with armature_serve(default_model_dir, log, args) as server_url:
        yield server_url


def decisions(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "armature_router_decisions_total":
                out[sample.labels["worker"]] = sample.value
    return out


def index_blocks(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "armature_router_index_blocks":
                return sample.value
    return 0.0


def complete(url: str, prompt: str) -> dict[str, int]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_two_vllm_workers_register_with_vllms_block_size(url: str) -> None:
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [MODEL]


def test_a_repeated_prefix_goes_to_the_same_worker(url: str) -> None:
    complete(url, PREFIX + "first question")
    deadline_s = time.monotonic() + 60
    while index_blocks(url) < 2:  # until the worker's KV events for the prefix reach the router
        assert time.monotonic() < deadline_s, "the router never indexed the prefix"
        time.sleep(0.05)
    before = decisions(url)
    cached = []
    for i in range(6):
        cached.append(complete(url, PREFIX + f"follow-up number {i}")["prompt_tokens_details"])
    moved = {w: v - before.get(w, 0.0) for w, v in decisions(url).items()}
    moved = {w: v for w, v in moved.items() if v}
    assert len(moved) == 1 and next(iter(moved.values())) == 6, moved
    # and vLLM on that worker found the prefix cached every time
    assert all(c["cached_tokens"] >= 256 for c in cached), cached
