"""Serving benchmarks' shared steps: wait for a started server to answer /health, and load it
with `armature bench` (one step), returning that step's summary from its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

__all__ = ["run_armature_bench", "running_server", "wait_healthy"]


def wait_healthy(
    proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float, poll_s: float
) -> None:
    """Return once `url`/health answers 200; RuntimeError if `proc` exits or time runs out."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"server not ready after {timeout_s:g} s; see {log}")


def run_armature_bench(
    url: str,
    *,
    concurrency: int,
    num_requests: int,
    input_len: int,
    output_len: int,
    out: Path,
    warmup: int | None = None,
) -> dict[str, Any]:
    """One closed-loop `armature bench` step (EOS ignored); its summary."""
    command = [sys.executable, "-m", "armature.cli", "bench", "--url", url]
    command += ["--concurrency", str(concurrency), "--num-requests", str(num_requests)]
    command += ["--input-len", str(input_len), "--output-len", str(output_len), "--ignore-eos"]
    if warmup is not None:
        command += ["--warmup", str(warmup)]
    command += ["--report", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary: dict[str, Any] = json.loads((out / "report.json").read_text())["steps"][0]["summary"]
    return summary


@contextmanager
def running_server(
    command: list[str], url: str, log: Path, env: dict[str, str], timeout_s: float = 600
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `command` (output to `log`), wait until `url` is healthy, yield the process; stop
    it (SIGTERM, then SIGKILL after 60 s) on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(proc, url, log, timeout_s=timeout_s, poll_s=1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
