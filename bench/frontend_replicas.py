"""Requests/s through `armature serve --frontends N` (N frontend processes on one port,
SO_REUSEPORT, sharing their in-flight load), N = 1, 2, 4, on this machine.

    python -m bench.frontend_replicas            # full run, writes docs/benchmarks.md
    python -m bench.frontend_replicas --quick    # smoke run, writes bench/out/benchmarks.md

The load is issue 21's: `armature bench`, 32 concurrent streaming clients, 512-token prompts
whose first 384 tokens come from a pool of 32 shared prefixes, 64 output tokens with EOS
ignored; two mocker workers at effectively infinite speed (speedup 1e9) behind the KV
router, so that what is measured is the serving path itself. Each process's CPU (user +
system, from /proc) is read over the measured run: the frontends', the workers' and the
client's cost per request/s (the client's as `armature bench` measures itself while
measuring), from which the scaling beyond this machine's cores is
projected (each part on cores of its own). The skew is the busiest worker's requests over
the mean, from the workers' own counters.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness import BenchArgs, parse_args, publish
from bench.paths import REPO_ROOT
from bench.report import Section, markdown_table
from bench.serving import running_server

REPLICAS = (1, 2, 4)
NUM_WORKERS = 2
CONCURRENCY = 32
INPUT_LEN, OUTPUT_LEN, PREFIX_GROUPS, PREFIX_RATIO = 512, 64, 32, 0.75
LOG_DIR = REPO_ROOT / "bench" / "out" / "frontend_replicas"
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    num_frontends: int
    requests_per_s: float
    ttft_p50_ms: float
    frontend_core_per_rps: float  # % of a core per request/s, all frontends together
    worker_core_per_rps: float  # all workers together
    client_core_per_rps: float
    skew: float  # busiest worker's finished requests / the mean


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _children(pid: int) -> dict[str, list[int]]:
    """The serve's child processes by kind (`frontend`, `worker`)."""
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True, check=True
    ).stdout
    kinds: dict[str, list[int]] = {"frontend": [], "worker": []}
    for line in out.splitlines():
        child, args = line.strip().split(" ", 1)
        for kind in kinds:
            if f"armature.cli {kind}" in args:
                kinds[kind].append(int(child))
    return kinds


def _worker_requests(log: Path) -> list[float]:
    """Requests each worker finished, from its own /metrics (urls from the serve's log)."""
    urls = re.findall(r"metrics (http://\S+/metrics)", log.read_text(errors="replace"))
    counts = []
    for url in urls:
        text = httpx.get(url, timeout=10).text
        found = re.findall(r'^armature_worker_requests_total\{reason="\w+"\} (\S+)$', text, re.M)
        counts.append(sum(float(x) for x in found))
    return counts


def _run(args: BenchArgs, num_frontends: int, num_requests: int, port: int) -> Run:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"serve_{num_frontends}.log"
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "armature.cli", "serve", "--model", str(args.model_dir)]
    command += ["--engine", "mocker", "--speedup-ratio", "1e9", "--router", "kv"]
    command += ["--workers", str(NUM_WORKERS), "--frontends", str(num_frontends)]
    command += ["--port", str(port), "--num-kv-blocks", "16384"]
    with running_server(command, url, log, dict(os.environ)) as proc:
        while len(_children(proc.pid)["frontend"]) < num_frontends - 1:
            time.sleep(0.2)
        _bench(url, CONCURRENCY, 64, Path(tempfile.mkdtemp()))  # warm every replica
        kinds = _children(proc.pid)
        frontends = [proc.pid, *kinds["frontend"]]
        before = {pid: _cpu_s(pid) for pid in frontends + kinds["worker"]}
        summary = _bench(url, CONCURRENCY, num_requests, Path(tempfile.mkdtemp()))
        spent = {pid: _cpu_s(pid) - s for pid, s in before.items()}
        counts = _worker_requests(log)
    rps = summary["requests_per_s"]
    wall_s = summary["wall_time_s"]

    def per_rps(cpu_s: float) -> float:
        return 100 * cpu_s / wall_s / rps

    return Run(
        num_frontends=num_frontends,
        requests_per_s=rps,
        ttft_p50_ms=summary["ttft_ms"]["p50"],
        frontend_core_per_rps=per_rps(sum(spent[p] for p in frontends)),
        worker_core_per_rps=per_rps(sum(spent[p] for p in kinds["worker"])),
        client_core_per_rps=summary["client_cpu_percent"] / rps,
        skew=max(counts) / (sum(counts) / len(counts)) if counts else float("nan"),
    )


def _bench(url: str, concurrency: int, num_requests: int, out: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "armature.cli", "bench", "--url", url, "--endpoint"]
    command += ["completions", "--concurrency", str(concurrency)]
    command += ["--num-requests", str(num_requests), "--input-len", str(INPUT_LEN)]
    command += ["--output-len", str(OUTPUT_LEN), "--prefix-groups", str(PREFIX_GROUPS)]
    command += ["--prefix-ratio", str(PREFIX_RATIO), "--ignore-eos", "--report", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    summary: dict[str, float] = report["steps"][0]["summary"]
    return summary


def _projection(run: Run) -> float:
    """Requests/s with one core per frontend replica for the frontends alone (the workers and
    the client on cores of their own), at the cost per request/s measured with as many
    replicas: the frontends' cost bounds it."""
    return 100 * run.num_frontends / run.frontend_core_per_rps


def _section(runs: list[Run], num_requests: int) -> Section:
    rows = [
        (
            r.num_frontends,
            r.requests_per_s,
            r.requests_per_s / runs[0].requests_per_s,
            r.ttft_p50_ms,
            r.frontend_core_per_rps,
            r.worker_core_per_rps,
            r.client_core_per_rps,
            r.skew,
        )
        for r in runs
    ]
    table = markdown_table(
        [
            "frontends",
            "requests/s",
            "vs 1",
            "TTFT p50 ms",
            "frontends, % core per req/s",
            "workers, % core per req/s",
            "client, % core per req/s",
            "worker skew",
        ],
        rows,
    )
    base = runs[0]
    projected = markdown_table(
        ["frontends, a core each", "requests/s they could serve (projected)"],
        [(r.num_frontends, _projection(r)) for r in runs],
    )
    fastest = max(runs, key=lambda r: r.requests_per_s)
    cores = len(os.sched_getaffinity(0))
    total = base.frontend_core_per_rps + base.worker_core_per_rps + base.client_core_per_rps
    body = (
        f"{NUM_WORKERS} mocker workers (speedup 1e9), KV router; `armature bench` with "
        f"{CONCURRENCY} streaming clients, {num_requests} requests of {INPUT_LEN} prompt tokens "
        f"({PREFIX_RATIO:.0%} from {PREFIX_GROUPS} shared prefixes) and {OUTPUT_LEN} output "
        f"tokens, EOS ignored. 2-core shared CPU machine, loaded by other work: the numbers "
        f"swing from run to run.\n\n{table}\n\n"
        f"Where the cores cap it: this machine has {cores} cores for the client, the "
        f"frontends and the workers together; one request/s costs {total:.2f}% of a core "
        f"over all of them with one frontend, so {cores} cores serve at most "
        f"~{100 * cores / total:.0f} requests/s whatever the number of frontends, and the "
        f"machine's other load takes a share of that. More frontends add processes competing "
        f"for the same cores: the best run here had {fastest.num_frontends} frontend(s) "
        f"({fastest.requests_per_s:.0f} requests/s), within the swing of this machine, and the "
        f"frontends' cost per request/s grows with their number (each replica's fixed work: "
        f"its event loop, KV-event and load-sharing tasks, discovery polling; and more "
        f"context switches on 2 cores).\n\n"
        f"Scaling beyond it, projected: each replica on a core of its own, the workers and "
        f"the clients on cores of theirs, at the frontends' cost per request/s measured with "
        f"that many replicas here (sharing load costs each replica one snapshot of a few "
        f"bytes per worker per change, at most every 10 ms, and a decode per peer's "
        f"snapshot):\n\n{projected}\n"
    )
    return Section("frontend_replicas", "Frontend replicas (serve --frontends)", body, "n/a")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    args, _ = parse_args(__doc__ or "", parser)
    num_requests = 128 if args.quick else 1024
    runs = []
    for n in (1, 2) if args.quick else REPLICAS:
        port = _free_port()
        run = _run(args, n, num_requests, port)
        print(run, flush=True)
        runs.append(run)
    publish(args, _section(runs, num_requests))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    main()
