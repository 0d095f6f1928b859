"""Two hosts on one machine: a worker in its own network namespace, reached over a veth
link by a frontend, etcd and the zmq/TCP planes in the root namespace. Needs root and
`ip netns`; skipped with the reason otherwise."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import PROMPTS, Fleet, complete

from servers import Etcd

FRONT_IP, WORKER_IP = "10.231.0.1", "10.231.0.2"


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def worker_netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("multi-host test needs root and iproute2 (ip netns)")
    name = f"armw{secrets.token_hex(3)}"
    veth = f"av{secrets.token_hex(3)}"
    try:
        _run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.decode().strip()}")
    try:
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _run("ip", "link", "set", f"{veth}p", "netns", name)
        _run("ip", "addr", "add", f"{FRONT_IP}/24", "dev", veth)
        _run("ip", "link", "set", veth, "up")
        _run("ip", "netns", "exec", name, "ip", "addr", "add", f"{WORKER_IP}/24", "dev", f"{veth}p")
        _run("ip", "netns", "exec", name, "ip", "link", "set", f"{veth}p", "up")
        _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.slow
@pytest.mark.integration
def test_worker_on_another_host(
    worker_netns: str, default_model_dir: Path, tmp_path: Path, base_url: str
) -> None:
    etcd = Etcd(tmp_path / "etcd", host=FRONT_IP)
    etcd.start()
    runtime = ["--discovery", "etcd", "--etcd-endpoints", etcd.url, "--event-plane", "zmq"]
    fleet = Fleet(default_model_dir, tmp_path, runtime)
    try:
        fleet.start_worker(
            "remote-worker",
            extra=["--host", WORKER_IP],
            wrapper=["ip", "netns", "exec", worker_netns],
        )
        url = fleet.start_frontend(host=FRONT_IP)
        expected = [complete(base_url, p) for p in PROMPTS]
        assert [complete(url, p) for p in PROMPTS] == expected
        log = (tmp_path / "frontend.log").read_text()
        assert f"tcp://{WORKER_IP}:" in log  # the worker was reached on its own address
    finally:
        fleet.stop()
        etcd.stop()
    fleet.assert_no_tracebacks()


@pytest.mark.slow
@pytest.mark.integration
def test_disaggregated_across_hosts(
    worker_netns: str, default_model_dir: Path, tmp_path: Path, base_url: str
) -> None:
    """A prefill worker on the other host, a decode worker here: the KV blocks cross the veth
    link over TCP and the outputs equal the single-process server's."""
    etcd = Etcd(tmp_path / "etcd", host=FRONT_IP)
    etcd.start()
    runtime = ["--discovery", "etcd", "--etcd-endpoints", etcd.url, "--event-plane", "zmq"]
    fleet = Fleet(default_model_dir, tmp_path, runtime)
    tcp = ["--kv-transfer-backends", "tcp"]
    try:
        fleet.start_worker(
            "prefill",
            extra=["--host", WORKER_IP, "--role", "prefill", *tcp],
            wrapper=["ip", "netns", "exec", worker_netns],
        )
        fleet.start_worker("decode", extra=["--host", FRONT_IP, "--role", "decode", *tcp])
        url = fleet.start_frontend(host=FRONT_IP, extra=["--max-local-prefill-tokens", "0"])
        prompts = [
            f"{p} Tell the whole story in detail, with every step explained. " * 3 for p in PROMPTS
        ]
        expected = [complete(base_url, p) for p in prompts]
        assert [complete(url, p) for p in prompts] == expected
        assert f"KV transfer tcp tcp://{WORKER_IP}:" in (tmp_path / "prefill.log").read_text()
        decode = fleet.worker_metrics("decode")
        assert decode['armature_worker_kv_pulls_total{backend="tcp"}'] >= 1
        assert decode["armature_worker_kv_pull_failures_total"] == 0
    finally:
        fleet.stop()
        etcd.stop()
    fleet.assert_no_tracebacks()
