"""Worker churn: how long a kill -9'd worker keeps its place in discovery and in the
frontend, and how long a new worker takes from process start to its first routed request.

    python -m bench.worker_churn [--lease-ttl-s 10] [--repeats 3]

File discovery, TCP request plane, zmq events, mocker workers. "Removed" is when the
frontend's router drops the worker (its log says "left"); "first routed" is when the frontend
counts a routing decision for the new worker while a client sends one request every 50 ms.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from armature.workload.measure import quantile
from bench.paths import results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section

ENGINE = ["--engine", "mocker", "--speedup-ratio", "100", "--num-kv-blocks", "1024"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "armature.cli", *args], stdout=out, stderr=subprocess.STDOUT
        )


def wait_for(condition, timeout_s: float, step_s: float = 0.01) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(step_s)
    raise TimeoutError


def decisions(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line.startswith('armature_router_decisions_total{worker="'):
            name = line.split('"')[1]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lease-ttl-s", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="churn-"))
    runtime = ["--discovery", "file", "--discovery-dir", str(work / "disc")]
    worker_args = ["worker", *ENGINE, *runtime, "--lease-ttl-s", str(args.lease_ttl_s)]
    workers = [spawn([*worker_args, "--instance-id", "0"], work / "w0.log")]
    procs = list(workers)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    frontend_log = work / "frontend.log"
    procs.append(spawn(["frontend", *runtime, "--port", str(port)], frontend_log))
    rows = []
    try:
        wait_for(lambda: _healthy(url), 120, 0.2)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "hi", "max_tokens": 1}
        for i in range(1, args.repeats + 1):
            started = time.monotonic()
            new = spawn([*worker_args, "--instance-id", str(i)], work / f"w{i}.log")
            procs.append(new)
            workers.append(new)

            def routed_to_new(name: str = f"worker-{i:x}") -> bool:
                httpx.post(f"{url}/v1/completions", json=body, timeout=30)
                return name in decisions(url)

            wait_for(routed_to_new, 120, 0.05)
            start_to_routed = time.monotonic() - started
            victim = workers[-2]
            lefts = frontend_log.read_text().count(" left")
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            kill_to_removed = wait_for(
                lambda n=lefts: frontend_log.read_text().count(" left") > n, args.lease_ttl_s + 10
            )
            rows.append([i, start_to_routed, kill_to_removed])
            print(rows[-1], flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
    body_md = (
        f"Lease TTL {args.lease_ttl_s:g} s. Each round starts a worker process, waits until a "
        "routing decision goes to it, then kill -9's the previous worker and waits for the "
        "frontend to drop it.\n\n"
        + markdown_table(["round", "start -> first routed s", "kill -> removed s"], rows)
        + f"\n\nMedian start -> first routed {quantile([r[1] for r in rows], 0.5):.2f} s "
        f"(importing the worker and building its engine; a mocker loads no torch); median "
        "kill -> removed "
        f"{quantile([r[2] for r in rows], 0.5):.2f} s (bounded by the lease TTL plus the "
        "watcher's 0.1 s poll).\n"
    )
    out = results_path(args.quick)
    write_section(
        out,
        Section("worker_churn", "Worker churn: removal and join", body_md, "n/a"),
        get_machine_facts(),
    )
    print(f"wrote {out}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
