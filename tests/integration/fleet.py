"""Frontend and worker processes for the distributed-runtime integration tests: start them
with any runtime flags, read their logs, check discovery, stop them all by PID. `wait_until`
and `Load` are for fault tests that must not depend on the machine's speed: they wait for a
state rather than for a time, and keep work in flight until the fault has struck it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import unquote

import httpx
import pytest
from serve_process import SERVED_MODEL_NAME, _free_port, _wait_healthy, parse_metrics

LEASE_TTL_S = 2.0  # seconds; etcd leases are whole seconds
WAIT_DEADLINE_S = 120.0  # a bound on waits for a state, far beyond it on an idle machine
T = TypeVar("T")
ENGINE_ARGS = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--num-kv-blocks",
    "256",
    "--max-model-len",
    "1024",
    "--served-model-name",
    SERVED_MODEL_NAME,
]


class Fleet:
    def __init__(
        self,
        model_dir: Path,
        root: Path,
        runtime_args: list[str] | None = None,
        engine_args: list[str] | None = None,
    ):
        """`runtime_args` default to file discovery in `root` with the TCP and zmq planes."""
        self.model_dir = model_dir
        self.root = root
        self.discovery_dir = root / "discovery"
        self.procs: list[subprocess.Popen[bytes]] = []
        self._runtime_args = runtime_args
        self.engine_args = ENGINE_ARGS if engine_args is None else engine_args

    def _spawn(
        self, name: str, args: list[str], wrapper: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [*(wrapper or []), sys.executable, "-m", "armature.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.procs.append(proc)
        return proc

    def runtime_args(self) -> list[str]:
        if self._runtime_args is not None:
            return self._runtime_args
        return ["--discovery", "file", "--discovery-dir", str(self.discovery_dir)]

    def start_worker(
        self,
        name: str,
        extra: list[str] | None = None,
        wrapper: list[str] | None = None,
        wait: bool = True,
    ) -> subprocess.Popen[bytes]:
        """`wrapper` prefixes the command (e.g. `ip netns exec NS`); `wait`: until it is
        ready."""
        args = ["worker", "--model", str(self.model_dir), *self.engine_args, *self.runtime_args()]
        args += ["--lease-ttl-s", str(LEASE_TTL_S), *(extra or [])]
        proc = self._spawn(name, args, wrapper)
        if wait:
            self.wait_for_log(name, "ready:", proc)
        return proc

    def start_frontend(self, host: str = "127.0.0.1", extra: list[str] | None = None) -> str:
        return self.start_frontend_process("frontend", host, extra)[0]

    def start_frontend_process(
        self, name: str, host: str = "127.0.0.1", extra: list[str] | None = None
    ) -> tuple[str, subprocess.Popen[bytes]]:
        """A frontend logging to `name`.log, once healthy: its url and process."""
        port = _free_port()
        args = ["frontend", "--port", str(port), "--router", "kv", *self.runtime_args()]
        args += extra or []
        proc = self._spawn(name, [*args, "--host", host])
        url = f"http://{host}:{port}"
        _wait_healthy(proc, url, self.root / f"{name}.log")
        return url, proc

    def wait_for_log(self, name: str, text: str, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 180
        path = self.root / f"{name}.log"
        while time.monotonic() < deadline:
            if text in path.read_text(errors="replace"):
                return
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{path.read_text()}")
            time.sleep(0.2)
        pytest.fail(f"{name} did not log {text!r}:\n{path.read_text()}")

    def log_text(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def worker_id(self, name: str) -> str:
        """The worker id that `name` announced when it became ready."""
        found = re.search(r"worker (\S+) ready:", self.log_text(name))
        assert found, f"{name} is not ready"
        return found.group(1)

    def num_running(self, name: str) -> int:
        """Requests the worker's engine is running now, from its own /metrics."""
        metrics = self.worker_metrics(name)
        prefix = "armature_worker_requests_running{"
        return int(sum(v for k, v in metrics.items() if k.startswith(prefix)))

    def worker_metrics(self, name: str) -> dict[str, float]:
        """The worker's own /metrics, found through the url its log announces."""
        found = re.search(r"metrics (http://\S+/metrics)", (self.root / f"{name}.log").read_text())
        assert found, f"{name} logged no metrics url"
        return parse_metrics(httpx.get(found.group(1), timeout=10).text)

    def registered(self) -> list[str]:
        """The workers' registrations in discovery (frontend replicas register too: see
        `registered_keys`)."""
        return [k for k in self.registered_keys() if "/worker/" in k]

    def registered_keys(self) -> list[str]:
        """Every key in discovery, sorted."""
        entries = self.discovery_dir / "entries"
        return sorted(unquote(p.name) for p in entries.iterdir()) if entries.exists() else []

    def assert_no_tracebacks(self) -> None:
        for log in self.root.glob("*.log"):
            text = log.read_text(errors="replace")
            assert "Traceback" not in text, f"{log.name}:\n{text}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_until(condition: Callable[[], T], what: str) -> T:
    """Poll `condition` until it returns a true value, and return that; fail after
    WAIT_DEADLINE_S."""
    deadline_s = time.monotonic() + WAIT_DEADLINE_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline_s:
            pytest.fail(f"not {what} after {WAIT_DEADLINE_S:g} s")
        time.sleep(0.02)


class Load(Generic[T]):
    """`num_clients` threads call `send(0)`, `send(1)`, ... one request at a time until
    `finish()` is called and at least `min_requests` were sent: work stays in flight for as
    long as a fault test needs, however fast the machine serves it."""

    def __init__(self, send: Callable[[int], T], num_clients: int, min_requests: int):
        self._send = send
        self._min_requests = min_requests
        self._lock = threading.Lock()
        self._num_sent = 0
        self._finishing = threading.Event()
        self._results: dict[int, T] = {}
        self._pool = ThreadPoolExecutor(num_clients)
        self._clients = [self._pool.submit(self._client) for _ in range(num_clients)]

    def _client(self) -> None:
        while True:
            with self._lock:
                i = self._num_sent
                if self._finishing.is_set() and i >= self._min_requests:
                    return
                self._num_sent += 1
            self._results[i] = self._send(i)

    def finish(self) -> list[T]:
        """Stop sending once `min_requests` were sent; every result, in request order (a
        client's exception is raised here)."""
        self._finishing.set()
        try:
            for client in self._clients:
                client.result()
        finally:
            self._pool.shutdown()
        return [self._results[i] for i in range(len(self._results))]


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]


def decisions(url: str) -> dict[str, float]:
    metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    prefix = 'armature_router_decisions_total{worker="'
    return {k[len(prefix) : -2]: v for k, v in metrics.items() if k.startswith(prefix)}


def complete(url: str, prompt: str) -> str:
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])
