"""etcd's own security, used for real: an etcd that serves only https, demands client
certificates and has authentication on, with our user allowed only its namespace's keys. A
worker and a frontend register, watch and serve through it; wrong credentials, a missing client
certificate or a namespace outside the user's grant fail fast with one line (exit code 2); the
password never reaches a log; an expired token is renewed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet

from armature.protocols.worker import worker_prefix
from armature.runtime.discovery_etcd import EtcdAccess, EtcdDiscovery, EtcdError
from servers import Etcd, TlsFiles

USER = "armature-worker"
PASSWORD = "s3cret-etcd-pass"
NAMESPACE = "secure"
MOCKER = ["--engine", "mocker", "--num-kv-blocks", "256", "--served-model-name", SERVED_MODEL_NAME]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    root = tmp_path_factory.mktemp("secure-etcd")
    server = Etcd(root / "etcd", tls=TlsFiles(root / "tls"), extra_args=["--auth-token-ttl", "2"])
    server.start()
    try:
        server.enable_auth(USER, PASSWORD, worker_prefix(NAMESPACE))
        yield server
    finally:
        server.stop()


def runtime_args(etcd: Etcd, namespace: str = NAMESPACE, cert: bool = True) -> list[str]:
    assert etcd.tls is not None
    args = ["--discovery", "etcd", "--etcd-endpoints", etcd.url, "--namespace", namespace]
    args += ["--etcd-user", USER, "--etcd-ca-file", str(etcd.tls.ca)]
    if cert:
        args += ["--etcd-cert-file", str(etcd.tls.client), "--etcd-key-file"]
        args += [str(etcd.tls.client_key)]
    return args


def run_worker(args: list[str], password: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARMATURE_ETCD_PASSWORD": password}
    command = [sys.executable, "-m", "armature.cli", "worker", *MOCKER, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.integration
def test_workers_and_frontends_serve_through_a_secured_etcd(
    etcd: Etcd, default_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARMATURE_ETCD_PASSWORD", PASSWORD)
    fleet = Fleet(default_model_dir, tmp_path, runtime_args(etcd), MOCKER)
    try:
        fleet.start_worker("worker-a")
        url = fleet.start_frontend()
        time.sleep(3)  # past the token's TTL: the next calls authenticate again
        fleet.start_worker("worker-b")
        body = {"model": SERVED_MODEL_NAME, "prompt": "Hello", "max_tokens": 4}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        listed = etcd.call(
            "/v3/kv/range",
            {"key": "", "range_end": "AA=="},  # every key: only root may
            token=None,
        )
        assert listed.status_code in (400, 401), listed.text  # anonymous reads are refused
    finally:
        fleet.stop()
    fleet.assert_no_tracebacks()
    for log in tmp_path.glob("*.log"):
        assert PASSWORD not in log.read_text(), log.name


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "password", "message"),
    [
        ("good", "wrong-password", "authentication failed"),
        ("no-cert", PASSWORD, "no etcd endpoint answered"),
        ("other-namespace", PASSWORD, "permission denied"),
    ],
)
def test_refused_access_fails_fast_with_one_line(
    etcd: Etcd, args: str, password: str, message: str
) -> None:
    namespace = "elsewhere" if args == "other-namespace" else NAMESPACE
    result = run_worker(runtime_args(etcd, namespace, cert=args != "no-cert"), password)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("armature: error: ") and message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr
    assert password not in result.stderr + result.stdout


def test_expired_tokens_are_renewed(etcd: Etcd) -> None:
    assert etcd.tls is not None
    access = EtcdAccess(
        user=USER,
        password=PASSWORD,
        ca_file=str(etcd.tls.ca),
        cert_file=str(etcd.tls.client),
        key_file=str(etcd.tls.client_key),
    )
    prefix = worker_prefix(NAMESPACE)

    async def scenario() -> None:
        discovery = EtcdDiscovery([etcd.url], access=access)
        try:
            registration = await discovery.register(f"{prefix}renewal", b"card", ttl_s=30)
            first_token = discovery._token
            await asyncio.sleep(3)  # the token's TTL is 2 s
            assert await discovery.list(prefix) == {f"{prefix}renewal": b"card"}
            assert discovery._token != first_token
            await registration.close()
            assert await discovery.list(prefix) == {}
            with pytest.raises(EtcdError, match="permission denied"):
                await discovery.list("instances/elsewhere/")
        finally:
            await discovery.close()
        assert PASSWORD not in repr(access)

    asyncio.run(scenario())
