"""Soak: moderate load on a frontend and two mocker workers for ARMATURE_SOAK_S seconds (90 in
the suite; `ARMATURE_SOAK_S=600` is the 10-minute run, see bench/soak.py for the report).
After warm-up, the frontend's and the workers' RSS grow less than 5%; the router's prefix
index never holds more than its bound (the workers' KV capacity), while small KV caches keep
it churning through stored and removed events; every request completes."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet
from serve_process import parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DURATION_S = float(os.environ.get("ARMATURE_SOAK_S", "90"))
WARMUP_S = max(30.0, DURATION_S * 0.2)
SAMPLE_EVERY_S = 5.0
CONCURRENCY = 6
MOCKER = ["--engine", "mocker", "--speedup-ratio", "1", "--num-kv-blocks", "512"]
PREFIXES = [
    f"System prompt {i}: " + "you are a careful assistant. " * (4 + i % 9) for i in range(40)
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def load_loop(url: str, seed: int, stop: threading.Event, outcomes: list[int]) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            prompt = rng.choice(PREFIXES) + f"question {rng.randrange(10**9)}"
            body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": rng.randint(8, 64)}
            response = client.post(f"{url}/v1/completions", json=body)
            outcomes.append(response.status_code)


def test_soak_memory_and_index_stay_bounded(default_model_dir: Path, tmp_path: Path) -> None:
    fleet = Fleet(
        default_model_dir, tmp_path, engine_args=[*MOCKER, "--served-model-name", SERVED_MODEL_NAME]
    )
    stop, outcomes = threading.Event(), []  # type: ignore[var-annotated]
    samples: list[dict[str, float]] = []
    try:
        workers = [fleet.start_worker(f"w{i}") for i in range(2)]
        url = fleet.start_frontend()
        frontend = fleet.procs[-1]
        loops = [
            threading.Thread(target=load_loop, args=(url, i, stop, outcomes))
            for i in range(CONCURRENCY)
        ]
        for thread in loops:
            thread.start()
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < DURATION_S:
            time.sleep(SAMPLE_EVERY_S)
            metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
            samples.append(
                {
                    "t_s": elapsed,
                    "frontend": rss_kib(frontend.pid),
                    **{f"w{i}": rss_kib(w.pid) for i, w in enumerate(workers)},
                    "index": metrics["armature_router_index_blocks"],
                    "bound": metrics["armature_router_index_capacity_blocks"],
                }
            )
        stop.set()
        for thread in loops:
            thread.join(timeout=60)
    finally:
        stop.set()
        fleet.stop()
    report = os.environ.get("ARMATURE_SOAK_REPORT")  # bench/soak.py reads the samples
    if report:
        summary = {"duration_s": DURATION_S, "warmup_s": WARMUP_S, "requests": len(outcomes)}
        Path(report).write_text(json.dumps({**summary, "samples": samples}))
    assert outcomes and set(outcomes) == {200}, sorted(set(outcomes))
    assert all(0 < s["index"] <= s["bound"] == 2 * 512 for s in samples[1:]), samples
    assert max(s["index"] for s in samples) >= 512  # the caches filled: eviction was exercised
    after_warmup = [s for s in samples if s["t_s"] >= WARMUP_S]
    base, last = after_warmup[0], after_warmup[-3:]
    for process in ("frontend", "w0", "w1"):
        grown = max(s[process] for s in last) / base[process] - 1
        assert grown < 0.05, (process, grown, [s[process] for s in samples])
    fleet.assert_no_tracebacks()
