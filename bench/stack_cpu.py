"""The serving stack's CPU per request besides the engines, on this machine: the frontend
process, each worker's threads other than its engine's (the asyncio shell: request plane,
streaming, KV events), and the load generator (`armature bench`) when it runs on the same
host. `--system local`'s engines share the host's cores with all of it
(`armature.configurator.host.HostShare`, `armature configure --stack-cpu-ms-per-request`).

Measured over a window of steady open-loop load: the CPU each part spent in it over the
requests that finished in it (the same way `bench.serving_cpu` splits a worker's CPU between
its engine thread and the rest).
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
from bench.serving_cpu import finished_requests, thread_cpu_s

__all__ = ["StackCpu", "measure_stack_cpu", "per_request_ms"]


@dataclass(frozen=True)
class StackCpu:
    """CPU ms per finished request over the window, by part, at `requests_per_s`."""

    requests_per_s: float
    frontend_ms: float
    shells_ms: float  # every worker's threads but its engine's, together
    client_ms: float

    @property
    def total_ms(self) -> float:
        return self.frontend_ms + self.shells_ms + self.client_ms

    def describe(self) -> str:
        return (
            f"{self.total_ms:.1f} ms per request (frontend {self.frontend_ms:.1f}, workers' "
            f"shells {self.shells_ms:.1f}, load generator {self.client_ms:.1f}) at "
            f"{self.requests_per_s:.2f} requests/s"
        )


def per_request_ms(
    start_cpu_s: Sequence[float], end_cpu_s: Sequence[float], num_finished: float
) -> list[float]:
    """Each part's CPU over the window, in ms per finished request."""
    if num_finished <= 0:
        raise RuntimeError("no request finished inside the window")
    return [1000.0 * (b - a) / num_finished for a, b in zip(start_cpu_s, end_cpu_s, strict=True)]


def _parts_cpu_s(frontend: int, workers: list[int], client: int) -> list[float]:
    """(frontend, the workers' non-engine threads together, client) CPU seconds so far."""
    shells = sum(cpu_s(w) - thread_cpu_s(w) for w in workers)
    return [cpu_s(frontend), shells, cpu_s(client)]


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
    """Start `serve`, run the load generator `bench` against it (its request list must
    outlast the window), and measure the stack's CPU over `window_s` once `settle_requests`
    have finished; the load generator is stopped after the window."""
    with running_server(serve, url, log, env) as server:
        workers = [p.pid for p in psutil.Process(server.pid).children()]
        client = subprocess.Popen(bench, stdout=subprocess.DEVNULL)
        try:
            deadline_s = time.monotonic() + 300
            while finished_requests(url)[0] < settle_requests:
                if client.poll() is not None or time.monotonic() > deadline_s:
                    raise RuntimeError("the load generator ended or stalled before the window")
                time.sleep(0.5)
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
    frontend_ms, shells_ms, client_ms = per_request_ms(start, end, end_done - start_done)
    return StackCpu((end_done - start_done) / elapsed_s, frontend_ms, shells_ms, client_ms)
