"""The multi-node runtime on real servers: etcd discovery with the TCP or NATS request plane
and the NATS event plane. Greedy outputs equal the single-process server's; a kill -9'd worker
leaves etcd within its lease; etcd restarted with its data wiped → the workers register again
and the frontend keeps routing; NATS restarted → traffic resumes."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet import PROMPTS, SERVED_MODEL_NAME, Fleet, complete, decisions

from armature.protocols.worker import worker_prefix
from armature.runtime.discovery_etcd import EtcdDiscovery
from servers import Etcd, Nats


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Etcd, Nats]]:
    etcd = Etcd(tmp_path_factory.mktemp("etcd"))
    nats = Nats(tmp_path_factory.mktemp("nats"))
    etcd.start()
    try:
        nats.start()
        try:
            yield etcd, nats
        finally:
            nats.stop()
    finally:
        etcd.stop()


def registered(etcd: Etcd, namespace: str) -> list[str]:
    async def read() -> list[str]:
        d = EtcdDiscovery([etcd.url], request_timeout_s=2)
        try:
            return sorted(await d.list(worker_prefix(namespace)))
        finally:
            await d.close()

    return asyncio.run(read())


def wait_until(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def completes(url: str, prompt: str) -> bool:
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0},
        timeout=30,
    )
    return response.status_code == 200


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("request_plane", ["tcp", "nats"])
def test_etcd_and_nats_runtime(
    request_plane: str,
    servers: tuple[Etcd, Nats],
    default_model_dir: Path,
    tmp_path: Path,
    base_url: str,
) -> None:
    etcd, nats = servers
    namespace = f"it-{request_plane}"
    runtime = [
        "--namespace",
        namespace,
        "--discovery",
        "etcd",
        "--etcd-endpoints",
        etcd.url,
        "--request-plane",
        request_plane,
        "--event-plane",
        "nats",
        "--nats-url",
        nats.url,
    ]
    fleet = Fleet(default_model_dir, tmp_path, runtime)
    try:
        first = fleet.start_worker("worker-a")
        fleet.start_worker("worker-b")
        url = fleet.start_frontend()
        expected = [complete(base_url, p) for p in PROMPTS]
        assert [complete(url, p) for p in PROMPTS] == expected
        assert len(registered(etcd, namespace)) == 2

        first.send_signal(signal.SIGKILL)
        for prompt in PROMPTS:
            assert complete(url, prompt) in expected
        wait_until(lambda: len(registered(etcd, namespace)) == 1, 1 + 3.0, "the lease to end")
        before = set(decisions(url))
        fleet.start_worker("worker-c")
        wait_until(lambda: len(registered(etcd, namespace)) == 2, 10, "worker-c")
        wait_until(
            lambda: completes(url, f"fresh {time.monotonic()}") and set(decisions(url)) - before,
            30,
            "traffic to worker-c",
        )

        etcd.wipe_and_restart()  # every key and lease gone: the workers must register again
        wait_until(lambda: len(registered(etcd, namespace)) == 2, 10, "re-registration")
        # the frontend saw the keys vanish and come back: it routes again once its watch
        # has resumed (a moment after the re-registration)
        wait_until(lambda: completes(url, "after the etcd restart"), 20, "traffic after etcd")
        assert [complete(url, p) for p in PROMPTS] == expected

        nats.restart()
        wait_until(lambda: completes(url, "after the restart"), 20, "traffic after NATS restart")
        assert [complete(url, p) for p in PROMPTS] == expected

        fleet.stop()
        assert registered(etcd, namespace) == []
    finally:
        fleet.stop()
    fleet.assert_no_tracebacks()
