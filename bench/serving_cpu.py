"""Serving-path CPU per request: `armature serve --engine mocker --workers 2` at effectively
infinite speed, loaded by `armature bench` with 32 concurrent streaming clients (512-token
prompts from 32 shared 384-token prefixes, 64 output tokens, EOS ignored). CPU of the frontend
process and of each worker process is read from /proc over a steady window in the middle of
the run, and the requests finished in that window from the frontend's own /metrics counter.
Reported: requests/s and % of one core per request/s, for the frontend and the workers.
A second, short run at concurrency 1 reports TTFT and ITL through the frontend.

    python -m bench.serving_cpu            # full run, writes docs/benchmarks.md
    python -m bench.serving_cpu --quick    # smoke run, writes bench/out/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.paths import REPO_ROOT, results_path
from bench.report import Section, get_machine_facts, markdown_table, write_section
from bench.request_plane import cpu_s, free_port
from bench.serving import running_server

LOG_DIR = REPO_ROOT / "bench" / "out"
CONCURRENCY = 32
INPUT_LEN, PREFIX_LEN, OUTPUT_LEN, NUM_PREFIXES = 512, 384, 64, 32
SPEEDUP = "1e9"
_REQUESTS = re.compile(r'^armature_requests_total\{[^}]*status="(\d+)"[^}]*\} (\S+)$', re.M)


@dataclass(frozen=True)
class Plan:
    settle_s: float  # load runs this long before the window opens
    window_s: float
    max_requests: int  # the client's whole request list (far more than the window needs)
    num_requests_c1: int


FULL = Plan(settle_s=5, window_s=20, max_requests=8000, num_requests_c1=60)
QUICK = Plan(settle_s=3, window_s=6, max_requests=3000, num_requests_c1=10)


@dataclass(frozen=True)
class Reading:
    requests_per_s: float
    frontend_pct_per_rps: float
    workers_pct_per_rps: list[float]  # one per worker process
    client_cpu_pct: float  # % of one core over the window
    engines_pct_per_rps: list[float]  # the part of each worker's that its engine thread used


def serve_command(port: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "armature.cli",
        "serve",
        "--engine",
        "mocker",
        "--workers",
        "2",
        "--speedup-ratio",
        SPEEDUP,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra,
    ]


def bench_command(url: str, concurrency: int, out: Path, **limits: int) -> list[str]:
    command = [sys.executable, "-m", "armature.cli", "bench", "--url", url, "--endpoint"]
    command += ["completions", "--concurrency", str(concurrency), "--input-len", str(INPUT_LEN)]
    command += ["--output-len", str(OUTPUT_LEN), "--ignore-eos", "--report", str(out)]
    command += ["--prefix-groups", str(NUM_PREFIXES)]
    command += ["--prefix-ratio", str(PREFIX_LEN / INPUT_LEN), "--warmup", str(concurrency)]
    for name, value in limits.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def finished_requests(url: str) -> tuple[float, float]:
    """(requests finished with 200, requests finished otherwise) from the frontend's metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    ok = failed = 0.0
    for status, value in _REQUESTS.findall(text):
        if status == "200":
            ok += float(value)
        else:
            failed += float(value)
    return ok, failed


def summary(out: Path) -> dict[str, Any]:
    steps = json.loads((out / "report.json").read_text())["steps"]
    result: dict[str, Any] = steps[0]["summary"]
    return result


def wait_for_load(url: str, client: subprocess.Popen[bytes], num_requests: int) -> None:
    """Return once `num_requests` have finished (the client's warm-up and first rounds)."""
    deadline_s = time.monotonic() + 300
    while finished_requests(url)[0] < num_requests:
        if client.poll() is not None or time.monotonic() > deadline_s:
            raise RuntimeError("armature bench ended or stalled before the load started")
        time.sleep(0.5)


def thread_cpu_s(pid: int) -> float:
    """CPU seconds of the Python-started threads of process `pid` other than its main thread
    (in a worker: the engine thread, which runs the scheduler and the mocker's steps)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if int(task.name) == pid or (task / "comm").read_text().strip() != "python":
            continue
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _sample(url: str, pids: list[int], workers: list[int]) -> tuple[float, float, list[float]]:
    """(time, finished requests, CPU seconds: each of `pids`, then each worker's engine)."""
    cpu = [cpu_s(p) for p in pids] + [thread_cpu_s(w) for w in workers]
    return time.monotonic(), finished_requests(url)[0], cpu


def _profilers(pids: dict[str, int], plan: Plan, out: Path | None) -> list[subprocess.Popen[bytes]]:
    """py-spy (if asked for: `out`) sampling each named process over the window, as collapsed
    stacks in `out`/NAME.txt."""
    if out is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    command = ["py-spy", "record", "--nonblocking", "--format", "raw", "--rate", "200"]
    command += ["--duration", str(int(plan.window_s))]
    return [
        subprocess.Popen(
            [*command, "--pid", str(pid), "--output", str(out / f"{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def top_frames(collapsed: Path, num: int) -> list[tuple[str, float, float]]:
    """(function, % of samples on the stack, % of samples as the innermost frame) of the
    `num` functions most often on the stack, from a py-spy raw (collapsed) profile."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    pending = ""  # a stack whose frame name held a newline goes on on the next line
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = (pending + line).rpartition(" ")
        if not count_text.isdigit():
            pending += line + "\n"
            continue
        pending = ""
        count = int(count_text)
        total += count
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])[:num]
    return [(f, 100 * n / total, 100 * own.get(f, 0) / total) for f, n in ranked]


def measure_load(
    url: str, frontend_pid: int, plan: Plan, out: Path, profile: Path | None = None
) -> Reading:
    """Closed loop at CONCURRENCY; CPU and finished requests over the steady window, then the
    client is stopped (bounded: at most `plan.max_requests` requests and the window's time)."""
    workers = [p.pid for p in psutil.Process(frontend_pid).children()]
    assert len(workers) == 2, f"expected 2 worker processes, found {workers}"
    command = bench_command(url, CONCURRENCY, out, num_requests=plan.max_requests)
    client = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    pids = [frontend_pid, *workers, client.pid]
    try:
        wait_for_load(url, client, 3 * CONCURRENCY)
        time.sleep(plan.settle_s)
        profilers = _profilers({"frontend": frontend_pid, "worker": workers[0]}, plan, profile)
        start = _sample(url, pids, workers)
        time.sleep(plan.window_s)
        end = _sample(url, pids, workers)
        # counted before the client is stopped: the streams it leaves end as 499
        failed = finished_requests(url)[1]
        for profiler in profilers:
            profiler.wait(timeout=60)
        if client.poll() is not None:
            raise RuntimeError("armature bench ran out of requests inside the window")
    finally:
        client.terminate()
        client.wait(timeout=60)
    assert failed == 0, f"{failed} requests failed"
    window_s = end[0] - start[0]
    rps = (end[1] - start[1]) / window_s
    pct = [100 * (b - a) / window_s / rps for a, b in zip(start[2], end[2], strict=True)]
    num = len(workers)
    return Reading(rps, pct[0], pct[1 : 1 + num], pct[1 + num] * rps, pct[2 + num :])


def measure_latency(url: str, plan: Plan, out: Path) -> dict[str, float]:
    """TTFT and ITL p50 at concurrency 1 through the frontend."""
    command = bench_command(url, 1, out, num_requests=plan.num_requests_c1)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    result = summary(out)
    return {"ttft_p50_ms": result["ttft_ms"]["p50"], "itl_p50_ms": result["itl_ms"]["p50"]}


def render(reading: Reading, latency: dict[str, float], label: str) -> str:
    workers, engines = reading.workers_pct_per_rps, reading.engines_pct_per_rps
    rows = [
        [
            label,
            reading.requests_per_s,
            f"{reading.frontend_pct_per_rps:.3f}",
            " + ".join(f"{w:.3f}" for w in workers),
            " + ".join(f"{w - e:.3f}" for w, e in zip(workers, engines, strict=True)),
            f"{reading.frontend_pct_per_rps + sum(workers):.3f}",
            f"{reading.client_cpu_pct:.0f}",
            latency["ttft_p50_ms"],
            latency["itl_p50_ms"],
        ]
    ]
    headers = [
        "build",
        "requests/s",
        "frontend % core per req/s",
        "workers % core per req/s",
        "worker shells (less engine thread)",
        "stack % core per req/s",
        "bench client % core",
        "c=1 TTFT p50 ms",
        "c=1 ITL p50 ms",
    ]
    return markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows, scratch output")
    parser.add_argument("--label", default="this commit", help="row label")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--src", type=Path, default=REPO_ROOT / "src", help="serve this source tree (a base)"
    )
    parser.add_argument(
        "--latency-only", action="store_true", help="only the concurrency-1 run (prints it)"
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the frontend and a worker into this directory"
    )
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_server(
            serve_command(port, args.serve_arg), url, LOG_DIR / "serving_cpu.log", env, 120
        ) as server,
    ):
        if args.latency_only:
            print(args.label, measure_latency(url, plan, Path(tmp) / "c1"))
            return
        reading = measure_load(url, server.pid, plan, Path(tmp) / "load", args.profile)
        latency = measure_latency(url, plan, Path(tmp) / "c1")
    table = render(reading, latency, args.label)
    print(table, flush=True)
    for name in ("frontend", "worker") if args.profile else ():
        print(f"\n{name}: function, % on stack, % innermost")
        for frame, on_stack, innermost in top_frames(args.profile / f"{name}.txt", 60):
            print(f"{on_stack:5.1f} {innermost:5.1f}  {frame}")
    if args.no_write or args.profile:
        return
    body = (
        f"`armature serve --engine mocker --workers 2 --speedup-ratio {SPEEDUP}`; "
        f"`armature bench` closed loop at concurrency {CONCURRENCY}, /v1/completions streaming, "
        f"{INPUT_LEN}-token prompts from {NUM_PREFIXES} shared {PREFIX_LEN}-token prefixes, "
        f"{OUTPUT_LEN} output tokens, EOS ignored. CPU (utime + stime from /proc) over a "
        f"{plan.window_s:g} s window after {plan.settle_s:g} s of load; requests finished in "
        "the window from the frontend's /metrics. The bench client shares the 2 cores.\n\n"
        + table
        + "\n"
    )
    section = Section("serving_cpu", "Serving path: CPU per request", body, "n/a")
    write_section(results_path(args.quick), section, get_machine_facts())


if __name__ == "__main__":
    main()
