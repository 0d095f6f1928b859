"""The chaos run, reported: 300 requests at concurrency 32 against a frontend and 4 mocker
worker processes (speedup 1), once undisturbed and once while a random worker is killed with
SIGKILL every 1.5 s and a replacement started. Reported per run: requests sent, completed,
migrated, failed by reason, end-to-end latency p50/p99, kills.

    python -m bench.chaos [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from armature.workload.measure import quantile
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

MOCKER = ["--engine", "mocker", "--speedup-ratio", "1", "--num-kv-blocks", "4096"]
MAX_TOKENS = 160


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet:
    def __init__(self, root: Path):
        self.root = root
        self.runtime = ["--discovery", "file", "--discovery-dir", str(root / "discovery")]
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "armature.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.procs.append(proc)
        return proc

    def worker(self, name: str, engine_args: list[str] | None = None) -> subprocess.Popen[bytes]:
        engine = MOCKER if engine_args is None else engine_args
        return self.spawn(name, ["worker", *engine, "--lease-ttl-s", "2", *self.runtime])

    def frontend(self, extra: list[str] | None = None, num_workers: int = 4) -> str:
        """Start the frontend; returns its url once it sees `num_workers` workers."""
        port = free_port()
        self.spawn("frontend", ["frontend", "--port", str(port), *self.runtime, *(extra or [])])
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"{url}/metrics", timeout=2).text
                if text.count("armature_worker_kv_capacity_blocks{") >= num_workers:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the fleet did not come up")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def run(num_requests: int, chaos: bool) -> list[object]:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp))
        live = {f"w{i}": fleet.worker(f"w{i}") for i in range(4)}
        try:
            url = fleet.frontend()
            model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
            rng, kills = random.Random(7), 0
            with httpx.Client(limits=httpx.Limits(max_connections=32)) as client:
                client.headers["content-type"] = "application/json"
                with ThreadPoolExecutor(32) as pool:
                    futures = [
                        pool.submit(_send, client, url, model, i) for i in range(num_requests)
                    ]
                    spawned = len(live)
                    while chaos and not all(f.done() for f in futures):
                        time.sleep(1.5)
                        if all(f.done() for f in futures):
                            break
                        victim = rng.choice(sorted(live))
                        live.pop(victim).send_signal(signal.SIGKILL)
                        kills += 1
                        live[f"w{spawned}"] = fleet.worker(f"w{spawned}")
                        spawned += 1
                    results = [f.result() for f in futures]
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
        finally:
            fleet.stop()
    migrated = next(
        (
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("armature_router_migrations_total")
        ),
        0.0,
    )
    outcomes = Counter(outcome for outcome, _ in results)
    latencies = sorted(elapsed for outcome, elapsed in results if outcome == "ok")
    failed = ", ".join(f"{k}: {v}" for k, v in outcomes.items() if k != "ok") or "none"
    return [
        "chaos" if chaos else "undisturbed",
        num_requests,
        outcomes["ok"],
        int(migrated),
        failed,
        kills,
        f"{quantile(latencies, 0.5) * 1000:.0f}" if latencies else "-",
        f"{quantile(latencies, 0.99) * 1000:.0f}" if latencies else "-",
    ]


def _send(client: httpx.Client, url: str, model: str, i: int) -> tuple[str, float]:
    body = {
        "model": model,
        "prompt": f"request {i}: " + "more " * (i % 50),
        "max_tokens": MAX_TOKENS,
    }
    started = time.perf_counter()
    try:
        response = client.post(f"{url}/v1/completions", json=body, timeout=120)
    except httpx.HTTPError as exc:
        return f"client error {type(exc).__name__}", time.perf_counter() - started
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        return f"{response.status_code} {response.json()['error']['message'][:60]}", elapsed
    tokens = response.json()["usage"]["completion_tokens"]
    return ("ok" if tokens == MAX_TOKENS else f"truncated at {tokens}"), elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 64 if args.quick else 300
    rows = [run(n, chaos=False), run(n, chaos=True)]
    for row in rows:
        print(row, flush=True)
    body = (
        f"A frontend (kv router) and 4 mocker worker processes (speedup 1: an H100-class step "
        f"time), {n} completions of {MAX_TOKENS} tokens at concurrency 32; file discovery with "
        "2 s leases, TCP request plane. chaos: a random worker SIGKILLed every 1.5 s and a "
        "replacement started. Latency is end to end, completed requests only.\n\n"
        + markdown_table(
            [
                "run",
                "sent",
                "completed",
                "migrated",
                "failed (reason: count)",
                "kills",
                "e2e p50 ms",
                "e2e p99 ms",
            ],
            rows,
        )
        + "\n"
    )
    out = results_path(args.quick)
    write_section(
        out, Section("chaos", "Chaos: worker kills under load", body, "n/a"), get_machine_facts()
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
