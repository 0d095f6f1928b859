"""The serving stack's CPU per request besides the engines, on this machine: the frontend
process, each worker's threads other than its engine's (the asyncio shell: request plane,
streaming, KV events), and the load generator (`armature bench`) when it runs on the same
host. `--system local`'s engines share the host's cores with all of it
(`armature.configurator.host.HostShare`, `armature configure --stack-cpu-ms-per-request`,
its parts `--shell-cpu-ms-per-request` and `--frontend-cpu-ms-per-request`).

Measured in two windows (a worker's CPU split between its engine thread and the rest as
`bench.serving_cpu` does): idle, the server up and no request (the cores the stack takes
whatever the load: timers, load reports, metrics), then under steady open-loop load, where
each part's CPU beyond its idle rate, over the requests that finished in the window, is its
CPU per request.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.request_plane import cpu_s
from bench.serving import running_server
from bench.serving_cpu import finished_requests, thread_cpu_s, wait_for_load

__all__ = ["StackCpu", "measure_stack_cpu", "per_request_ms"]


@dataclass(frozen=True)
class StackCpu:
    """The cores the stack takes idle, and its CPU ms per finished request beyond that, by
    part, measured at `requests_per_s`."""

    requests_per_s: float
    idle_cores: float  # the frontend and the workers' shells with no request
    frontend_ms: float
    shells_ms: float  # every worker's threads but its engine's, together
    client_ms: float

    @property
    def total_ms(self) -> float:
        return self.frontend_ms + self.shells_ms + self.client_ms

    def describe(self) -> str:
        return (
            f"{self.idle_cores:.3f} cores idle, and {self.total_ms:.1f} ms per request "
            f"(frontend {self.frontend_ms:.1f}, workers' shells {self.shells_ms:.1f}, load "
            f"generator {self.client_ms:.1f}) measured at {self.requests_per_s:.2f} requests/s"
        )


def per_request_ms(
    start_cpu_s: Sequence[float],
    end_cpu_s: Sequence[float],
    num_finished: float,
    idle_cpu_s: Sequence[float],
) -> list[float]:
    """Each part's CPU over the window beyond `idle_cpu_s` (what it would have spent idle),
    in ms per finished request."""
    if num_finished <= 0:
        raise RuntimeError("no request finished inside the window")
    spent = zip(start_cpu_s, end_cpu_s, idle_cpu_s, strict=True)
    return [1000.0 * max(0.0, b - a - idle) / num_finished for a, b, idle in spent]


def _server_cpu_s(frontend: int, workers: list[int]) -> list[float]:
    """(frontend, the workers' non-engine threads together) CPU seconds so far."""
    return [cpu_s(frontend), sum(cpu_s(w) - thread_cpu_s(w) for w in workers)]


def _parts_cpu_s(frontend: int, workers: list[int], client: int) -> list[float]:
    """`_server_cpu_s` and the client's CPU seconds so far."""
    return [*_server_cpu_s(frontend, workers), cpu_s(client)]


def measure_stack_cpu(
    serve: list[str],
    bench: list[str],
    url: str,
    env: dict[str, str],
    log: Path,
    *,
    settle_requests: int,
    window_s: float,
) -> StackCpu:
    """Start `serve`; measure the stack's CPU idle over `window_s`, then run the load
    generator `bench` against it (its request list must outlast the window) and measure over
    `window_s` once `settle_requests` have finished; the load generator is stopped after."""
    with running_server(serve, url, log, env) as server:
        workers = [p.pid for p in psutil.Process(server.pid).children()]
        idle_start = _server_cpu_s(server.pid, workers)
        time.sleep(window_s)
        idle_end = _server_cpu_s(server.pid, workers)
        idle_rates = [(b - a) / window_s for a, b in zip(idle_start, idle_end, strict=True)]
        client = subprocess.Popen(bench, stdout=subprocess.DEVNULL)
        try:
            wait_for_load(url, client, settle_requests)
            started_s, start_done = time.monotonic(), finished_requests(url)[0]
            start = _parts_cpu_s(server.pid, workers, client.pid)
            time.sleep(window_s)
            end = _parts_cpu_s(server.pid, workers, client.pid)
            elapsed_s, end_done = time.monotonic() - started_s, finished_requests(url)[0]
            if client.poll() is not None:
                raise RuntimeError("the load generator ran out of requests inside the window")
        finally:
            client.terminate()
            client.wait(timeout=60)
    idle_cpu_s = [rate * elapsed_s for rate in idle_rates] + [0.0]  # the client: none
    frontend_ms, shells_ms, client_ms = per_request_ms(
        start, end, end_done - start_done, idle_cpu_s
    )
    rate = (end_done - start_done) / elapsed_s
    return StackCpu(rate, sum(idle_rates), frontend_ms, shells_ms, client_ms)
