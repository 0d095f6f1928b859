"""Disaggregated serving with vLLM workers: `armature serve --engine vllm --prefill-workers 1
--decode-workers 1 --enforce-disagg`. The prefill worker's vLLM computes each prompt and its
first token; the decode worker's vLLM pulls the prompt's KV blocks through vLLM's NIXL
connector (CPU memory here) and continues. Greedy output equals vLLM's own aggregated run,
for prompts inside one block, ending exactly on a block boundary (the first token then opens
a block the prefill never had) and spanning several blocks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_servers import ARMATURE_ENGINE_ARGS, armature_serve, offline_greedy, skip_without_vllm

skip_without_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration]

MODEL = "smollm2-vllm-disagg"
MAX_TOKENS = 16
BLOCK_SIZE = 128  # vLLM's CPU default
PROMPT_LENGTHS = [100, 2 * BLOCK_SIZE, 300]  # one partial block, a boundary, several blocks
TEXT = (
    "The history of the lighthouse begins with fires lit on hills to guide ships home. "
    "Later, towers of stone carried lamps of oil, and lenses gathered their light. "
)


@pytest.fixture(scope="module")
def prompt_ids(default_model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    ids = tokenizer(TEXT * 20, add_special_tokens=False)["input_ids"]
    return [ids[:n] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def offline(default_model_dir: Path, prompt_ids: list[list[int]]) -> tuple[list[str], Any]:
    """vLLM's own aggregated answers, computed before the servers start."""
    return offline_greedy(default_model_dir, prompt_ids, MAX_TOKENS)


@pytest.fixture(scope="module")
def served(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("vllm-disagg") / "serve.log"
    args = [*ARMATURE_ENGINE_ARGS, "--served-model-name", MODEL, "--kv-cache-bytes", "256MiB"]
    args += ["--prefill-workers", "1", "--decode-workers", "1", "--enforce-disagg"]
    with armature_serve(default_model_dir, log, args) as url:
        yield url, log


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def worker_metrics_url(log: Path, role: str) -> str:
    found = re.search(rf"{role} role.*metrics (http://\S+/metrics)", log.read_text())
    assert found, f"no {role} worker metrics url in the log"
    return found.group(1)


def test_greedy_output_equals_vllm_aggregated(
    offline: tuple[list[str], list[list[int]]],
    prompt_ids: list[list[int]],
    served: tuple[str, Path],
) -> None:
    """`offline` is listed first: vLLM's own run happens before the servers start."""
    url, log = served
    texts, token_ids = offline
    for ids, text, expected_ids in zip(prompt_ids, texts, token_ids, strict=True):
        body = {"model": MODEL, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["choices"][0]["text"] == text, len(ids)
        assert data["usage"]["completion_tokens"] == len(expected_ids)
        assert data["usage"]["prompt_tokens"] == len(ids)
    frontend = samples(f"{url}/metrics")
    remote = frontend[("armature_router_prefills_total", (("where", "remote"),))]
    assert remote == len(prompt_ids)
    decode = samples(worker_metrics_url(log, "decode"))
    pulls = decode[("armature_worker_kv_pulls_total", (("backend", "vllm-nixl"),))]
    assert pulls == len(prompt_ids)
    # vLLM loaded every full prompt block from the prefill worker (it counts them as cached)
    pulled = decode[("armature_worker_kv_blocks_pulled_total", ())]
    assert pulled >= sum(len(ids) // BLOCK_SIZE for ids in prompt_ids), pulled


def test_streaming_a_disaggregated_request(served: tuple[str, Path]) -> None:
    url, _ = served
    body = {
        "model": MODEL,
        "prompt": TEXT * 4,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[str] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(line)
    assert len(chunks) >= 3  # the prefill's token, then the decode worker's, then usage
    assert '"completion_tokens":12' in chunks[-1].replace(" ", "")
